#pragma once
// What a serving report reads of the engines it covers: one engine's own figures, or a
// cluster's merged (totals summed, peaks the highest engine's, time averages the engines' mean,
// latencies over every request), and the metrics made of them.

#include <optional>
#include <string>
#include <vector>

#include "configs/schema/run.pb.h"
#include "serving/cluster.hpp"
#include "serving/engine.hpp"
#include "serving/simulation.hpp"
#include "sim/stats.hpp"

namespace kvtier::serving {

struct Figures {
  ServingTotals totals;
  // Engines covered: per-GPU rates and utilisations are of the mean engine.
  double engines = 1.0;
  sim::LatencyDistribution ttft;
  sim::LatencyDistribution tpot;
  sim::LatencyDistribution e2e;
  sim::LatencyDistribution queue_wait;
  sim::LatencyDistribution iteration;
  double kv_used_peak = 0.0;
  double kv_used_mean = 0.0;
  // With data-parallel dispatch, the most KV one GPU held (ServingEngine::busiest_gpu_kv_peak).
  std::optional<double> busiest_gpu_kv_peak;
  double kv_reserved_peak = 0.0;
  double full_kv_peak = 0.0;
  double full_kv_mean = 0.0;
  double host_used_peak = 0.0;
  double host_reserved_peak = 0.0;
  double swap_used_peak = 0.0;
  // The HBM high-water mark of a GPU: weights, workspace, reserve and the KV reserved at its
  // peak, the highest engine's (engines of pools split differently hold different weights).
  double hbm_peak = 0.0;
  double running_mean = 0.0;
};

[[nodiscard]] Figures figures_of(const ServingEngine& engine);
// Every engine of `cluster` merged.
[[nodiscard]] Figures figures_of(const Cluster& cluster);

// The run's policy recodes tokens between T1 and T2 but the run does not time them (no
// tiering.host_recode): its recode times have no value, and a note says why.
[[nodiscard]] bool recodes_untimed(const Figures& figures, const ServingEngine& engine);
// Speculative decoding: the tokens a decode step gave on average (0 without steps), and the
// drafter's share of the GPU time (0 without any).
[[nodiscard]] double speculative_tokens_per_step(const ServingTotals& totals);
[[nodiscard]] double draft_busy_fraction(const ServingTotals& totals);
// The report's note on them: the drafts, the tokens a step given and expected, the drafter's
// share of the GPU time.
[[nodiscard]] std::string speculative_note(const config::SpeculativeDecoding& speculative,
                                           const ServingTotals& totals);

// The report's metrics of `figures`, in the report's order (simulated_events and the cluster's
// own follow). `engine` is any engine they cover: what every engine of a run shares (memory
// plan, cost model, tier demand, the workload's shape).
[[nodiscard]] std::vector<Metric> engine_metrics(const Figures& figures,
                                                 const ServingEngine& engine,
                                                 const config::RunSpec& run);

}  // namespace kvtier::serving
