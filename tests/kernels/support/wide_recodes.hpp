#pragma once
// Test helpers: a live run whose re-tierings recode enough T1 <-> T2 token-layers at once for the
// cache's recode pool to run them in parallel (kernels/impl/host_recode.hpp), on either backend.

#include <cstdint>
#include <memory>

#include "configs/schema/model.pb.h"
#include "kernels/engine.hpp"
#include "kernels/live.hpp"
#include "kernels/model_weights.hpp"

namespace kvtier::kernels::testing {

// Seeded random weights in a Llama shape with a 7B's token-layer (32 KV heads of 128: 8,192
// values) and little else (4 layers, hidden size 256, FFN 256, vocabulary 64).
[[nodiscard]] std::shared_ptr<const ModelWeights> wide_kv_model();

// `engine` (of wide_kv_model()) following synthetic reasoning attention for 160 steps under a
// tiered policy that re-tiers every 8 steps between T1 and T2, on `recode_threads` threads,
// keeping every step's logits.
[[nodiscard]] LiveResult follow_with_recodes(Engine& engine, int recode_threads);

// The most T1 <-> T2 recodes of any step's moves, all layers together.
[[nodiscard]] std::uint64_t most_recodes_in_a_step(const LiveResult& result);

}  // namespace kvtier::kernels::testing
