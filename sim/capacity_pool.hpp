#pragma once
// A fixed amount of memory (HBM, pinned host DDR) handed out in bytes. Allocation is refused,
// not forced, when it does not fit: the caller decides whether to queue, evict or preempt.
// Usage is a time-weighted gauge, so a run reports the average and the high-water mark.

#include <cstdint>

#include "sim/stats.hpp"

namespace kvtier::sim {

class Simulator;

class CapacityPool {
 public:
  CapacityPool(const Simulator& simulator, std::uint64_t capacity_bytes);

  // Takes `bytes` if they fit and returns true; otherwise changes nothing, counts a refusal and
  // returns false.
  [[nodiscard]] bool try_allocate(std::uint64_t bytes);
  // Returns `bytes` to the pool. Freeing more than is allocated is a logic error
  // (std::logic_error): the model lost track of what it holds.
  void free(std::uint64_t bytes);

  [[nodiscard]] std::uint64_t capacity() const noexcept { return capacity_; }
  [[nodiscard]] std::uint64_t used() const noexcept { return used_; }
  [[nodiscard]] std::uint64_t available() const noexcept { return capacity_ - used_; }
  [[nodiscard]] std::uint64_t high_water_mark() const noexcept { return high_water_mark_; }
  [[nodiscard]] const Counter& refusals() const noexcept { return refusals_; }
  [[nodiscard]] const TimeWeightedGauge& usage() const noexcept { return usage_; }

 private:
  std::uint64_t capacity_;
  std::uint64_t used_ = 0;
  std::uint64_t high_water_mark_ = 0;
  Counter refusals_;
  TimeWeightedGauge usage_;
};

}  // namespace kvtier::sim
