#pragma once
// Per-layer attention statistics of a trace (`kvtier trace info`): how much mass the sinks and
// the newest tokens take, how spread out rows are, and how far back attention reaches.
//
// Computed from mean rows when the trace has them, else from top-k rows; then the masses are
// lower bounds (the residual's positions are unknown) and the entropy treats the residual as
// spread evenly over the positions outside the top k.

#include <array>
#include <cstdint>
#include <vector>

#include "traces/reader.hpp"

namespace kvtier::traces {

struct StatsOptions {
  std::uint32_t sink_tokens = 4;      // positions 0 .. sink_tokens - 1 count as sinks
  std::uint32_t recent_window = 128;  // "recent": distance below this
  double reach_threshold = 0.01;      // entries at least this heavy enter the reach histogram
  std::uint32_t far_distance = 256;   // "far": distance at least this (sinks excluded)
  std::uint32_t sample_steps = 1024;  // steps evenly spread over the trace; 0 = every step
};

// Distance bins of the reach histogram: bin 0 is distance 0, bin b ≥ 1 is [2^(b-1), 2^b); the
// last bin holds everything farther.
inline constexpr std::size_t kReachBins = 18;

struct LayerStats {
  std::uint32_t layer = 0;
  std::uint64_t rows = 0;
  double sink_mass = 0;     // mean over rows
  double recent_mass = 0;   // mean over rows
  double far_mass = 0;      // mean over rows, sinks excluded
  double entropy_bits = 0;  // mean over rows
  // Exponential decay length fitted to the mean attention by distance (0 .. 31) above the
  // floor at distances 96 .. 127; 0 when the rows are too short or the profile is flat.
  double recency_decay_tokens = 0;
  // Share of the above-threshold, non-sink mass in each distance bin (sums to 1, or all 0).
  std::array<double, kReachBins> reach{};
};

struct TraceStats {
  bool from_topk = false;
  std::vector<std::uint32_t> steps;  // the steps sampled
  std::vector<LayerStats> layers;
};

[[nodiscard]] TraceStats compute_stats(const TraceReader& reader, const StatsOptions& options);

// "0", "1", "2-3", "4-7", ..., "65536+": the distances of each reach bin.
[[nodiscard]] std::string reach_bin_label(std::size_t bin);

}  // namespace kvtier::traces
