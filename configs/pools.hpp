#pragma once
// A run's engines over its GPUs and nodes, and a disaggregated cluster's pools
// (run.cluster.disaggregation): the decode engines are split over their GPUs as the run says,
// the prefill engines as prefill_parallelism says where it says otherwise. One place builds the
// prefill engines' run and counts the GPUs and nodes the engines take, for the checks, the
// simulator and the planner.

#include <cstdint>
#include <string_view>

#include "configs/schema/run.pb.h"

namespace kvtier::config {

// The run's pipeline stages (pipeline_parallel_degree; 1 without it).
[[nodiscard]] std::uint32_t pipeline_stages(const RunSpec& run);
// The GPUs of one engine: its tensor-parallel group in each pipeline stage.
[[nodiscard]] std::uint32_t gpus_per_engine(const RunSpec& run);
// The engines one node holds: whole ones, or the share of one whose GPUs span nodes (1/2 over
// two nodes).
[[nodiscard]] double engines_per_node(const RunSpec& run);

// The run as a prefill engine of it is split: each field of
// cluster.disaggregation.prefill_parallelism in place of the run's field of that name (a pool
// whose attention is split by heads dispatches nothing: engine.data_parallel_dispatch cleared).
// The run itself when it sets none.
[[nodiscard]] RunSpec prefill_pool_run(const RunSpec& run);

// Whether the prefill engines are split otherwise than the decode engines.
[[nodiscard]] bool pools_differ(const RunSpec& run);

// The field of PoolParallelism that stands in for the run's `run_field`
// ("engine.expert_parallel": "expert_parallel"); empty for a field it has none for.
[[nodiscard]] std::string_view pool_field_of_run_field(std::string_view run_field);

// The GPUs of all the run's engines: one engine's, or its cluster's, each pool's engines split
// as that pool is.
[[nodiscard]] std::uint64_t cluster_gpus(const RunSpec& run);
// The nodes those engines take: each pool's engines over its engines_per_node, summed, in whole
// nodes (0 when an engine has no GPUs).
[[nodiscard]] double cluster_nodes(const RunSpec& run);
// Over the run's engines: GPUs an engine takes and engines a node holds on average
// (gpus_per_engine and engines_per_node when every engine is split alike), and the GPUs of the
// largest.
[[nodiscard]] double mean_gpus_per_engine(const RunSpec& run);
[[nodiscard]] double mean_engines_per_node(const RunSpec& run);
[[nodiscard]] std::uint32_t largest_gpus_per_engine(const RunSpec& run);

}  // namespace kvtier::config
