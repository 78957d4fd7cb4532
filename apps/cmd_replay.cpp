// `kvtier replay run|search-budgets`: policies over attention traces (docs/REPLAY.md).

#include "apps/cli.hpp"
#include "common/errors.hpp"

namespace kvtier::app {

int run_replay(const Arguments& args, Context& context) {
  if (args.empty()) {
    throw ConfigError(
        "replay needs a subcommand: run or search-budgets (see kvtier replay --help)");
  }
  if (args.front() == "--help" || args.front() == "-h") {
    context.out << "usage: kvtier replay run --trace FILE --policy POLICY [OPTIONS]\n"
                   "       kvtier replay search-budgets --traces FILE... --base-policy NAME "
                   "[OPTIONS]\n\n"
                   "Replays KV policies over attention traces: where every token lives at every "
                   "step and layer, what moves between tiers and how much attention is kept.\n"
                   "Each subcommand has its own --help.\n";
    return 0;
  }
  const Arguments rest(args.begin() + 1, args.end());
  if (args.front() == "run") {
    return run_replay_run(rest, context);
  }
  if (args.front() == "search-budgets") {
    return run_replay_search_budgets(rest, context);
  }
  throw ConfigError("unknown replay subcommand '" + args.front() +
                    "': expected run or search-budgets");
}

}  // namespace kvtier::app
