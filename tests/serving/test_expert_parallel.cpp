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
#include "hwmodels/collectives.hpp"
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
using kvtier::test::prefill;
using kvtier::test::preset;

namespace {

// Routing to simulate: `picks` distinct experts of `experts` for each token, uniformly among the
// experts of `chosen` of `groups` equal groups, themselves chosen uniformly (1 of 1: any
// experts).
struct Routing {
  std::uint32_t experts = 256;
  std::uint32_t picks = 8;
  std::uint32_t groups = 1;
  std::uint32_t chosen = 1;
};

// The first `count` of `items` after a partial Fisher-Yates shuffle: `count` distinct ones.
void shuffle_front(std::vector<std::uint32_t>& items, std::uint32_t count,
                   std::mt19937_64& random) {
  for (std::uint32_t i = 0; i < count; ++i) {
    std::uniform_int_distribution<std::size_t> pick(i, items.size() - 1);
    std::swap(items[i], items[pick(random)]);
  }
}

// What a simulation counts per GPU: the (token, expert) rows its experts take, or the tokens
// it receives when tokens are dealt out evenly to the GPUs and each is sent once to every other
// GPU its picks land on (DeepEP's normal dispatch).
enum class Count { kRows, kReceivedTokens };

// The mean over `trials` of the most any of `gpus` GPUs counts when `tokens` tokens are routed
// so, the experts dealt out to the GPUs in contiguous blocks.
double simulated_busiest(Count count, const Routing& routing, std::uint32_t gpus,
                         std::uint32_t tokens, int trials) {
  std::mt19937_64 random(count == Count::kRows ? 7 : 11);
  const std::uint32_t group_size = routing.experts / routing.groups;
  std::vector<std::uint32_t> groups(routing.groups);
  std::iota(groups.begin(), groups.end(), 0U);
  std::vector<std::uint32_t> reachable(routing.chosen * group_size);
  const std::uint32_t per_gpu = (routing.experts + gpus - 1) / gpus;
  double sum = 0.0;
  for (int trial = 0; trial < trials; ++trial) {
    std::vector<std::uint32_t> counted(gpus, 0);
    for (std::uint32_t token = 0; token < tokens; ++token) {
      shuffle_front(groups, routing.chosen, random);
      for (std::uint32_t g = 0; g < routing.chosen; ++g) {
        std::iota(reachable.begin() + g * group_size, reachable.begin() + (g + 1) * group_size,
                  groups[g] * group_size);
      }
      shuffle_front(reachable, routing.picks, random);
      std::vector<std::uint32_t> picks_on(gpus, 0);
      for (std::uint32_t i = 0; i < routing.picks; ++i) {
        ++picks_on[reachable[i] / per_gpu];
      }
      for (std::uint32_t gpu = 0; gpu < gpus; ++gpu) {
        const bool sent = picks_on[gpu] > 0 && gpu != token % gpus;  // none to its own GPU
        counted[gpu] += count == Count::kRows ? picks_on[gpu] : (sent ? 1 : 0);
      }
    }
    sum += *std::max_element(counted.begin(), counted.end());
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
  // DeepSeek-V3's 256 experts, 8 picks a token, from any experts.
  ModelSpec deepseek = preset<ModelSpec>("model", "DeepSeek-V3");
  deepseek.mutable_moe()->clear_expert_groups();
  deepseek.mutable_moe()->clear_groups_per_token();
  const Parallelism whole{8, AttentionSplit::kHeads, ExpertSplit::kWhole};
  const Parallelism sliced{8, AttentionSplit::kHeads, ExpertSplit::kSliced};
  using kvtier::hw::expert_rows_on_busiest_gpu;
  // Sliced, every GPU takes a slice of every row.
  CHECK(expert_rows_on_busiest_gpu(deepseek, sliced, 100) == 800);
  // Whole: against a simulation of random routing over 2, 4 and 8 GPUs, within 2% from 16 to
  // 4,096 tokens. (Without the GPUs' correlation, √(n/(n−1)), the excess over the mean would
  // be 29% low on 2 GPUs, and the rows 5% low at 16 tokens.)
  for (const std::uint32_t gpus : {2U, 4U, 8U}) {
    Parallelism over{gpus, AttentionSplit::kHeads, ExpertSplit::kWhole};
    for (const std::uint32_t tokens : {16U, 64U, 512U, 4096U}) {
      CAPTURE(gpus, tokens);
      const double simulated =
          simulated_busiest(Count::kRows, Routing{}, gpus, tokens, tokens >= 4096 ? 300 : 3000);
      CHECK(expert_rows_on_busiest_gpu(deepseek, over, tokens) == Approx(simulated).epsilon(0.02));
    }
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

TEST_CASE("group-limited routing: a token's picks crowd onto the GPUs of its groups",
          "[model_shape]") {
  // DeepSeek-V3: 8 groups of 32 experts, a token's 8 picks from the 128 experts of 4 of them.
  const ModelSpec deepseek = preset<ModelSpec>("model", "DeepSeek-V3");
  ModelSpec uniform = deepseek;
  uniform.mutable_moe()->clear_expert_groups();
  uniform.mutable_moe()->clear_groups_per_token();
  using kvtier::hw::expert_rows_on_busiest_gpu;
  using kvtier::hw::picks_on_busiest_gpu;
  const Routing grouped{256, 8, 8, 4};
  // A GPU of 16 experts (half a group), 32 (a group) or 64 (two groups), against a simulation:
  // within 1% from 512 tokens; at 16 tokens within 4% (about 3.6% low on 16 GPUs, where a token's
  // picks cluster on few GPUs and the normal approximation of the sums is poorest).
  for (const std::uint32_t gpus : {4U, 8U, 16U}) {
    const Parallelism over{gpus, AttentionSplit::kHeads, ExpertSplit::kWhole};
    for (const std::uint32_t tokens : {16U, 512U}) {
      CAPTURE(gpus, tokens);
      const double simulated =
          simulated_busiest(Count::kRows, grouped, gpus, tokens, tokens >= 512 ? 1000 : 3000);
      CHECK(expert_rows_on_busiest_gpu(deepseek, over, tokens) ==
            Approx(simulated).epsilon(tokens >= 512 ? 0.01 : 0.04));
      CHECK(expert_rows_on_busiest_gpu(deepseek, over, tokens) >
            expert_rows_on_busiest_gpu(uniform, over, tokens));
    }
  }
  // At TP 8 a GPU is a group: chosen with probability 1/2, and then 8 picks of 128 of which its
  // 32 (none with probability C(96, 8)/C(128, 8)).
  const Parallelism tp8{8, AttentionSplit::kHeads, ExpertSplit::kWhole};
  const auto picks = picks_on_busiest_gpu(deepseek, tp8);
  double none_given_chosen = 1.0;
  for (int i = 0; i < 8; ++i) {
    none_given_chosen *= (96.0 - i) / (128.0 - i);
  }
  CHECK(picks.mean == Approx(1.0).epsilon(1e-12));  // 8 · 32/256
  CHECK(picks.none == Approx(0.5 + 0.5 * none_given_chosen).epsilon(1e-12));
  // Given its group, 2 picks with hypergeometric variance 8·¼·¾·120/127; over the choice, plus
  // the spread of 0 or 2: Var = ½·(that + 4) − 1.
  CHECK(picks.variance == Approx(0.5 * (8 * 0.25 * 0.75 * 120 / 127 + 4) - 1).epsilon(1e-12));
  CHECK(picks.variance > picks_on_busiest_gpu(uniform, tp8).variance);
  // Every group chosen is uniform routing.
  ModelSpec all_groups = deepseek;
  all_groups.mutable_moe()->set_groups_per_token(8);
  const auto same = picks_on_busiest_gpu(all_groups, tp8);
  CHECK(same.variance == Approx(picks_on_busiest_gpu(uniform, tp8).variance).epsilon(1e-9));
  CHECK(same.none == Approx(picks_on_busiest_gpu(uniform, tp8).none).epsilon(1e-9));
  // Groups that straddle GPUs: 48 experts in 3 groups of 16, 2 chosen, over 2 GPUs of 24, the
  // first holding a whole group and half of the next.
  ModelSpec straddling = deepseek;
  straddling.mutable_moe()->set_num_experts(48);
  straddling.mutable_moe()->set_expert_groups(3);
  straddling.mutable_moe()->set_groups_per_token(2);
  const Parallelism tp2{2, AttentionSplit::kHeads, ExpertSplit::kWhole};
  for (const std::uint32_t tokens : {16U, 512U}) {
    CAPTURE(tokens);
    const double simulated = simulated_busiest(Count::kRows, Routing{48, 8, 3, 2}, 2, tokens, 3000);
    CHECK(expert_rows_on_busiest_gpu(straddling, tp2, tokens) == Approx(simulated).epsilon(0.02));
  }
}

TEST_CASE("a prefill's dispatch: the tokens the busiest GPU receives", "[model_shape]") {
  using kvtier::hw::tokens_reaching_busiest_gpu;
  const ModelSpec deepseek = preset<ModelSpec>("model", "DeepSeek-V3");
  ModelSpec uniform = deepseek;
  uniform.mutable_moe()->clear_expert_groups();
  uniform.mutable_moe()->clear_groups_per_token();
  // Against a simulation of tokens dealt out evenly and sent once to each other GPU they reach,
  // grouped (8 groups, 4 chosen) and uniform routing over 4 and 8 GPUs, 64 to 8,192 tokens:
  // within 1.5% (at most 0.9% off when written). Scaling the mean by the busiest GPU's excess
  // of rows, as before, overstated it by 2-4% at 64 tokens.
  for (const bool grouped : {true, false}) {
    const Routing routing = grouped ? Routing{256, 8, 8, 4} : Routing{};
    const ModelSpec& model = grouped ? deepseek : uniform;
    for (const std::uint32_t gpus : {4U, 8U}) {
      const Parallelism over{gpus, AttentionSplit::kRequests, ExpertSplit::kWhole};
      for (const std::uint32_t tokens : {64U, 1024U, 8192U}) {
        CAPTURE(grouped, gpus, tokens);
        const double simulated = simulated_busiest(Count::kReceivedTokens, routing, gpus, tokens,
                                                   tokens >= 8192 ? 100 : 1000);
        const double others = tokens * (gpus - 1.0) / gpus;
        CHECK(tokens_reaching_busiest_gpu(model, over, others) == Approx(simulated).epsilon(0.015));
      }
    }
  }
  // A stated imbalance scales the mean, at most every token once.
  Parallelism stated{8, AttentionSplit::kRequests, ExpertSplit::kWhole, 1.5};
  const double reach = 1.0 - kvtier::hw::picks_on_busiest_gpu(deepseek, stated).none;
  CHECK(tokens_reaching_busiest_gpu(deepseek, stated, 1000) == Approx(1500 * reach).epsilon(1e-12));
  stated.expert_load_imbalance = 4.0;
  CHECK(tokens_reaching_busiest_gpu(deepseek, stated, 1000) == 1000);
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
  const ModelSpec model = preset<ModelSpec>("model", "DeepSeek-V3");  // 3 dense + 58 MoE layers
  const Parallelism gathered{8, AttentionSplit::kRequests, ExpertSplit::kSliced};
  Parallelism deep_ep{8, AttentionSplit::kRequests, ExpertSplit::kWhole, 1.0};
  const double hidden = 7168;
  const double fp8_with_scales = 1.0 + 4.0 / 128;  // dispatched
  const double bf16 = 2.0;                         // combined
  // The dense layers gather and scatter every token as before: one all-reduce's bytes.
  const auto dense_layers = [&](double tokens) {
    return 3 * kvtier::hw::ring_all_reduce_bytes_per_gpu(8, tokens * hidden * bf16);
  };
  const auto batch = decode(512, 2000);
  const auto gather = IterationCostModel(model, gpu, &nvlink, gathered).cost(batch);
  const auto balanced = IterationCostModel(model, gpu, &nvlink, deep_ep).cost(batch);
  // Decoding: each GPU's 64 tokens send a copy for each of their 8 picks on another GPU's
  // experts (224 of 256), DeepEP's low-latency kernels.
  const double decode_sent = 64.0 * 8 * 224 / 256 * hidden * (fp8_with_scales + bf16);
  CHECK(balanced.interconnect_bytes == Approx(58 * decode_sent + dense_layers(512)).epsilon(1e-9));
  // A fifth less than gathering every token to every GPU and scattering it back moves (7 of a
  // token's 8 picks cross, in FP8 one way).
  CHECK(balanced.interconnect_bytes < 0.8 * gather.interconnect_bytes);
  // Balanced, each GPU receives as many copies as it sends; twice the mean share of rows, the
  // busiest receives twice the other GPUs' share of its rows (2 · 512 · 8/8 · 7/8), and the
  // all-to-alls take as long as that, plus their fixed cost.
  deep_ep.expert_load_imbalance = 2.0;
  deep_ep.expert_all_to_all_overhead_s = 30e-6;
  const auto skewed = IterationCostModel(model, gpu, &nvlink, deep_ep).cost(batch);
  const double received = 2.0 * 512 * 8 / 8 * 7 / 8 * hidden;
  const auto overhead = kvtier::sim::from_seconds(30e-6, kvtier::sim::Rounding::kUp);
  const auto moe_layer = kvtier::hw::all_to_all_time(nvlink, 8, received * fp8_with_scales) +
                         kvtier::hw::all_to_all_time(nvlink, 8, received * bf16) + overhead * 2;
  // A dense layer's all-gather and reduce-scatter take one all-reduce's time (attention split
  // by requests has none of its own).
  const auto dense_layer = kvtier::hw::ring_all_reduce_time(nvlink, 8, 512 * hidden * bf16);
  CHECK(skewed.all_reduce == moe_layer * std::int64_t{58} + dense_layer * std::int64_t{3});
  CHECK(skewed.interconnect_bytes == balanced.interconnect_bytes);  // sent: the same
  // Each GPU routes and weights only its own tokens, and runs the shared expert on them
  // whole.
  CHECK(balanced.total < gather.total);
  // Prefill (DeepEP's normal kernels): a 1,024-token chunk on one GPU sends each token once to
  // each other GPU its picks land on; a GPU of 32 experts, one group, is missed when its group
  // is not among the token's 4 of 8 or when all 8 picks of the chosen 128 experts miss its 32.
  double missed_when_chosen = 1.0;
  for (int i = 0; i < 8; ++i) {
    missed_when_chosen *= (96.0 - i) / (128.0 - i);
  }
  const double missed = 0.5 + 0.5 * missed_when_chosen;
  deep_ep.expert_load_imbalance = 1.0;
  const auto chunk = IterationCostModel(model, gpu, &nvlink, deep_ep).cost(prefill(1024, 0));
  CHECK(
      chunk.interconnect_bytes ==
      Approx(58 * 1024 * 7 * (1 - missed) * hidden * (fp8_with_scales + bf16) + dense_layers(1024))
          .epsilon(1e-9));
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
  CHECK(balanced.at("hbm_weights_gib") == sliced.at("hbm_weights_gib"));
  // A GPU whose experts take 1.8 times the mean share of rows slows every step.
  CHECK(skewed.at("tpot_mean_ms") > balanced.at("tpot_mean_ms"));
  // Unused without expert parallelism: accepted (a sweep's base may carry it), changing nothing.
  CHECK(metrics(with({"engine.expert_load_imbalance=1.8"})) == sliced);
  // With data-parallel attention: the all-to-alls, each with its fixed cost, and the shared
  // expert whole on each GPU.
  const std::vector<std::string> deep_ep{"engine.data_parallel_attention=true",
                                         "engine.expert_parallel=true"};
  auto with_deep_ep = [&](const std::string& overhead) {
    auto sets = with(deep_ep);
    sets.push_back("engine.expert_all_to_all_overhead_us=" + overhead);
    return metrics(sets);
  };
  const auto quick = with_deep_ep("0");
  const auto slow = with_deep_ep("200");
  CHECK(quick.at("hbm_weights_gib") > sliced.at("hbm_weights_gib"));
  CHECK(quick.at("requests_completed") == sliced.at("requests_completed"));
  // Two all-to-alls in each of 26 MoE layers, 200 us each: 10.4 ms more a step.
  CHECK(slow.at("tpot_mean_ms") - quick.at("tpot_mean_ms") == Approx(10.4).epsilon(0.02));

  using Catch::Matchers::Contains;
  using kvtier::test::problems;
  using RunSpec = kvtier::config::RunSpec;
  const auto run = kvtier::test::quickstart_run();
  const auto first = [&](const std::vector<std::string>& sets) {
    const auto lines = problems<RunSpec>(run, sets);
    return lines.empty() ? std::string() : lines.front();
  };
  CHECK_THAT(
      first({"engine.expert_parallel=true"}),
      Contains("engine.expert_parallel") && Contains("needs a mixture of experts (model.moe)"));
  CHECK_THAT(first({"model.preset=DeepSeek-V2-Lite", "tensor_parallel_degree=1",
                    "engine.expert_parallel=true"}),
             Contains("tensor_parallel_degree must be at least 2"));
  CHECK_THAT(first(with({"engine.expert_parallel=true", "engine.expert_load_imbalance=0.5"})),
             Contains("engine.expert_load_imbalance"));
  // Mixtral's 8 experts cut to 4 leave half of 8 GPUs without one.
  CHECK_THAT(first({"model.preset=Mixtral-8x7B-v0.1", "model.moe.num_experts=4",
                    "tensor_parallel_degree=8", "engine.expert_parallel=true"}),
             Contains("the model's 4 experts leave GPUs of tensor_parallel_degree 8 without one"));
  // DeepEP's all-to-alls: their fixed cost stated, as many experts on every GPU.
  CHECK_THAT(first(with(deep_ep)),
             Contains("engine.expert_all_to_all_overhead_us") && Contains("required"));
  auto uneven = with(deep_ep);
  uneven.insert(uneven.end(), {"engine.expert_all_to_all_overhead_us=20",
                               "model.moe.num_experts=63", "tensor_parallel_degree=2"});
  CHECK_THAT(first(uneven), Contains("tensor_parallel_degree 2 does not divide the model's 63 "
                                     "experts"));
}

TEST_CASE("group-limited routing's fields are checked together", "[model_shape]") {
  using kvtier::test::problems;
  const auto first = [](const std::string& moe) {
    const auto lines = problems<ModelSpec>("preset: \"DeepSeek-V3\" moe { " + moe + " }");
    return lines.empty() ? std::string() : lines.front();
  };
  CHECK(first("expert_groups: 8 groups_per_token: 4").empty());
  // DeepSeek-V2-Lite's routing is not group-limited: a group count alone is refused.
  const auto alone =
      kvtier::test::problems<ModelSpec>("preset: \"DeepSeek-V2-Lite\" moe { expert_groups: 8 }");
  REQUIRE_FALSE(alone.empty());
  CHECK_THAT(alone.front(),
             Catch::Contains("needs both moe.expert_groups and moe.groups_per_token"));
  const auto with = [&](const std::string& sets) {
    const auto lines = problems<ModelSpec>("preset: \"DeepSeek-V3\"", {sets});
    return lines.empty() ? std::string() : lines.front();
  };
  CHECK_THAT(with("moe.expert_groups=7"), Catch::Contains("expert_groups 7 does not divide the "
                                                          "256 experts"));
  CHECK_THAT(with("moe.groups_per_token=9"),
             Catch::Contains("groups_per_token 9 exceeds expert_groups 8"));
  CHECK_THAT(with("moe.groups_per_token=0"), Catch::Contains("moe.groups_per_token"));
  // 8 picks from 4 groups: of 128 groups of 2 experts they take all 8, of 256 groups of one
  // there are 4.
  CHECK(with("moe.expert_groups=128").empty());
  CHECK_THAT(with("moe.expert_groups=256"),
             Catch::Contains("experts_per_token 8 exceeds the 4 experts in groups_per_token 4 of "
                             "expert_groups 256"));
}
