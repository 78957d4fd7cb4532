#pragma once
// The percentile rule of every figure kvtier reports (simulated latencies and live step times):
// nearest rank, so a percentile is always a value that was recorded.

#include <algorithm>
#include <cmath>
#include <cstddef>

namespace kvtier {

// 0-based index, among `count` ≥ 1 samples in ascending order, of the sample of rank
// ceil(fraction · count) (1-based), fraction in [0, 1]; fraction 0 gives the minimum. The 1e-9
// absorbs fraction · count landing a hair above a whole rank (0.07 of 100 samples computes
// 7.000000000000001, which must stay rank 7).
[[nodiscard]] inline std::size_t nearest_rank_index(double fraction, std::size_t count) {
  const double rank = std::ceil(fraction * static_cast<double>(count) - 1e-9);
  const auto index = static_cast<std::size_t>(std::max(rank, 1.0)) - 1;
  return std::min(index, count - 1);
}

}  // namespace kvtier
