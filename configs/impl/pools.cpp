#include "configs/pools.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <string_view>
#include <utility>
#include <vector>

namespace kvtier::config {
namespace {

// PoolParallelism's fields and the run's they stand in for.
constexpr std::array<std::pair<std::string_view, std::string_view>, 4> kFields{{
    {"tensor_parallel_degree", "tensor_parallel_degree"},
    {"pipeline_parallel_degree", "pipeline_parallel_degree"},
    {"data_parallel_attention", "engine.data_parallel_attention"},
    {"expert_parallel", "engine.expert_parallel"},
}};

// The run's engines as pools of engines split alike: one pool, or a disaggregated cluster's
// prefill and decode pools when they are split differently.
struct Pool {
  RunSpec run;
  std::uint64_t engines = 0;
};

std::vector<Pool> pools_of(const RunSpec& run) {
  const std::uint64_t engines = run.has_cluster() ? run.cluster().engines() : 1;
  if (!pools_differ(run)) {
    return {{run, engines}};
  }
  const std::uint64_t prefill =
      std::min<std::uint64_t>(run.cluster().disaggregation().prefill_engines(), engines);
  return {{prefill_pool_run(run), prefill}, {run, engines - prefill}};
}

}  // namespace

std::uint32_t pipeline_stages(const RunSpec& run) {
  return run.has_pipeline_parallel_degree() ? std::max(run.pipeline_parallel_degree(), 1U) : 1;
}

std::uint32_t gpus_per_engine(const RunSpec& run) {
  return run.tensor_parallel_degree() * pipeline_stages(run);
}

double engines_per_node(const RunSpec& run) {
  const double gpus_per_node = run.hardware().node().gpus_per_node();
  const double gpus = gpus_per_engine(run);
  return gpus > gpus_per_node ? gpus_per_node / gpus : std::floor(gpus_per_node / gpus);
}

RunSpec prefill_pool_run(const RunSpec& run) {
  RunSpec pool = run;
  if (!run.cluster().has_disaggregation() ||
      !run.cluster().disaggregation().has_prefill_parallelism()) {
    return pool;
  }
  const PoolParallelism& split = run.cluster().disaggregation().prefill_parallelism();
  if (split.has_tensor_parallel_degree()) {
    pool.set_tensor_parallel_degree(split.tensor_parallel_degree());
  }
  if (split.has_pipeline_parallel_degree()) {
    pool.set_pipeline_parallel_degree(split.pipeline_parallel_degree());
  }
  if (split.has_data_parallel_attention()) {
    pool.mutable_engine()->set_data_parallel_attention(split.data_parallel_attention());
    // Attention split by heads has no GPU of its own to dispatch a request to.
    if (!split.data_parallel_attention()) {
      pool.mutable_engine()->clear_data_parallel_dispatch();
    }
  }
  if (split.has_expert_parallel()) {
    pool.mutable_engine()->set_expert_parallel(split.expert_parallel());
  }
  return pool;
}

bool pools_differ(const RunSpec& run) {
  if (!run.cluster().has_disaggregation()) {
    return false;
  }
  const RunSpec pool = prefill_pool_run(run);
  return pool.tensor_parallel_degree() != run.tensor_parallel_degree() ||
         pipeline_stages(pool) != pipeline_stages(run) ||
         pool.engine().data_parallel_attention() != run.engine().data_parallel_attention() ||
         pool.engine().expert_parallel() != run.engine().expert_parallel();
}

std::string_view pool_field_of_run_field(std::string_view run_field) {
  for (const auto& [pool, of_run] : kFields) {
    if (of_run == run_field) {
      return pool;
    }
  }
  return {};
}

std::uint64_t cluster_gpus(const RunSpec& run) {
  std::uint64_t gpus = 0;
  for (const Pool& pool : pools_of(run)) {
    gpus += pool.engines * gpus_per_engine(pool.run);
  }
  return gpus;
}

double cluster_nodes(const RunSpec& run) {
  double nodes = 0.0;
  for (const Pool& pool : pools_of(run)) {
    const double per_node = engines_per_node(pool.run);
    if (!(per_node > 0.0)) {
      return 0.0;
    }
    nodes += static_cast<double>(pool.engines) / per_node;
  }
  return std::ceil(nodes);
}

double mean_gpus_per_engine(const RunSpec& run) {
  const std::vector<Pool> pools = pools_of(run);
  if (pools.size() == 1) {
    return gpus_per_engine(run);
  }
  return static_cast<double>(cluster_gpus(run)) / static_cast<double>(run.cluster().engines());
}

double mean_engines_per_node(const RunSpec& run) {
  const std::vector<Pool> pools = pools_of(run);
  if (pools.size() == 1) {
    return engines_per_node(run);
  }
  double nodes = 0.0;
  for (const Pool& pool : pools) {
    nodes += static_cast<double>(pool.engines) / engines_per_node(pool.run);
  }
  return static_cast<double>(run.cluster().engines()) / nodes;
}

std::uint32_t largest_gpus_per_engine(const RunSpec& run) {
  std::uint32_t largest = 0;
  for (const Pool& pool : pools_of(run)) {
    largest = std::max(largest, gpus_per_engine(pool.run));
  }
  return largest;
}

}  // namespace kvtier::config
