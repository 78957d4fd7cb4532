#include <catch2/catch.hpp>

#include "common/errors.hpp"
#include "hwmodels/model_shape.hpp"

using kvtier::config::ModelSpec;
constexpr auto kHeads = kvtier::hw::AttentionSplit::kHeads;
constexpr auto kRequests = kvtier::hw::AttentionSplit::kRequests;

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
  // Quantised weights keep the embedding and LM head (80 each) in 16 bits.
  const auto total = static_cast<double>(kvtier::hw::count_parameters(model).total);
  CHECK(kvtier::hw::weight_bytes(model, kvtier::config::INT8) == (total - 160) * 1 + 160 * 2);
  CHECK(kvtier::hw::weight_bytes(model, kvtier::config::INT4) == (total - 160) * 0.5 + 160 * 2);
  CHECK(kvtier::hw::weight_bytes(model, kvtier::config::BF16) == total * 2);
  CHECK(kvtier::hw::weight_bytes(model, kvtier::config::FP32) == total * 4);
  // Over two GPUs both tables are split with the rest.
  CHECK(kvtier::hw::weight_bytes_per_gpu(model, kvtier::config::INT4, 2,
                                         kvtier::hw::AttentionSplit::kHeads) ==
        (total - 160) * 0.5 / 2 + 160 * 2 / 2);
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

namespace {

// tiny()'s model with multi-head latent attention: 4 heads of query/key width 3 (2 without RoPE,
// 1 with) over a latent of 4, values of 2, queries through a latent of 2.
ModelSpec tiny_latent() {
  ModelSpec model = tiny(kvtier::config::DEEPSEEK_V2);
  model.set_num_key_value_heads(4);
  model.set_head_dim(3);
  auto& mla = *model.mutable_mla();
  mla.set_kv_lora_rank(4);
  mla.set_q_lora_rank(2);
  mla.set_qk_nope_head_dim(2);
  mla.set_qk_rope_head_dim(1);
  mla.set_v_head_dim(2);
  return model;
}

}  // namespace

TEST_CASE("latent attention's parameters are its down- and up-projections and latent norms",
          "[model_shape]") {
  ModelSpec model = tiny_latent();
  auto count = kvtier::hw::count_parameters(model);
  // q_a 8x2 + its norm 2 + q_b 2x(4·3); kv_a 8x(4+1) + its norm 4; kv_b 4x(4·(2+2)); o (4·2)x8.
  CHECK(count.attention_per_layer == (16 + 2 + 24) + (40 + 4) + 64 + 64);
  CHECK(count.total == 80 + 2 * (214 + 384 + 16) + 8 + 80);
  // The down-projections and their norms are replicated over tensor parallelism.
  CHECK(count.replicated == 2 * (8 * (2 + 4 + 1) + 2 + 4));
  CHECK(kvtier::hw::weight_bytes_per_gpu(model, kvtier::config::BF16, 2, kHeads) ==
        2.0 * ((1396.0 - 124.0) / 2.0 + 124.0));
  CHECK(kvtier::hw::weight_bytes_per_gpu(model, kvtier::config::BF16, 1, kHeads) ==
        kvtier::hw::weight_bytes(model, kvtier::config::BF16));
  // Data-parallel attention keeps all of every layer's attention (2 · 214) and the input
  // embedding (80) whole.
  CHECK(kvtier::hw::weight_bytes_per_gpu(model, kvtier::config::BF16, 2, kRequests) ==
        2.0 * ((1396.0 - 508.0) / 2.0 + 508.0));
  // In INT8 the tables stay 16-bit: the whole embedding and half the LM head, 2 bytes each.
  CHECK(kvtier::hw::weight_bytes_per_gpu(model, kvtier::config::INT8, 2, kRequests) ==
        ((1396.0 - 508.0 - 80.0) / 2.0 + (508.0 - 80.0)) + 2.0 * (80.0 / 2.0 + 80.0));
  // Without a query latent, the queries come straight from the hidden state.
  model.mutable_mla()->clear_q_lora_rank();
  count = kvtier::hw::count_parameters(model);
  CHECK(count.attention_per_layer == 8 * (4 * 3) + (40 + 4) + 64 + 64);
  CHECK(count.replicated == 2 * (8 * (4 + 1) + 4));
}

