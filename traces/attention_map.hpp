#pragma once
// Where a layer's decode attention goes, binned for a picture (`kvtier trace info --format
// html`): decode steps down, key positions across. A cell is the attention mass that falls on
// its positions, averaged over a few steps of its row spread evenly through the row's steps, so
// a row sums to 1 (less, from top-k rows: their residual's positions are unknown).

#include <cstdint>
#include <vector>

#include "traces/reader.hpp"

namespace kvtier::traces {

struct AttentionMapOptions {
  std::uint32_t step_bins = 80;       // rows at most
  std::uint32_t position_bins = 144;  // columns at most
  std::uint32_t steps_per_bin = 4;    // steps read per row at most
};

struct AttentionMap {
  std::uint32_t layer = 0;
  bool from_topk = false;       // the trace has no mean rows: top-k entries only
  std::uint64_t steps = 0;      // decode steps of the trace
  std::uint64_t positions = 0;  // key positions: prompt plus steps
  std::uint64_t steps_per_bin = 1;
  std::uint64_t positions_per_bin = 1;
  std::uint32_t step_bins = 0;
  std::uint32_t position_bins = 0;
  // step_bins × position_bins, row by row; NaN where no step read for the row reaches the
  // cell's first position (after its causal edge).
  std::vector<double> mass;
  [[nodiscard]] double at(std::uint32_t step_bin, std::uint32_t position_bin) const {
    return mass[static_cast<std::size_t>(step_bin) * position_bins + position_bin];
  }
};

// DataError when the layer is not in the trace; ConfigError for bins or steps of 0.
[[nodiscard]] AttentionMap attention_map(const TraceReader& reader, std::uint32_t layer,
                                         const AttentionMapOptions& options = {});

}  // namespace kvtier::traces
