// `kvtier plan RUN --slo ... [--policy P] [--compare ...] [--target-tokens-per-s X]
// [--target-requests-per-s R]`: capacity planning with the simulator (serving/plan.hpp), of
// the batch for a closed loop and of the arrival rate for open-loop workloads.

#include <filesystem>
#include <optional>

#include "apps/cli.hpp"
#include "apps/plan_layouts.hpp"
#include "apps/plan_report.hpp"
#include "common/errors.hpp"
#include "common/text_output.hpp"
#include "configs/schema/run.pb.h"
#include "configs/validate.hpp"
#include "serving/demand_memo.hpp"
#include "serving/memory_plan.hpp"
#include "serving/plan.hpp"

namespace kvtier::app {
namespace {

namespace po = boost::program_options;

// The option's value, or nullopt when it is absent (plan_capacity checks a target's value).
std::optional<double> optional_number(const po::variables_map& values, const char* name) {
  return values.count(name) != 0U ? std::optional<double>(values[name].as<double>()) : std::nullopt;
}

}  // namespace

int run_plan(const Arguments& args, Context& context) {
  po::options_description options("plan options");
  options.add_options()("run", po::value<std::string>()->required(), "RunSpec file")(
      "slo", po::value<std::string>()->required(),
      "latency objectives, e.g. tpot_p99=50ms,ttft_p99=2s")(
      "policy", po::value<std::string>(), "plan this policy instead of the run's")(
      "compare", po::value<std::string>(),
      "also plan these policies, e.g. full,tiered:hbm=0.5,evict=0.1")(
      "target-tokens-per-s", po::value<double>(),
      "output tokens/s to serve: how many engines, GPUs and nodes it needs")(
      "target-requests-per-s", po::value<double>(),
      "requests/s to serve: how many engines, GPUs and nodes it needs")(
      "rounds", po::value<std::uint32_t>()->default_value(3),
      "closed loop: requests per batch slot (num_requests = rounds x batch)")(
      "rate-precision", po::value<double>()->default_value(0.01),
      "open loop: stop when the smallest rate missing an SLO is within this share above the "
      "largest meeting them")(
      "layouts", po::value<std::string>(),
      "plan each of these splits of an engine instead of the run's own: TPxSTAGES,... (e.g. "
      "16x1,8x2); for a run with a cluster also its engines, N@TPxSTAGES (e.g. 4@2x1, each "
      "engine prefilling and decoding), and for a disaggregated run its pools, "
      "P@TPxSTAGES+D@TPxSTAGES, prefill engines + decode engines (e.g. 2@4x1+1@8x1); or auto "
      "(every power-of-two "
      "split the hardware's GPUs hold; with a cluster, as many engines as they hold and, for a "
      "disaggregated run, every pair of one-stage pools that takes them all); a split the "
      "model or hardware cannot take is listed with the reason");
  add_format_option(options, true);
  add_set_option(options);
  po::positional_options_description positional;
  positional.add("run", 1);
  po::variables_map values;
  if (!parse_arguments(
          args, options, positional, values,
          "usage: kvtier plan RUN --slo METRIC=LIMIT[,...] [--policy P] [--compare P1,P2,...] "
          "[--target-tokens-per-s X] [--target-requests-per-s R] [--rounds N | "
          "--rate-precision F] [--layouts TPxSTAGES,...|N@TPxSTAGES,...|"
          "P@TPxSTAGES+D@TPxSTAGES,...|auto] "
          "[--set PATH=VALUE]... "
          "[--format text|json|html]\n\n"
          "For each policy, the largest load one engine (a TP group, or its pipeline stages) "
          "serves while meeting the "
          "SLOs, found by bisection with the simulator: with a closed_loop workload the batch, "
          "over closed-loop runs of RUN's request shape; with a poisson or request_file "
          "workload the arrival rate, over RUN's own requests arriving faster or slower (an "
          "SLO on ttft, queue_wait or e2e_latency is then required). Also what binds it (HBM, "
          "DDR, PCIe, host recodes, compute or the batch cap); throughput per engine, GPU and "
          "node; and with targets, the engines, GPUs and nodes that serve them. A run with a "
          "cluster (run.cluster) is planned whole, its router included, by its arrival rate. With "
          "--layouts, each split of an engine over tensor parallelism and pipeline stages (or of "
          "a cluster's GPUs into engines, or into prefill and decode pools) is planned in turn, "
          "and "
          "the best per GPU (with a target, the fewest GPUs) named.",
          context.out)) {
    return 0;
  }
  const Format format = format_from(values, true);  // refused before the search, not after it
  const std::string file = values["run"].as<std::string>();
  config::RunSpec run;
  // Validated once --policy and --compare have edited it, as sim does.
  const config::LocationMap locations =
      context.loader.resolve_file(file, run, overrides_from(values));
  apply_policy_options(values, run);
  if (const auto problems = config::validate(run, context.loader, locations); !problems.empty()) {
    throw config::InvalidConfig(problems, locations);
  }
  check_run_policies(run, locations, &values);
  // Traces (and a request file) are found beside the config that names them, as sim finds them.
  config::resolve_run_paths(run, file);
  serving::PlanOptions plan;
  plan.slos = serving::parse_slos(values["slo"].as<std::string>());
  plan.rounds = values["rounds"].as<std::uint32_t>();
  plan.rate_precision = values["rate-precision"].as<double>();
  const bool closed_loop = run.workload().has_closed_loop();
  if (closed_loop && !values["rate-precision"].defaulted()) {
    throw ConfigError(
        "--rate-precision applies to open-loop workloads (poisson, request_file), "
        "whose arrival rate plan searches; this run's is a closed_loop");
  }
  if (!closed_loop && !values["rounds"].defaulted()) {
    throw ConfigError(
        "--rounds applies to closed_loop workloads, whose batch plan searches; "
        "this run's arrivals are open-loop (its own requests are replayed)");
  }
  plan.target_output_tokens_per_s = optional_number(values, "target-tokens-per-s");
  plan.target_requests_per_s = optional_number(values, "target-requests-per-s");
  const bool with_target = plan.has_target();
  serving::DemandMemo memo;
  if (values.count("layouts") != 0U) {
    const std::vector<LayoutPlan> plans =
        plan_layouts(run, serving::parse_layouts(values["layouts"].as<std::string>(), run), plan,
                     context.loader, locations, memo);
    write_layout_plans(plans, serving::policy_names(run), run, plan,
                       values["slo"].as<std::string>(), file, format, context.out);
    return 0;
  }
  std::vector<serving::PlanResult> results;
  for (const config::RunSpec& alone : serving::runs_per_policy(run)) {
    results.push_back(serving::plan_capacity(alone, plan, &memo));
  }

  if (format == Format::kHtml) {
    context.out << plan_html(results, serving::policy_names(run), run, plan, file, version_line(),
                             serving::describe_engines(run));
    return 0;
  }
  if (format == Format::kJson) {
    context.out << "{\"run\": " << json_escape(file) << ", \"plans\": [";
    for (std::size_t i = 0; i < results.size(); ++i) {
      context.out << (i == 0 ? "" : ", ")
                  << plan_json(results[i], plan.slos, with_target, run.has_cluster());
    }
    context.out << "]}\n";
    return 0;
  }
  write_plan_header(context.out, file, run, serving::describe_engines(run),
                    values["slo"].as<std::string>(), plan);
  const PlanTable answer = plan_table(results, closed_loop, with_target);
  TextTable table(answer.header);
  for (const auto& row : answer.rows) {
    table.add_row(row);
  }
  table.render(context.out);
  for (const auto& result : results) {
    for (const std::string& note : result.notes) {
      context.out << "\nnote (" << result.policy << "): " << note << "\n";
    }
  }
  return 0;
}

}  // namespace kvtier::app
