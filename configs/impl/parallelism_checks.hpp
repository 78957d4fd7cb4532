#pragma once
// The consistency rules of how a run splits its engines over GPUs (tensor_parallel_degree,
// pipeline_parallel_degree, engine.data_parallel_attention, engine.expert_parallel), kept apart
// so that a disaggregated cluster's prefill pool (cluster.disaggregation.prefill_parallelism)
// is held to the same rules as the run.

#include <string>
#include <vector>

#include "configs/locations.hpp"
#include "configs/schema/run.pb.h"
#include "configs/validate.hpp"

namespace kvtier::config::detail {

// The path of `field` under `prefix`, as problems name it.
inline std::string at(const std::string& prefix, const std::string& field) {
  return join_path(prefix, field);
}

// Whether a routing weighs load alone (ROUND_ROBIN, LEAST_OUTSTANDING), not cached prefixes:
// what a decode engine's router and data-parallel dispatch may use.
inline bool weighs_load_only(Routing routing) {
  return routing == ROUND_ROBIN || routing == LEAST_OUTSTANDING;
}

// The problems of `run`'s pipeline stages, each at its field under `path`; `host_recodes`: the
// run's tier policy recodes on the host (tiering.host_recode), which stages do not model.
void check_pipeline(const RunSpec& run, const std::string& path, bool host_recodes,
                    std::vector<Problem>& problems);
// The problems of `run`'s tensor-parallel group: data-parallel attention, expert parallelism,
// a group over nodes, the heads it splits.
void check_tensor_split(const RunSpec& run, const std::string& path,
                        std::vector<Problem>& problems);
// The problems of engine.data_parallel_dispatch: it needs data-parallel attention, a routing
// that weighs no prefix, and neither a disaggregated cluster nor preemption by swapping.
void check_data_parallel_dispatch(const RunSpec& run, const std::string& path,
                                  std::vector<Problem>& problems);

// The problems of the prefill pool's split that the run's own split has not, each at the
// field of cluster.disaggregation.prefill_parallelism that makes it (or, for what the pool
// inherits, at the run's field) and saying it is the prefill engines'.
void check_prefill_pool(const RunSpec& run, const std::string& path,
                        std::vector<Problem>& problems);

}  // namespace kvtier::config::detail
