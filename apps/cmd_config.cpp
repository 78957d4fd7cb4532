// `kvtier config check FILE`: validate a config and print it fully resolved.

#include "apps/cli.hpp"
#include "apps/report.hpp"
#include "common/errors.hpp"
#include "common/text_output.hpp"
#include "configs/parse.hpp"
#include "configs/schema/run.pb.h"
#include "configs/schema/sweep.pb.h"
#include "sweep/sweep.hpp"

namespace kvtier::app {
namespace {

namespace po = boost::program_options;

int check(const Arguments& args, Context& context) {
  po::options_description options("config check options");
  std::string kinds;
  for (const auto kind : config::config_kinds()) {
    kinds += (kinds.empty() ? "" : ", ") + std::string(kind);
  }
  options.add_options()("file", po::value<std::string>()->required(),
                        "config file (text format or JSON)")(
      "kind", po::value<std::string>(),
      ("message type: " + kinds + "; default: the file's '# proto-message:' line, else run")
          .c_str());
  add_format_option(options);
  add_set_option(options);
  po::positional_options_description positional;
  positional.add("file", 1);
  po::variables_map values;
  if (!parse_arguments(args, options, positional, values,
                       "usage: kvtier config check FILE [--kind K] [--set PATH=VALUE]... "
                       "[--format text|json]\n\nValidates FILE (protobuf text format, or JSON), "
                       "expands its preset references, applies the overrides and prints every "
                       "resolved value with its unit. Exit 2 with one line per problem when the "
                       "config is invalid.",
                       context.out)) {
    return 0;
  }
  const Format format = format_from(values);
  const std::string path = values["file"].as<std::string>();
  const std::string text = config::read_config_file(path);
  std::string kind =
      values.count("kind") != 0U ? values["kind"].as<std::string>() : config::declared_kind(text);
  if (kind.empty()) {
    kind = "run";
  }
  auto message = config::new_config_message(kind);
  const std::vector<config::Override> overrides = overrides_from(values);
  const config::LocationMap locations = context.loader.load_text(text, path, *message, overrides);
  // What `sim`, `plan` and `sweep` refuse before they run, config check refuses too.
  if (const auto* run = dynamic_cast<const config::RunSpec*>(message.get())) {
    check_run_policies(*run, locations);
  }
  if (dynamic_cast<const config::SweepSpec*>(message.get()) != nullptr) {
    // A policy axis and the base's policies belong to replay/, above configs/: sweep/ checks
    // them, with the point count.
    (void)sweep::load_sweep_text(text, path, context.loader, overrides);
  }
  const std::vector<Row> derived = derived_rows(*message);
  if (format == Format::kJson) {
    context.out << "{\"file\": " << json_escape(path) << ", \"kind\": " << json_escape(kind)
                << ", \"valid\": true, \"resolved\": " << message_json(*message)
                << ", \"derived\": " << rows_json(derived) << "}\n";
    return 0;
  }
  context.out << path << ": valid " << message->GetDescriptor()->name() << "\n\n";
  print_rows(context.out, spec_rows(*message), "field", false);
  if (!derived.empty()) {
    context.out << "\n";
    print_rows(context.out, derived, "derived", true);
  }
  return 0;
}

}  // namespace

int run_config(const Arguments& args, Context& context) {
  if (args.empty()) {
    throw ConfigError("config needs a subcommand: check (see kvtier config --help)");
  }
  if (args.front() == "--help" || args.front() == "-h") {
    context.out << "usage: kvtier config check FILE [--kind K] [--set PATH=VALUE]... "
                   "[--format text|json]\n";
    return 0;
  }
  if (args.front() == "check") {
    return check(Arguments(args.begin() + 1, args.end()), context);
  }
  throw ConfigError("unknown config subcommand '" + args.front() + "': expected check");
}

}  // namespace kvtier::app
