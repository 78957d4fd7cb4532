#pragma once
// A sweep that plans (SweepSpec.plan): each point and policy planned as `kvtier plan` plans a
// run (serving/plan.hpp), its row the plan's figures and the run's metrics at the planned load.

#include <cstdint>
#include <string>
#include <vector>

#include "configs/schema/sweep.pb.h"
#include "configs/validate.hpp"
#include "serving/demand_memo.hpp"
#include "serving/plan.hpp"
#include "sweep/sweep.hpp"

namespace kvtier::sweep {

// The plan's options as `kvtier plan` takes them: --rounds 3 and --rate-precision 0.01 where the
// spec gives none.
[[nodiscard]] serving::PlanOptions plan_options(const config::SweepPlan& plan);

// The plan block's problems against the base run (none added when the schema found some in the
// block already): SLOs that do not parse, options that do not apply to the base's workload
// (rounds for an open loop, rate_precision for a closed one) or that the planner refuses, and
// axes on a field the plan searches itself (a closed loop's concurrency and num_requests, an
// open loop's rate_per_s or time_scale).
void check_sweep_plan(const config::SweepSpec& spec, std::vector<config::Problem>& problems);

// One row per policy of `run` (point `point`, its axis values `values`): plan_* figures (of one
// engine; a cluster's whole rate too, plan_cluster_max_requests_per_s), then the metrics of the run
// at the planned load. A policy that serves no load within the SLOs (or whose requests do not
// fit) is a row whose error says what binds it; one the planner refuses, a row with the refusal.
[[nodiscard]] std::vector<Row> plan_rows(const config::SweepPlan& plan, const config::RunSpec& run,
                                         std::uint64_t point,
                                         const std::vector<std::string>& values,
                                         serving::DemandMemo& memo);

}  // namespace kvtier::sweep
