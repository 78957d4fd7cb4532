#pragma once
// When a workload's requests arrive: open loop at their own times, closed loop the first
// `concurrency` at time zero and then one each time a request completes. The one place that
// paces a workload, for an engine serving it alone and for a cluster's router alike.

#include <cstdint>
#include <functional>

#include "serving/workload.hpp"
#include "sim/simulator.hpp"

namespace kvtier::serving {

class Arrivals {
 public:
  // `deliver` takes each request id (its index in `workload`) at the moment it arrives.
  // `workload` must outlive this.
  Arrivals(sim::Simulator& simulator, const Workload& workload,
           std::function<void(std::uint32_t)> deliver);

  // Schedules the first arrivals; run the simulator afterwards.
  void start();
  // A request has completed: in a closed loop the next one arrives now.
  void completed();

 private:
  void schedule_next_open_loop_arrival();

  sim::Simulator& simulator_;
  const Workload& workload_;
  std::function<void(std::uint32_t)> deliver_;
  std::uint32_t next_ = 0;
};

}  // namespace kvtier::serving
