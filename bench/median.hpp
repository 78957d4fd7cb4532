#pragma once
// The median every benchmark quotes (bench/RESULTS.md): of an odd count the middle value, of an
// even count the mean of the middle two; NaN of none.
#include <algorithm>
#include <cstddef>
#include <limits>
#include <vector>

namespace kvtier::bench {

inline double median(std::vector<double> values) {
  if (values.empty()) {
    return std::numeric_limits<double>::quiet_NaN();
  }
  std::sort(values.begin(), values.end());
  const std::size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

}  // namespace kvtier::bench
