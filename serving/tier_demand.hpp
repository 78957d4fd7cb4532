#pragma once
// A tier policy's demand for every request of a run: the policy replayed over the run's traces
// (or over a synthetic trace when the run names none), projected onto the simulated model.
//
// Projection (DESIGN.md §2): target layer l reads source layer round(l·(Ls−1)/(Lt−1)); token
// positions map 1:1, so a decode step that attends c tokens reads the trace step whose row has
// c entries (t = c − prompt − 1). A request shorter than its trace's prompt reads step 0 with
// the counts scaled to c tokens. A request longer than its trace is a ConfigError unless the
// run sets tiering.extend_synthetic; the steps past the trace then read a synthetic trace's
// replay, and the report gives their share. Requests are assigned to traces uniformly at
// random from the run's seed (stream kTraceAssignment), in request order.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "configs/schema/policy.pb.h"
#include "configs/schema/run.pb.h"
#include "replay/engine.hpp"
#include "serving/demand_memo.hpp"
#include "serving/workload.hpp"

namespace kvtier::serving {

// One request's tokens in one layer at one decode step, by tier, and what moved at that step.
struct LayerDemand {
  double hbm = 0.0;
  double host = 0.0;        // T1: full precision in host memory, prefetched for attention
  double compressed = 0.0;  // T2: compressed in host memory
  double evicted = 0.0;
  double newly_host = 0.0;  // tokens that entered T1 at this step
  double demoted = 0.0;     // HBM -> host at this step
  double promoted = 0.0;    // host -> HBM at this step (copied in at full precision)
  double compressed_moves = 0.0;
};

// What admission reserves for a request over its whole life, in token-layers (Σ over target
// layers of tokens): upper bounds from the replay's running maxima.
struct RequestPeaks {
  double hbm_token_layers = 0.0;
  double host_token_layers = 0.0;        // T1
  double compressed_token_layers = 0.0;  // T2
  double staged_tokens = 0.0;  // the most T1 + T2 tokens one layer must stage for attention
};

// One replayed trace.
struct ReplayedTrace {
  std::string source;  // file name, or the synthetic trace's description
  std::uint64_t prompt_tokens = 0;
  std::uint64_t steps = 0;
  std::vector<std::uint32_t> layer_map;  // target layer -> source layer
  std::shared_ptr<const MemoDemand> replayed;
  replay::ReplaySummary summary;
  [[nodiscard]] const replay::ReplayDemand& demand() const { return replayed->demand; }
  // Running maxima over steps, per step: Σ over target layers of T0, T1, T2 tokens, and the
  // largest T1 + T2 of any layer.
  std::vector<double> max_hbm;
  std::vector<double> max_host;
  std::vector<double> max_compressed;
  std::vector<double> max_staged;
};

class TierDemand {
 public:
  // Replays `policy` (not `full`) for every trace the run's tiering names, or takes the
  // demand from `memo` when an earlier simulation of this process replayed it (null: no
  // sharing); ConfigError for an unknown policy, a trace too short without extend_synthetic;
  // DataError for a bad trace.
  TierDemand(const config::RunSpec& run, const config::PolicySpec& policy, const Workload& workload,
             DemandMemo* memo = nullptr);
  TierDemand(const TierDemand&) = delete;
  TierDemand& operator=(const TierDemand&) = delete;
  ~TierDemand();

  // "tiered:hbm=0.5,evict=0.1,..." with every parameter.
  [[nodiscard]] const std::string& policy() const noexcept { return canonical_; }
  // The policy moves only tokens newly placed in T1 each step (`prefetch=differential`),
  // rather than all of T1.
  [[nodiscard]] bool differential_prefetch() const noexcept { return differential_; }
  [[nodiscard]] double compressed_bits() const noexcept { return compressed_bits_; }

  [[nodiscard]] LayerDemand at(std::uint32_t request, std::uint64_t context,
                               std::uint32_t layer) const;
  [[nodiscard]] const RequestPeaks& peaks(std::uint32_t request) const {
    return peaks_.at(request);
  }

  [[nodiscard]] const std::vector<ReplayedTrace>& traces() const noexcept { return traces_; }
  [[nodiscard]] bool synthetic() const noexcept { return synthetic_only_; }
  // Mean attention mass kept over requests (each weighted by its decode steps), and the worst
  // step-layer of any trace used.
  [[nodiscard]] double mean_kept_mass() const noexcept { return mean_kept_; }
  [[nodiscard]] double min_kept_mass() const noexcept { return min_kept_; }
  // Share of all requests' decode steps read from the synthetic extension.
  [[nodiscard]] double synthetic_tail_fraction() const noexcept { return tail_fraction_; }
  // Traces whose demand came from the cache folder rather than a replay.
  [[nodiscard]] std::uint32_t cache_hits() const noexcept { return cache_hits_; }

 private:
  struct Assignment {
    std::uint32_t trace = 0;
    std::uint64_t prompt = 0;
  };
  void add_demand(std::string source, std::shared_ptr<const MemoDemand> replayed,
                  std::uint32_t target_layers);
  [[nodiscard]] RequestPeaks request_peaks(const Assignment& assignment,
                                           const RequestSpec& request) const;

  std::string canonical_;
  bool differential_ = false;
  double compressed_bits_ = 8.0;
  std::vector<ReplayedTrace> traces_;
  std::uint32_t tail_trace_ = UINT32_MAX;  // synthetic extension, when used
  bool synthetic_only_ = false;
  std::vector<Assignment> assignment_;
  std::vector<RequestPeaks> peaks_;
  double mean_kept_ = 1.0;
  double min_kept_ = 1.0;
  double tail_fraction_ = 0.0;
  std::uint32_t cache_hits_ = 0;
};

}  // namespace kvtier::serving
