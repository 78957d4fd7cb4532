#include "sim/stats.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "common/nearest_rank.hpp"
#include "sim/simulator.hpp"

namespace kvtier::sim {

TimeWeightedGauge::TimeWeightedGauge(const Simulator& simulator, double initial_value)
    : simulator_(simulator),
      start_(simulator.now()),
      last_change_(simulator.now()),
      value_(initial_value),
      max_(initial_value),
      min_(initial_value) {}

void TimeWeightedGauge::accumulate_until_now() {
  const Tick now = simulator_.now();
  area_ += value_ * static_cast<double>((now - last_change_).picoseconds());
  last_change_ = now;
}

void TimeWeightedGauge::set(double value) {
  accumulate_until_now();
  value_ = value;
  max_ = std::max(max_, value);
  min_ = std::min(min_, value);
}

double TimeWeightedGauge::time_average() const {
  const Tick now = simulator_.now();
  const auto elapsed = static_cast<double>((now - start_).picoseconds());
  if (elapsed == 0.0) {
    return value_;
  }
  const double area = area_ + value_ * static_cast<double>((now - last_change_).picoseconds());
  return area / elapsed;
}

void LatencyDistribution::merge(const LatencyDistribution& other) {
  if (other.samples_.empty()) {
    return;
  }
  const bool was_empty = samples_.empty();
  samples_.insert(samples_.end(), other.samples_.begin(), other.samples_.end());
  sorted_ = was_empty && other.sorted_;
}

void LatencyDistribution::sort_if_needed() const {
  if (!sorted_) {
    std::sort(samples_.begin(), samples_.end());
    sorted_ = true;
  }
}

Tick LatencyDistribution::percentile(double p) const {
  if (samples_.empty()) {
    throw std::logic_error("sim::LatencyDistribution: percentile of an empty distribution");
  }
  if (!(p >= 0.0 && p <= 100.0)) {
    throw std::invalid_argument("sim::LatencyDistribution: percentile must be in [0, 100]");
  }
  sort_if_needed();
  return samples_[nearest_rank_index(p / 100.0, samples_.size())];
}

double LatencyDistribution::mean_ps() const {
  if (samples_.empty()) {
    throw std::logic_error("sim::LatencyDistribution: mean of an empty distribution");
  }
  // Summed exactly in 128 bits (a sum of int64 picoseconds can pass 2^63), divided once.
  __extension__ typedef __int128 Int128;  // __extension__: no -Wpedantic warning
  Int128 sum = 0;
  for (const Tick sample : samples_) {
    sum += sample.picoseconds();
  }
  return static_cast<double>(static_cast<long double>(sum) /
                             static_cast<long double>(samples_.size()));
}

}  // namespace kvtier::sim
