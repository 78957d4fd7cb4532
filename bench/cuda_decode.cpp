// Decoding speed of the CUDA engine at batch 1 against the memory roofline, and what tracing
// attention costs it (docs/ENGINE.md, "The CUDA engine"; scripts/gpu-validate.sh runs it).
//
//   kvtier_bench_cuda_decode [PROMPT] [STEPS] [REPEATS] [OUT_DIR] [LAYERS] [DEVICE]
//
// The model is Llama-2-7B shaped (hidden 4096, 32 layers, 32 heads, MHA, intermediate 11008,
// vocabulary 32000, untied head; LAYERS changes the layer count) with seeded random weights
// (uniform, standard deviation 0.02, norm gains 1), run in BF16. To keep host memory and set-up
// short, every layer is built from the same host tensors; the engine uploads each layer to a
// buffer of its own, so the device reads 13.5 GB of distinct weights per token as a real 7B.
//
// Measured, each REPEATS times (medians reported), over the same forward passes (a prefill of
// PROMPT random tokens, then STEPS greedy decode steps):
// - plain: generate() with no observer; decode tokens/s from a separate timing of the decode
//   steps alone;
// - null observer: an observer that does nothing, attached (asynchronous delivery of per-head
//   rows): the cost of the device-to-host copies and the delivery thread alone;
// - traced mean: capture_trace writing mean rows (FP16) to OUT_DIR, the engine reducing head
//   means on the device (what `kvtier trace capture --device cuda` does for mean traces);
// - traced mean, per-head copies: the same trace with every head's rows copied to the host;
//   (plain steps replay decode graphs, the default, while observed steps launch every kernel:
//   the tracing overheads include what the graphs save);
// - alternatives: the decode steps alone again on engines that differ from the default in one
//   kernel, timed right after the default engine's in every repeat so that load affects all
//   alike: `per_head_*` with the per-head attention kernel (CudaAttention::kPerHead),
//   `cublas_*` with cuBLAS for every GEMM (CudaGemm::kCublas), `launched_*` with every decode
//   step launched kernel by kernel (CudaGraphs::kOff), `cublas_launched_*` with both (the
//   default engine before 2026-11-30), and three that change no result: `fused_*` with
//   CudaFusion::kOn, `early_*` with CudaEarlyLaunch::kProgrammatic and `fused_early_*` with
//   both; for each, how many greedy tokens it decodes as the default engine before they first
//   differ (BF16 rounding may flip a near tie of random weights' flat logits; a difference from
//   the first step would point at a bug, and any for the last three). Every other figure is
//   the default engine's (its kernels named by `attention`, `gemm`, `graphs`, `fusion` and
//   `early_launch`). Nine engines hold the 7B's weights at once (about 122 GB): on a smaller GPU
//   the last alternatives report `*_error` (cudaMalloc).
// The roofline is tokens/s = bandwidth / (weight bytes + mean KV bytes read per step), for the
// HBM's peak bandwidth (from the device's memory clock and bus width) and for the bandwidth a
// large device-to-device copy reaches. Prints one JSON line.

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "bench/median.hpp"
#include "common/errors.hpp"
#include "common/text_output.hpp"
#include "kernels/cuda_engine.hpp"
#include "kernels/engine.hpp"
#include "kernels/generate.hpp"
#include "kernels/random_model.hpp"
#include "kernels/sampler.hpp"
#include "kernels/tracer.hpp"

namespace {

namespace kk = kvtier::kernels;
using Clock = std::chrono::steady_clock;

constexpr std::int64_t kHidden = 4096;
constexpr std::int64_t kHeads = 32;
constexpr std::int64_t kHeadDim = 128;
constexpr std::int64_t kIntermediate = 11008;
constexpr std::int64_t kVocab = 32000;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

using kvtier::bench::median;

// JSON has no infinities or NaN: a figure that could not be measured (a device reporting no
// memory clock gives no peak bandwidth) is null.
std::string json_number(double value) {
  return kvtier::json_number_or_null(value);
}

std::string json_list(const std::vector<double>& values) {
  std::ostringstream out;
  out << "[";
  for (std::size_t i = 0; i < values.size(); ++i) {
    out << (i == 0 ? "" : ",") << json_number(values[i]);
  }
  out << "]";
  return out.str();
}

void check(cudaError_t status, const char* call) {
  if (status != cudaSuccess) {
    throw kvtier::Error(std::string(call) + " failed: " + cudaGetErrorString(status), "bench",
                        kvtier::ExitCode::kRuntimeFailure);
  }
}

std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30U)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27U)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31U);
}

