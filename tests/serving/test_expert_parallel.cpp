// Expert parallelism: a mixture of experts' routed experts kept whole and spread over the GPUs,
// in the weights per GPU, the iteration cost model and the serving simulation.

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "configs/schema/run.pb.h"
#include "hwmodels/iteration_cost.hpp"
#include "hwmodels/model_shape.hpp"
#include "serving/memory_plan.hpp"
#include "tests/support/batch_shapes.hpp"
#include "tests/support/config_fixture.hpp"
#include "tests/support/serving_metrics.hpp"

using kvtier::config::ModelSpec;
using kvtier::hw::AttentionSplit;
using kvtier::hw::ExpertSplit;
using kvtier::hw::IterationCostModel;
using kvtier::hw::Parallelism;
using kvtier::test::decode;
using kvtier::test::preset;

namespace {

// The mean over `trials` of the most (token, expert) rows any of `gpus` GPUs takes when each of
// `tokens` tokens picks `picks` distinct experts of `experts` uniformly at random, the experts
// dealt out to the GPUs in contiguous blocks.
double simulated_busiest_rows(std::uint32_t experts, std::uint32_t picks, std::uint32_t gpus,
                              std::uint32_t tokens, int trials) {
  std::mt19937_64 random(7);
  std::vector<std::uint32_t> order(experts);
  std::iota(order.begin(), order.end(), 0U);
  const std::uint32_t per_gpu = (experts + gpus - 1) / gpus;
  double sum = 0.0;
  for (int trial = 0; trial < trials; ++trial) {
    std::vector<std::uint32_t> rows(gpus, 0);
    for (std::uint32_t token = 0; token < tokens; ++token) {
      // A partial Fisher-Yates shuffle: the first `picks` are the token's experts.
      for (std::uint32_t i = 0; i < picks; ++i) {
        std::uniform_int_distribution<std::uint32_t> pick(i, experts - 1);
        std::swap(order[i], order[pick(random)]);
        ++rows[order[i] / per_gpu];
      }
    }
    sum += *std::max_element(rows.begin(), rows.end());
  }
  return sum / trials;
}

}  // namespace

TEST_CASE("the expected largest of n standard normal variables", "[model_shape]") {
  using kvtier::hw::expected_max_standard_normal;
  CHECK(expected_max_standard_normal(1) == 0.0);
  // Closed forms for 2 and 3 (1/√π and 3/(2√π)); the tabulated 1.42360 for 8.
  CHECK(expected_max_standard_normal(2) == Approx(0.5641895835).epsilon(1e-9));
  CHECK(expected_max_standard_normal(3) == Approx(0.8462843753).epsilon(1e-9));
  CHECK(expected_max_standard_normal(8) == Approx(1.4236003).epsilon(1e-6));
  CHECK(expected_max_standard_normal(64) > expected_max_standard_normal(8));
  CHECK(expected_max_standard_normal(100) > expected_max_standard_normal(64));
}

TEST_CASE("the busiest GPU's expert rows under uniformly random routing", "[model_shape]") {
  const ModelSpec deepseek = preset<ModelSpec>("model", "DeepSeek-V3");  // 256 experts, 8 each
  const Parallelism whole{8, AttentionSplit::kHeads, ExpertSplit::kWhole};
  const Parallelism sliced{8, AttentionSplit::kHeads, ExpertSplit::kSliced};
  using kvtier::hw::expert_rows_on_busiest_gpu;
  // Sliced, every GPU takes a slice of every row.
  CHECK(expert_rows_on_busiest_gpu(deepseek, sliced, 100) == 800);
  // Whole: against a simulation of random routing, within 3% from 16 to 4,096 tokens (1.3% at most,
  // seed 7).
  for (const std::uint32_t tokens : {16U, 64U, 512U, 4096U}) {
    CAPTURE(tokens);
    const double simulated = simulated_busiest_rows(256, 8, 8, tokens, tokens >= 4096 ? 40 : 400);
    CHECK(expert_rows_on_busiest_gpu(deepseek, whole, tokens) == Approx(simulated).epsilon(0.03));
  }
  // Above the mean share, less so the more tokens there are.
  const double mean_64 = 64.0 * 8 / 8;
  const double mean_4096 = 4096.0 * 8 / 8;
  CHECK(expert_rows_on_busiest_gpu(deepseek, whole, 64) / mean_64 >
        expert_rows_on_busiest_gpu(deepseek, whole, 4096) / mean_4096);
  CHECK(expert_rows_on_busiest_gpu(deepseek, whole, 4096) > mean_4096);
  // One token cannot put more than its 8 picks on a GPU, however unlucky.
  CHECK(expert_rows_on_busiest_gpu(deepseek, whole, 1) <= 8.0);
  // A stated imbalance replaces the statistics.
  Parallelism balanced = whole;
  balanced.expert_load_imbalance = 1.0;
  CHECK(expert_rows_on_busiest_gpu(deepseek, balanced, 64) == mean_64);
  balanced.expert_load_imbalance = 1.5;
  CHECK(expert_rows_on_busiest_gpu(deepseek, balanced, 64) == 1.5 * mean_64);
}

