#pragma once
// Drives an attention trace through a policy and records, for every step and layer, the tokens
// in each tier, what moved, and the attention mass each tier held at that step (mass on T3 is
// lost). Replay is hardware-independent: the simulator turns this demand into bytes and time.

#include <array>
#include <cstdint>
#include <span>
#include <vector>

#include "replay/attention.hpp"
#include "replay/policy.hpp"

namespace kvtier::replay {

struct StepLayerRecord {
  std::array<std::uint32_t, kTierCount> tokens{};  // after the policy's step
  std::uint32_t promoted = 0;
  std::uint32_t demoted = 0;
  std::uint32_t compressed = 0;
  std::uint32_t evicted = 0;
  std::uint32_t newly_host = 0;
  std::array<float, kTierCount> mass{};  // of the step's attention, by the tier it fell on

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
  [[nodiscard]] ReplaySummary summary() const;
  // Bits per K or V element of a T2 token (Policy::compressed_bits of the replayed policy).
  [[nodiscard]] double compressed_bits() const noexcept { return compressed_bits_; }
  void set_compressed_bits(double bits) noexcept { compressed_bits_ = bits; }

 private:
  std::uint32_t layers_;
  std::uint64_t steps_;
  std::vector<StepLayerRecord> records_;
  double compressed_bits_ = 8.0;
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

// Replays every step of `source` through `policy`.
[[nodiscard]] ReplayDemand replay(AttentionSource& source, Policy& policy);

}  // namespace kvtier::replay
