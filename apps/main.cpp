// The kvtier command line: dispatches to subcommands and turns every error into one line on
// stderr with the documented exit code (2 usage/config, 3 bad data, 1 other failures).

#include <iostream>
#include <map>

#include "apps/cli.hpp"
#include "common/errors.hpp"
#include "common/temporary_file.hpp"

namespace {

using kvtier::ExitCode;

struct Command {
  const char* summary;
  int (*run)(const kvtier::app::Arguments&, kvtier::app::Context&);
};

const std::map<std::string, Command>& commands() {
  static const std::map<std::string, Command> table = {
      {"presets", {"list and show built-in hardware and model presets", kvtier::app::run_presets}},
      {"config", {"validate a config file and print it resolved", kvtier::app::run_config}},
      {"devices", {"list the CPU and CUDA devices this build can use", kvtier::app::run_devices}},
      {"sim", {"simulate batched serving on a modelled GPU node", kvtier::app::run_sim}},
      {"plan",
       {"largest batch per engine that meets latency SLOs, per policy; GPUs for a target",
        kvtier::app::run_plan}},
      {"policies", {"list and show KV tier and eviction policies", kvtier::app::run_policies}},
      {"validate",
       {"compare the simulator with live runs, references and published measurements",
        kvtier::app::run_validate}},
      {"replay",
       {"replay KV policies over attention traces; search per-layer budgets",
        kvtier::app::run_replay}},
      {"trace",
       {"capture, inspect, validate, generate and convert attention traces",
        kvtier::app::run_trace}},
      {"live", {"decode with the real tiered KV cache and measure it", kvtier::app::run_live}},
      {"sweep",
       {"what-if grids over batch, context, model, hardware and policy", kvtier::app::run_sweep}},
  };
  return table;
}

void print_usage(std::ostream& out) {
  out << "usage: kvtier [--help] [--version] COMMAND [ARGS...]\n\n"
         "kvtier projects HBM, latency and PCIe load of tiered KV caches for LLM serving.\n\n"
         "commands:\n";
  for (const auto& [name, command] : commands()) {
    out << "  " << name << std::string(10 - name.size(), ' ') << command.summary << "\n";
  }
  out << "\n`kvtier COMMAND --help` (or `kvtier help COMMAND`) describes each command.\n"
         "exit codes: 0 ok, 1 runtime failure, 2 bad usage or config, 3 bad input data\n";
}

int run(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty()) {  // a usage error: the usage goes to stderr, as errors do
    print_usage(std::cerr);
    return static_cast<int>(ExitCode::kUsageOrConfig);
  }
  // `kvtier help COMMAND [SUBCOMMAND]` is `kvtier COMMAND [SUBCOMMAND] --help`.
  if (args.size() >= 2 && args.front() == "help") {
    args.erase(args.begin());
    args.emplace_back("--help");
  }
  if (args.front() == "--help" || args.front() == "-h" || args.front() == "help") {
    print_usage(std::cout);
    return 0;
  }
  if (args.front() == "--version") {
    std::cout << kvtier::app::version_line() << "\n";
    return 0;
  }
  const auto found = commands().find(args.front());
  if (found == commands().end()) {
    throw kvtier::ConfigError("unknown command '" + args.front() + "' (see kvtier --help)");
  }
  const kvtier::config::PresetRegistry presets(kvtier::config::builtin_preset_files());
  const kvtier::config::ConfigLoader loader(presets);
  kvtier::app::Context context{std::cout, presets, loader};
  return found->second.run(kvtier::app::Arguments(args.begin() + 1, args.end()), context);
}

}  // namespace

int main(int argc, char** argv) {
  kvtier::install_interrupt_cleanup();
  try {
    const int code = run(argc, argv);
    std::cout.flush();
    if (!std::cout) {
      std::cerr << "kvtier: error: cannot write to standard output\n";
      return static_cast<int>(ExitCode::kRuntimeFailure);
    }
    return code;
  } catch (...) {
    return kvtier::app::report_failure(std::current_exception());
  }
}
