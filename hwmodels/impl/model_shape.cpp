#include "hwmodels/model_shape.hpp"

#include <algorithm>

#include "configs/dtype.hpp"

namespace kvtier::hw {

ParameterCount count_parameters(const config::ModelSpec& model) {
  const uint64_t hidden = model.hidden_size();
  const uint64_t q_width = static_cast<uint64_t>(model.num_attention_heads()) * model.head_dim();
  const uint64_t kv_width = static_cast<uint64_t>(model.num_key_value_heads()) * model.head_dim();
  ParameterCount count;
  count.embedding = static_cast<uint64_t>(model.vocab_size()) * hidden;
  count.attention_per_layer = hidden * q_width + 2 * hidden * kv_width + q_width * hidden;
  if (model.attention_bias()) {
    count.attention_per_layer += q_width + 2 * kv_width;
  }
  if (model.qk_norm()) {
    count.attention_per_layer += 2ULL * model.head_dim();
  }
  if (model.has_moe()) {
    const config::MixtureOfExperts& moe = model.moe();
    count.expert = 3 * hidden * moe.expert_intermediate_size();
    count.router = hidden * moe.num_experts();
    count.shared_expert = 3 * hidden * moe.shared_expert_intermediate_size();
    count.mlp_per_layer = moe.num_experts() * count.expert + count.router + count.shared_expert;
    count.active_mlp_per_layer =
        moe.experts_per_token() * count.expert + count.router + count.shared_expert;
  } else {
    count.mlp_per_layer = 3 * hidden * model.intermediate_size();
    count.active_mlp_per_layer = count.mlp_per_layer;
  }
  count.norms_per_layer = 2 * hidden;
  count.final_norm = hidden;
  count.lm_head = model.tie_word_embeddings() ? 0 : count.embedding;
  count.layers = model.num_hidden_layers() *
                 (count.attention_per_layer + count.mlp_per_layer + count.norms_per_layer);
  count.total = count.embedding + count.layers + count.final_norm + count.lm_head;
  count.active = count.total - static_cast<uint64_t>(model.num_hidden_layers()) *
                                   (count.mlp_per_layer - count.active_mlp_per_layer);
  return count;
}

double weight_bytes(const config::ModelSpec& model, config::DType dtype) {
  return static_cast<double>(count_parameters(model).total) * config::dtype_bytes(dtype);
}

double kv_bytes_per_token_per_layer(const config::ModelSpec& model) {
  return 2.0 * model.num_key_value_heads() * model.head_dim() *
         config::dtype_bytes(model.kv_dtype());
}

double kv_bytes_per_token(const config::ModelSpec& model) {
  return kv_bytes_per_token_per_layer(model) * model.num_hidden_layers();
}

double linear_flops_per_token(const config::ModelSpec& model) {
  const ParameterCount count = count_parameters(model);
  const uint64_t matrix_weights_per_layer = count.attention_per_layer + count.active_mlp_per_layer;
  // The LM head multiplies by a vocab x hidden matrix whether or not it is tied.
  return 2.0 * (static_cast<double>(matrix_weights_per_layer) * model.num_hidden_layers() +
                static_cast<double>(count.embedding));
}

double attention_flops_per_context_token(const config::ModelSpec& model) {
  return 4.0 * model.num_hidden_layers() * model.num_attention_heads() * model.head_dim();
}

double flops_per_token(const config::ModelSpec& model, uint64_t context_tokens) {
  uint64_t attended = context_tokens;
  if (model.has_sliding_window()) {
    attended = std::min<uint64_t>(attended, model.sliding_window());
  }
  return linear_flops_per_token(model) +
         attention_flops_per_context_token(model) * static_cast<double>(attended);
}

}  // namespace kvtier::hw
