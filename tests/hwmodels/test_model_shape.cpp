#include <catch2/catch.hpp>

#include "hwmodels/model_shape.hpp"

using kvtier::config::ModelSpec;

namespace {

ModelSpec tiny(kvtier::config::Architecture architecture) {
  ModelSpec model;
  model.set_architecture(architecture);
  model.set_num_hidden_layers(2);
  model.set_hidden_size(8);
  model.set_num_attention_heads(4);
  model.set_num_key_value_heads(2);
  model.set_head_dim(2);
  model.set_intermediate_size(16);
  model.set_vocab_size(10);
  model.set_tie_word_embeddings(false);
  model.set_attention_bias(false);
  model.set_qk_norm(false);
  model.set_kv_dtype(kvtier::config::BF16);
  model.set_weight_dtype(kvtier::config::BF16);
  return model;
}

}  // namespace

TEST_CASE("parameters are counted per tensor", "[model_shape]") {
  ModelSpec model = tiny(kvtier::config::LLAMA);
  const auto count = kvtier::hw::count_parameters(model);
  CHECK(count.embedding == 80);
  CHECK(count.attention_per_layer == 8 * 8 + 2 * 8 * 4 + 8 * 8);  // q, k+v, o
  CHECK(count.mlp_per_layer == 3 * 8 * 16);
  CHECK(count.norms_per_layer == 16);
  CHECK(count.lm_head == 80);
  CHECK(count.total == 80 + 2 * (192 + 384 + 16) + 8 + 80);

  model.set_tie_word_embeddings(true);
  CHECK(kvtier::hw::count_parameters(model).lm_head == 0);
  model.set_attention_bias(true);
  CHECK(kvtier::hw::count_parameters(model).attention_per_layer == 192 + 8 + 2 * 4);
  model.set_qk_norm(true);
  CHECK(kvtier::hw::count_parameters(model).attention_per_layer == 192 + 16 + 2 * 2);
}

TEST_CASE("KV bytes follow 2 · layers · kv_heads · head_dim · bytes", "[model_shape]") {
  ModelSpec model = tiny(kvtier::config::LLAMA);
  CHECK(kvtier::hw::kv_bytes_per_token_per_layer(model) == 2 * 2 * 2 * 2);
  CHECK(kvtier::hw::kv_bytes_per_token(model) == 2 * 2 * 2 * 2 * 2);
  model.set_kv_dtype(kvtier::config::INT4);
  CHECK(kvtier::hw::kv_bytes_per_token(model) == 2 * 2 * 2 * 2 * 0.5);
  CHECK(kvtier::hw::weight_bytes(model, kvtier::config::INT8) ==
        static_cast<double>(kvtier::hw::count_parameters(model).total));
}

TEST_CASE("FLOPs per token: two per matrix weight plus attention over the context",
          "[model_shape]") {
  ModelSpec model = tiny(kvtier::config::LLAMA);
  const double linear = 2.0 * (2 * (192 + 384) + 80);
  CHECK(kvtier::hw::linear_flops_per_token(model) == linear);
  CHECK(kvtier::hw::attention_flops_per_context_token(model) == 4.0 * 2 * 4 * 2);
  CHECK(kvtier::hw::flops_per_token(model, 100) == linear + 64.0 * 100);
  // A sliding window caps how far attention reaches.
  model.set_sliding_window(10);
  CHECK(kvtier::hw::flops_per_token(model, 100) == linear + 64.0 * 10);
}
