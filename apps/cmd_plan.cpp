// `kvtier plan RUN --slo ... [--policy P] [--compare ...] [--target-tokens-per-s X]
// [--target-requests-per-s R]`: capacity planning with the simulator (serving/plan.hpp), of
// the batch for a closed loop and of the arrival rate for open-loop workloads.

#include <filesystem>
#include <optional>

#include "apps/cli.hpp"
#include "apps/plan_report.hpp"
#include "common/errors.hpp"
#include "common/text_output.hpp"
#include "configs/schema/run.pb.h"
#include "configs/validate.hpp"
#include "replay/parameters.hpp"
#include "serving/demand_memo.hpp"
#include "serving/memory_plan.hpp"
#include "serving/plan.hpp"

namespace kvtier::app {
namespace {

namespace po = boost::program_options;

std::string json_result(const serving::PlanResult& result, const std::vector<serving::Slo>& slos,
                        bool with_target, bool cluster) {
  const bool rate = result.search == serving::PlanSearch::kRate;
  std::string json = "{\"policy\": " + json_escape(result.policy);
  if (rate) {
    json += ", \"max_requests_per_s\": " + format_double(result.requests_per_s_per_engine) +
            ", \"infeasible_requests_per_s\": " + format_double(result.infeasible_requests_per_s) +
            ", \"max_running_requests\": " + std::to_string(result.max_batch);
    if (cluster) {
      json += ", \"cluster_engines\": " + std::to_string(result.cluster_engines) +
              ", \"cluster_max_requests_per_s\": " + format_double(result.cluster_requests_per_s);
    }
  } else {
    json += ", \"max_batch\": " + std::to_string(result.max_batch) +
            ", \"requests_per_s_per_engine\": " + format_double(result.requests_per_s_per_engine);
  }
  json +=
      ", \"binding\": " + json_escape(result.binding) + ", \"output_tokens_per_s_per_engine\": " +
      format_double(result.output_tokens_per_s_per_engine) +
      ", \"output_tokens_per_s_per_gpu\": " + format_double(result.output_tokens_per_s_per_gpu) +
      ", \"output_tokens_per_s_per_node\": " + format_double(result.output_tokens_per_s_per_node) +
      ", \"evaluations\": " + std::to_string(result.evaluations);
  if (with_target && !serving::serves_any(result)) {  // no engine meets the SLOs: none serves it
    json += R"(, "engines": null, "gpus": null, "nodes": null)";
  } else if (with_target) {
    json += ", \"engines\": " + std::to_string(result.engines) +
            ", \"gpus\": " + std::to_string(result.gpus) +
            ", \"nodes\": " + std::to_string(result.nodes);
  }
  json += ", \"notes\": [";
  for (std::size_t i = 0; i < result.notes.size(); ++i) {
    json += (i == 0 ? "" : ", ") + json_escape(result.notes[i]);
  }
  json += "], \"metrics\": {";
  for (std::size_t i = 0; i < result.metrics.size(); ++i) {
    json += (i == 0 ? "" : ", ") + json_escape(result.metrics[i].name) + ": " +
            format_double(result.metrics[i].value);
  }
  json += "}, \"probes\": [";
  for (std::size_t p = 0; p < result.probes.size(); ++p) {
    const serving::PlanProbe& probe = result.probes[p];
    json += std::string(p == 0 ? "" : ", ") + "{\"load\": " + format_double(probe.load) +
            ", \"feasible\": " + (probe.feasible ? "true" : "false") +
            ", \"binding\": " + json_escape(probe.binding) + ", \"slos_ms\": {";
    for (std::size_t s = 0; s < slos.size(); ++s) {
      json += (s == 0 ? "" : ", ") + json_escape(slos[s].metric) + ": " +
              json_number_or_null(probe.slo_values_ms[s]);
    }
    json += "}, \"output_tokens_per_s\": " + json_number_or_null(probe.output_tokens_per_s) + "}";
  }
  return json + "]}";
}

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
      "largest meeting them");
  add_format_option(options, true);
  add_set_option(options);
  po::positional_options_description positional;
  positional.add("run", 1);
  po::variables_map values;
  if (!parse_arguments(
          args, options, positional, values,
          "usage: kvtier plan RUN --slo METRIC=LIMIT[,...] [--policy P] [--compare P1,P2,...] "
          "[--target-tokens-per-s X] [--target-requests-per-s R] [--rounds N | "
          "--rate-precision F] [--set PATH=VALUE]... [--format text|json|html]\n\n"
          "For each policy, the largest load one engine (a TP group, or its pipeline stages) "
          "serves while meeting the "
          "SLOs, found by bisection with the simulator: with a closed_loop workload the batch, "
          "over closed-loop runs of RUN's request shape; with a poisson or request_file "
          "workload the arrival rate, over RUN's own requests arriving faster or slower (an "
          "SLO on ttft, queue_wait or e2e_latency is then required). Also what binds it (HBM, "
          "DDR, PCIe, host recodes, compute or the batch cap); throughput per engine, GPU and "
          "node; and with targets, the engines, GPUs and nodes that serve them. A run with a "
          "cluster (run.cluster) is planned whole, its router included, by its arrival rate.",
          context.out)) {
    return 0;
  }
  const Format format = format_from(values, true);  // refused before the search, not after it
  const std::string file = values["run"].as<std::string>();
  config::RunSpec run;
  const config::LocationMap locations = context.loader.load_file(file, run, overrides_from(values));
  if (values.count("policy") != 0U) {
    *run.mutable_policy() = replay::parse_policy_string(values["policy"].as<std::string>());
  }
  if (values.count("compare") != 0U) {
    run.clear_compare();
    for (auto& spec : parse_policy_list(values["compare"].as<std::string>())) {
      *run.add_compare() = std::move(spec);
    }
  }
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
  std::vector<config::PolicySpec> policies{run.policy()};
  policies.insert(policies.end(), run.compare().begin(), run.compare().end());

  serving::DemandMemo memo;
  std::vector<serving::PlanResult> results;
  for (const config::PolicySpec& policy : policies) {
    config::RunSpec variant = run;
    *variant.mutable_policy() = policy;
    variant.clear_compare();
    results.push_back(serving::plan_capacity(variant, plan, &memo));
  }

  const bool with_target =
      plan.target_output_tokens_per_s.has_value() || plan.target_requests_per_s.has_value();
  if (format == Format::kHtml) {
    context.out << plan_html(results, serving::policy_names(run), run, plan, file, version_line());
    return 0;
  }
  if (format == Format::kJson) {
    context.out << "{\"run\": " << json_escape(file) << ", \"plans\": [";
    for (std::size_t i = 0; i < results.size(); ++i) {
      context.out << (i == 0 ? "" : ", ")
                  << json_result(results[i], plan.slos, with_target, run.has_cluster());
    }
    context.out << "]}\n";
    return 0;
  }
  context.out << "kvtier plan: " << file << "\n  " << run.model().name() << " on "
              << run.hardware().node().gpu().name() << ", " << serving::describe_parallelism(run)
              << ", SLO " << values["slo"].as<std::string>() << "\n  "
              << (closed_loop ? "largest batch (closed loop of the run's request shape)"
                              : "largest arrival rate (the run's requests, arriving faster or "
                                "slower; precision " +
                                    format_double(plan.rate_precision) + ")")
              << "\n";
  if (run.has_cluster()) {
    context.out << "  of a cluster of " << run.cluster().engines() << " engines routed "
                << config::Routing_Name(run.cluster().routing())
                << ": per-engine figures are a share of the cluster's, engines come in whole "
                   "clusters\n";
  }
  context.out << "\n";
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
