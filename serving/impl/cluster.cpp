#include "serving/cluster.hpp"

#include <utility>

#include "common/errors.hpp"

namespace kvtier::serving {
namespace {

config::ClusterSpec single_engine() {
  config::ClusterSpec cluster;
  cluster.set_engines(1);
  cluster.set_routing(config::ROUND_ROBIN);
  return cluster;
}

}  // namespace

Cluster::Cluster(sim::Simulator& simulator, const config::RunSpec& run, Workload workload,
                 const TierDemand* tiers)
    : workload_(std::move(workload)),
      arrivals_(simulator, workload_, [this](std::uint32_t request) { route(request); }) {
  const config::ClusterSpec cluster = run.has_cluster() ? run.cluster() : single_engine();
  if (cluster.engines() == 0) {  // the loader requires at least one; a run built in code too
    throw ConfigError("a cluster needs at least one engine", "field cluster.engines");
  }
  for (std::uint32_t e = 0; e < cluster.engines(); ++e) {
    engines_.push_back(std::make_unique<ServingEngine>(simulator, run, workload_, tiers));
    views_.push_back(engines_.back().get());
  }
  router_ = make_router(cluster, workload_, engines_.front()->memory().block_tokens);
  routed_.assign(engines_.size(), 0);
}

void Cluster::start() {
  for (const auto& engine : engines_) {
    engine->start_serving([this](std::uint32_t) { arrivals_.completed(); });
  }
  arrivals_.start();
}

void Cluster::route(std::uint32_t request) {
  const std::size_t chosen = router_->route(request, views_);
  ++routed_[chosen];
  engines_[chosen]->submit(request);
}

}  // namespace kvtier::serving
