// `kvtier live`: decode with the real tiered KV cache (CPU backend) and write a measurement file
// (docs/LIVE.md, configs/schema/measurement.proto).

#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "apps/cli.hpp"
#include "common/atomic_file.hpp"
#include "common/errors.hpp"
#include "common/text_output.hpp"
#include "configs/schema/measurement.pb.h"
#include "configs/units.hpp"
#include "configs/utf8_fields.hpp"
#include "kernels/cuda_engine.hpp"
#include "kernels/device_info.hpp"
#include "kernels/engine.hpp"
#include "kernels/live.hpp"
#include "kernels/tiered_cache.hpp"
#include "kernels/tokenizer.hpp"
#include "replay/parameters.hpp"
#include "replay/trace_source.hpp"
#include "traces/writer.hpp"

namespace kvtier::app {
namespace {

namespace po = boost::program_options;

void fill(config::CopyMeasurement& out, const kernels::CopyCounter& counter) {
  out.set_bytes(counter.bytes);
  out.set_token_layers(counter.tokens);
  out.set_seconds(counter.seconds);
  out.set_runs(counter.runs);
  out.set_gb_per_s(
      counter.seconds > 0.0 ? static_cast<double>(counter.bytes) / counter.seconds / 1e9 : 0.0);
}

std::string bytes_text(std::uint64_t bytes) {
  return format_fixed(static_cast<double>(bytes) / 1024.0, 1) + " KiB";
}

// The tokens a run starts from and, in trace-driven mode, the ones it is forced to run.
struct RunTokens {
  std::vector<std::int32_t> prompt;
  std::vector<std::int32_t> forced;
  std::uint64_t folded = 0;  // trace tokens outside the model's vocabulary (taken modulo it)
};

// --follow-trace: the trace's prompt, and its tokens at positions P .. P + new − 1.
RunTokens trace_tokens(const replay::TraceAttention& trace, const config::ModelSpec& spec,
                       int new_tokens) {
  const std::vector<std::int32_t> all = trace.reader().read_tokens();
  const std::uint64_t prompt_tokens = trace.prompt_tokens();
  RunTokens tokens;
  const auto vocab = static_cast<std::int64_t>(spec.vocab_size());
  const auto fold = [&](std::int32_t token) {
    if (token >= vocab) {
      ++tokens.folded;
      return static_cast<std::int32_t>(token % vocab);
    }
    return token;
  };
  for (std::uint64_t i = 0; i < prompt_tokens; ++i) {
    tokens.prompt.push_back(fold(all[i]));
  }
  for (int step = 0; step < new_tokens; ++step) {
    tokens.forced.push_back(fold(all[prompt_tokens + static_cast<std::uint64_t>(step)]));
  }
  return tokens;
}

// The followed trace as the measurement file records it: relative to the file's folder, which
// is how kvtier validate resolves it, so a file and its trace can move together.
std::string trace_path_for(const std::string& trace, const std::string& measurement) {
  if (measurement.empty()) {
    return trace;
  }
  namespace fs = std::filesystem;
  const fs::path folder = fs::absolute(fs::path(measurement)).parent_path();
  return fs::absolute(fs::path(trace)).lexically_normal().lexically_relative(folder).string();
}

// --cuda-lookahead N: the cache's default when not given; ConfigError with another device or out
// of range, checked before the device is, like the other CUDA choices.
int cuda_lookahead_option(const po::variables_map& values, const std::string& device) {
  if (values.count("cuda-lookahead") == 0U) {
    return kernels::TieredCacheOptions{}.staging_lookahead;
  }
  if (device != "cuda") {
    throw ConfigError(
        "--cuda-lookahead applies to --device cuda (the CPU cache stages a layer when its "
        "attention reads it)");
  }
  const int layers = values["cuda-lookahead"].as<int>();
  kernels::check_staging_lookahead(layers, "--cuda-lookahead");
  return layers;
}

}  // namespace

int run_live(const Arguments& args, Context& context) {
  po::options_description options("live options");
  options.add_options()(
      "model", po::value<std::string>()->required(),
      "llama2.c checkpoint file, Hugging Face model directory, or random:PRESET[@SEED] (random "
      "weights in a model preset's shapes, for --follow-trace timing)")(
      "tokenizer", po::value<std::string>(), "tokenizer file (default: found beside the model)")(
      "policy", po::value<std::string>()->required(),
      "tier policy, e.g. tiered:hbm=0.5,evict=0.1 (kvtier policies list)")(
      "prompt", po::value<std::string>(), "prompt text")("prompt-file", po::value<std::string>(),
                                                         "file holding the prompt")(
      "follow-trace", po::value<std::string>(),
      "trace-driven mode: run this trace's tokens and place them by its attention (no prompt)")(
      "max-new-tokens", po::value<int>()->default_value(128),
      "tokens to generate; with --follow-trace default: the trace's steps")(
      "device", po::value<std::string>()->default_value("cpu"),
      "engine and cache backend: cpu or cuda")(
      "compute-dtype", po::value<std::string>(),
      "--device cuda: the engine's weights, activations and KV cache: bf16 (default), fp16 or "
      "fp32")(
      "cuda-copies", po::value<std::string>(),
      "--device cuda: what moves the tiers' full-precision slots: kernels (default: over mapped "
      "host memory, on the SMs) or copy-engines (batched DMA copies; docs/LIVE.md)")(
      "cuda-lookahead", po::value<int>(),
      "--device cuda: layers the cache stages ahead of the one computing, 0 to 16 (default 1)")(
      "recode-threads", po::value<int>()->default_value(1),
      "host threads recoding T1 <-> T2 tokens between steps, on the step's path; the same bytes "
      "for every count")(
      "t0-budget", po::value<std::string>(),
      "hard limit of the T0 arena, e.g. 2MiB (default: the full cache of prompt + new tokens)")(
      "no-reference", "skip the full-cache run (no divergence figures)")(
      "measure", po::value<std::string>(), "write the measurement file (JSON) here");
  options.add(sampling_options());
  options.add(cpu_engine_options());
  options.add(cuda_engine_options());
  po::variables_map values;
  if (!parse_arguments(
          args, options, {}, values,
          "usage: kvtier live --model PATH [--tokenizer FILE] --policy P\n"
          "                   (--prompt TEXT | --prompt-file FILE | --follow-trace TRACE)\n"
          "                   [--max-new-tokens N]\n"
          "                   [--temperature T --top-p P --seed S]\n"
          "                   [--device cpu [--threads N] |\n"
          "                    --device cuda [--compute-dtype bf16|fp16|fp32]\n"
          "                                  [--cuda-attention split-keys|per-head]\n"
          "                                  [--cuda-gemm cublas|warp-rows]\n"
          "                                  [--cuda-fusion off|on]\n"
          "                                  [--cuda-copies kernels|copy-engines]\n"
          "                                  [--cuda-lookahead N]]\n"
          "                   [--recode-threads N] [--t0-budget BYTES] [--no-reference]\n"
          "                   [--measure FILE]\n\n"
          "Decodes (greedy, or sampled with a seed) with the real tiered KV cache (T0 arena, T1\n"
          "host staged before each layer's attention, T2 8-bit, T3 dropped), placed step by step\n"
          "by the replay's policy, and compares it with the full cache on the same tokens\n"
          "(docs/LIVE.md). All --max-new-tokens steps run, past EOS. With\n"
          "--follow-trace the cache follows the trace's attention (the replay's placement of\n"
          "that trace) and the engine runs the trace's tokens: timing of any model shape.",
          context.out)) {
    return 0;
  }
  const std::string device = values["device"].as<std::string>();
  const kernels::CudaAttention attention = cuda_attention_option(values, device);
  const kernels::CudaGemm gemm = cuda_gemm_option(values, device);
  const kernels::CudaFusion fusion = cuda_fusion_option(values, device);
  const kernels::CacheCopies copies = cuda_copies_option(values, device);
  const kernels::CudaComputeDtype compute_dtype = cuda_compute_dtype_option(values, device);
  const int staging_lookahead = cuda_lookahead_option(values, device);
  const kernels::CpuEngineOptions cpu_options = cpu_engine_option(values, device);
  // Every option's value is checked before the device, so a bad one fails alike with or
  // without a GPU.
  const int recode_threads = thread_count_option(values, "recode-threads");
  kernels::DeviceInfo ran_on = check_engine_device(device);
  const bool follow = values.count("follow-trace") != 0U;
  const int prompt_sources = static_cast<int>(values.count("prompt") != 0U) +
                             static_cast<int>(values.count("prompt-file") != 0U) +
                             static_cast<int>(follow);
  if (prompt_sources != 1) {
    throw ConfigError(
        "give exactly one of --prompt, --prompt-file and --follow-trace (a followed trace "
        "brings its own prompt)");
  }
  if (values.count("measure") != 0U) {
    check_output_file("--measure", values["measure"].as<std::string>(),
                      model_input_paths(values, {"prompt-file", "follow-trace"}));
  }
  kernels::LiveOptions live_options;
  live_options.copies = copies;
  live_options.recode_threads = recode_threads;
  live_options.staging_lookahead = staging_lookahead;
  live_options.max_new_tokens = values["max-new-tokens"].as<int>();
  if (live_options.max_new_tokens < 1) {
    throw ConfigError("--max-new-tokens must be at least 1");
  }
  live_options.sampling = sampling_option(values);
  if (follow && live_options.sampling.temperature != 0.0F) {
    throw ConfigError("--temperature applies to a live run: a followed trace's tokens are forced");
  }
  live_options.policy = replay::parse_policy_string(values["policy"].as<std::string>());
  kernels::check_live_policy(live_options.policy.name());
  if (values.count("t0-budget") != 0U) {
    const double bytes =
        units::convert(values["t0-budget"].as<std::string>(), "B", true, "--t0-budget");
    // 2^62 bytes (4 EiB) is more than any machine holds and converts to an integer exactly.
    if (!(bytes >= 1.0 && bytes <= 0x1p62)) {
      throw ConfigError("--t0-budget must be from one byte to 4 EiB");
    }
    live_options.t0_budget_bytes = static_cast<std::uint64_t>(bytes);
  }
  std::unique_ptr<replay::TraceAttention> trace;
  if (follow) {
    trace = std::make_unique<replay::TraceAttention>(values["follow-trace"].as<std::string>());
    if (values["max-new-tokens"].defaulted()) {
      live_options.max_new_tokens =
          static_cast<int>(std::min<std::uint64_t>(trace->steps(), 1U << 30U));
    }
  }
  const std::string prompt_text = values.count("prompt") != 0U ? values["prompt"].as<std::string>()
                                  : values.count("prompt-file") != 0U
                                      ? read_prompt_file(values["prompt-file"].as<std::string>())
                                      : std::string();

  const std::filesystem::path model_path = values["model"].as<std::string>();
  const auto weights = std::make_shared<const kernels::ModelWeights>(
      load_model_argument(model_path.string(), context));
  // A followed run needs no tokenizer (its tokens are the trace's); one given names its text.
  std::unique_ptr<kernels::Tokenizer> tokenizer;
  if (!follow || values.count("tokenizer") != 0U) {
    const std::filesystem::path tokenizer_path =
        values.count("tokenizer") != 0U
            ? std::filesystem::path(values["tokenizer"].as<std::string>())
            : find_tokenizer(model_path);
    tokenizer = load_model_tokenizer(tokenizer_path, weights->spec);
  }
  RunTokens tokens;
  if (follow) {
    if (static_cast<std::uint64_t>(live_options.max_new_tokens) > trace->steps()) {
      throw ConfigError(trace->name() + " holds " + std::to_string(trace->steps()) +
                        " decode steps; --max-new-tokens " +
                        std::to_string(live_options.max_new_tokens) + " is more");
    }
    tokens = trace_tokens(*trace, weights->spec, live_options.max_new_tokens);
    live_options.follow = trace.get();
    live_options.forced_tokens = tokens.forced;
  } else {
    tokens.prompt = encode_prompt_argument(*tokenizer, prompt_text, values);
  }
  const bool with_reference = values.count("no-reference") == 0U;
  std::unique_ptr<kernels::Engine> engine;
  std::unique_ptr<kernels::Engine> reference;
  if (device == "cuda") {
    kernels::CudaEngineOptions cuda;
    cuda.dtype = compute_dtype;
    // The policy reads each step's head-mean rows right after the decode returns.
    cuda.observer_rows = kernels::ObserverRows::kHeadMean;
    cuda.observer_delivery = kernels::ObserverDelivery::kSynchronous;
    cuda.attention = attention;
    cuda.gemm = gemm;
    cuda.fusion = fusion;
    // The cached engine launches every kernel (graphs do not apply with a device KV store); the
    // reference launches them too, so that a cache that changes nothing changes no logit.
    cuda.graphs = kernels::CudaGraphs::kOff;
    engine = kernels::make_cuda_engine(weights, cuda);
    if (with_reference) {
      reference = kernels::make_cuda_engine(weights, cuda);
    }
  } else {
    engine = kernels::make_cpu_engine(weights, cpu_options);
    if (with_reference) {
      reference = kernels::make_cpu_engine(weights, cpu_options);
    }
  }
  const kernels::LiveResult result =
      kernels::run_live(*engine, reference.get(), tokens.prompt, live_options);

  double decode_seconds = 0.0;
  for (const double seconds : result.step_seconds) {
    decode_seconds += seconds;
  }
  const double tokens_per_s =
      decode_seconds > 0.0 ? static_cast<double>(result.step_seconds.size()) / decode_seconds : 0.0;
  config::LiveMeasurement measurement;
  measurement.set_format_version(1);
  config::MeasurementProvenance& provenance = *measurement.mutable_provenance();
  const kernels::DeviceInfo cpu = device == "cpu" ? ran_on : kernels::host_cpu();
  if (device == "cuda") {
    ran_on.detail +=
        ", " + std::string(kernels::cuda_compute_dtype_name(compute_dtype)) + ", " +
        std::string(kernels::cuda_attention_name(attention)) + " attention, " +
        std::string(kernels::cuda_gemm_name(gemm)) + " gemm, " +
        // Fused kernels replace warp-rows GEMM and split-key kernels only.
        (fusion == kernels::CudaFusion::kOn && (gemm == kernels::CudaGemm::kWarpRows ||
                                                attention == kernels::CudaAttention::kSplitKeys)
             ? "fused kernels, "
             : "") +
        std::string(kernels::cache_copies_name(copies)) + " copies";
  }
  // A cache recoding on one thread, as every run did before the option, names none.
  if (live_options.recode_threads > 1) {
    ran_on.detail += ", " + std::to_string(live_options.recode_threads) + " recode threads";
  }
  if (device == "cuda") {
    measurement.set_staging_lookahead_layers(
        static_cast<std::uint32_t>(live_options.staging_lookahead));
  }
  measurement.set_recode_threads(static_cast<std::uint32_t>(live_options.recode_threads));
  const kernels::RecodePoolShape recode_pool = kernels::recode_pool_shape();
  measurement.set_recode_chunk_token_layers(recode_pool.chunk_token_layers);
  measurement.set_recode_parallel_min_values(recode_pool.parallel_min_values);
  provenance.set_tool(version_line() + " live");
  provenance.set_device(device);
  provenance.set_device_name(ran_on.name);
  provenance.set_device_detail(ran_on.detail);
  provenance.set_cpu_model(cpu.name);
  provenance.set_date_utc(traces::current_utc_time());
  provenance.set_model(weights->spec.name());
  provenance.set_model_path(model_path.string());
  provenance.set_command(command_line("kvtier live", args));
  measurement.set_policy(result.policy);
  *measurement.mutable_sampling() = kernels::sampling_record(live_options.sampling);
  measurement.set_prefetch(result.prefetch == kernels::PrefetchMode::kFull ? "full"
                                                                           : "differential");
  measurement.set_prompt_tokens(result.prompt_tokens);
  measurement.set_new_tokens(result.tokens.size());
  measurement.set_prefill_seconds(result.prefill_seconds);
  measurement.set_decode_seconds(decode_seconds);
  measurement.set_tokens_per_s(tokens_per_s);
  config::LatencyDistribution& latency = *measurement.mutable_step_latency();
  latency.set_count(result.step_seconds.size());
  latency.set_mean_ms(result.step_seconds.empty()
                          ? 0.0
                          : decode_seconds * 1e3 / static_cast<double>(result.step_seconds.size()));
  latency.set_p50_ms(kernels::percentile(result.step_seconds, 0.50) * 1e3);
  latency.set_p90_ms(kernels::percentile(result.step_seconds, 0.90) * 1e3);
  latency.set_p99_ms(kernels::percentile(result.step_seconds, 0.99) * 1e3);
  latency.set_max_ms(kernels::percentile(result.step_seconds, 1.0) * 1e3);
  config::TierBytes& tiers = *measurement.mutable_tiers();
  tiers.set_t0_budget_bytes(result.t0_budget_bytes);
  tiers.set_t0_peak_bytes(result.cache.t0_peak_bytes);
  tiers.set_t1_peak_bytes(result.cache.t1_peak_bytes);
  tiers.set_t2_peak_bytes(result.cache.t2_peak_bytes);
  tiers.set_staging_peak_bytes(result.cache.staging_peak_bytes);
  config::DeviceMemoryFigures& memory = *measurement.mutable_device_memory();
  memory.set_weights_bytes(device == "cuda" ? kernels::cuda_engine_weight_bytes(*engine) : 0);
  memory.set_t0_arena_bytes(result.allocation.t0_arena_bytes);
  memory.set_staging_bytes(result.allocation.staging_bytes);
  memory.set_used_peak_bytes(result.allocation.device_used_peak_bytes);
  for (const std::uint64_t count : result.final_tier_tokens) {
    tiers.add_final_tier_token_layers(count);
  }
  if (follow) {
    measurement.set_follow_trace(
        trace_path_for(values["follow-trace"].as<std::string>(),
                       values.count("measure") != 0U ? values["measure"].as<std::string>() : ""));
  }
  double kept_sum = 0.0;
  for (std::size_t step = 0; step < result.steps.size(); ++step) {
    const kernels::LiveStep& figures = result.steps[step];
    config::StepFigures& out = *measurement.add_steps();
    out.set_latency_ms(result.step_seconds[step] * 1e3);
    out.set_h2d_bytes(figures.h2d_bytes);
    out.set_d2h_bytes(figures.d2h_bytes);
    out.set_h2d_busy_ms(figures.h2d_seconds * 1e3);
    out.set_d2h_busy_ms(figures.d2h_seconds * 1e3);
    for (const std::uint64_t count : figures.tier_token_layers) {
      out.add_tier_token_layers(count);
    }
    out.set_kept_mass(figures.kept_mass);
    kept_sum += figures.kept_mass;
  }
  measurement.set_mean_kept_mass(
      result.steps.empty() ? 0.0 : kept_sum / static_cast<double>(result.steps.size()));
  fill(*measurement.mutable_h2d(), result.cache.h2d());
  fill(*measurement.mutable_h2d_prefetch(), result.cache.h2d_prefetch);
  fill(*measurement.mutable_h2d_compressed(), result.cache.h2d_compressed);
  fill(*measurement.mutable_h2d_promote(), result.cache.h2d_promote);
  fill(*measurement.mutable_d2h(), result.cache.d2h_offload);
  fill(*measurement.mutable_host_recode(), result.cache.host_recode);
  for (const std::int32_t token : result.tokens) {
    measurement.add_generated_tokens(token);
  }
  if (tokenizer != nullptr) {
    measurement.set_generated_text(tokenizer->decode(result.tokens));
  }
  config::Divergence& divergence = *measurement.mutable_divergence();
  divergence.set_measured(result.has_reference);
  divergence.set_greedy_agreement_tokens(result.agreement);
  divergence.set_mean_kl_nats(result.mean_kl);
  divergence.set_max_kl_nats(result.max_kl);
  divergence.set_identical_logit_steps(result.identical_logit_steps);

  if (values.count("measure") != 0U) {
    // The prompt, file names and generated text (a byte-level tokenizer can stop mid-character).
    config::make_strings_valid_utf8(measurement);
    std::string json;
    google::protobuf::util::JsonPrintOptions print;
    print.add_whitespace = true;
    print.always_print_primitive_fields = true;
    print.preserve_proto_field_names = true;
    const auto status = google::protobuf::util::MessageToJsonString(measurement, &json, print);
    if (!status.ok()) {
      throw Error("cannot print the measurement: " + std::string(status.message()), "",
                  ExitCode::kRuntimeFailure);
    }
    write_file_atomically(values["measure"].as<std::string>(), json);
  }

  context.out << "policy    " << result.policy << "\n"
              << "model     " << weights->spec.name() << ", prompt " << result.prompt_tokens
              << " tokens, " << result.tokens.size() << " new tokens\n";
  if (follow) {
    context.out << "followed  " << values["follow-trace"].as<std::string>()
                << " (its tokens and attention; mean kept mass "
                << format_fixed(measurement.mean_kept_mass(), 4) << ")\n";
    if (tokens.folded > 0) {
      context.out << "note      " << tokens.folded
                  << " of the trace's tokens are outside the model's vocabulary of "
                  << weights->spec.vocab_size() << " and were taken modulo it\n";
    }
  }
  TextTable table({"metric", "value"}, {false, true});
  table.add_row({"tokens/s", format_fixed(tokens_per_s, 1)});
  table.add_row({"step p50 / p90 / p99 ms", format_fixed(latency.p50_ms(), 3) + " / " +
                                                format_fixed(latency.p90_ms(), 3) + " / " +
                                                format_fixed(latency.p99_ms(), 3)});
  table.add_row({"T0 peak / budget", bytes_text(result.cache.t0_peak_bytes) + " / " +
                                         bytes_text(result.t0_budget_bytes)});
  table.add_row({"T1 peak", bytes_text(result.cache.t1_peak_bytes)});
  table.add_row({"T2 peak", bytes_text(result.cache.t2_peak_bytes)});
  table.add_row({"H2D", bytes_text(result.cache.h2d().bytes) + " in " +
                            format_fixed(result.cache.h2d().seconds * 1e3, 3) + " ms"});
  table.add_row({"D2H", bytes_text(result.cache.d2h_offload.bytes) + " in " +
                            format_fixed(result.cache.d2h_offload.seconds * 1e3, 3) + " ms"});
  table.add_row({"evicted token-layers", std::to_string(result.final_tier_tokens[3])});
  if (result.has_reference) {
    table.add_row(
        {live_options.sampling.temperature == 0.0F ? "greedy agreement" : "agreement",
         std::to_string(result.agreement) + " / " + std::to_string(result.tokens.size())});
    table.add_row({"mean KL (nats)", format_double(result.mean_kl)});
  }
  table.render(context.out);
  if (values.count("measure") != 0U) {
    context.out << "measurement written to " << values["measure"].as<std::string>() << "\n";
  }
  return 0;
}

}  // namespace kvtier::app
