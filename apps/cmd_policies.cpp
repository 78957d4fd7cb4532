// `kvtier policies list` and `kvtier policies show NAME`: the policy registry.

#include "apps/cli.hpp"
#include "common/errors.hpp"
#include "common/text_output.hpp"
#include "replay/registry.hpp"

namespace kvtier::app {

namespace po = boost::program_options;

namespace {

std::string type_name(const replay::ParamSpec& spec) {
  if (spec.list) {
    return spec.type == replay::ParamType::kInteger ? "integer list (a/b/...)"
                                                    : "number list (a/b/...)";
  }
  switch (spec.type) {
    case replay::ParamType::kNumber: return "number";
    case replay::ParamType::kInteger: return "integer";
    case replay::ParamType::kFlag: return "flag";
    case replay::ParamType::kChoice: {
      std::string choices;
      for (const auto& choice : spec.choices) {
        choices += (choices.empty() ? "" : "|") + choice;
      }
      return choices;
    }
  }
  return {};
}

std::string range(const replay::ParamSpec& spec) {
  if (spec.type != replay::ParamType::kNumber && spec.type != replay::ParamType::kInteger) {
    return {};
  }
  return "[" + format_double(spec.min) + ", " +
         (spec.max >= 1e9 ? "inf" : format_double(spec.max)) + "]";
}

int list(const Arguments& args, Context& context) {
  po::options_description options("policies list options");
  add_format_option(options);
  po::variables_map values;
  if (!parse_arguments(args, options, {}, values,
                       "usage: kvtier policies list [--format text|json]", context.out)) {
    return 0;
  }
  const auto registry = replay::builtin_policies();
  if (format_from(values) == Format::kJson) {
    context.out << "[";
    bool first = true;
    for (const auto& info : registry.all()) {
      context.out << (first ? "" : ",\n ") << "{\"name\": " << json_escape(info.name)
                  << ", \"summary\": " << json_escape(info.summary) << "}";
      first = false;
    }
    context.out << "]\n";
    return 0;
  }
  TextTable table({"policy", "parameters", "summary"});
  for (const auto& info : registry.all()) {
    std::string params;
    for (const auto& spec : info.params) {
      if (spec.list && spec.default_value.empty()) {
        continue;  // absent unless given
      }
      params += (params.empty() ? "" : ",") + spec.name + "=" + spec.default_value;
    }
    table.add_row({info.name, params.empty() ? "-" : params, info.summary});
  }
  table.render(context.out);
  return 0;
}

int show(const Arguments& args, Context& context) {
  po::options_description options("policies show options");
  options.add_options()("name", po::value<std::string>()->required(), "policy name");
  add_format_option(options);
  po::positional_options_description positional;
  positional.add("name", 1);
  po::variables_map values;
  if (!parse_arguments(args, options, positional, values,
                       "usage: kvtier policies show NAME [--format text|json]", context.out)) {
    return 0;
  }
  const auto registry = replay::builtin_policies();
  const std::string name = values["name"].as<std::string>();
  const replay::PolicyInfo* info = registry.find(name);
  if (info == nullptr) {
    throw ConfigError("unknown policy '" + name + "' (see kvtier policies list)");
  }
  if (format_from(values) == Format::kJson) {
    context.out << "{\"name\": " << json_escape(info->name)
                << ", \"summary\": " << json_escape(info->summary)
                << ", \"source\": " << json_escape(info->source) << ", \"parameters\": [";
    for (size_t i = 0; i < info->params.size(); ++i) {
      const auto& spec = info->params[i];
      context.out << (i == 0 ? "" : ", ") << "{\"name\": " << json_escape(spec.name)
                  << ", \"type\": " << json_escape(type_name(spec))
                  << ", \"default\": " << json_escape(spec.default_value)
                  << ", \"doc\": " << json_escape(spec.doc) << "}";
    }
    context.out << "]}\n";
    return 0;
  }
  context.out << info->name << ": " << info->summary << "\nsource: " << info->source << "\n";
  if (info->params.empty()) {
    context.out << "\nno parameters\n";
    return 0;
  }
  context.out << "\n";
  TextTable table({"parameter", "type", "default", "range", "meaning"});
  for (const auto& spec : info->params) {
    table.add_row({spec.name, type_name(spec), spec.default_value, range(spec), spec.doc});
  }
  table.render(context.out);
  context.out << "\nwrite as: " << info->name << ":" << info->params.front().name << "="
              << info->params.front().default_value << ",...\n";
  return 0;
}

}  // namespace

int run_policies(const Arguments& args, Context& context) {
  if (args.empty()) {
    throw ConfigError("policies needs a subcommand: list or show (see kvtier policies --help)");
  }
  if (args.front() == "--help" || args.front() == "-h") {
    context.out << "usage: kvtier policies list [--format text|json]\n"
                   "       kvtier policies show NAME [--format text|json]\n\n"
                   "KV tier and eviction policies, each with its declared parameters. A policy "
                   "is written NAME:PARAM=VALUE,... (e.g. tiered:hbm=0.5,evict=0.1,delta=64).\n";
    return 0;
  }
  const Arguments rest(args.begin() + 1, args.end());
  if (args.front() == "list") {
    return list(rest, context);
  }
  if (args.front() == "show") {
    return show(rest, context);
  }
  throw ConfigError("unknown policies subcommand '" + args.front() + "': expected list or show");
}

}  // namespace kvtier::app
