// `kvtier trace info|validate|synth|convert`: attention traces (docs/TRACE_FORMAT.md).

#include <charconv>
#include <optional>

#include "apps/cli.hpp"
#include "common/errors.hpp"
#include "configs/locations.hpp"
#include "configs/schema/model.pb.h"
#include "traces/convert.hpp"
#include "traces/describe.hpp"
#include "traces/synth.hpp"
#include "traces/validate.hpp"

namespace kvtier::app {
namespace {

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
    throw ConfigError(std::string("--") + option + " takes A:B (first, one past last), got '" +
                      text + "'");
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
      "weights at least this heavy enter the reach histogram");
  add_format_option(options);
  po::positional_options_description positional;
  positional.add("file", 1);
  po::variables_map values;
  if (!parse_arguments(args, options, positional, values,
                       "usage: kvtier trace info FILE [--sample-steps N] [--format text|json]\n\n"
                       "What a trace holds and per-layer attention statistics: sink mass, mass "
                       "within the last 128 tokens, far mass, entropy, recency decay and how far "
                       "back attention reaches.",
                       context.out)) {
    return 0;
  }
  const Format format = format_from(values);
  const traces::TraceReader reader(values["file"].as<std::string>());
  traces::StatsOptions stats_options;
  stats_options.sample_steps = values["sample-steps"].as<std::uint32_t>();
  stats_options.sink_tokens = values["sink-tokens"].as<std::uint32_t>();
  stats_options.reach_threshold = values["threshold"].as<double>();
  const traces::TraceStats stats = traces::compute_stats(reader, stats_options);
  const traces::TraceSummary summary = traces::summarize(reader);
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
                       "[--no-mean]] [--heads] [--set PARAM=VALUE ...]\n\nWrites a seeded "
                       "synthetic attention trace: sinks, a decaying recency band, Zipf heavy "
                       "hitters and (reasoning) notes re-read in bursts hundreds of steps later.",
                       context.out)) {
    return 0;
  }
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
  synth.key_norms = values.count("key-norms") != 0U;
  const std::string dtype = values["dtype"].as<std::string>();
  if (dtype != "fp16" && dtype != "fp32") {
    throw ConfigError("--dtype must be fp16 or fp32");
  }
  synth.dtype = dtype == "fp16" ? config::FP16 : config::FP32;
  synth.writer = writer_options(values, "trace synth");
  // How it was made, for the trace's /meta: the command line without the output name, so
  // that the same command gives the same file wherever it is written.
  std::string command = "kvtier trace synth";
  for (std::size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--out") {
      ++i;
    } else if (args[i].rfind("--out=", 0) != 0) {
      command += " " + args[i];
    }
  }
  synth.description = command;
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
      "drop-dense", "with --top-k: keep only the top-k rows")("steps", po::value<std::string>(),
                                                              "keep steps A:B (A becomes step 0)")(
      "layers", po::value<std::string>(), "keep model layers A:B");
  add_writer_options(options);
  po::positional_options_description positional;
  positional.add("file", 1);
  po::variables_map values;
  if (!parse_arguments(args, options, positional, values,
                       "usage: kvtier trace convert FILE --out OUT [--to-mean] [--top-k K "
                       "[--drop-dense]] [--steps A:B] [--layers A:B] [--deflate L]\n\nPer-head "
                       "to mean, dense to top-k, slices and recompression, streamed.",
                       context.out)) {
    return 0;
  }
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

int run_trace(const Arguments& args, Context& context) {
  const std::string usage =
      "usage: kvtier trace info FILE [--format text|json]\n"
      "       kvtier trace validate FILE\n"
      "       kvtier trace synth --model NAME --prompt-tokens P --steps N --out FILE [...]\n"
      "       kvtier trace convert FILE --out OUT [...]\n\n"
      "Attention traces (HDF5, format v1; docs/TRACE_FORMAT.md). `kvtier trace COMMAND --help` "
      "lists each command's options.";
  if (args.empty()) {
    throw ConfigError(
        "trace needs a subcommand: info, validate, synth or convert (see kvtier trace --help)");
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
  throw ConfigError("unknown trace subcommand '" + args.front() +
                    "': expected info, validate, synth or convert");
}

}  // namespace kvtier::app