TEST_CASE("latent attention caches one latent and RoPE key per token, whole on every GPU",
          "[model_shape]") {
  const ModelSpec model = tiny_latent();
  const auto vectors = kvtier::hw::kv_vectors_per_token_per_layer(model);
  CHECK(vectors.count == 1);
  CHECK(vectors.width == 4 + 1);
  CHECK(kvtier::hw::kv_bytes_per_token_per_layer(model) == 5 * 2);
  CHECK(kvtier::hw::kv_bytes_per_token(model) == 2 * 5 * 2);
  CHECK(kvtier::hw::kv_shards(model, 4, kHeads) == 1);
  CHECK(kvtier::hw::kv_bytes_per_token_per_gpu(model, 4, kHeads) == 2 * 5 * 2);
  CHECK(kvtier::hw::kv_bytes_per_token_per_layer_per_gpu(model, 4, kHeads) == 5 * 2);
  // With data-parallel attention a GPU keeps its own requests' latents: a quarter on average.
  CHECK(kvtier::hw::kv_shards(model, 4, kRequests) == 4);
  CHECK(kvtier::hw::kv_bytes_per_token_per_gpu(model, 4, kRequests) == 2 * 5 * 2 / 4.0);
  // Per-head KV is split over the GPUs.
  const ModelSpec gqa = tiny(kvtier::config::LLAMA);
  CHECK(kvtier::hw::kv_vectors_per_token_per_layer(gqa).count == 2 * 2);
  CHECK(kvtier::hw::kv_shards(gqa, 2, kHeads) == 2);
  CHECK(kvtier::hw::kv_bytes_per_token_per_gpu(gqa, 2, kHeads) ==
        kvtier::hw::kv_bytes_per_token(gqa) / 2);
  // Decoding's attention: scores over latent + RoPE key, then the latent weighted: per head
  // 2·(4 + 1) + 2·4 FLOPs per context token, in 2 layers of 4 heads.
  CHECK(kvtier::hw::attention_flops_per_context_token(model) == 2.0 * 4 * (2 * 4 + 1) * 2);
}

TEST_CASE("a mixture of experts' first dense layers count a dense MLP", "[model_shape]") {
  ModelSpec model = tiny(kvtier::config::QWEN3);
  model.set_qk_norm(false);
  model.set_num_hidden_layers(3);
  auto& moe = *model.mutable_moe();
  moe.set_num_experts(4);
  moe.set_experts_per_token(2);
  moe.set_expert_intermediate_size(4);
  moe.set_first_dense_layers(1);
  const auto count = kvtier::hw::count_parameters(model);
  CHECK(count.expert == 3 * 8 * 4);
  CHECK(count.router == 8 * 4);
  CHECK(count.mlp_per_layer == 4 * 96 + 32);
  CHECK(count.dense_mlp_layers == 1);
  CHECK(count.dense_mlp_per_layer == 3 * 8 * 16);
  // Three layers of attention (192) and norms (16), two of experts and one dense MLP.
  CHECK(count.total == 80 + (3 * (192 + 16) + 2 * 416 + 384) + 8 + 80);
  CHECK(count.active == count.total - 2 * (416 - (2 * 96 + 32)));
  CHECK(count.replicated == 2 * 32);  // the two routers
  CHECK(kvtier::hw::linear_flops_per_token(model) ==
        2.0 * (3 * 192 + 2 * (2 * 96 + 32) + 384 + 80));
}

TEST_CASE("dimensions past any model's range are refused instead of wrapping", "[model_shape]") {
  ModelSpec model = tiny(kvtier::config::LLAMA);
  model.set_name("huge");
  // 4·10^9 × 4·10^9 embedding weights: past 2^64, which would wrap to a small model.
  model.set_hidden_size(4000000000U);
  model.set_vocab_size(4000000000U);
  CHECK_THROWS_AS(kvtier::hw::count_parameters(model), kvtier::ConfigError);
  CHECK_THROWS_WITH(kvtier::hw::count_parameters(model),
                    Catch::Contains("model huge has more than 2^64 parameters"));
  // One layer's MLP fits (3 · 2^21 · (2^32 − 1) weights), 1,024 of them do not.
  model = tiny(kvtier::config::LLAMA);
  model.set_hidden_size(1U << 21);
  model.set_intermediate_size(0xFFFFFFFFU);
  model.set_num_hidden_layers(1024);
  CHECK_THROWS_AS(kvtier::hw::count_parameters(model), kvtier::ConfigError);
  CHECK_THROWS_AS(kvtier::hw::weight_bytes(model, kvtier::config::BF16), kvtier::ConfigError);
}
