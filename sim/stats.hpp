#pragma once
// Statistics objects. Each is held by the model object that updates it and updated through a
// direct member call — never looked up by name on a hot path (DRAMsim3's string-keyed stats
// cost more than the simulation they measured). A StatsRegistry (sim/stats_registry.hpp) names
// them for dumping only.

#include <cstdint>
#include <vector>

#include "sim/tick.hpp"

namespace kvtier::sim {

class Simulator;

// A monotonically increasing count (events, bytes, refusals).
class Counter {
 public:
  void add(std::uint64_t amount = 1) noexcept { value_ += amount; }
  [[nodiscard]] std::uint64_t value() const noexcept { return value_; }

 private:
  std::uint64_t value_ = 0;
};

// A quantity that holds its value between changes (bytes in use, queue length), averaged over
// simulated time: time_average() = ∫ value dt / (now − start), start being when the gauge was
// created. Reads the clock from its simulator, so it must not outlive it.
class TimeWeightedGauge {
 public:
  explicit TimeWeightedGauge(const Simulator& simulator, double initial_value = 0.0);

  void set(double value);
  void add(double delta) { set(value_ + delta); }

  [[nodiscard]] double value() const noexcept { return value_; }
  // Largest and smallest value ever set, including values held for zero time (a transient peak
  // within one picosecond still counts toward a high-water mark).
  [[nodiscard]] double max() const noexcept { return max_; }
  [[nodiscard]] double min() const noexcept { return min_; }
  // Average over [start, now]; the current value when no time has passed.
  [[nodiscard]] double time_average() const;
  [[nodiscard]] Tick start_time() const noexcept { return start_; }

 private:
  void accumulate_until_now();

  const Simulator& simulator_;
  Tick start_;
  Tick last_change_;
  double value_;
  double max_;
  double min_;
  double area_ = 0.0;  // ∫ value dt over [start, last_change] in value·picoseconds
};

// Every recorded duration, kept so percentiles are exact rather than estimated.
//
// Percentile rule (nearest rank): percentile(p) for 0 < p ≤ 100 is the smallest recorded value
// v such that at least p% of the samples are ≤ v, i.e. the sample of rank ceil(p/100 · n) in
// ascending order (1-based); percentile(0) is the minimum. Every percentile is therefore a value
// that was actually recorded (common/nearest_rank.hpp). Querying an empty distribution throws
// std::logic_error.
class LatencyDistribution {
 public:
  void record(Tick duration) {
    samples_.push_back(duration);
    sorted_ = samples_.size() == 1 || (sorted_ && samples_[samples_.size() - 2] <= duration);
  }

  // Adds every sample of `other` (a cluster's engines merged into one distribution).
  void merge(const LatencyDistribution& other);

  [[nodiscard]] std::size_t count() const noexcept { return samples_.size(); }
  [[nodiscard]] Tick percentile(double p) const;
  [[nodiscard]] Tick min() const { return percentile(0.0); }
  [[nodiscard]] Tick max() const { return percentile(100.0); }
  // Arithmetic mean in picoseconds (real-valued: the mean of whole picoseconds need not be one).
  [[nodiscard]] double mean_ps() const;

 private:
  void sort_if_needed() const;

  // Sorted lazily on the first query after a record; sorting does not change the multiset.
  mutable std::vector<Tick> samples_;
  mutable bool sorted_ = true;
};

}  // namespace kvtier::sim
