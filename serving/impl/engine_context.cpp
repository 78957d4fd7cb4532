// What a decoding request's attention reads: its context, capped by a sliding window in the
// layers that attend within one, whole in the others; with data-parallel dispatch, on its GPU.

#include <cstdint>

#include "hwmodels/model_shape.hpp"
#include "serving/engine.hpp"

namespace kvtier::serving {

std::uint64_t ServingEngine::attended(const Request& request) const {
  return attended(request, request.generated);
}

std::uint64_t ServingEngine::attended(const Request& request, std::uint64_t generated) const {
  return plan_.held_tokens(request.spec.prompt_tokens + generated);
}

std::uint64_t ServingEngine::tiered_context(const Request& request, std::uint64_t generated) const {
  return hw::has_hybrid_attention(run_.model()) ? request.spec.prompt_tokens + generated
                                                : attended(request, generated);
}

void ServingEngine::add_decode_context(const Request& request, std::uint64_t extra,
                                       hw::BatchShape& batch) const {
  batch.decode_context_tokens += attended(request) + extra;
  if (!batch.decodes_by_gpu.empty()) {
    hw::GpuDecodes& own = batch.decodes_by_gpu[request.gpu];
    ++own.decode_tokens;
    own.decode_context_tokens += attended(request) + extra;
  }
  if (hw::has_hybrid_attention(run_.model())) {
    batch.decode_global_context_tokens += request.spec.prompt_tokens + request.generated + extra;
  }
}

void ServingEngine::add_drafts(const Request& request, std::uint64_t drafted,
                               hw::BatchShape& batch) {
  batch.decode_draft_tokens += drafted;
  if (!batch.decodes_by_gpu.empty()) {
    batch.decodes_by_gpu[request.gpu].decode_draft_tokens += drafted;
  }
}

void ServingEngine::prepare_gpu_decodes(hw::BatchShape& batch) const {
  batch.decodes_by_gpu.assign(dispatch_ ? dispatch_->gpus() : 0, hw::GpuDecodes{});
}

}  // namespace kvtier::serving
