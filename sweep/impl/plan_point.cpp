#include "sweep/impl/plan_point.hpp"

#include <algorithm>
#include <cmath>

#include "common/errors.hpp"
#include "common/text_output.hpp"
#include "replay/parameters.hpp"

namespace kvtier::sweep {

serving::PlanOptions plan_options(const config::SweepPlan& plan) {
  serving::PlanOptions options;
  options.slos = serving::parse_slos(plan.slo());
  if (plan.has_rounds()) {
    options.rounds = plan.rounds();
  }
  if (plan.has_rate_precision()) {
    options.rate_precision = plan.rate_precision();
  }
  if (plan.has_target_output_tokens_per_s()) {
    options.target_output_tokens_per_s = plan.target_output_tokens_per_s();
  }
  if (plan.has_target_requests_per_s()) {
    options.target_requests_per_s = plan.target_requests_per_s();
  }
  return options;
}

void check_sweep_plan(const config::SweepSpec& spec, std::vector<config::Problem>& problems) {
  if (!spec.has_plan()) {
    return;
  }
  // The schema's own problems with the block (a missing slo, a value out of range) are reported
  // already: one line for each.
  if (std::any_of(problems.begin(), problems.end(), [](const config::Problem& problem) {
        return problem.path.rfind("plan", 0) == 0;
      })) {
    return;
  }
  const config::SweepPlan& plan = spec.plan();
  serving::PlanOptions options;
  try {
    options = plan_options(plan);
  } catch (const ConfigError& error) {
    problems.push_back({"plan.slo", error.what()});
    return;
  }
  const config::WorkloadSpec& workload = spec.base().workload();
  const bool closed_loop = workload.has_closed_loop();
  if (closed_loop && plan.has_rate_precision()) {
    problems.push_back({"plan.rate_precision",
                        "rate_precision applies to open-loop workloads (poisson, request_file); "
                        "the base run's is a closed_loop"});
  }
  if (!closed_loop && plan.has_rounds()) {
    problems.push_back({"plan.rounds",
                        "rounds applies to closed_loop workloads; the base run's arrivals are "
                        "open-loop"});
  }
  // The load the plan searches replaces these fields at every probe: an axis on one would give
  // the same rows at each of its values.
  const std::vector<std::string> searched =
      closed_loop ? std::vector<std::string>{"workload.closed_loop.concurrency",
                                             "workload.closed_loop.num_requests"}
                  : std::vector<std::string>{"workload.poisson.rate_per_s",
                                             "workload.request_file.time_scale"};
  for (int a = 0; a < spec.axis_size(); ++a) {
    if (std::find(searched.begin(), searched.end(), spec.axis(a).path()) != searched.end()) {
      problems.push_back({"axis[" + std::to_string(a) + "].path",
                          "a sweep that plans searches " + spec.axis(a).path() +
                              " itself at every point: sweep another field"});
    }
  }
  try {
    serving::check_plan_options(spec.base(), options);
  } catch (const ConfigError& error) {
    problems.push_back({"plan", error.what()});
  }
}

std::vector<Row> plan_rows(const config::SweepPlan& plan, const config::RunSpec& run,
                           std::uint64_t point, const std::vector<std::string>& values,
                           serving::DemandMemo& memo) {
  const serving::PlanOptions options = plan_options(plan);
  const bool target = options.has_target();
  std::vector<Row> rows;
  for (const config::RunSpec& alone : serving::runs_per_policy(run)) {
    serving::PlanResult result;
    try {
      result = serving::plan_capacity(alone, options, &memo);
    } catch (const ConfigError& error) {
      // This policy's refusal (a workload too short to load one engine): its row alone.
      rows.push_back(Row{point, values, replay::policy_string(alone.policy()), error.what(), {}});
      continue;
    }
    if (!serving::serves_any(result)) {
      // No load meets the SLOs, or not even one request fits: what binds it, as an error.
      rows.push_back(
          Row{point, values, result.policy, "no load within the SLOs: " + result.binding, {}});
      continue;
    }
    Row row{point, values, result.policy, {}, {}};
    const auto add = [&row](const char* name, double value) {
      row.metrics.emplace_back(name, format_double(value));
    };
    if (result.search == serving::PlanSearch::kBatch) {
      add("plan_max_batch", result.max_batch);
      add("plan_requests_per_s_per_engine", result.requests_per_s_per_engine);
    } else {
      add("plan_max_requests_per_s", result.requests_per_s_per_engine);
      if (run.has_cluster()) {
        add("plan_cluster_max_requests_per_s", result.cluster_requests_per_s);
      }
      add("plan_max_running_requests", result.max_batch);
    }
    add("plan_output_tokens_per_s_per_engine", result.output_tokens_per_s_per_engine);
    add("plan_output_tokens_per_s_per_gpu", result.output_tokens_per_s_per_gpu);
    add("plan_output_tokens_per_s_per_node", result.output_tokens_per_s_per_node);
    if (target) {
      add("plan_engines", static_cast<double>(result.engines));
      add("plan_gpus", static_cast<double>(result.gpus));
      add("plan_nodes", static_cast<double>(result.nodes));
    }
    add("plan_evaluations", result.evaluations);
    for (const serving::Metric& metric : result.metrics) {
      if (!std::isnan(metric.value)) {
        row.metrics.emplace_back(metric.name, format_double(metric.value));
      }
    }
    rows.push_back(std::move(row));
  }
  return rows;
}

}  // namespace kvtier::sweep
