#pragma once
// Quantities that follow from a model's architecture: parameter counts, weight and KV bytes,
// FLOPs per token. Computed from the spec every time; never typed into a preset.

#include <cstdint>

#include "configs/schema/model.pb.h"

namespace kvtier::hw {

struct ParameterCount {
  uint64_t embedding = 0;            // token embedding table
  uint64_t attention_per_layer = 0;  // q, k, v, o projections (+ biases, + q/k norms)
  uint64_t mlp_per_layer = 0;        // gate, up, down; with experts, all of them and the router
  // A mixture of experts' (0 without): one expert MLP, the router, the shared expert, and what
  // one token uses of a layer's MLP (its experts, the router and the shared expert; the whole
  // MLP of a dense model).
  uint64_t expert = 0;
  uint64_t router = 0;
  uint64_t shared_expert = 0;
  uint64_t active_mlp_per_layer = 0;
  uint64_t norms_per_layer = 0;  // the two RMSNorm weight vectors
  uint64_t final_norm = 0;
  uint64_t lm_head = 0;  // 0 when tied to the embedding
  uint64_t layers = 0;   // all decoder layers together
  uint64_t total = 0;
  uint64_t active = 0;  // what one token uses: total less the experts it is not routed to
};

[[nodiscard]] ParameterCount count_parameters(const config::ModelSpec& model);

// Weight bytes when every parameter is stored as `dtype` (norm vectors included; they are
// < 0.01% of any preset model).
[[nodiscard]] double weight_bytes(const config::ModelSpec& model, config::DType dtype);

// K and V of one token in one layer: 2 · kv_heads · head_dim · bytes(kv_dtype).
[[nodiscard]] double kv_bytes_per_token_per_layer(const config::ModelSpec& model);
[[nodiscard]] double kv_bytes_per_token(const config::ModelSpec& model);

// Matrix-multiply FLOPs for one token excluding attention over the context:
// 2 FLOPs per weight of every projection, MLP and the LM head (the embedding is a lookup); of a
// mixture of experts, the experts a token is routed to.
[[nodiscard]] double linear_flops_per_token(const config::ModelSpec& model);
// Attention FLOPs one token spends per context token it attends to (QKᵀ and AV, all layers).
[[nodiscard]] double attention_flops_per_context_token(const config::ModelSpec& model);
// Total FLOPs for one token attending to `context_tokens` earlier tokens (capped by the
// sliding window where the model has one).
[[nodiscard]] double flops_per_token(const config::ModelSpec& model, uint64_t context_tokens);

}  // namespace kvtier::hw
