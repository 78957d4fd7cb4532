// Data-parallel attention with requests dispatched to GPUs (engine.data_parallel_dispatch):
// each GPU's own queue, batch, prefill budget and KV memory (serving/data_parallel_dispatch.hpp).

#include <string>

#include "common/errors.hpp"
#include "serving/engine.hpp"

namespace kvtier::serving {

void ServingEngine::start_dispatching(const config::RunSpec& run) {
  // Checked with the config (configs/impl/parallelism_checks.cpp); a run built in code is held
  // to it here.
  const config::Routing routing = run.engine().data_parallel_dispatch();
  const auto refuse = [routing](const std::string& why) {
    throw ConfigError("data_parallel_dispatch " + config::Routing_Name(routing) + " " + why,
                      "field engine.data_parallel_dispatch");
  };
  if (attention_split(run) != hw::AttentionSplit::kRequests) {
    refuse("needs engine.data_parallel_attention");
  }
  if (routing != config::ROUND_ROBIN && routing != config::LEAST_OUTSTANDING) {
    refuse("is not a dispatch: choose ROUND_ROBIN or LEAST_OUTSTANDING");
  }
  if (pipeline_stages(run) > 1) {
    refuse("with pipeline stages is not modelled");
  }
  if (prefix_cache_) {
    refuse("with memory.prefix_caching is not modelled");
  }
  // A swapped request's KV crosses its own GPU's PCIe link, not the mean GPU's share.
  if (swapping_) {
    refuse("with preemption by swapping (workload.on_demand_admission.swap) is not modelled");
  }
  dispatch_.emplace(routing, run.tensor_parallel_degree(), max_batch_, chunk_cap_);
}

std::uint64_t ServingEngine::chunk_room(const Request& request) const {
  return dispatch_ ? dispatch_->prefill_room(request.gpu) : chunk_cap_;
}

}  // namespace kvtier::serving