kk::ModelWeights random_7b(int layers) {
  kvtier::config::ModelSpec spec;
  spec.set_name("random-llama-7B-shape");
  spec.set_architecture(kvtier::config::LLAMA);
  spec.set_num_hidden_layers(static_cast<std::uint32_t>(layers));
  spec.set_hidden_size(kHidden);
  spec.set_num_attention_heads(kHeads);
  spec.set_num_key_value_heads(kHeads);
  spec.set_head_dim(kHeadDim);
  spec.set_intermediate_size(kIntermediate);
  spec.set_vocab_size(kVocab);
  spec.set_tie_word_embeddings(false);
  spec.set_attention_bias(false);
  spec.set_qk_norm(false);
  spec.set_max_position_embeddings(4096);
  spec.set_rope_theta(10000.0);
  spec.set_rms_norm_eps(1e-5);
  spec.set_weight_dtype(kvtier::config::BF16);
  spec.set_activation_dtype(kvtier::config::BF16);
  spec.set_kv_dtype(kvtier::config::BF16);
  return kk::random_model(spec);
}

class NullObserver final : public kk::ForwardObserver {
 public:
  void on_attention(const kk::AttentionStep& step) override { static_cast<void>(step); }
};

// The bandwidth a large device-to-device copy reaches (bytes read + written per second).
double copy_bandwidth(int device) {
  check(cudaSetDevice(device), "cudaSetDevice");
  const std::size_t bytes = std::size_t{2} << 30U;
  void* source = nullptr;
  void* target = nullptr;
  check(cudaMalloc(&source, bytes), "cudaMalloc");
  check(cudaMalloc(&target, bytes), "cudaMalloc");
  cudaEvent_t start = nullptr;
  cudaEvent_t stop = nullptr;
  check(cudaEventCreate(&start), "cudaEventCreate");
  check(cudaEventCreate(&stop), "cudaEventCreate");
  check(cudaMemset(source, 1, bytes), "cudaMemset");
  float best_ms = 1e30F;
  for (int i = 0; i < 6; ++i) {
    check(cudaEventRecord(start), "cudaEventRecord");
    check(cudaMemcpy(target, source, bytes, cudaMemcpyDeviceToDevice), "cudaMemcpy");
    check(cudaEventRecord(stop), "cudaEventRecord");
    check(cudaEventSynchronize(stop), "cudaEventSynchronize");
    float ms = 0.0F;
    check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
    if (i > 0) {  // the first copy warms up
      best_ms = std::min(best_ms, ms);
    }
  }
  static_cast<void>(cudaEventDestroy(start));
  static_cast<void>(cudaEventDestroy(stop));
  static_cast<void>(cudaFree(source));
  static_cast<void>(cudaFree(target));
  return 2.0 * static_cast<double>(bytes) / (static_cast<double>(best_ms) * 1e-3);
}

}  // namespace

