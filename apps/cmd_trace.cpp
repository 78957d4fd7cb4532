// `kvtier trace info|validate|synth|convert|capture` (and `meta`, apps/cmd_trace_meta.cpp):
// attention traces (docs/TRACE_FORMAT.md).

#include <unistd.h>

#include <charconv>
#include <chrono>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <iterator>
#include <optional>
#include <sstream>

#include "apps/cli.hpp"
#include "apps/trace_report.hpp"
#include "common/errors.hpp"
#include "common/text_output.hpp"
#include "configs/locations.hpp"
#include "configs/schema/model.pb.h"
#include "kernels/cuda_engine.hpp"
#include "kernels/hf_checkpoint.hpp"
#include "kernels/tokenizer.hpp"
#include "kernels/tracer.hpp"
#include "traces/convert.hpp"
#include "traces/describe.hpp"
#include "traces/synth.hpp"
#include "traces/validate.hpp"

namespace kvtier::app {
namespace {

// --dtype of trace synth, capture and meta: the stored attention weights' type.
config::DType trace_dtype(const boost::program_options::variables_map& values) {
  const std::string dtype = values["dtype"].as<std::string>();
  if (dtype != "fp16" && dtype != "fp32") {
    throw ConfigError("--dtype must be fp16 or fp32");
  }
  return dtype == "fp16" ? config::FP16 : config::FP32;
}

namespace po = boost::program_options;

void add_writer_options(po::options_description& options) {
  options.add_options()("deflate", po::value<int>()->default_value(1),
                        "zlib level of the attention datasets, 1..9 (0: uncompressed)")(
      "chunk-elements", po::value<std::uint32_t>()->default_value(1U << 16),
      "elements per chunk of the attention datasets");
}

traces::WriterOptions writer_options(const po::variables_map& values, const std::string& tool) {
  traces::WriterOptions options;
  options.deflate_level = values["deflate"].as<int>();
  options.chunk_elements = values["chunk-elements"].as<std::uint32_t>();
  if (options.deflate_level < 0 || options.deflate_level > 9) {
    throw ConfigError("--deflate must be 0..9");
  }
  if (options.chunk_elements == 0) {
    throw ConfigError("--chunk-elements must be at least 1");
  }
  options.producer = version_line() + " " + tool;
  return options;
}

// "0,15,31": layer indices; ConfigError naming the option for anything else.
std::vector<std::uint32_t> parse_layer_list(const std::string& text, const char* option) {
  std::vector<std::uint32_t> layers;
  std::size_t begin = 0;
  while (begin <= text.size()) {
    const std::size_t end = std::min(text.find(',', begin), text.size());
    std::uint32_t layer = 0;
    const auto parsed = std::from_chars(text.data() + begin, text.data() + end, layer);
    if (end == begin || parsed.ec != std::errc() || parsed.ptr != text.data() + end) {
      throw ConfigError(std::string(option) + " takes layer numbers separated by commas, got '" +
                        text + "'");
    }
    layers.push_back(layer);
    begin = end + 1;
  }
  return layers;
}

// "A:B" is the half-open range [A, B); "A" alone is [A, A + 1).
std::pair<std::uint32_t, std::uint32_t> parse_range(const std::string& text, const char* option) {
  const auto colon = text.find(':');
  const std::string first_text = text.substr(0, colon);
  const std::string end_text = colon == std::string::npos ? std::string() : text.substr(colon + 1);
  std::uint32_t first = 0;
  std::uint32_t end = 0;
  auto parse = [&](const std::string& part, std::uint32_t& value) {
    const auto result = std::from_chars(part.data(), part.data() + part.size(), value);
    return !part.empty() && result.ec == std::errc() && result.ptr == part.data() + part.size();
  };
  const bool ok = parse(first_text, first) &&
                  (colon == std::string::npos ? (end = first + 1, true) : parse(end_text, end));
  if (!ok || end <= first) {
    throw ConfigError(std::string("--") + option +
                      " takes A:B (first, one past last) or A (that one alone), got '" + text +
                      "'");
  }
  return {first, end};
}

int info(const Arguments& args, Context& context) {
  po::options_description options("trace info options");
  options.add_options()("file", po::value<std::string>()->required(), "trace file")(
      "sample-steps", po::value<std::uint32_t>()->default_value(1024),
      "steps the statistics read, evenly spread (0: all)")(
      "sink-tokens", po::value<std::uint32_t>()->default_value(4), "positions counted as sinks")(
      "threshold", po::value<double>()->default_value(0.01),
      "weights at least this heavy enter the reach histogram")(
      "map-layers", po::value<std::string>(),
      "html: layers to draw attention maps of, e.g. 0,15,31 (default: the first, middle and "
      "last)");
  add_format_option(options, true);
  po::positional_options_description positional;
  positional.add("file", 1);
  po::variables_map values;
  if (!parse_arguments(args, options, positional, values,
                       "usage: kvtier trace info FILE [--sample-steps N] [--sink-tokens N] "
                       "[--threshold W] [--format text|json|html [--map-layers L,...]]\n\n"
                       "What a trace holds and per-layer attention statistics: sink mass, mass "
                       "within the last 128 tokens, far mass, entropy, recency decay and how far "
                       "back attention reaches. --format html also draws them, and maps where "
                       "chosen layers' attention goes, step by step.",
                       context.out)) {
    return 0;
  }
  const Format format = format_from(values, true);
  if (values.count("map-layers") != 0U && format != Format::kHtml) {
    throw ConfigError("--map-layers chooses the attention maps of --format html");
  }
  const traces::TraceReader reader(values["file"].as<std::string>());
  traces::StatsOptions stats_options;
  stats_options.sample_steps = values["sample-steps"].as<std::uint32_t>();
  stats_options.sink_tokens = values["sink-tokens"].as<std::uint32_t>();
  stats_options.reach_threshold = values["threshold"].as<double>();
  if (!(stats_options.reach_threshold > 0.0 && stats_options.reach_threshold <= 1.0)) {
    throw ConfigError("--threshold " + format_double(stats_options.reach_threshold) +
                      ": an attention weight, above 0 and at most 1");
  }
  const traces::TraceStats stats = traces::compute_stats(reader, stats_options);
  const traces::TraceSummary summary = traces::summarize(reader);
  if (format == Format::kHtml) {
    const traces::LayerRange layers = reader.shape().layers;
    const std::vector<std::uint32_t> chosen =
        values.count("map-layers") != 0U
            ? parse_layer_list(values["map-layers"].as<std::string>(), "--map-layers")
            : std::vector<std::uint32_t>{layers.first, layers.first + layers.count / 2,
                                         layers.end() - 1};
    std::vector<traces::AttentionMap> maps;
    for (const std::uint32_t layer : chosen) {
      if (std::none_of(maps.begin(), maps.end(),
                       [layer](const traces::AttentionMap& map) { return map.layer == layer; })) {
        maps.push_back(traces::attention_map(reader, layer));
      }
    }
    context.out << trace_html(reader, summary, stats, stats_options, maps, version_line());
    return 0;
  }
  context.out << (format == Format::kJson
                      ? traces::describe_json(reader, summary, stats, stats_options)
                      : traces::describe_text(reader, summary, stats, stats_options));
  return 0;
}

int validate(const Arguments& args, Context& context) {
  po::options_description options("trace validate options");
  options.add_options()("file", po::value<std::string>()->required(), "trace file");
  po::positional_options_description positional;
  positional.add("file", 1);
  po::variables_map values;
  if (!parse_arguments(args, options, positional, values,
                       "usage: kvtier trace validate FILE\n\nChecks every dataset against /meta "
                       "and every row: a probability distribution, no NaN or infinity, tokens in "
                       "the vocabulary. Prints each problem with its place; exit 3 when invalid.",
                       context.out)) {
    return 0;
  }
  const std::string file = values["file"].as<std::string>();
  const traces::ValidationReport report = traces::validate_trace(file);
  if (!report.valid()) {
    throw traces::InvalidTrace(report);
  }
  context.out << file << ": valid (" << report.rows_checked << " rows checked)\n";
  return 0;
}

int synth(const Arguments& args, Context& context) {
  po::options_description options("trace synth options");
  options.add_options()("model", po::value<std::string>()->required(), "model preset name")(
      "prompt-tokens", po::value<std::uint32_t>()->required(), "prompt length")(
      "steps", po::value<std::uint32_t>()->required(), "decode steps")(
      "pattern", po::value<std::string>()->default_value("reasoning"),
      "reasoning, chat or retrieval")("seed", po::value<std::uint64_t>()->default_value(1),
                                      "random seed")("out", po::value<std::string>()->required(),
                                                     "output trace file")(
      "top-k", po::value<std::uint32_t>()->default_value(0), "also write top-k rows of K entries")(
      "no-mean", "write no dense mean rows (needs --top-k; reaches 32k+ steps cheaply)")(
      "heads", "also write per-head rows")(
      "prefill-window", po::value<std::uint32_t>()->default_value(0),
      "also write the attention of the last W prompt queries")("key-norms", "also write key norms")(
      "dtype", po::value<std::string>()->default_value("fp16"), "attention storage: fp16 or fp32")(
      "set", po::value<std::vector<std::string>>()->composing(),
      "override a generator parameter, e.g. recency_decay_tokens=20 (docs/TRACE_FORMAT.md)");
  add_writer_options(options);
  po::variables_map values;
  if (!parse_arguments(args, options, {}, values,
                       "usage: kvtier trace synth --model NAME --prompt-tokens P --steps N "
                       "[--pattern reasoning|chat|retrieval] [--seed S] --out FILE [--top-k K "
                       "[--no-mean]] [--heads] [--prefill-window W] [--key-norms] "
                       "[--dtype fp16|fp32] [--deflate L] [--chunk-elements N] "
                       "[--set PARAM=VALUE]...\n\nWrites a seeded "
                       "synthetic attention trace: sinks, a decaying recency band, Zipf heavy "
                       "hitters and (reasoning) notes re-read in bursts hundreds of steps later.",
                       context.out)) {
    return 0;
  }
  check_output_file("--out", values["out"].as<std::string>());
  traces::SynthOptions synth;
  const std::string model_name = values["model"].as<std::string>();
  const config::PresetFile* preset = context.presets.find("model", model_name);
  if (preset == nullptr) {
    throw ConfigError(context.presets.unknown_message("model", model_name));
  }
  (void)context.loader.load_preset(*preset, synth.model, {});
  synth.prompt_tokens = values["prompt-tokens"].as<std::uint32_t>();
  synth.steps = values["steps"].as<std::uint32_t>();
  if (synth.prompt_tokens == 0 || synth.steps == 0) {
    throw ConfigError("--prompt-tokens and --steps must be at least 1");
  }
  synth.params = traces::synthetic_preset(values["pattern"].as<std::string>(),
                                          values["seed"].as<std::uint64_t>());
  config::LocationMap locations("--set");
  for (const auto& override_ : overrides_from(values)) {
    config::apply_override(synth.params, override_, locations);
  }
  synth.top_k = values["top-k"].as<std::uint32_t>();
  synth.mean = values.count("no-mean") == 0U;
  if (!synth.mean && synth.top_k == 0) {
    throw ConfigError("--no-mean needs --top-k: a trace needs mean or top-k rows");
  }
  synth.heads = values.count("heads") != 0U;
  synth.prefill_window = values["prefill-window"].as<std::uint32_t>();
  // Usage errors, not a /meta the writer refuses: a window is some of the prompt's queries.
  if (synth.prefill_window > synth.prompt_tokens) {
    throw ConfigError("--prefill-window " + std::to_string(synth.prefill_window) +
                      " is longer than the prompt (" + std::to_string(synth.prompt_tokens) +
                      " tokens)");
  }
  if (synth.top_k > traces::kMaxTopK) {
    throw ConfigError("--top-k " + std::to_string(synth.top_k) + " is more than " +
                      std::to_string(traces::kMaxTopK));
  }
  synth.key_norms = values.count("key-norms") != 0U;
  synth.dtype = trace_dtype(values);
  synth.writer = writer_options(values, "trace synth");
  synth.description = command_line("kvtier trace synth", args, {"--out"});
  const std::string out = values["out"].as<std::string>();
  traces::write_synthetic_trace(out, synth);
  context.out << "wrote " << out << "\n";
  return 0;
}

int convert(const Arguments& args, Context& context) {
  po::options_description options("trace convert options");
  options.add_options()("file", po::value<std::string>()->required(), "input trace")(
      "out", po::value<std::string>()->required(), "output trace")(
      "to-mean", "average the per-head rows into mean rows (per-head rows dropped)")(
      "top-k", po::value<std::uint32_t>()->default_value(0),
      "compute top-k rows of K entries from the dense rows")(
      "drop-dense", "with --top-k: keep only the top-k rows")(
      "steps", po::value<std::string>(), "keep steps A:B (A becomes step 0; A alone: step A)")(
      "layers", po::value<std::string>(), "keep model layers A:B (A alone: layer A)");
  add_writer_options(options);
  po::positional_options_description positional;
  positional.add("file", 1);
  po::variables_map values;
  if (!parse_arguments(args, options, positional, values,
                       "usage: kvtier trace convert FILE --out OUT [--to-mean] [--top-k K "
                       "[--drop-dense]] [--steps A:B] [--layers A:B] [--deflate L] "
                       "[--chunk-elements N]\n\nPer-head "
                       "to mean, dense to top-k, slices and recompression, streamed.",
                       context.out)) {
    return 0;
  }
  check_output_file("--out", values["out"].as<std::string>(), {values["file"].as<std::string>()});
  traces::ConvertOptions convert_options;
  convert_options.heads_to_mean = values.count("to-mean") != 0U;
  convert_options.top_k = values["top-k"].as<std::uint32_t>();
  convert_options.drop_dense = values.count("drop-dense") != 0U;
  if (convert_options.drop_dense && convert_options.top_k == 0) {
    throw ConfigError("--drop-dense needs --top-k");
  }
  if (values.count("steps") != 0U) {
    const auto [first, end] = parse_range(values["steps"].as<std::string>(), "steps");
    convert_options.steps = traces::StepRange{first, end - first};
  }
  if (values.count("layers") != 0U) {
    const auto [first, end] = parse_range(values["layers"].as<std::string>(), "layers");
    convert_options.layers = traces::LayerRange{first, end - first};
  }
  convert_options.writer = writer_options(values, "trace convert");
  const std::string out = values["out"].as<std::string>();
  const std::string done =
      traces::convert_trace(values["file"].as<std::string>(), out, convert_options);
  context.out << "wrote " << out << " (" << done << ")\n";
  return 0;
}

}  // namespace

// --granularity values, repeatable and comma-separated: mean, heads, topk:K.
namespace {

// --granularity values, repeatable and comma-separated: mean, heads, topk:K (mean rows when none
// is named); ConfigError for anything else.
void parse_granularities(const std::vector<std::string>& values, kernels::TraceContents& contents) {
  contents.mean = false;
  bool any = false;
  for (const std::string& value : values) {
    std::stringstream list(value);
    std::string item;
    while (std::getline(list, item, ',')) {
      any = true;
      if (item == "mean") {
        contents.mean = true;
      } else if (item == "heads") {
        contents.heads = true;
      } else if (item.rfind("topk:", 0) == 0) {
        const std::string number = item.substr(5);
        std::uint32_t k = 0;
        const auto parsed = std::from_chars(number.data(), number.data() + number.size(), k);
        if (number.empty() || parsed.ec != std::errc() ||
            parsed.ptr != number.data() + number.size() || k == 0) {
          throw ConfigError("--granularity topk:K needs a whole K >= 1, got '" + item + "'");
        }
        if (contents.top_k != 0 && contents.top_k != k) {
          throw ConfigError("--granularity names two different top-k sizes (" +
                            std::to_string(contents.top_k) + " and " + std::to_string(k) + ")");
        }
        contents.top_k = k;
      } else {
        throw ConfigError("unknown --granularity '" + item + "': expected mean, heads or topk:K");
      }
    }
  }
  contents.mean = contents.mean || !any;  // mean rows unless granularities were named
}

}  // namespace

kernels::TraceContents parse_trace_contents(const boost::program_options::variables_map& values) {
  kernels::TraceContents contents;
  parse_granularities(values.count("granularity") != 0U
                          ? values["granularity"].as<std::vector<std::string>>()
                          : std::vector<std::string>(),
                      contents);
  contents.prefill_window = values["window"].as<std::uint32_t>();
  contents.key_norms = values.count("key-norms") != 0U;
  contents.dtype = trace_dtype(values);
  return contents;
}

namespace {

// Progress on stderr, rewritten in place, when stderr is a terminal: a capture can take
// minutes, while logs and pipes should not fill with carriage returns.
class ProgressLine {
 public:
  ProgressLine() : enabled_(isatty(STDERR_FILENO) == 1) {}
  ProgressLine(const ProgressLine&) = delete;
  ProgressLine& operator=(const ProgressLine&) = delete;
  ProgressLine(ProgressLine&&) = delete;
  ProgressLine& operator=(ProgressLine&&) = delete;
  ~ProgressLine() { end(); }

