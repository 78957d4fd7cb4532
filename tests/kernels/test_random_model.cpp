// Seeded random models (kernels/random_model.hpp): the shapes a checkpoint of the architecture
// would have, values fixed by the seed, and an engine that runs them.

#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <memory>

#include "common/errors.hpp"
#include "kernels/engine.hpp"
#include "kernels/random_model.hpp"
#include "tests/kernels/support/model_files.hpp"

namespace {

namespace kk = kvtier::kernels;
using kvtier::config::Architecture;

bool same_values(const kk::WeightTensor& a, const kk::WeightTensor& b) {
  return a.rows == b.rows && a.cols == b.cols &&
         std::memcmp(a.data, b.data, static_cast<std::size_t>(a.rows * a.cols) * sizeof(float)) ==
             0;
}

}  // namespace

TEST_CASE("a random model has the architecture's tensors and shapes", "[kernels][random]") {
  for (const Architecture architecture :
       {kvtier::config::LLAMA, kvtier::config::QWEN2, kvtier::config::QWEN3}) {
    CAPTURE(architecture);
    const kvtier::config::ModelSpec spec = kk::testing::small_spec(architecture);
    const kk::ModelWeights model = kk::random_model(spec);
    const kk::ExpectedShapes shape = kk::expected_shapes(spec);
    REQUIRE(model.layers.size() == spec.num_hidden_layers());
    REQUIRE(model.token_embedding.rows == shape.vocab);
    REQUIRE(model.token_embedding.cols == shape.hidden);
    const kk::LayerWeights& layer = model.layers.back();
    REQUIRE(layer.wq.rows == shape.q_out);
    REQUIRE(layer.wk.rows == shape.kv_out);
    REQUIRE(layer.w_down.cols == shape.intermediate);
    REQUIRE(layer.q_bias.present() == spec.attention_bias());
    REQUIRE(layer.k_norm.present() == spec.qk_norm());
    REQUIRE(model.source == "random:" + spec.name());
    // Values: within ±0.02·√3, not constant; norms are ones.
    float low = 1.0F;
    float high = -1.0F;
    for (std::int64_t i = 0; i < layer.wq.rows * layer.wq.cols; ++i) {
      low = std::min(low, layer.wq.data[i]);
      high = std::max(high, layer.wq.data[i]);
    }
    REQUIRE(low >= -0.0347F);
    REQUIRE(high <= 0.0347F);
    REQUIRE(high - low > 0.05F);
    REQUIRE(layer.mlp_norm.data[0] == 1.0F);
  }
}

TEST_CASE("a random model's values are fixed by its seed", "[kernels][random]") {
  const kvtier::config::ModelSpec spec = kk::testing::small_spec(kvtier::config::QWEN2);
  const kk::ModelWeights a = kk::random_model(spec, {.seed = 5});
  const kk::ModelWeights b = kk::random_model(spec, {.seed = 5});
  const kk::ModelWeights c = kk::random_model(spec, {.seed = 6});
  REQUIRE(same_values(a.token_embedding, b.token_embedding));
  REQUIRE(same_values(a.layers[0].w_up, b.layers[0].w_up));
  REQUIRE(same_values(a.layers[0].q_bias, b.layers[0].q_bias));
  REQUIRE_FALSE(same_values(a.layers[0].w_up, c.layers[0].w_up));
  // Tensors differ from each other (each has its own stream).
  REQUIRE_FALSE(same_values(a.layers[0].w_gate, a.layers[0].w_up));

  // Shared layers point at one layer's tensors; unshared ones have their own, the first layer
  // equal to the shared one.
  REQUIRE(a.layers.back().wq.data == a.layers.front().wq.data);
  const kk::ModelWeights own = kk::random_model(spec, {.seed = 5, .share_layer_weights = false});
  REQUIRE(own.layers.back().wq.data != own.layers.front().wq.data);
  REQUIRE(same_values(own.layers.front().wq, a.layers.front().wq));
  REQUIRE_FALSE(same_values(own.layers.back().wq, own.layers.front().wq));
}

TEST_CASE("the CPU engine runs a random model", "[kernels][random]") {
  const auto model = std::make_shared<const kk::ModelWeights>(
      kk::random_model(kk::testing::small_spec(kvtier::config::QWEN3)));
  const auto engine = kk::make_cpu_engine(model);
  const std::vector<std::int32_t> prompt = {1, 2, 3, 4};
  std::span<const float> logits = engine->prefill(prompt);
  logits = engine->decode(7);
  REQUIRE(logits.size() == model->spec.vocab_size());
  for (const float value : logits) {
    REQUIRE(std::isfinite(value));
  }
}

TEST_CASE("a random model of an engine-incompatible spec is refused", "[kernels][random]") {
  kvtier::config::ModelSpec spec = kk::testing::small_spec(kvtier::config::LLAMA);
  spec.set_num_key_value_heads(3);  // heads not a multiple of KV heads
  REQUIRE_THROWS_AS(kk::random_model(spec), kvtier::DataError);
  // A mixture of experts is simulated, not run: the engine says so, naming the field.
  kvtier::config::ModelSpec moe = kk::testing::small_spec(kvtier::config::QWEN3);
  moe.mutable_moe()->set_num_experts(4);
  moe.mutable_moe()->set_experts_per_token(2);
  moe.mutable_moe()->set_expert_intermediate_size(8);
  CHECK_THROWS_WITH(kk::random_model(moe),
                    Catch::Contains("is a mixture of experts") && Catch::Contains("field moe"));
  // So is latent attention.
  kvtier::config::ModelSpec latent = kk::testing::small_spec(kvtier::config::DEEPSEEK_V2);
  latent.mutable_mla()->set_kv_lora_rank(8);
  latent.mutable_mla()->set_qk_nope_head_dim(4);
  latent.mutable_mla()->set_qk_rope_head_dim(4);
  latent.mutable_mla()->set_v_head_dim(8);
  CHECK_THROWS_WITH(kk::random_model(latent),
                    Catch::Contains("multi-head latent attention") && Catch::Contains("field mla"));
  // So are hybrid attention and Gemma 3.
  kvtier::config::ModelSpec hybrid = kk::testing::small_spec(kvtier::config::MISTRAL);
  hybrid.set_sliding_window(4);
  hybrid.set_sliding_window_pattern(2);
  CHECK_THROWS_WITH(kk::random_model(hybrid), Catch::Contains("has hybrid attention") &&
                                                  Catch::Contains("field sliding_window_pattern"));
  kvtier::config::ModelSpec gemma = kk::testing::small_spec(kvtier::config::QWEN3);
  gemma.set_architecture(kvtier::config::GEMMA3);
  CHECK_THROWS_WITH(kk::random_model(gemma),
                    Catch::Contains("is a Gemma 3") && Catch::Contains("field architecture"));
}
