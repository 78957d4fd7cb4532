#pragma once
// Drives an attention trace through a policy and records, for every step and layer, the tokens
// in each tier, what moved, and the attention mass each tier held at that step (mass on T3 is
// lost). Replay is hardware-independent: the simulator turns this demand into bytes and time.

#include <array>
#include <cstdint>
#include <span>
#include <vector>

#include "replay/attention.hpp"
#include "replay/compressed_format.hpp"
#include "replay/policy.hpp"

namespace kvtier::replay {

// One step of one layer: tokens by tier, the step's moves (as TierMoves counts them) and its
// attention mass by tier.
struct StepLayerRecord {
  std::array<std::uint32_t, kTierCount> tokens{};  // after the policy's step
  std::uint32_t promoted = 0;
  std::uint32_t demoted = 0;
  std::uint32_t compressed = 0;
  std::uint32_t evicted = 0;
  std::uint32_t newly_host = 0;
  std::uint32_t promoted_from_compressed = 0;
  std::uint32_t compressed_from_hbm = 0;
  // The step's attention by the tier it fell on, as shares of the row's total: trace rows are
  // float softmax rows that sum to 1 only within rounding, and a share keeps what is kept in
  // [0, 1]. T3's share is exactly 0 when nothing is evicted.
  std::array<float, kTierCount> mass{};

  // The share of the step's attention on tokens that are not evicted: 1 − T3's share, so that
  // a placement which evicts nothing keeps exactly 1 (not the float sum of three shares).
  [[nodiscard]] double kept_share() const noexcept { return 1.0 - static_cast<double>(mass[3]); }

  friend bool operator==(const StepLayerRecord&, const StepLayerRecord&) = default;
};

struct ReplaySummary {
  double mean_kept_mass = 0.0;      // over steps and layers
  double min_kept_mass = 1.0;       // worst step-layer
  double mean_hbm_fraction = 0.0;   // T0 tokens / all tokens, averaged over steps and layers
  double final_hbm_fraction = 0.0;  // at the last step
  double final_evicted_fraction = 0.0;
  std::uint64_t promoted = 0;
  std::uint64_t demoted = 0;
  std::uint64_t evicted = 0;
  std::uint64_t host_token_steps = 0;  // Σ over steps and layers of T1 tokens (full prefetch)
  std::uint64_t newly_host = 0;        // Σ tokens entering T1 (differential prefetch)
};

class ReplayDemand {
 public:
  ReplayDemand(std::uint32_t layers, std::uint64_t steps);

  [[nodiscard]] std::uint32_t layers() const noexcept { return layers_; }
  [[nodiscard]] std::uint64_t steps() const noexcept { return steps_; }
  [[nodiscard]] StepLayerRecord& at(std::uint64_t step, std::uint32_t layer) {
    return records_[step * layers_ + layer];
  }
  [[nodiscard]] const StepLayerRecord& at(std::uint64_t step, std::uint32_t layer) const {
    return records_[step * layers_ + layer];
  }
  // Every layer's record of one step.
  [[nodiscard]] std::span<StepLayerRecord> step_records(std::uint64_t step) {
    return {records_.data() + step * layers_, layers_};
  }
  // The placement Policy::start() made of the prompt before step 0, per layer: `tokens` by tier
  // (they add up to the prompt) and the moves start() made, which step 0's record also counts
  // (its moves are those since the prefill). No attention mass. replay() and read_demand_file()
  // set them; until then every count is 0.
  [[nodiscard]] StepLayerRecord& start(std::uint32_t layer) { return start_.at(layer); }
  [[nodiscard]] const StepLayerRecord& start(std::uint32_t layer) const { return start_.at(layer); }
  // Records the start: tokens by tier and pending moves of `placement` (one entry per layer),
  // right after Policy::start() and before the moves are reset.
  void record_start(const std::vector<LayerPlacement>& placement);
  [[nodiscard]] ReplaySummary summary() const;
  // How the replayed policy stores a T2 token (Policy::compressed_format).
  [[nodiscard]] const CompressedFormat& compressed_format() const noexcept {
    return compressed_format_;
  }
  void set_compressed_format(const CompressedFormat& format) noexcept {
    compressed_format_ = format;
  }
  [[nodiscard]] double compressed_bits() const noexcept { return compressed_format_.code_bits; }
  // Whether the replayed policy's attention reads its T2 tokens (Policy::attends_compressed).
  [[nodiscard]] bool attends_compressed() const noexcept { return attends_compressed_; }
  void set_attends_compressed(bool attends) noexcept { attends_compressed_ = attends; }

 private:
  std::uint32_t layers_;
  std::uint64_t steps_;
  std::vector<StepLayerRecord> records_;
  std::vector<StepLayerRecord> start_;  // one per layer
  // replay() and read_demand_file() set it; until then the default Policy's format.
  CompressedFormat compressed_format_ = kInt8HeadScaled;
  // replay() sets it, and cached_replay() for a demand read back (the policy string fixes it).
  bool attends_compressed_ = true;
};

// One step of a replay, shared by replay() and the live tiered cache (kernels/live.hpp), so that
// what is replayed is what runs: measures the step's rows against the placement (mass by tier,
// kept and total mass), lets the policy observe them, and records tokens per tier and the moves.
class ReplayStepper {
 public:
  // `policy` must outlive the stepper.
  ReplayStepper(Policy& policy, std::uint32_t layers);

  // One step. `rows[l]` covers the placement's tokens of layer l; when `append_token`, the
  // step's own token is appended in HBM to every layer first (the live cache's store() has
  // already appended it). `records` gets one entry per layer. `heads` is 0 unless the policy
  // reads per-head rows.
  void step(std::uint64_t step, const std::vector<std::vector<float>>& rows,
            const std::vector<std::vector<float>>& head_rows, std::uint32_t heads,
            std::vector<LayerPlacement>& placement, std::span<StepLayerRecord> records,
            bool append_token);

 private:
  Policy& policy_;
  std::vector<double> kept_;
  std::vector<double> total_;
};

// DataError naming `source` when it lacks an input `policy` reads (per-head rows, the prefill
// window, key norms); replay() checks this first, callers may check several policies up front.
void check_inputs(AttentionSource& source, const Policy& policy);

// Replays every step of `source` through `policy`.
[[nodiscard]] ReplayDemand replay(AttentionSource& source, Policy& policy);

}  // namespace kvtier::replay
