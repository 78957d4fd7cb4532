#pragma once
// A cluster's router: picks the engine each arriving request is served by (cluster.routing,
// docs/CLUSTERS.md "Clusters and routing"). It sees what a production router sees at that
// moment: the engines' queues, their active KV blocks and, for KV-aware routing, their real
// cache contents (as Dynamo's router hears of them through KV events). Deterministic: ties go
// to the engine listed first, hashes are seeded streams.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "configs/schema/run.pb.h"
#include "serving/engine.hpp"
#include "serving/workload.hpp"

namespace kvtier::serving {

class Router {
 public:
  virtual ~Router() = default;
  // The index in `engines` (not empty) of the engine that serves `request` of the workload,
  // arriving now.
  [[nodiscard]] virtual std::size_t route(std::uint32_t request,
                                          std::span<const ServingEngine* const> engines) = 0;
};

// The router `cluster` names, over `workload` (which must outlive it). KV_AWARE needs
// `block_tokens` (memory.kv_block_tokens) > 0 and kv_overlap_weight; a ConfigError otherwise.
[[nodiscard]] std::unique_ptr<Router> make_router(const config::ClusterSpec& cluster,
                                                  const Workload& workload,
                                                  std::uint32_t block_tokens);

}  // namespace kvtier::serving
