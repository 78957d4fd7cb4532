// What a decoding request's attention reads: its context, capped by a sliding window in the
// layers that attend within one, whole in the others.

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
  if (hw::has_hybrid_attention(run_.model())) {
    batch.decode_global_context_tokens += request.spec.prompt_tokens + request.generated + extra;
  }
}

}  // namespace kvtier::serving
