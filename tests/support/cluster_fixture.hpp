#pragma once
// Hand-made workloads served by a cluster, for tests of clusters and disaggregation.

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "configs/schema/run.pb.h"
#include "serving/cluster.hpp"
#include "serving/workload.hpp"
#include "sim/simulator.hpp"

namespace kvtier::test {

// A cluster that has served a workload, with the simulator it ran on.
struct Served {
  sim::Simulator simulator;
  std::unique_ptr<serving::Cluster> cluster;
};

inline std::unique_ptr<Served> serve(const config::RunSpec& run, serving::Workload workload) {
  auto served = std::make_unique<Served>();
  served->cluster =
      std::make_unique<serving::Cluster>(served->simulator, run, std::move(workload), nullptr);
  served->cluster->start();
  served->simulator.run();
  return served;
}

inline serving::RequestSpec request_at(double seconds, std::uint64_t prompt, std::uint64_t output) {
  serving::RequestSpec request;
  request.prompt_tokens = prompt;
  request.output_tokens = output;
  request.arrival = sim::Tick::ps(static_cast<std::int64_t>(seconds * 1e12));
  return request;
}

inline serving::Workload open_loop(std::vector<serving::RequestSpec> requests) {
  serving::Workload workload;
  workload.requests = std::move(requests);
  return workload;
}

}  // namespace kvtier::test