  [[nodiscard]] bool enabled() const { return enabled_; }

  void update(const kernels::CaptureProgress& progress) {
    const auto now = std::chrono::steady_clock::now();
    const bool last = progress.tokens_done == progress.tokens_total;
    if (!last && shown_ && now - last_shown_ < std::chrono::milliseconds(250)) {
      return;
    }
    last_shown_ = now;
    shown_ = true;
    const bool tracing = progress.phase == kernels::CaptureProgress::Phase::kTracing;
    const double rate =
        progress.seconds > 0.0 ? static_cast<double>(progress.tokens_done) / progress.seconds : 0.0;
    std::ostringstream line;
    line << std::fixed << std::setprecision(0)
         << "\rkvtier: " << (tracing ? "tracing " : "generating ") << progress.tokens_done << "/"
         << progress.tokens_total << " tokens, " << rate << " tokens/s";
    std::error_code error;
    if (tracing && !progress.partial_file.empty()) {
      const std::uintmax_t bytes = std::filesystem::file_size(progress.partial_file, error);
      if (!error) {
        line << std::setprecision(1) << ", file " << static_cast<double>(bytes) / (1U << 20)
             << " MiB";
      }
    }
    // Erase what a longer earlier line left to the right.
    std::cerr << line.str() << "\033[K" << std::flush;
  }

