// `kvtier presets list [--kind K]` and `kvtier presets show NAME [--kind K]`.

#include <memory>

#include "apps/cli.hpp"
#include "apps/report.hpp"
#include "common/errors.hpp"
#include "common/text_output.hpp"
#include "configs/dtype.hpp"
#include "configs/schema/hardware.pb.h"
#include "configs/schema/model.pb.h"
#include "hwmodels/link_math.hpp"
#include "hwmodels/model_shape.hpp"

namespace kvtier::app {
namespace {

namespace po = boost::program_options;

void check_kind(const std::string& kind) {
  for (const auto known : config::PresetRegistry::kinds()) {
    if (kind == known) {
      return;
    }
  }
  throw ConfigError("unknown --kind '" + kind + "': expected gpu, host, link, node or model");
}

// The one-line summary `presets list` gives each preset.
std::string summary(const google::protobuf::Message& spec) {
  if (const auto* gpu = dynamic_cast<const config::GpuSpec*>(&spec)) {
    double bf16 = 0.0;
    for (const auto& rate : gpu->compute()) {
      bf16 = rate.dtype() == config::BF16 ? rate.dense_tflops() : bf16;
    }
    return format_fixed(gpu->memory_capacity_gib(), 1) + " GiB " + gpu->memory_type() + ", " +
           format_fixed(gpu->memory_bandwidth_gb_per_s(), 0) + " GB/s, BF16 " +
           format_fixed(bf16, 1) + " TFLOP/s";
  }
  if (const auto* host = dynamic_cast<const config::HostSpec*>(&spec)) {
    return std::to_string(host->sockets()) + " x " + std::to_string(host->channels_per_socket()) +
           " ch " + host->memory_type() + ", " +
           format_fixed(
               host->sockets() * host->channels_per_socket() * host->channel_bandwidth_gb_per_s(),
               1) +
           " GB/s, " + format_fixed(host->capacity_gib(), 0) + " GiB";
  }
  if (const auto* link = dynamic_cast<const config::LinkSpec*>(&spec)) {
    return config::LinkKind_Name(link->kind()) + ", " +
           format_fixed(hw::peak_gb_per_s_per_direction(*link), 2) + " GB/s per direction";
  }
  if (const auto* node = dynamic_cast<const config::NodeSpec*>(&spec)) {
    return std::to_string(node->gpus_per_node()) + " x " + node->gpu().name() + ", " +
           node->host_link().name() + ", " + config::GpuInterconnect_Name(node->gpu_interconnect());
  }
  if (const auto* model = dynamic_cast<const config::ModelSpec*>(&spec)) {
    const double params = static_cast<double>(hw::count_parameters(*model).total);
    const std::string count =
        params >= 1e9 ? format_fixed(params / 1e9, 2) + "B" : format_fixed(params / 1e6, 2) + "M";
    return count + " params, " + std::to_string(model->num_hidden_layers()) + " layers, KV " +
           format_fixed(hw::kv_bytes_per_token(*model) / 1024.0, 2) + " KiB/token (" +
           std::string(config::dtype_name(model->kv_dtype())) + ")";
  }
  return {};
}

std::unique_ptr<google::protobuf::Message> load(const config::PresetFile& preset, Context& context,
                                                const std::vector<config::Override>& overrides) {
  auto spec = config::new_config_message(preset.kind);
  (void)context.loader.load_preset(preset, *spec, overrides);
  return spec;
}

int list(const Arguments& args, Context& context) {
  po::options_description options("presets list options");
  options.add_options()("kind", po::value<std::string>(),
                        "only this kind: gpu, host, link, node, model");
  add_format_option(options);
  po::variables_map values;
  if (!parse_arguments(
          args, options, {}, values,
          "usage: kvtier presets list [--kind gpu|host|link|node|model] [--format text|json]",
          context.out)) {
    return 0;
  }
  const Format format = format_from(values);
  std::vector<std::string> kinds(config::PresetRegistry::kinds().begin(),
                                 config::PresetRegistry::kinds().end());
  if (values.count("kind") != 0U) {
    kinds = {values["kind"].as<std::string>()};
    check_kind(kinds.front());
  }
  TextTable table({"kind", "name", "summary", "source"});
  std::string json = "[";
  for (const auto& kind : kinds) {
    for (const config::PresetFile* preset : context.presets.list(kind)) {
      const auto spec = load(*preset, context, {});
      if (format == Format::kText) {
        table.add_row({kind, std::string(preset->name), summary(*spec), std::string(preset->path)});
      } else {
        json += (json.size() > 1 ? ",\n " : "") + std::string("{\"kind\": ") + json_escape(kind) +
                ", \"name\": " + json_escape(preset->name) +
                ", \"source\": " + json_escape(preset->path) +
                ", \"summary\": " + json_escape(summary(*spec)) + "}";
      }
    }
  }
  if (format == Format::kText) {
    table.render(context.out);
  } else {
    context.out << json << "]\n";
  }
  return 0;
}

int show(const Arguments& args, Context& context) {
  po::options_description options("presets show options");
  options.add_options()("name", po::value<std::string>()->required(), "preset name")(
      "kind", po::value<std::string>(), "kind, when the name alone is ambiguous");
  add_format_option(options);
  add_set_option(options);
  po::positional_options_description positional;
  positional.add("name", 1);
  po::variables_map values;
  if (!parse_arguments(args, options, positional, values,
                       "usage: kvtier presets show NAME [--kind K] [--set PATH=VALUE]... "
                       "[--format text|json]\n\nPrints the preset's resolved values, each with "
                       "its unit, and the quantities derived from them.",
                       context.out)) {
    return 0;
  }
  const Format format = format_from(values);
  const std::string name = values["name"].as<std::string>();
  const config::PresetFile* preset = nullptr;
  if (values.count("kind") != 0U) {
    const std::string kind = values["kind"].as<std::string>();
    check_kind(kind);
    preset = context.presets.find(kind, name);
    if (preset == nullptr) {
      throw ConfigError(context.presets.unknown_message(kind, name));
    }
  } else {
    preset = &context.presets.find_any(name);
  }
  const auto spec = load(*preset, context, overrides_from(values));
  const std::vector<Row> derived = derived_rows(*spec);
  if (format == Format::kJson) {
    context.out << "{\"kind\": " << json_escape(preset->kind)
                << ", \"name\": " << json_escape(preset->name)
                << ", \"source\": " << json_escape(preset->path)
                << ", \"spec\": " << message_json(*spec) << ", \"derived\": " << rows_json(derived)
                << "}\n";
    return 0;
  }
  context.out << preset->kind << " preset " << preset->name << " (" << preset->path << ")\n\n";
  print_rows(context.out, spec_rows(*spec), "field", false);
  if (!derived.empty()) {
    context.out << "\n";
    print_rows(context.out, derived, "derived", true);
  }
  return 0;
}

}  // namespace

int run_presets(const Arguments& args, Context& context) {
  const std::string usage =
      "usage: kvtier presets list [--kind K] [--format text|json]\n"
      "       kvtier presets show NAME [--kind K] [--set PATH=VALUE]... [--format text|json]\n\n"
      "Built-in hardware and model presets; each figure cites its source in the preset file.";
  if (args.empty()) {
    throw ConfigError("presets needs a subcommand: list or show (see kvtier presets --help)");
  }
  if (args.front() == "--help" || args.front() == "-h") {
    context.out << usage << "\n";
    return 0;
  }
  const Arguments rest(args.begin() + 1, args.end());
  if (args.front() == "list") {
    return list(rest, context);
  }
  if (args.front() == "show") {
    return show(rest, context);
  }
  throw ConfigError("unknown presets subcommand '" + args.front() + "': expected list or show");
}

}  // namespace kvtier::app
