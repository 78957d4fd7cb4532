#pragma once
// The error a simulation gives when a request of its workload cannot fit as its policy places it.

#include <string>
#include <utility>

#include "common/errors.hpp"

namespace kvtier::serving {

// A request of the workload whose KV, as this run's policy places it, cannot fit in HBM or in
// the GPU's share of host memory. A finding about the policy, not about the config: among
// compared policies the one it concerns gets a row saying so (simulate_all) while the others run.
class DoesNotFit : public ConfigError {
 public:
  enum class Memory { kHbm, kHost };
  DoesNotFit(Memory memory, std::string what) : ConfigError(std::move(what)), memory_(memory) {}
  [[nodiscard]] Memory memory() const noexcept { return memory_; }

 private:
  Memory memory_;
};

}  // namespace kvtier::serving
