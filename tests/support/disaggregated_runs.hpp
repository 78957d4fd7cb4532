#pragma once
// The quickstart run as a disaggregated cluster, with or without a tier policy, for tests of
// prefill and decode pools.

#include <string>
#include <vector>

#include "configs/schema/run.pb.h"
#include "hwmodels/link_math.hpp"
#include "hwmodels/model_shape.hpp"
#include "replay/parameters.hpp"
#include "serving/cluster.hpp"
#include "serving/tier_demand.hpp"
#include "serving/tier_timing.hpp"
#include "serving/workload.hpp"
#include "sim/simulator.hpp"
#include "sim/tick.hpp"
#include "tests/support/config_fixture.hpp"
#include "tests/support/tiered_runs.hpp"

namespace kvtier::test {

// The quickstart run of `engines` engines, `prefill` of them prefilling, joined by InfiniBand
// NDR, with `extra` sets.
inline config::RunSpec split_run(std::uint32_t engines, std::uint32_t prefill,
                                 const std::vector<std::string>& extra = {}) {
  std::vector<std::string> sets = {
      "cluster.engines=" + std::to_string(engines), "cluster.routing=ROUND_ROBIN",
      "cluster.disaggregation.prefill_engines=" + std::to_string(prefill),
      "cluster.disaggregation.decode_routing=LEAST_OUTSTANDING",
      "cluster.disaggregation.kv_link.preset=InfiniBand-NDR"};
  sets.insert(sets.end(), extra.begin(), extra.end());
  return load_spec<config::RunSpec>(quickstart_run(), sets);
}

// `copies` copies moving `bytes` over `link` (a disaggregation's kv_link), one after another.
inline sim::Tick kv_link_copies(const config::LinkSpec& link, double bytes,
                                std::uint64_t copies = 1) {
  return serving::swap_time(
      bytes, copies, hw::asymptotic_gb_per_s(link, config::PEER) * 1e9,
      sim::from_microseconds(link.per_copy_overhead_us(), sim::Rounding::kUp));
}

// The same over `run`'s kv_link (run.cluster.disaggregation).
inline sim::Tick kv_link_copies(const config::RunSpec& run, double bytes,
                                std::uint64_t copies = 1) {
  return kv_link_copies(run.cluster().disaggregation().kv_link(), bytes, copies);
}

// split_run's cluster of one prefill and two decode engines with a tier block, serving `policy`
// (a policy string: "tiered:hbm=0.3,...").
inline config::RunSpec tiered_split(const std::string& policy,
                                    const std::vector<std::string>& extra = {}) {
  std::vector<std::string> sets = kTieringSets;
  sets.insert(sets.end(), extra.begin(), extra.end());
  config::RunSpec run = split_run(3, 1, sets);
  *run.mutable_policy() = replay::parse_policy_string(policy);
  return run;
}

// A cluster that has served `workload` under `run`'s policy, with its demand.
struct TieredServed {
  TieredServed(const config::RunSpec& run, const serving::Workload& workload)
      : tiers(run, run.policy(), workload), cluster(simulator, run, workload, &tiers) {
    cluster.start();
    simulator.run();
  }
  serving::TierDemand tiers;
  sim::Simulator simulator;
  serving::Cluster cluster;
};

// One token in one layer on one GPU of `run`: its bytes at full precision and in the T2 format of
// `tiers`' policy.
struct TokenLayerBytes {
  double full = 0.0;
  double compressed = 0.0;
};

inline double full_token_layer_bytes(const config::RunSpec& run) {
  return hw::kv_bytes_per_token_per_layer_per_gpu(run.model(), run.tensor_parallel_degree(),
                                                  hw::AttentionSplit::kHeads);
}

inline TokenLayerBytes token_layer_bytes(const config::RunSpec& run,
                                         const serving::TierDemand& tiers) {
  const auto vectors = hw::kv_vectors_per_token_per_layer(run.model());
  return {full_token_layer_bytes(run),
          tiers.compressed_format().vectors_bytes(static_cast<double>(vectors.count),
                                                  static_cast<double>(vectors.width))};
}

// What request 0's decode step attending `context` tokens copies into HBM (its T1 whole, its T2,
// its promotions) and out of it (its offloads), over every layer.
struct StepCopies {
  double in = 0.0;
  double out = 0.0;
};

// Of those, the policy step's moves alone: its promotions (in) and its offloads (out).
inline StepCopies step_moves(const config::RunSpec& run, const serving::TierDemand& tiers,
                             std::uint64_t context) {
  const TokenLayerBytes bytes = token_layer_bytes(run, tiers);
  StepCopies moves;
  for (std::uint32_t layer = 0; layer < run.model().num_hidden_layers(); ++layer) {
    const serving::LayerDemand step = tiers.at(0, context, layer, true);
    moves.in += (step.promoted - step.promoted_from_compressed) * bytes.full +
                step.promoted_from_compressed * bytes.compressed;
    moves.out += step.demoted * bytes.full + step.compressed_from_hbm * bytes.compressed;
  }
  return moves;
}

inline StepCopies step_copies(const config::RunSpec& run, const serving::TierDemand& tiers,
                              std::uint64_t context) {
  const TokenLayerBytes bytes = token_layer_bytes(run, tiers);
  StepCopies copies = step_moves(run, tiers, context);
  for (std::uint32_t layer = 0; layer < run.model().num_hidden_layers(); ++layer) {
    const serving::LayerDemand step = tiers.at(0, context, layer, true);
    copies.in += step.host * bytes.full + step.compressed * bytes.compressed;
  }
  return copies;
}

}  // namespace kvtier::test