int main(int argc, char** argv) {
  const int prompt_tokens = argc > 1 ? std::atoi(argv[1]) : 512;
  const int steps = argc > 2 ? std::atoi(argv[2]) : 256;
  const int repeats = argc > 3 ? std::atoi(argv[3]) : 3;
  const std::filesystem::path out_dir = argc > 4 ? argv[4] : "/tmp";
  const int layers = argc > 5 ? std::atoi(argv[5]) : 32;
  const int device = argc > 6 ? std::atoi(argv[6]) : 0;
  if (prompt_tokens < 1 || steps < 1 || repeats < 1 || layers < 1 || prompt_tokens + steps > 4096) {
    std::cerr << "usage: kvtier_bench_cuda_decode [PROMPT] [STEPS] [REPEATS] [OUT_DIR] [LAYERS] "
                 "[DEVICE]  (PROMPT + STEPS <= 4096)\n";
    return 2;
  }
  try {
    cudaDeviceProp properties{};
    check(cudaGetDeviceProperties(&properties, device), "cudaGetDeviceProperties");
    int memory_clock_khz = 0;
    check(cudaDeviceGetAttribute(&memory_clock_khz, cudaDevAttrMemoryClockRate, device),
          "cudaDeviceGetAttribute");
    const double peak_bandwidth = 2.0 * memory_clock_khz * 1e3 * properties.memoryBusWidth / 8.0;
    const double copy_rate = copy_bandwidth(device);

    auto start = Clock::now();
    const auto weights = std::make_shared<const kk::ModelWeights>(random_7b(layers));
    const double build_seconds = seconds_since(start);
    // The default engine's options but for `options`' kernels and graphs.
    const auto engine_with = [&](kk::ObserverRows rows, kk::CudaEngineOptions options = {}) {
      options.device = device;
      options.dtype = kk::CudaComputeDtype::kBF16;
      options.observer_rows = rows;
      return kk::make_cuda_engine(weights, options);
    };
    start = Clock::now();
    const auto engine = engine_with(kk::ObserverRows::kPerHead);
    const double upload_seconds = seconds_since(start);

    // Weight bytes every decode step reads (BF16): the layers and the LM head; KV bytes: keys
    // and values of every earlier position, on average over the decode steps.
    const double layer_bytes =
        2.0 * static_cast<double>(4 * kHidden * kHidden + 3 * kIntermediate * kHidden);
    const double weight_bytes = layer_bytes * layers + 2.0 * static_cast<double>(kVocab * kHidden);
    const double mean_positions = prompt_tokens + (steps - 1) / 2.0 + 1.0;
    const double kv_bytes = 2.0 * 2.0 * static_cast<double>(kHidden) * layers * mean_positions;

    std::vector<std::int32_t> prompt(static_cast<std::size_t>(prompt_tokens));
    for (std::size_t i = 0; i < prompt.size(); ++i) {
      prompt[i] = static_cast<std::int32_t>(splitmix64(i) % kVocab);
    }
    // Plain runs make the same forward passes as a capture of `steps` decode steps: generate()
    // samples steps + 1 tokens and runs all but the last.
    kk::GenerationOptions plain;
    plain.max_new_tokens = steps + 1;
    kk::CaptureOptions traced;
    traced.generation.max_new_tokens = steps;
    traced.tool = "kvtier_bench_cuda_decode";
    const std::filesystem::path file = out_dir / "kvtier_bench_cuda_decode.h5";
    const auto mean_engine = engine_with(kk::ObserverRows::kHeadMean);
    // The decode steps alone on engines that differ from the default in one kernel each.
    struct Alternative {
      std::string name;  // the prefix of its JSON fields
      std::unique_ptr<kk::Engine> engine;
      std::vector<double> seconds;
      // Greedy tokens decoded as the default engine did before the first difference, fewest over
      // the repeats.
      int agreement = 0;
      // Why it stopped (an error of its engine), reported instead of its figures so that the
      // others' are not lost.
      std::string failure;
    };
    std::vector<Alternative> alternatives;
    const auto add_alternative = [&](const std::string& name,
                                     const kk::CudaEngineOptions& options) {
      Alternative& alternative = alternatives.emplace_back();
      alternative.name = name;
      alternative.agreement = steps;
      try {
        alternative.engine = engine_with(kk::ObserverRows::kPerHead, options);
      } catch (const std::exception& error) {
        alternative.failure = error.what();
      }
    };
    using Options = kk::CudaEngineOptions;
    const std::vector<std::pair<std::string, Options>> changes = {
        {"per_head", Options{.attention = kk::CudaAttention::kPerHead}},
        {"cublas", Options{.gemm = kk::CudaGemm::kCublas}},
        {"launched", Options{.graphs = kk::CudaGraphs::kOff}},
        {"cublas_launched", Options{.gemm = kk::CudaGemm::kCublas, .graphs = kk::CudaGraphs::kOff}},
        {"fused", Options{.fusion = kk::CudaFusion::kOn}},
        {"early", Options{.early_launch = kk::CudaEarlyLaunch::kProgrammatic}},
        {"fused_early", Options{.fusion = kk::CudaFusion::kOn,
                                .early_launch = kk::CudaEarlyLaunch::kProgrammatic}}};
    for (const auto& [name, options] : changes) {
      add_alternative(name, options);
    }
    // Prefills, then times `steps` greedy decode steps; the tokens go to `decoded`.
    const auto decode_alone = [&](kk::Engine& on, std::vector<std::int32_t>& decoded) {
      on.reset();
      on.reserve(prompt_tokens + steps);
      std::span<const float> logits = on.prefill(prompt);
      decoded.clear();
      const auto begin = Clock::now();
      for (int step = 0; step < steps; ++step) {
        decoded.push_back(kk::argmax(logits));
        logits = on.decode(decoded.back());
      }
      return seconds_since(begin);
    };

    std::vector<double> prefill_seconds;
    std::vector<double> decode_seconds;
    std::vector<double> plain_seconds;
    std::vector<double> null_seconds;
    std::vector<double> traced_mean_seconds;
    std::vector<double> traced_heads_seconds;
    std::uintmax_t trace_bytes = 0;
    NullObserver null_observer;
    for (int repeat = 0; repeat < repeats; ++repeat) {
      // Decode alone: prefill, then time the greedy decode steps.
      engine->reset();
      engine->reserve(prompt_tokens + steps);
      start = Clock::now();
      std::span<const float> logits = engine->prefill(prompt);
      prefill_seconds.push_back(seconds_since(start));
      std::vector<std::int32_t> decoded;
      start = Clock::now();
      for (int step = 0; step < steps; ++step) {
        decoded.push_back(kk::argmax(logits));
        logits = engine->decode(decoded.back());
      }
      decode_seconds.push_back(seconds_since(start));

      std::vector<std::int32_t> other;
      for (Alternative& alternative : alternatives) {
        if (!alternative.failure.empty()) {
          continue;
        }
        try {
          alternative.seconds.push_back(decode_alone(*alternative.engine, other));
        } catch (const std::exception& error) {
          alternative.failure = error.what();
          continue;
        }
        const auto differ = std::mismatch(decoded.begin(), decoded.end(), other.begin()).first;
        alternative.agreement =
            std::min(alternative.agreement, static_cast<int>(differ - decoded.begin()));
      }

      start = Clock::now();
      const kk::GenerationResult result = kk::generate(*engine, prompt, plain);
      plain_seconds.push_back(seconds_since(start));

      engine->set_observer(&null_observer);
      start = Clock::now();
      static_cast<void>(kk::generate(*engine, prompt, plain));
      engine->set_observer(nullptr);  // waits for the last deliveries
      null_seconds.push_back(seconds_since(start));

      start = Clock::now();
      const kk::CaptureResult mean = kk::capture_trace(*mean_engine, prompt, traced, file);
      traced_mean_seconds.push_back(seconds_since(start));
      trace_bytes = std::filesystem::file_size(file);
      std::filesystem::remove(file);

      start = Clock::now();
      static_cast<void>(kk::capture_trace(*engine, prompt, traced, file));
      traced_heads_seconds.push_back(seconds_since(start));
      std::filesystem::remove(file);
      if (!std::equal(mean.generation.tokens.begin(), mean.generation.tokens.end(),
                      result.tokens.begin())) {
        std::cerr << "warning: the traced run decoded other tokens than the plain one\n";
      }
    }

    const double decode_rate = steps / median(decode_seconds);
    const double roofline_peak = peak_bandwidth / (weight_bytes + kv_bytes);
    const double roofline_copy = copy_rate / (weight_bytes + kv_bytes);
    const double plain_median = median(plain_seconds);
    std::ostringstream alternative_fields;
    for (const Alternative& alternative : alternatives) {
      const std::string& name = alternative.name;
      if (!alternative.failure.empty()) {
        alternative_fields << ",\"" << name
                           << "_error\":" << kvtier::json_escape(alternative.failure);
        continue;
      }
      const double rate = steps / median(alternative.seconds);
      alternative_fields << ",\"" << name << "_decode_s\":" << json_list(alternative.seconds)
                         << ",\"" << name << "_decode_tokens_per_s\":" << json_number(rate) << ",\""
                         << name
                         << "_fraction_of_peak_roofline\":" << json_number(rate / roofline_peak)
                         << ",\"" << name
                         << "_fraction_of_copy_roofline\":" << json_number(rate / roofline_copy)
                         << ",\"" << name << "_agreement_tokens\":" << alternative.agreement;
      if (kk::cuda_engine_options(*alternative.engine).graphs == kk::CudaGraphs::kDecode) {
        // Whether its steps did replay graphs, and how often they were captured.
        const kk::CudaGraphCounts counts = kk::cuda_engine_graph_counts(*alternative.engine);
        alternative_fields << ",\"" << name << "_graph_captures\":" << counts.captures << ",\""
                           << name << "_graph_replays\":" << counts.replays;
      }
    }
    std::cout << "{\"bench\":\"cuda_decode\",\"model\":\"" << weights->spec.name()
              << "\",\"layers\":" << layers << ",\"dtype\":\"bf16\",\"attention\":\""
              << kk::cuda_attention_name(kk::CudaEngineOptions{}.attention) << "\",\"gemm\":\""
              << kk::cuda_gemm_name(kk::CudaEngineOptions{}.gemm) << "\",\"graphs\":\""
              << kk::cuda_graphs_name(kk::CudaEngineOptions{}.graphs) << "\",\"fusion\":\""
              << kk::cuda_fusion_name(kk::CudaEngineOptions{}.fusion) << "\",\"early_launch\":\""
              << kk::cuda_early_launch_name(kk::CudaEngineOptions{}.early_launch)
              << "\",\"device\":\"" << properties.name << "\",\"prompt_tokens\":" << prompt_tokens
              << ",\"steps\":" << steps << ",\"repeats\":" << repeats
              << ",\"weight_bytes\":" << weight_bytes << ",\"mean_kv_bytes_per_step\":" << kv_bytes
              << ",\"hbm_peak_bytes_per_s\":" << json_number(peak_bandwidth)
              << ",\"copy_bytes_per_s\":" << copy_rate << ",\"build_s\":" << build_seconds
              << ",\"upload_s\":" << upload_seconds
              << ",\"prefill_s\":" << json_list(prefill_seconds) << ",\"prefill_tokens_per_s\":"
              << json_number(prompt_tokens / median(prefill_seconds))
              << ",\"decode_s\":" << json_list(decode_seconds)
              << ",\"decode_tokens_per_s\":" << json_number(decode_rate)
              << ",\"roofline_tokens_per_s_peak\":" << json_number(roofline_peak)
              << ",\"roofline_tokens_per_s_copy\":" << json_number(roofline_copy)
              << ",\"fraction_of_peak_roofline\":" << json_number(decode_rate / roofline_peak)
              << ",\"fraction_of_copy_roofline\":" << json_number(decode_rate / roofline_copy)
              << alternative_fields.str() << ",\"plain_s\":" << json_list(plain_seconds)
              << ",\"null_observer_s\":" << json_list(null_seconds)
              << ",\"traced_mean_s\":" << json_list(traced_mean_seconds)
              << ",\"traced_mean_per_head_copies_s\":" << json_list(traced_heads_seconds)
              << ",\"trace_bytes\":" << trace_bytes << ",\"overhead_null_observer\":"
              << json_number(median(null_seconds) / plain_median - 1.0)
              << ",\"overhead_traced_mean\":"
              << json_number(median(traced_mean_seconds) / plain_median - 1.0)
              << ",\"overhead_traced_mean_per_head_copies\":"
              << json_number(median(traced_heads_seconds) / plain_median - 1.0) << "}\n";
  } catch (const kvtier::Error& error) {
    for (const std::string& line : error.lines()) {
      std::cerr << line << "\n";
    }
    return static_cast<int>(error.exit_code());
  }
  return 0;
}