TEST_CASE("whole experts: the GPU with the most of them sets the weights per GPU",
          "[model_shape]") {
  ModelSpec model = preset<ModelSpec>("model", "DeepSeek-V3");
  const auto dtype = model.weight_dtype();
  const auto count = kvtier::hw::count_parameters(model);
  const double expert_layers = 58;
  const Parallelism sliced{8, AttentionSplit::kHeads, ExpertSplit::kSliced};
  const Parallelism whole{8, AttentionSplit::kHeads, ExpertSplit::kWhole};
  using kvtier::hw::weight_bytes_per_gpu;
  // 256 experts over 8 GPUs: 32 whole each, the same bytes as a slice of each (FP8: 1 B).
  CHECK(weight_bytes_per_gpu(model, dtype, whole) ==
        Approx(weight_bytes_per_gpu(model, dtype, sliced)).epsilon(1e-12));
  // 252 experts: the busiest GPU holds 32, not 31.5.
  model.mutable_moe()->set_num_experts(252);
  CHECK(weight_bytes_per_gpu(model, dtype, whole) - weight_bytes_per_gpu(model, dtype, sliced) ==
        Approx(expert_layers * 0.5 * static_cast<double>(count.expert)).epsilon(1e-9));
  CHECK(kvtier::hw::experts_on_busiest_gpu(model, whole) == 32);
  // With data-parallel attention, each GPU keeps the shared expert whole as well.
  model.mutable_moe()->set_num_experts(256);
  const Parallelism dp{8, AttentionSplit::kRequests, ExpertSplit::kSliced};
  const Parallelism dp_whole{8, AttentionSplit::kRequests, ExpertSplit::kWhole};
  CHECK(weight_bytes_per_gpu(model, dtype, dp_whole) - weight_bytes_per_gpu(model, dtype, dp) ==
        Approx(expert_layers * static_cast<double>(count.shared_expert) * 7 / 8).epsilon(1e-9));
}

TEST_CASE("whole experts: the layer waits for the GPU whose experts take the most rows",
          "[iteration_cost]") {
  const auto gpu = preset<kvtier::config::GpuSpec>("gpu", "H200");
  const auto nvlink = preset<kvtier::config::LinkSpec>("link", "NVLink4");
  const ModelSpec model = preset<ModelSpec>("model", "DeepSeek-V3");
  const Parallelism sliced{8, AttentionSplit::kHeads, ExpertSplit::kSliced};
  Parallelism balanced{8, AttentionSplit::kHeads, ExpertSplit::kWhole, 1.0};
  Parallelism doubled = balanced;
  doubled.expert_load_imbalance = 2.0;
  const Parallelism random{8, AttentionSplit::kHeads, ExpertSplit::kWhole};
  const auto batch = decode(256, 2000);
  const auto by_slices = IterationCostModel(model, gpu, &nvlink, sliced).cost(batch);
  const auto even = IterationCostModel(model, gpu, &nvlink, balanced).cost(batch);
  const auto twice = IterationCostModel(model, gpu, &nvlink, doubled).cost(batch);
  const auto routed = IterationCostModel(model, gpu, &nvlink, random).cost(batch);
  // Balanced, the GPU does an eighth of the rows with whole experts: the FLOPs of a slice of
  // every row, and the same all-reduces.
  CHECK(even.flops == Approx(by_slices.flops).epsilon(1e-12));
  CHECK(even.interconnect_bytes == by_slices.interconnect_bytes);
  // Twice the mean share of rows: the routed experts' FLOPs twice over (58 layers, 256 tokens
  // with 8 picks each over 8 GPUs, gate, up and down of 7,168 x 2,048).
  const double routed_flops = 58.0 * 2 * (256.0 * 8 / 8) * 3 * 7168 * 2048;
  CHECK(twice.flops - even.flops == Approx(routed_flops).epsilon(1e-9));
  // Random routing lands between the two, and costs more time than perfect balance.
  CHECK(routed.flops > even.flops);
  CHECK(routed.flops < twice.flops);
  CHECK(routed.total >= even.total);
  // A dense model has no experts to spread.
  const auto llama = preset<ModelSpec>("model", "Llama-3.1-70B");
  CHECK_THROWS_WITH(IterationCostModel(llama, gpu, &nvlink, random),
                    Catch::Contains("expert parallelism needs a mixture of experts"));
}

