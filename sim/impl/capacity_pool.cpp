#include "sim/capacity_pool.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace kvtier::sim {

CapacityPool::CapacityPool(const Simulator& simulator, std::uint64_t capacity_bytes)
    : capacity_(capacity_bytes), usage_(simulator, 0.0) {}

bool CapacityPool::try_allocate(std::uint64_t bytes) {
  if (bytes > available()) {
    refusals_.add();
    return false;
  }
  used_ += bytes;
  high_water_mark_ = std::max(high_water_mark_, used_);
  usage_.set(static_cast<double>(used_));
  return true;
}

void CapacityPool::free(std::uint64_t bytes) {
  if (bytes > used_) {
    throw std::logic_error("sim::CapacityPool: freeing " + std::to_string(bytes) +
                           " bytes with only " + std::to_string(used_) + " allocated");
  }
  used_ -= bytes;
  usage_.set(static_cast<double>(used_));
}

}  // namespace kvtier::sim
