// `kvtier trace meta`: the /meta record and the HDF5 attributes of a captured trace, as one JSON
// object, for trace writers outside kvtier (scripts/capture_hf.py; docs/TRACE_FORMAT.md,
// "Capturing with PyTorch"). The record is built by the same code as `trace capture`'s
// (kernels::capture_meta) and checked by the writer's own rules, so other writers never derive
// a ModelSpec or a /meta field themselves.

#include <google/protobuf/util/json_util.h>

#include <filesystem>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "apps/cli.hpp"
#include "common/errors.hpp"
#include "common/text_output.hpp"
#include "configs/utf8_fields.hpp"
#include "kernels/hf_checkpoint.hpp"
#include "kernels/sampler.hpp"
#include "kernels/tracer.hpp"
#include "traces/format.hpp"
#include "traces/meta.hpp"
#include "traces/writer.hpp"

namespace kvtier::app {
namespace {

namespace po = boost::program_options;

// RFC 4648 base64 with padding.
std::string base64(std::string_view bytes) {
  static constexpr std::string_view kAlphabet =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string text;
  text.reserve((bytes.size() + 2) / 3 * 4);
  for (std::size_t i = 0; i < bytes.size(); i += 3) {
    const std::size_t left = bytes.size() - i;
    std::uint32_t group = static_cast<std::uint32_t>(static_cast<unsigned char>(bytes[i])) << 16U;
    if (left > 1) {
      group |= static_cast<std::uint32_t>(static_cast<unsigned char>(bytes[i + 1])) << 8U;
    }
    if (left > 2) {
      group |= static_cast<std::uint32_t>(static_cast<unsigned char>(bytes[i + 2]));
    }
    text += kAlphabet[(group >> 18U) & 63U];
    text += kAlphabet[(group >> 12U) & 63U];
    text += left > 1 ? kAlphabet[(group >> 6U) & 63U] : '=';
    text += left > 2 ? kAlphabet[group & 63U] : '=';
  }
  return text;
}

// The architecture only: a Hugging Face directory's config.json (no weights, so directories
// with weights the engine cannot read work too), or a llama2.c checkpoint's header, checked
// against the file's size as `trace capture` checks it (the file is mapped, not read).
config::ModelSpec model_spec(const std::filesystem::path& path) {
  std::error_code error;
  if (std::filesystem::is_directory(path, error)) {
    return kernels::read_hf_config(path / "config.json");
  }
  return kernels::load_model(path).spec;
}

std::string attributes_json(const std::vector<traces::TraceAttribute>& attributes) {
  std::string json = "[";
  for (std::size_t i = 0; i < attributes.size(); ++i) {
    const traces::TraceAttribute& attribute = attributes[i];
    json += i == 0 ? "\n    " : ",\n    ";
    json += "{\"name\": " + json_escape(attribute.name) + ", \"type\": \"" +
            std::string(traces::attribute_type_name(attribute.type)) + "\", \"value\": ";
    json += attribute.type == traces::TraceAttribute::Type::kString
                ? json_escape(attribute.text)
                : std::to_string(attribute.number);
    json += "}";
  }
  return json + "]";
}

const char* json_bool(bool value) {
  return value ? "true" : "false";
}

std::string shape_json(const traces::TraceShape& shape) {
  std::ostringstream out;
  out << "{\"prompt_tokens\": " << shape.prompt_tokens << ", \"steps\": " << shape.steps
      << ", \"first_layer\": " << shape.layers.first << ", \"num_layers\": " << shape.layers.count
      << ", \"heads\": " << shape.heads << ", \"kv_heads\": " << shape.kv_heads
      << ", \"vocab_size\": " << shape.vocab_size << ", \"top_k\": " << shape.top_k
      << ", \"prefill_window\": " << shape.prefill_window << ", \"weight_type\": \""
      << (shape.weight_type == traces::WeightType::kFloat16 ? "float16" : "float32")
      << "\", \"has_mean\": " << json_bool(shape.has_mean)
      << ", \"has_heads\": " << json_bool(shape.has_heads)
      << ", \"has_topk\": " << json_bool(shape.has_topk)
      << ", \"has_prefill\": " << json_bool(shape.has_prefill)
      << ", \"has_key_norms\": " << json_bool(shape.has_key_norms) << "}";
  return out.str();
}

// Every dataset path the shape implies, per layer and for the whole file.
std::string paths_json(const traces::TraceShape& shape) {
  std::ostringstream out;
  out << "{\"meta\": " << json_escape(traces::kMetaPath)
      << ", \"tokens\": " << json_escape(traces::kTokensPath);
  if (shape.has_dense()) {
    out << ", \"row_offsets\": " << json_escape(traces::kRowOffsetsPath);
  }
  if (shape.has_key_norms) {
    out << ", \"key_norms\": " << json_escape(traces::kKeyNormsPath);
  }
  out << ", \"layers\": [";
  for (std::uint32_t layer = shape.layers.first; layer < shape.layers.end(); ++layer) {
    out << (layer == shape.layers.first ? "\n    " : ",\n    ") << "{\"layer\": " << layer;
    if (shape.has_mean) {
      out << ", \"mean\": " << json_escape(traces::mean_path(layer));
    }
    if (shape.has_heads) {
      out << ", \"heads\": " << json_escape(traces::heads_path(layer));
    }
    if (shape.has_topk) {
      out << ", \"topk_indices\": " << json_escape(traces::topk_indices_path(layer))
          << ", \"topk_weights\": " << json_escape(traces::topk_weights_path(layer))
          << ", \"topk_residual\": " << json_escape(traces::topk_residual_path(layer));
    }
    if (shape.has_prefill) {
      out << ", \"prefill\": " << json_escape(traces::prefill_path(layer));
    }
    out << "}";
  }
  out << "]}";
  return out.str();
}

}  // namespace

int run_trace_meta(const Arguments& args, Context& context) {
  po::options_description options("trace meta options");
  options.add_options()("model", po::value<std::string>()->required(),
                        "llama2.c checkpoint file or Hugging Face model directory (config.json)")(
      "model-name", po::value<std::string>(),
      "the model's name in /meta (default: the directory's or file's name)")(
      "prompt-tokens", po::value<std::uint32_t>()->required(), "prompt length P")(
      "steps", po::value<std::uint32_t>()->required(), "decode steps N")(
      "granularity", po::value<std::vector<std::string>>()->composing(),
      "mean, heads or topk:K; repeatable or comma-separated (default: mean)")(
      "window", po::value<std::uint32_t>()->default_value(0),
      "the trace holds the prefill window of the last W prompt queries")(
      "key-norms", "the trace holds key norms")(
      "dtype", po::value<std::string>()->default_value("fp16"), "attention storage: fp16 or fp32")(
      "temperature", po::value<float>()->default_value(0.0F), "sampling temperature (0: greedy)")(
      "top-p", po::value<float>()->default_value(1.0F), "nucleus sampling mass, (0, 1]")(
      "top-k", po::value<std::uint32_t>()->default_value(0),
      "sampling among the K most likely tokens (0: all)")(
      "seed", po::value<std::uint64_t>()->default_value(1), "sampling seed")(
      "tool", po::value<std::string>()->required(),
      "the program writing the trace, with its version (/meta source.tool, root 'producer')")(
      "description", po::value<std::string>()->default_value(""),
      "how the trace was made: the command line, the prompt (/meta source.description)");
  po::variables_map values;
  if (!parse_arguments(
          args, options, {}, values,
          "usage: kvtier trace meta --model PATH --prompt-tokens P --steps N --tool TEXT\n"
          "                         [--granularity mean|heads|topk:K ...] [--window W] "
          "[--key-norms]\n"
          "                         [--dtype fp16|fp32] [--temperature T --top-p P --top-k K "
          "--seed S]\n"
          "                         [--model-name NAME] [--description TEXT]\n\n"
          "Prints, as one JSON object, the /meta of a captured trace of this shape (the "
          "serialized kvtier.config.TraceMeta in base64, source SOURCE_CAPTURED), the "
          "attributes kvtier's writer puts on the root group and on /meta (name, HDF5 type, "
          "value), the trace's dimensions and its dataset paths: everything a writer outside "
          "kvtier (scripts/capture_hf.py) needs to write a file `kvtier trace validate` accepts. "
          "Only the model's architecture is read (config.json or the llama2.c header).",
          context.out)) {
    return 0;
  }
  const kernels::TraceContents contents = parse_trace_contents(values);
  const std::uint32_t prompt_tokens = values["prompt-tokens"].as<std::uint32_t>();
  const std::uint32_t steps = values["steps"].as<std::uint32_t>();
  if (prompt_tokens == 0 || steps == 0) {
    throw ConfigError("--prompt-tokens and --steps must be at least 1");
  }
  // The trace format's limit (traces/impl/format.cpp), refused here as the arguments it is.
  if (std::uint64_t{prompt_tokens} + steps > std::uint64_t{1} << 31U) {
    throw ConfigError("--prompt-tokens + --steps is more than a trace holds (2^31 positions)");
  }
  kernels::TraceProvenance provenance;
  provenance.sampling = kernels::SamplingOptions::nucleus(values["temperature"].as<float>(),
                                                          values["top-p"].as<float>(),
                                                          values["seed"].as<std::uint64_t>());
  const kernels::Sampler check_sampling(provenance.sampling);  // ConfigError for bad values
  provenance.tool = values["tool"].as<std::string>();
  if (provenance.tool.empty()) {
    throw ConfigError("--tool must name the program writing the trace");
  }
  provenance.description = values["description"].as<std::string>();

  config::ModelSpec model = model_spec(values["model"].as<std::string>());
  if (values.count("model-name") != 0U) {
    model.set_name(values["model-name"].as<std::string>());
  }
  config::TraceMeta meta = kernels::capture_meta(model, prompt_tokens, steps, contents, provenance);
  if (const std::uint32_t top_k = values["top-k"].as<std::uint32_t>(); top_k > 0) {
    meta.mutable_sampling()->set_top_k(top_k);
  }
  // The writer's own check: what it refuses, this refuses; and the text it records, as it does.
  const traces::TraceShape shape = traces::checked_shape(meta, "kvtier trace meta, /meta");
  config::make_strings_valid_utf8(meta);

  std::string bytes;
  if (!meta.SerializeToString(&bytes)) {
    throw Error("cannot serialize /meta", "kvtier trace meta", ExitCode::kRuntimeFailure);
  }
  std::string readable;
  google::protobuf::util::JsonPrintOptions print;
  print.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(meta, &readable, print);

  context.out << "{\"message_type\": " << json_escape(traces::kMetaMessageType)
              << ",\n \"meta_base64\": \"" << base64(bytes) << "\""
              << ",\n \"root_attributes\": "
              << attributes_json(
                     traces::root_attributes(provenance.tool, traces::current_utc_time()))
              << ",\n \"meta_attributes\": " << attributes_json(traces::meta_attributes(meta))
              << ",\n \"shape\": " << shape_json(shape) << ",\n \"paths\": " << paths_json(shape)
              << ",\n \"meta\": " << readable << "}\n";
  return 0;
}

}  // namespace kvtier::app
