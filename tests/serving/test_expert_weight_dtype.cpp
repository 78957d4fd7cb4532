// A mixture of experts whose routed experts are stored in their own format
// (moe.expert_weight_dtype; gpt-oss's MXFP4 experts beside BF16 attention), in the weights per
// GPU, the iteration cost model, the config checks and the gpt-oss-120b preset.

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "configs/dtype.hpp"
#include "configs/schema/run.pb.h"
#include "hwmodels/iteration_cost.hpp"
#include "hwmodels/model_shape.hpp"
#include "tests/support/config_fixture.hpp"

using kvtier::config::ModelSpec;
using kvtier::hw::AttentionSplit;
using kvtier::hw::ExpertSplit;
using kvtier::hw::Parallelism;
using kvtier::test::preset;

namespace {

constexpr double kMxfp4Bytes = 17.0 / 32.0;  // 32 values of 4 bits and their 8-bit scale

// Qwen3-30B-A3B (BF16) with its routed experts in MXFP4.
ModelSpec mxfp4_experts() {
  ModelSpec model = preset<ModelSpec>("model", "Qwen3-30B-A3B");
  model.mutable_moe()->set_expert_weight_dtype(kvtier::config::MXFP4);
  return model;
}

}  // namespace

TEST_CASE("MXFP4 takes 4.25 bits a value", "[dtype]") {
  CHECK(kvtier::config::dtype_bytes(kvtier::config::MXFP4) == kMxfp4Bytes);
  CHECK(kvtier::config::is_floating_point(kvtier::config::MXFP4));
}

TEST_CASE("routed experts in their own format take its bytes on every GPU, sliced or whole",
          "[model_shape]") {
  const ModelSpec bf16 = preset<ModelSpec>("model", "Qwen3-30B-A3B");
  const ModelSpec mxfp4 = mxfp4_experts();
  const auto count = kvtier::hw::count_parameters(bf16);
  const double routed = static_cast<double>(bf16.num_hidden_layers()) * bf16.moe().num_experts() *
                        static_cast<double>(count.expert);
  const double saved_per_weight = 2.0 - kMxfp4Bytes;
  // One GPU: every routed expert, the rest at BF16.
  CHECK(kvtier::hw::weight_bytes(mxfp4, mxfp4.weight_dtype()) ==
        Approx(kvtier::hw::weight_bytes(bf16, bf16.weight_dtype()) - routed * saved_per_weight)
            .epsilon(1e-12));
  // 100 experts over 8 GPUs: sliced, an eighth of each; whole, the busiest GPU's 13.
  ModelSpec bf16_100 = bf16;
  bf16_100.mutable_moe()->set_num_experts(100);
  ModelSpec mxfp4_100 = mxfp4;
  mxfp4_100.mutable_moe()->set_num_experts(100);
  const double expert_layers = bf16.num_hidden_layers();
  for (const ExpertSplit split : {ExpertSplit::kSliced, ExpertSplit::kWhole}) {
    const Parallelism eight{8, AttentionSplit::kHeads, split};
    const double experts_on_gpu = split == ExpertSplit::kWhole ? 13.0 : 100.0 / 8;
    INFO((split == ExpertSplit::kWhole ? "whole" : "sliced"));
    CHECK(kvtier::hw::weight_bytes_per_gpu(mxfp4_100, mxfp4.weight_dtype(), eight) ==
          Approx(kvtier::hw::weight_bytes_per_gpu(bf16_100, bf16.weight_dtype(), eight) -
                 expert_layers * experts_on_gpu * static_cast<double>(count.expert) *
                     saved_per_weight)
              .epsilon(1e-12));
  }
  // Given as the weights' own format, nothing changes.
  ModelSpec same = bf16;
  same.mutable_moe()->set_expert_weight_dtype(kvtier::config::BF16);
  CHECK(kvtier::hw::weight_bytes(same, same.weight_dtype()) ==
        kvtier::hw::weight_bytes(bf16, bf16.weight_dtype()));
}

