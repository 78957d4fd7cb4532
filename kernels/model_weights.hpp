#pragma once
// A loaded model: its architecture (configs' ModelSpec, the same message the simulator's model
// presets use) and float32 views of every weight, plus what keeps those views alive.

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "configs/schema/model.pb.h"
#include "kernels/tensor.hpp"

namespace kvtier::kernels {

// How a checkpoint orders the two halves of each rotary pair inside a head. Meta's and llama2.c's
// checkpoints rotate adjacent elements (2i, 2i+1); Hugging Face checkpoints were permuted on
// conversion so that element i pairs with i + head_dim/2. The engine rotates either way rather
// than permuting weights on load, so float32 checkpoints stay zero-copy.
enum class RopeLayout { kInterleavedPairs, kHalfSplit };

struct LayerWeights {
  WeightTensor attention_norm;  // [hidden]
  WeightTensor wq;              // [heads * head_dim, hidden]
  WeightTensor wk;              // [kv_heads * head_dim, hidden]
  WeightTensor wv;              // [kv_heads * head_dim, hidden]
  WeightTensor wo;              // [hidden, heads * head_dim]
  WeightTensor q_bias;          // Qwen2 only: [heads * head_dim]
  WeightTensor k_bias;          // Qwen2 only: [kv_heads * head_dim]
  WeightTensor v_bias;          // Qwen2 only: [kv_heads * head_dim]
  WeightTensor q_norm;          // Qwen3 only: [head_dim], RMSNorm of each query head
  WeightTensor k_norm;          // Qwen3 only: [head_dim]
  WeightTensor mlp_norm;        // [hidden]
  WeightTensor w_gate;          // [intermediate, hidden]  (llama2.c w1)
  WeightTensor w_up;            // [intermediate, hidden]  (llama2.c w3)
  WeightTensor w_down;          // [hidden, intermediate]  (llama2.c w2)
};

struct ModelWeights {
  config::ModelSpec spec;
  RopeLayout rope_layout = RopeLayout::kHalfSplit;
  std::string source;  // the checkpoint's path, for diagnostics and provenance

  WeightTensor token_embedding;  // [vocab, hidden]
  std::vector<LayerWeights> layers;
  WeightTensor final_norm;  // [hidden]
  WeightTensor lm_head;     // [vocab, hidden]; the embedding itself when tied

  WeightStorage storage;
};

// Checks the architecture fields the forward pass relies on (head grouping, even head_dim,
// supported RoPE scaling); throws DataError naming the field and `where`.
void check_engine_spec(const config::ModelSpec& spec, const std::string& where);

// Checks the tokens of one forward call starting at `position`: at least one, each inside the
// vocabulary, the last within max_position_embeddings. Throws DataError naming the model.
void check_forward_tokens(const config::ModelSpec& spec, int position,
                          std::span<const std::int32_t> tokens);

// The tensor shapes a spec implies, for loaders to check against.
struct ExpectedShapes {
  std::int64_t hidden = 0;
  std::int64_t q_out = 0;   // heads * head_dim
  std::int64_t kv_out = 0;  // kv_heads * head_dim
  std::int64_t head_dim = 0;
  std::int64_t intermediate = 0;
  std::int64_t vocab = 0;
};
[[nodiscard]] ExpectedShapes expected_shapes(const config::ModelSpec& spec);

}  // namespace kvtier::kernels
