#pragma once
// `kvtier plan --layouts`: the same plan for several splits of an engine over tensor
// parallelism and pipeline stages, or of a cluster's GPUs into engines or into prefill and
// decode pools, side by side, and the best of them per GPU.

#include <ostream>
#include <string>
#include <vector>

#include "apps/cli.hpp"
#include "configs/loader.hpp"
#include "configs/schema/run.pb.h"
#include "serving/demand_memo.hpp"
#include "serving/plan.hpp"

namespace kvtier::app {

struct LayoutPlan {
  serving::Layout layout;
  // Why the model or hardware cannot take it (the config check's first problem, or the
  // planner's refusal); empty when it was planned.
  std::string refused;
  std::vector<serving::PlanResult> results;  // one per policy, in the run's order
};

// Plans each policy of `run` (runs_per_policy) on each layout in turn, after the options' checks
// (check_plan_options). A layout the config check refuses, or whose weights leave no room for
// KV, is listed with its reason, not planned; any other ConfigError of a layout's plan is the
// command's, naming the layout.
[[nodiscard]] std::vector<LayoutPlan> plan_layouts(const config::RunSpec& run,
                                                   const std::vector<serving::Layout>& layouts,
                                                   const serving::PlanOptions& options,
                                                   const config::ConfigLoader& loader,
                                                   const config::LocationMap& locations,
                                                   serving::DemandMemo& memo);

// For each policy, the layout whose engine serves the most output tokens/s per GPU within the
// SLOs (index into `plans`; -1 when none serves any load), the first such on a tie.
[[nodiscard]] std::vector<int> best_layouts_per_gpu(const std::vector<LayoutPlan>& plans,
                                                    std::size_t policies);
// For each policy, the layout that serves a target with the fewest GPUs (the most output tokens/s
// per GPU among those, then the first); -1 when none serves any load.
[[nodiscard]] std::vector<int> fewest_gpu_layouts(const std::vector<LayoutPlan>& plans,
                                                  std::size_t policies);

// The answer in `format`: a row per layout and policy, the refused layouts with their reasons,
// the best layout per GPU for each policy and, with a target, the one needing fewest GPUs.
void write_layout_plans(const std::vector<LayoutPlan>& plans,
                        const std::vector<std::string>& policy_names, const config::RunSpec& run,
                        const serving::PlanOptions& options, const std::string& slo_text,
                        const std::string& file, Format format, std::ostream& out);

}  // namespace kvtier::app
