#pragma once
// A tier policy's demand for every request of a run: the policy replayed over the run's traces
// (or over a synthetic trace when the run names none), projected onto the simulated model.
//
// The target layers are the run's tiered layers (tiered_layers, memory_plan.hpp): every layer of
// the simulated model, or with hybrid attention its global layers (the windowed layers keep
// their window in HBM, outside the policy), in order.
//
// Projection (DESIGN.md §2): target layer l reads source layer round(l·(Ls−1)/(Lt−1)); token
// positions map 1:1, so a decode step that attends c tokens reads the trace step whose row has
// c entries (t = c − prompt − 1). A request whose prompt is shorter than its trace's reads the
// start placement's shares, scaled to its tokens, until it reaches the trace's first step. A
// request longer than its trace is a ConfigError unless the run sets tiering.extend_synthetic;
// the steps past the trace then read a synthetic trace's replay, and the report gives their
// share. Requests are assigned to traces uniformly at random from the run's seed (stream
// kTraceAssignment), in request order. On a sliding-window model a request attending past the
// window is a ConfigError (the window drops tokens that a trace's placement still holds),
// unless the window is hybrid attention's, which the tiered layers do not attend within.
//
// Step semantics are the live cache's (kernels/live.hpp, docs/LIVE.md): decode step t stages
// for attention the placement in force before its policy step (the previous step's, or the
// start's for step 0); then the policy observes the step and the step's moves are made. The
// prefill places the prompt as the request's first decode step finds it.

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "configs/schema/policy.pb.h"
#include "configs/schema/run.pb.h"
#include "replay/compressed_format.hpp"
#include "replay/engine.hpp"
#include "serving/demand_memo.hpp"
#include "serving/workload.hpp"

namespace kvtier::serving {

// One request's tokens in one layer at one decode step, by tier, and what moved at that step.
struct LayerDemand {
  // What the step's attention reads: the placement in force before the step's policy step, over
  // the tokens before the step's own (which is in HBM and not counted here).
  double hbm = 0.0;
  double host = 0.0;  // T1: full precision in host memory, staged for attention
  // T2: compressed in host memory, staged and dequantised; none when the policy's attention
  // leaves T2 out (Monarch's attend=hot: its cold pages are held, compressed_held, not read).
  double compressed = 0.0;
  double evicted = 0.0;
  // T2 tokens held before the step, read or not (what a prompt's placement offloads).
  double compressed_held = 0.0;
  // Of `host`, the tokens without a staged copy (what a differential prefetch copies): those
  // that entered T1 at the previous step's moves, and all of T1 at a request's first step.
  double unstaged_host = 0.0;
  // Tokens held after the step's moves, the step's own included.
  double hbm_after = 0.0;
  // Of a step that gives several tokens (TierDemand::step), the most T0 held after any of their
  // policy steps, the tokens whose policy steps are still to come beside it in HBM; hbm_after
  // for one.
  double hbm_after_most = 0.0;
  double host_after = 0.0;
  double compressed_after = 0.0;
  // The step's moves, made after its attention.
  double demoted = 0.0;   // HBM -> T1
  double promoted = 0.0;  // host (T1/T2) -> HBM
  // Of `promoted`, those from T2: their compressed bytes cross and are dequantised in HBM.
  double promoted_from_compressed = 0.0;
  // HBM -> T2 at this step, offloaded as compressed bytes.
  double compressed_from_hbm = 0.0;
  // Recoded inside host memory by the host's CPU, crossing no bus: T1 -> T2 and T2 -> T1.
  double recoded_to_compressed = 0.0;
  double recoded_to_full = 0.0;
};

// What admission reserves for a request over its whole life, in token-layers (Σ over one GPU's
// target layers of tokens: all of them, or with pipeline stages those of the stage whose sum is
// largest at that step): upper bounds from the replay's running maxima. In a paged cache
// (memory.kv_block_tokens) each layer's T0 counts in whole blocks (in_whole_blocks).
struct RequestPeaks {
  double hbm_token_layers = 0.0;
  double host_token_layers = 0.0;        // T1
  double compressed_token_layers = 0.0;  // T2
  double staged_tokens = 0.0;  // the most T1 + T2 tokens one layer must stage for attention
  // Of hbm_token_layers, the policy's placements' alone, without the prompt whole in HBM as it
  // is prefilled (what a decode engine receiving into host memory holds there).
  double placed_hbm_token_layers = 0.0;
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
  // Running maxima over the placements held, [0] the start's and [t + 1] step t's: Σ over one
  // GPU's target layers (the heaviest stage's, StageSums) of T0 (in whole blocks in a paged
  // cache), T1, T2 tokens, and the largest T1 + T2 of any layer that attention reads (T1 alone
  // when the policy leaves T2 out). Step t stages placement [t], so max_staged[t] is the most
  // any layer stages up to step t.
  std::vector<double> max_hbm;
  std::vector<double> max_host;
  std::vector<double> max_compressed;
  std::vector<double> max_staged;
};

// Sums over the target layers of one GPU. With pipeline stages a GPU holds its stage's layers
// only, so what one GPU holds is the largest of the stages' sums (with one stage, the sum).
class StageSums {
 public:
  explicit StageSums(const std::vector<std::uint32_t>& stage_of_layer)
      : stage_of_layer_(&stage_of_layer),
        sums_(stage_of_layer.empty() ? 1 : stage_of_layer.back() + 1, 0.0) {}
  void add(std::uint32_t layer, double value) { sums_[(*stage_of_layer_)[layer]] += value; }
  [[nodiscard]] double busiest() const { return *std::max_element(sums_.begin(), sums_.end()); }

 private:
  const std::vector<std::uint32_t>* stage_of_layer_;
  std::vector<double> sums_;
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
  // How the policy stores a T2 token (replay::Policy::compressed_format).
  [[nodiscard]] const replay::CompressedFormat& compressed_format() const noexcept {
    return compressed_format_;
  }

  // Request `request`'s decode step that attends `context` tokens (the step's own included), in
  // target layer `layer`; `first` when it is the request's first decode step (nothing of it is
  // staged yet). The prefill's offloads are what the first step's placement holds off HBM.
  [[nodiscard]] LayerDemand at(std::uint32_t request, std::uint64_t context, std::uint32_t layer,
                               bool first) const;
  // A decode step that gives `tokens` tokens (speculative decoding), the policy stepping once
  // for each: what attention reads is at()'s at `context` (one forward pass reads that
  // placement for every token), the moves add up (made one after another: a token moved and
  // moved back within the step crosses twice), what is held after is the last token's, and
  // hbm_after_most the most T0 any of them leaves with the tokens still to be stepped. With
  // differential prefetch the unstaged T1 tokens are those that entered T1 at any of the
  // previous step's `previous_tokens` policy steps (no attention read the placements between
  // them), no more than T1 holds. at() for one token after a step of one.
  [[nodiscard]] LayerDemand step(std::uint32_t request, std::uint64_t context, std::uint64_t tokens,
                                 std::uint64_t previous_tokens, std::uint32_t layer,
                                 bool first) const;
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
  std::vector<std::uint32_t> stage_of_layer_;  // target layer -> pipeline stage
  std::uint32_t largest_stage_layers_ = 0;
  std::uint32_t block_tokens_ = 0;  // memory.kv_block_tokens; 0: T0 counted a token at a time
  replay::CompressedFormat compressed_format_;  // set by add_demand(), from the replay
  bool attends_compressed_ = true;              // likewise (Policy::attends_compressed)
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