  // Ends the line, so that what follows starts on a line of its own.
  void end() {
    if (shown_) {
      std::cerr << "\n" << std::flush;
      shown_ = false;
    }
  }

 private:
  bool enabled_;
  bool shown_ = false;
  std::chrono::steady_clock::time_point last_shown_;
};

int capture(const Arguments& args, Context& context) {
  po::options_description options("trace capture options");
  options.add_options()("model", po::value<std::string>()->required(),
                        "llama2.c checkpoint file or Hugging Face model directory")(
      "tokenizer", po::value<std::string>(),
      "tokenizer file (default: the model directory's, or tokenizer.bin / the only tok*.bin "
      "beside a checkpoint file)")("prompt", po::value<std::string>(), "prompt text")(
      "prompt-file", po::value<std::string>(),
      "file holding the prompt (one final newline dropped)")(
      "max-new-tokens", po::value<int>()->default_value(256),
      "decode steps to trace, fewer when a stop token comes first")(
      "granularity", po::value<std::vector<std::string>>()->composing(),
      "mean, heads or topk:K; repeatable or comma-separated (default: mean)")(
      "window", po::value<std::uint32_t>()->default_value(0),
      "also record the attention of the last W prompt queries (prefill window)")(
      "key-norms", "also record the L2 norm of every cached key")(
      "no-stop", "run all --max-new-tokens steps, past EOS (one pass instead of two)")(
      "dtype", po::value<std::string>()->default_value("fp16"), "attention storage: fp16 or fp32")(
      "device", po::value<std::string>()->default_value("cpu"), "engine: cpu or cuda")(
      "out", po::value<std::string>()->required(), "output trace file");
  add_writer_options(options);
  options.add(sampling_options());
  options.add(cpu_engine_options());
  options.add(cuda_engine_options());
  po::variables_map values;
  if (!parse_arguments(
          args, options, {}, values,
          "usage: kvtier trace capture --model PATH [--tokenizer FILE] (--prompt TEXT | "
          "--prompt-file FILE) [--max-new-tokens N] [--no-stop] [--granularity mean|heads|topk:K] "
          "[--window W] [--key-norms] [--temperature T --top-p P --seed S] [--dtype fp16|fp32] "
          "[--deflate L] [--chunk-elements N] [--device cpu [--threads N] | --device cuda "
          "[--cuda-attention KERNEL] [--cuda-gemm GEMM] [--cuda-fusion off|on]] --out FILE\n\n"
          "Runs a model on the prompt and writes the attention of every decode step: step t "
          "runs the token at position prompt + t and attends to positions 0 .. prompt + t. "
          "Generation stops after the tokenizer's EOS (and, for llama2.c tokenizers, BOS) "
          "unless --no-stop; the tokens are then generated first and traced in a second pass "
          "(docs/ENGINE.md).",
          context.out)) {
    return 0;
  }
  // Everything that needs no model is checked before the model is loaded.
  const std::string device = values["device"].as<std::string>();
  const kernels::CudaAttention attention = cuda_attention_option(values, device);
  const kernels::CudaGemm gemm = cuda_gemm_option(values, device);
  const kernels::CudaFusion fusion = cuda_fusion_option(values, device);
  const kernels::CpuEngineOptions cpu_options = cpu_engine_option(values, device);
  check_engine_device(device);
  if ((values.count("prompt") != 0U) == (values.count("prompt-file") != 0U)) {
    throw ConfigError("give the prompt with exactly one of --prompt and --prompt-file");
  }
  check_output_file("--out", values["out"].as<std::string>(),
                    model_input_paths(values, {"prompt-file"}));
  kernels::CaptureOptions capture_options;
  capture_options.contents = parse_trace_contents(values);
  const kernels::TraceContents& contents = capture_options.contents;
  kernels::GenerationOptions& generation = capture_options.generation;
  generation.max_new_tokens = values["max-new-tokens"].as<int>();
  if (generation.max_new_tokens < 1) {
    throw ConfigError("--max-new-tokens must be at least 1");
  }
  generation.sampling = sampling_option(values);
  capture_options.writer = writer_options(values, "trace capture");
  capture_options.tool = version_line() + " trace capture";

  const std::string prompt_text = values.count("prompt") != 0U
                                      ? values["prompt"].as<std::string>()
                                      : read_prompt_file(values["prompt-file"].as<std::string>());
  const std::filesystem::path model_path = values["model"].as<std::string>();
  const auto weights =
      std::make_shared<const kernels::ModelWeights>(kernels::load_model(model_path));
  const std::filesystem::path tokenizer_path =
      values.count("tokenizer") != 0U ? std::filesystem::path(values["tokenizer"].as<std::string>())
                                      : find_tokenizer(model_path);
  const auto tokenizer = load_model_tokenizer(tokenizer_path, weights->spec);
  if (values.count("no-stop") == 0U) {
    if (const auto eos = tokenizer->eos_id()) {
      generation.stop_tokens.push_back(*eos);
    }
    // llama2.c's run.c ends a story at BOS, which its models emit between stories.
    if (const auto bos = tokenizer->bos_id(); bos && tokenizer->kind() == "llama2.c") {
      generation.stop_tokens.push_back(*bos);
    }
  }
  const std::vector<std::int32_t> prompt = encode_prompt_argument(*tokenizer, prompt_text, values);
  capture_options.description =
      command_line("kvtier trace capture", args, {"--out", "--threads"}) +
      "; prompt: " + std::to_string(prompt.size()) + " tokens from " +
      (values.count("prompt") != 0U ? std::string("--prompt")
                                    : "the file " + values["prompt-file"].as<std::string>());

  ProgressLine progress_line;
  if (progress_line.enabled()) {
    capture_options.progress = [&](const kernels::CaptureProgress& progress) {
      progress_line.update(progress);
    };
  }
  std::unique_ptr<kernels::Engine> engine;
  if (device == "cuda") {
    kernels::CudaEngineOptions cuda;
    // Head means reduced on the device suffice unless per-head rows or a prefill window are kept.
    cuda.observer_rows = contents.heads || contents.prefill_window > 0
                             ? kernels::ObserverRows::kPerHead
                             : kernels::ObserverRows::kHeadMean;
    cuda.attention = attention;
    cuda.gemm = gemm;
    cuda.fusion = fusion;
    engine = kernels::make_cuda_engine(weights, cuda);
  } else {
    engine = kernels::make_cpu_engine(weights, cpu_options);
  }
  const std::string out = values["out"].as<std::string>();
  const kernels::CaptureResult result =
      kernels::capture_trace(*engine, prompt, capture_options, out);
  progress_line.end();
  context.out << "wrote " << out << " (" << result.generation.prompt_tokens << " prompt tokens, "
              << result.steps << " decode steps"
              << (result.generation.stopped ? ", ended by a stop token" : "") << ")\n";
  return 0;
}

}  // namespace

int run_trace(const Arguments& args, Context& context) {
  const std::string usage =
      "usage: kvtier trace info FILE [--format text|json]\n"
      "       kvtier trace validate FILE\n"
      "       kvtier trace synth --model NAME --prompt-tokens P --steps N --out FILE [...]\n"
      "       kvtier trace convert FILE --out OUT [...]\n"
      "       kvtier trace capture --model PATH --prompt TEXT --out FILE [...]\n"
      "       kvtier trace meta --model PATH --prompt-tokens P --steps N --tool TEXT [...]\n\n"
      "Attention traces (HDF5, format v1; docs/TRACE_FORMAT.md). `kvtier trace COMMAND --help` "
      "lists each command's options.";
  if (args.empty()) {
    throw ConfigError(
        "trace needs a subcommand: info, validate, synth, convert, capture or meta (see kvtier "
        "trace --help)");
  }
  if (args.front() == "--help" || args.front() == "-h") {
    context.out << usage << "\n";
    return 0;
  }
  const Arguments rest(args.begin() + 1, args.end());
  if (args.front() == "info") {
    return info(rest, context);
  }
  if (args.front() == "validate") {
    return validate(rest, context);
  }
  if (args.front() == "synth") {
    return synth(rest, context);
  }
  if (args.front() == "convert") {
    return convert(rest, context);
  }
  if (args.front() == "capture") {
    return capture(rest, context);
  }
  if (args.front() == "meta") {
    return run_trace_meta(rest, context);
  }
  throw ConfigError("unknown trace subcommand '" + args.front() +
                    "': expected info, validate, synth, convert, capture or meta");
}

}  // namespace kvtier::app