TEST_CASE("an iteration reads the experts it reaches in their own format", "[iteration_cost]") {
  const auto gpu = preset<kvtier::config::GpuSpec>("gpu", "H100-SXM");
  const ModelSpec bf16 = preset<ModelSpec>("model", "Qwen3-30B-A3B");
  const ModelSpec mxfp4 = mxfp4_experts();
  // One decoding token reaches its 8 experts in each layer: their gate, up and down weights.
  kvtier::hw::BatchShape batch;
  batch.decode_tokens = 1;
  batch.decode_context_tokens = 1;
  batch.logits_tokens = 1;
  const auto read = [&](const ModelSpec& model) {
    return kvtier::hw::IterationCostModel(model, gpu, nullptr, 1).cost(batch).hbm_bytes;
  };
  const double expert_weights = 3.0 * bf16.hidden_size() * bf16.moe().expert_intermediate_size();
  const double reached = bf16.moe().experts_per_token() * bf16.num_hidden_layers();
  CHECK(read(bf16) - read(mxfp4) ==
        Approx(reached * expert_weights * (2.0 - kMxfp4Bytes)).epsilon(1e-9));
  // The GEMMs still run in BF16: the FLOPs are the same.
  CHECK(kvtier::hw::IterationCostModel(mxfp4, gpu, nullptr, 1).cost(batch).flops ==
        kvtier::hw::IterationCostModel(bf16, gpu, nullptr, 1).cost(batch).flops);
}

TEST_CASE("MXFP4 is a weight format only", "[config]") {
  const auto problems = [](const std::vector<std::string>& sets) {
    return kvtier::test::joined(
        kvtier::test::problems<kvtier::config::RunSpec>(kvtier::test::quickstart_run(), sets));
  };
  CHECK_THAT(problems({"model.activation_dtype=MXFP4"}),
             Catch::Contains("MXFP4 is modelled as a weight format only (weight_dtype, "
                             "moe.expert_weight_dtype), not as activation_dtype"));
  CHECK_THAT(problems({"model.kv_dtype=MXFP4"}),
             Catch::Contains("not as kv_dtype") && Catch::Contains("field model.kv_dtype"));
  CHECK(problems({"model.weight_dtype=MXFP4"}).empty());
  // Integer activations with floating-point experts are refused as with such weights.
  CHECK_THAT(problems({"model.weight_dtype=INT8", "model.activation_dtype=INT8",
                       "model.kv_dtype=INT8", "model.moe.expert_weight_dtype=MXFP4"}),
             Catch::Contains("integer activations with floating-point weights"));
}

TEST_CASE("gpt-oss-120b and gpt-oss-20b match their model card's parameters and checkpoint sizes",
          "[presets]") {
  // arXiv:2508.10925, Table 1: parameters in all and active (without the embedding lookup), the
  // checkpoint's GiB; their biases and sinks (40M and 7M) are not counted. Every other layer
  // global, 2,048 bytes of KV a layer and token.
  struct Card {
    std::string name;
    double parameters;
    double active;
    double gib;
    std::uint32_t layers;
  };
  for (const Card& card : {Card{"gpt-oss-120b", 116.83e9, 5.13e9, 60.8, 36},
                           Card{"gpt-oss-20b", 20.91e9, 3.61e9, 12.8, 24}}) {
    INFO(card.name);
    const ModelSpec model = preset<ModelSpec>("model", card.name.c_str());
    const auto count = kvtier::hw::count_parameters(model);
    CHECK(std::abs(static_cast<double>(count.total) - card.parameters) / card.parameters < 0.001);
    const double active = static_cast<double>(count.active - count.embedding);
    CHECK(std::abs(active - card.active) / card.active < 0.01);
    const double gib =
        kvtier::hw::weight_bytes(model, model.weight_dtype()) / (1024.0 * 1024 * 1024);
    CHECK(std::abs(gib - card.gib) / card.gib < 0.005);
    CHECK(model.num_hidden_layers() == card.layers);
    CHECK(kvtier::hw::global_attention_layers(model, card.layers) == card.layers / 2);
    CHECK(kvtier::hw::kv_bytes_per_token_per_layer(model) == 2048);
  }
}
