#pragma once
// Engines that serve one workload together behind a router, on one simulator (run.cluster;
// without it, one engine). The workload's arrivals (serving/arrivals.hpp) go to the router as
// they come; each request is routed once, when it arrives, and served to its end by that
// engine. A closed loop keeps its concurrency in flight across the whole cluster.

#include <cstdint>
#include <memory>
#include <vector>

#include "configs/schema/run.pb.h"
#include "serving/arrivals.hpp"
#include "serving/engine.hpp"
#include "serving/router.hpp"
#include "serving/tier_demand.hpp"
#include "serving/workload.hpp"
#include "sim/simulator.hpp"

namespace kvtier::serving {

class Cluster {
 public:
  // Builds run.cluster().engines engines (one without run.cluster), each with the whole
  // workload's requests known and served those routed to it. `tiers` (not owned; null for the
  // full cache) must outlive the cluster. Throws what ServingEngine's constructor throws.
  Cluster(sim::Simulator& simulator, const config::RunSpec& run, Workload workload,
          const TierDemand* tiers);
  Cluster(const Cluster&) = delete;
  Cluster& operator=(const Cluster&) = delete;

  // Schedules the arrivals; run the simulator afterwards.
  void start();

  [[nodiscard]] const Workload& workload() const noexcept { return workload_; }
  [[nodiscard]] std::size_t size() const noexcept { return engines_.size(); }
  [[nodiscard]] const ServingEngine& engine(std::size_t index) const { return *engines_[index]; }
  // The requests routed to each engine.
  [[nodiscard]] const std::vector<std::uint64_t>& routed() const noexcept { return routed_; }

 private:
  void route(std::uint32_t request);

  Workload workload_;
  std::vector<std::unique_ptr<ServingEngine>> engines_;
  std::vector<const ServingEngine*> views_;
  std::unique_ptr<Router> router_;
  Arrivals arrivals_;
  std::vector<std::uint64_t> routed_;
};

}  // namespace kvtier::serving