TEST_CASE("data-parallel attention with whole experts: tokens travel to their experts and back",
          "[iteration_cost]") {
  const auto gpu = preset<kvtier::config::GpuSpec>("gpu", "H200");
  const auto nvlink = preset<kvtier::config::LinkSpec>("link", "NVLink4");
  ModelSpec model = preset<ModelSpec>("model", "DeepSeek-V3");
  model.mutable_moe()->clear_first_dense_layers();  // every layer's MLP is experts
  const Parallelism gathered{8, AttentionSplit::kRequests, ExpertSplit::kSliced};
  const Parallelism deep_ep{8, AttentionSplit::kRequests, ExpertSplit::kWhole};
  const auto batch = decode(512, 2000);
  const auto gather = IterationCostModel(model, gpu, &nvlink, gathered).cost(batch);
  const auto all_to_all = IterationCostModel(model, gpu, &nvlink, deep_ep).cost(batch);
  // Each GPU's 64 tokens go to the other GPUs their 8 picks land on: 7 GPUs, each missed by
  // all 8 picks with probability C(224, 8)/C(256, 8); in FP8 (1 B) there and BF16 back.
  double missed = 1.0;
  for (int i = 0; i < 8; ++i) {
    missed *= (224.0 - i) / (256.0 - i);
  }
  const double per_layer = 64.0 * 7 * (1 - missed) * 7168 * (1 + 2);
  CHECK(all_to_all.interconnect_bytes == Approx(61 * per_layer).epsilon(1e-9));
  // About half of what gathering every token to every GPU and scattering it back moves.
  CHECK(all_to_all.interconnect_bytes < 0.6 * gather.interconnect_bytes);
  // Each GPU routes and weights only its own tokens, and runs the shared expert on them
  // whole: fewer FLOPs than the shared expert sliced over all 512 tokens, plus imbalance.
  CHECK(all_to_all.total < gather.total);
}

TEST_CASE("engine.expert_parallel in a run", "[serving]") {
  const auto metrics = [](const std::vector<std::string>& sets) {
    return kvtier::test::serving_metrics(
        kvtier::test::load_spec<kvtier::config::RunSpec>(kvtier::test::quickstart_run(), sets));
  };
  const std::vector<std::string> v2_lite{"model.preset=DeepSeek-V2-Lite",
                                         "tensor_parallel_degree=2"};
  auto with = [&](std::vector<std::string> more) {
    more.insert(more.begin(), v2_lite.begin(), v2_lite.end());
    return more;
  };
  const auto sliced = metrics(v2_lite);
  const auto balanced =
      metrics(with({"engine.expert_parallel=true", "engine.expert_load_imbalance=1"}));
  const auto skewed =
      metrics(with({"engine.expert_parallel=true", "engine.expert_load_imbalance=1.8"}));
  // 64 experts over 2 GPUs: the same weights per GPU either way.
  CHECK(balanced.at("hbm_kv_capacity_gib") == sliced.at("hbm_kv_capacity_gib"));
  // A GPU whose experts take 1.8 times the mean share of rows slows every step.
  CHECK(skewed.at("tpot_mean_ms") > balanced.at("tpot_mean_ms"));

  using Catch::Matchers::Contains;
  using kvtier::test::problems;
  using RunSpec = kvtier::config::RunSpec;
  const auto run = kvtier::test::quickstart_run();
  const auto dense = problems<RunSpec>(run, {"engine.expert_parallel=true"});
  REQUIRE_FALSE(dense.empty());
  CHECK_THAT(dense.front(), Contains("engine.expert_parallel") &&
                                Contains("needs a mixture of experts (model.moe)"));
  const auto one_gpu = problems<RunSpec>(
      run,
      {"model.preset=DeepSeek-V2-Lite", "tensor_parallel_degree=1", "engine.expert_parallel=true"});
  REQUIRE_FALSE(one_gpu.empty());
  CHECK_THAT(one_gpu.front(), Contains("tensor_parallel_degree must be at least 2"));
  const auto stray = problems<RunSpec>(run, with({"engine.expert_load_imbalance=1.2"}));
  REQUIRE_FALSE(stray.empty());
  CHECK_THAT(stray.front(),
             Contains("engine.expert_load_imbalance") && Contains("set engine.expert_parallel"));
  const auto below_one = problems<RunSpec>(
      run, with({"engine.expert_parallel=true", "engine.expert_load_imbalance=0.5"}));
  REQUIRE_FALSE(below_one.empty());
  CHECK_THAT(below_one.front(), Contains("engine.expert_load_imbalance"));
}
