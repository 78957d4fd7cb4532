// Multi-head latent attention (DeepSeek-V2/V3) and a mixture of experts' first dense layers in
// the iteration cost model and the serving simulation.

#include <catch2/catch.hpp>

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "configs/schema/run.pb.h"
#include "hwmodels/iteration_cost.hpp"
#include "hwmodels/model_shape.hpp"
#include "serving/memory_plan.hpp"
#include "serving/simulation.hpp"
#include "tests/support/batch_shapes.hpp"
#include "tests/support/config_fixture.hpp"
#include "tests/support/serving_metrics.hpp"

using kvtier::config::ModelSpec;
using kvtier::hw::BatchShape;
using kvtier::hw::IterationCostModel;

using kvtier::test::decode;
using kvtier::test::prefill;
using kvtier::test::preset;

namespace {

// DeepSeek-V3 on H200s joined by NVLink 4, as the tests below cost it.
struct DeepSeekOnH200 {
  kvtier::config::GpuSpec gpu = preset<kvtier::config::GpuSpec>("gpu", "H200");
  kvtier::config::LinkSpec nvlink = preset<kvtier::config::LinkSpec>("link", "NVLink4");
  ModelSpec model = preset<ModelSpec>("model", "DeepSeek-V3");
  double layers = model.num_hidden_layers();

  [[nodiscard]] IterationCostModel at_tp8(kvtier::hw::AttentionSplit split) const {
    return {model, gpu, &nvlink, 8, split};
  }
};

}  // namespace

TEST_CASE("decoding reads each context token's latent once per layer, whole on every GPU",
          "[iteration_cost]") {
  const DeepSeekOnH200 setup;
  const auto& [gpu, nvlink, model, layers] = setup;
  for (const std::uint32_t tp : {1U, 8U}) {
    INFO("TP " << tp);
    const IterationCostModel costs(model, gpu, tp > 1 ? &nvlink : nullptr, tp);
    // 16 requests, 1,000 more context tokens each: only attention over the context changes.
    const auto shorter = costs.cost(decode(16, 3000));
    const auto longer = costs.cost(decode(16, 4000));
    const double extra_tokens = 16.0 * 1000;
    // (512 + 64) bf16 values per layer, the same bytes at TP 1 and 8.
    CHECK(longer.hbm_bytes - shorter.hbm_bytes ==
          Approx(extra_tokens * layers * 576 * 2).epsilon(1e-9));
    // Every head of this GPU scores the latent and the RoPE key and weights the latent.
    const double heads = 128.0 / tp;
    CHECK(longer.flops - shorter.flops ==
          Approx(extra_tokens * layers * heads * 2 * (2 * 512 + 64)).epsilon(1e-9));
  }
  // Grouped-query heads are split instead: Llama-3.1-70B's 8 KV heads over 8 GPUs, one each.
  const auto llama = preset<ModelSpec>("model", "Llama-3.1-70B");
  const IterationCostModel split(llama, gpu, &nvlink, 8);
  CHECK(split.cost(decode(16, 4000)).hbm_bytes - split.cost(decode(16, 3000)).hbm_bytes ==
        Approx(16.0 * 1000 * 80 * (2 * 1 * 128 * 2)).epsilon(1e-9));
}

TEST_CASE("a prefill chunk expands the latents it reads into every head's keys and values",
          "[iteration_cost]") {
  const DeepSeekOnH200 setup;
  const auto& [gpu, nvlink, model, layers] = setup;
  const IterationCostModel costs(model, gpu, &nvlink, 8);
  // The same 512-token chunk after 2,048 tokens of its prompt instead of none: kv_b_proj
  // up-projects 2,048 more latents to 16 heads' K (128) and V (128), and every query attends
  // 2,048 more keys of width 128 + 64 with values of 128.
  const double before = 2048;
  const double n = 512;
  const double heads = 16;
  const double extra = costs.cost(prefill(512, 2048)).flops - costs.cost(prefill(512, 0)).flops;
  CHECK(extra == Approx(layers * (2.0 * before * 512 * heads * (128 + 128) +
                                  2.0 * heads * (128 + 64 + 128) * n * before))
                     .epsilon(1e-9));
}

TEST_CASE("replicated down-projections and routers are read whole by every GPU",
          "[iteration_cost]") {
  const DeepSeekOnH200 setup;
  const auto& [gpu, nvlink, model, layers] = setup;
  const auto count = kvtier::hw::count_parameters(model);
  // 61 layers' q_a/kv_a projections and latent norms, 58 routers.
  CHECK(count.replicated == 61ULL * (7168 * (1536 + 512 + 64) + 1536 + 512) + 58ULL * 7168 * 256);
  // One decoding token on 8 GPUs reaches 8 experts per layer; its weights per GPU are 1/8 of
  // the split ones it touches and all the replicated ones: more than 1/8 of one GPU's reads.
  const IterationCostModel tp1(model, gpu, nullptr, 1);
  const IterationCostModel tp8(model, gpu, &nvlink, 8);
  const double one = tp1.cost(decode(1, 1)).hbm_bytes;
  const double eight = tp8.cost(decode(1, 1)).hbm_bytes;
  const double replicated = static_cast<double>(count.replicated);  // FP8: a byte each
  // (One token's activations, not all of which the GPUs split, are under 0.5% of the bytes.)
  CHECK(eight == Approx((one - replicated) / 8 + replicated).epsilon(0.005));
  CHECK(eight > 1.15 * one / 8);
}

TEST_CASE("a mixture of experts' first dense layers cost a dense MLP each", "[iteration_cost]") {
  const DeepSeekOnH200 setup;
  const auto& [gpu, nvlink, model, layers] = setup;
  ModelSpec experts_everywhere = model;
  experts_everywhere.mutable_moe()->clear_first_dense_layers();
  ModelSpec dense = experts_everywhere;
  dense.clear_moe();
  const ModelSpec& mixed = model;
  const auto batch = decode(32, 2000);
  const auto all = IterationCostModel(experts_everywhere, gpu, &nvlink, 8).cost(batch);
  const auto none = IterationCostModel(dense, gpu, &nvlink, 8).cost(batch);
  const auto three = IterationCostModel(mixed, gpu, &nvlink, 8).cost(batch);
  // Layers cost the same but for their MLP, and the head is the same: 3 dense + 58 expert layers.
  CHECK(three.flops == Approx((3 * none.flops + 58 * all.flops) / 61).epsilon(1e-12));
  CHECK(three.hbm_bytes == Approx((3 * none.hbm_bytes + 58 * all.hbm_bytes) / 61).epsilon(1e-12));
  CHECK(three.kernels * 61 == 3 * none.kernels + 58 * all.kernels);
  // The engine's mean layer: the layers' total within a picosecond each.
  const auto layers_total = three.total - three.head;
  CHECK((layers_total - three.layer * 61).picoseconds() >= 0);
  CHECK((layers_total - three.layer * 61).picoseconds() < 61);
}

TEST_CASE("under tensor parallelism every GPU keeps the whole latent", "[serving]") {
  const auto run = [](const std::string& model, int tp) {
    return kvtier::test::serving_metrics(kvtier::test::load_spec<kvtier::config::RunSpec>(
        kvtier::test::quickstart_run(),
        {"model.preset=" + model, "tensor_parallel_degree=" + std::to_string(tp)}));
  };
  const auto lite1 = run("DeepSeek-V2-Lite", 1);
  const auto lite2 = run("DeepSeek-V2-Lite", 2);
  CHECK(lite1.at("kv_bytes_per_token_per_gpu") == 576 * 2 * 27);
  CHECK(lite2.at("kv_bytes_per_token_per_gpu") == 576 * 2 * 27);
  CHECK(lite2.at("hbm_kv_used_peak_gib") == Approx(lite1.at("hbm_kv_used_peak_gib")));
  // Per-head KV halves.
  const auto llama1 = run("Llama-3.1-8B", 1);
  const auto llama2 = run("Llama-3.1-8B", 2);
  CHECK(llama2.at("kv_bytes_per_token_per_gpu") == llama1.at("kv_bytes_per_token_per_gpu") / 2);
}

TEST_CASE("T2 stores a latent as one vector with one scale", "[tiers]") {
  // Monarch copies only T2 tokens; int8 with a float32 scale is 512 + 64 + 4 bytes a
  // token-layer, turboquant's 16 bits (576 · 2).
  const auto run = [](const std::string& compression) {
    auto spec = kvtier::test::load_spec<kvtier::config::RunSpec>(
        kvtier::test::quickstart_run(),
        {"model.preset=DeepSeek-V2-Lite", "tiering.prefetch_lookahead_layers=1",
         "tiering.host_allocation=PINNED", "tiering.copy_method=COPY_ENGINES",
         "tiering.synthetic_pattern=reasoning",
         "workload.closed_loop.prompt_tokens.fixed_tokens=512",
         "workload.closed_loop.output_tokens.fixed_tokens=512"});
    spec.mutable_policy()->Clear();
    spec.mutable_policy()->set_name("monarch");
    auto* attend = spec.mutable_policy()->add_param();
    attend->set_name("attend");
    attend->set_text("all");
    auto* format = spec.mutable_policy()->add_param();
    format->set_name("compression");
    format->set_text(compression);
    return kvtier::test::serving_metrics(spec);
  };
  const auto int8 = run("int8");
  const auto turboquant = run("turboquant");
  REQUIRE(turboquant.at("pcie_h2d_gb") > 0.0);
  CHECK(int8.at("pcie_h2d_gb") / turboquant.at("pcie_h2d_gb") ==
        Approx(580.0 / 1152.0).epsilon(1e-12));
  CHECK(int8.at("host_kv_used_peak_gib") / turboquant.at("host_kv_used_peak_gib") ==
        Approx(580.0 / 1152.0).epsilon(1e-12));
}

TEST_CASE("data-parallel attention: each GPU attends its own requests with every head",
          "[iteration_cost]") {
  const DeepSeekOnH200 setup;
  const double layers = setup.layers;
  const IterationCostModel by_requests = setup.at_tp8(kvtier::hw::AttentionSplit::kRequests);
  const IterationCostModel by_heads = setup.at_tp8(kvtier::hw::AttentionSplit::kHeads);
  // 16 decoding requests: two per GPU, each read by one GPU only, scored by all 128 heads.
  const auto shorter = by_requests.cost(decode(16, 3000));
  const auto longer = by_requests.cost(decode(16, 4000));
  CHECK(longer.hbm_bytes - shorter.hbm_bytes ==
        Approx(16.0 * 1000 / 8 * layers * 576 * 2).epsilon(1e-9));
  CHECK(longer.flops - shorter.flops ==
        Approx(16.0 * 1000 / 8 * layers * 128 * 2 * (2 * 512 + 64)).epsilon(1e-9));
  // One all-gather and one reduce-scatter a layer move what one all-reduce does: half the
  // traffic of the two all-reduces of attention split by heads.
  CHECK(shorter.interconnect_bytes ==
        Approx(by_heads.cost(decode(16, 3000)).interconnect_bytes / 2).epsilon(1e-12));
  // A prefill chunk runs on one GPU whole: 2,048 more tokens of context before a 512-token
  // chunk cost every one of the 128 heads.
  const double extra =
      by_requests.cost(prefill(512, 2048)).flops - by_requests.cost(prefill(512, 0)).flops;
  CHECK(extra == Approx(layers * (2.0 * 2048 * 512 * 128 * (128 + 128) +
                                  2.0 * 128 * (128 + 64 + 128) * 512 * 2048))
                     .epsilon(1e-9));
  // Two chunks go to two GPUs, and the layer waits for the one with the longer chunk.
  BatchShape two = prefill(512, 0);
  two.prefill.push_back({64, 0});
  CHECK(by_requests.cost(two).attention == by_requests.cost(prefill(512, 0)).attention);
  // One request: its GPU reads every latent of its context, 10,000 more tokens of it here.
  CHECK(by_requests.cost(decode(1, 110000)).hbm_bytes -
            by_requests.cost(decode(1, 100000)).hbm_bytes ==
        Approx(10000.0 * layers * 576 * 2).epsilon(1e-9));
  // The same reads as split by heads, but every head's work and the attention weights whole.
  CHECK(by_requests.cost(decode(1, 100000)).total > by_heads.cost(decode(1, 100000)).total);
  // Nine requests on eight GPUs: the busiest attends two.
  CHECK(by_requests.cost(decode(9, 110000)).hbm_bytes -
            by_requests.cost(decode(9, 100000)).hbm_bytes ==
        Approx(2 * 10000.0 * layers * 576 * 2).epsilon(1e-9));
  // Without latent attention it is refused.
  const auto llama = preset<ModelSpec>("model", "Llama-3.1-70B");
  CHECK_THROWS_WITH(
      IterationCostModel(llama, setup.gpu, &setup.nvlink, 8, kvtier::hw::AttentionSplit::kRequests),
      Catch::Contains("data-parallel attention is modelled for latent attention"));
}

TEST_CASE("with data-parallel attention a GPU verifies its own requests' drafts",
          "[iteration_cost]") {
  // 16 requests verifying three drafts each against 64 requests of the same context decoding a
  // token each: on eight GPUs the busiest attends 2 requests' 8 queries or 8 requests' 8, the
  // same FLOPs and the same tokens through the MLP, its experts reached in the same
  // all-to-alls; only the latents read differ, 2 contexts' against 8.
  const DeepSeekOnH200 setup;
  const kvtier::hw::ExpertSplit experts =
      GENERATE(kvtier::hw::ExpertSplit::kSliced, kvtier::hw::ExpertSplit::kWhole);
  INFO((experts == kvtier::hw::ExpertSplit::kWhole ? "whole experts" : "sliced experts"));
  const kvtier::hw::Parallelism parallelism{8, kvtier::hw::AttentionSplit::kRequests, experts};
  const IterationCostModel costs(setup.model, setup.gpu, &setup.nvlink, parallelism);
  constexpr std::uint64_t kContext = 3000;
  BatchShape verify = decode(16, kContext);
  verify.decode_draft_tokens = 48;
  verify.logits_tokens = 64;
  const auto drafted = costs.cost(verify);
  const auto apart = costs.cost(decode(64, kContext));
  CHECK(drafted.flops == Approx(apart.flops).epsilon(1e-12));
  CHECK(drafted.interconnect_bytes == Approx(apart.interconnect_bytes).epsilon(1e-12));
  CHECK(drafted.all_reduce == apart.all_reduce);
  CHECK(apart.hbm_bytes - drafted.hbm_bytes ==
        Approx(6.0 * kContext * setup.layers * 576 * 2).epsilon(1e-9));
  CHECK(drafted.total < apart.total);
  // 9 and 16 requests drafting three each: the busiest GPU verifies 2 requests' 8 queries in
  // both (the mean request's drafts with its whole requests, not ceil((D + drafts) / TP)).
  BatchShape nine = decode(9, kContext);
  nine.decode_draft_tokens = 27;
  nine.logits_tokens = 36;
  CHECK(costs.cost(nine).layer_attention == drafted.layer_attention);
}

TEST_CASE("drafts cost data-parallel attention arithmetic that heads split do not",
          "[iteration_cost]") {
  // 450 requests at 3,072 tokens of context on eight GPUs, with and without a draft each
  // (docs/SIMULATION.md, "Speculative decoding"). Split by heads a GPU scores 16 heads over the
  // whole latent, bound by reading it, and a draft adds little; split by requests it scores all
  // 128 for its own 57 requests, and a draft adds most of a token's arithmetic.
  const DeepSeekOnH200 setup;
  const auto added = [&](kvtier::hw::AttentionSplit split) {
    const IterationCostModel costs = setup.at_tp8(split);
    BatchShape batch = decode(450, 3072);
    const auto plain = costs.cost(batch);
    batch.decode_draft_tokens = 450;
    batch.logits_tokens += 450;
    const auto drafted = costs.cost(batch);
    return std::pair{static_cast<double>(drafted.attention.picoseconds()) /
                         static_cast<double>(plain.attention.picoseconds()),
                     static_cast<double>(drafted.total.picoseconds()) /
                         static_cast<double>(plain.total.picoseconds())};
  };
  const auto [heads_attention, heads_pass] = added(kvtier::hw::AttentionSplit::kHeads);
  const auto [requests_attention, requests_pass] = added(kvtier::hw::AttentionSplit::kRequests);
  CHECK(heads_attention < 1.02);
  CHECK(requests_attention > 1.6);
  CHECK(requests_pass > heads_pass + 0.05);
}

TEST_CASE("with data-parallel attention a GPU keeps only its own requests' latents", "[serving]") {
  const auto run = [](const std::vector<std::string>& sets) {
    return kvtier::test::serving_metrics(
        kvtier::test::load_spec<kvtier::config::RunSpec>(kvtier::test::quickstart_run(), sets));
  };
  const auto by_heads = run({"model.preset=DeepSeek-V2-Lite", "tensor_parallel_degree=2"});
  const auto by_requests = run({"model.preset=DeepSeek-V2-Lite", "tensor_parallel_degree=2",
                                "engine.data_parallel_attention=true"});
  CHECK(by_requests.at("kv_bytes_per_token_per_gpu") == 576 * 2 * 27 / 2.0);
  CHECK(by_requests.at("hbm_kv_used_peak_gib") == Approx(by_heads.at("hbm_kv_used_peak_gib") / 2));
  // Every GPU holds the attention weights whole: more weights, room for twice the tokens.
  CHECK(by_requests.at("hbm_weights_gib") > by_heads.at("hbm_weights_gib"));
  CHECK(by_requests.at("largest_batch_that_fits") > 1.5 * by_heads.at("largest_batch_that_fits"));
  const auto problems = kvtier::test::problems<kvtier::config::RunSpec>(
      kvtier::test::quickstart_run(), {"engine.data_parallel_attention=true"});
  REQUIRE(problems.size() == 1);
  CHECK_THAT(problems[0], Catch::Contains("data-parallel attention is modelled for models with "
                                          "latent attention (model.mla) only") &&
                              Catch::Contains("field engine.data_parallel_attention"));
}

TEST_CASE("with data-parallel attention a prompt is prefilled in one GPU's share of the budget",
          "[serving]") {
  // One request of 4,096 prompt tokens and 4 output tokens, a budget of 2,048 tokens an
  // iteration: split by heads, two prefill iterations and three more decoding; by requests over
  // two GPUs, SGLang's per-GPU chunk of 1,024 takes four.
  const auto run = [](bool data_parallel) {
    return kvtier::test::serving_metrics(kvtier::test::load_spec<kvtier::config::RunSpec>(
        kvtier::test::quickstart_run(),
        {"model.preset=DeepSeek-V2-Lite", "tensor_parallel_degree=2",
         "workload.closed_loop.concurrency=1", "workload.closed_loop.num_requests=1",
         "workload.closed_loop.prompt_tokens.fixed_tokens=4096",
         "workload.closed_loop.output_tokens.fixed_tokens=4", "workload.prefill_chunk_tokens=2048",
         std::string("engine.data_parallel_attention=") + (data_parallel ? "true" : "false")}));
  };
  CHECK(run(false).at("iterations") == 2 + 3);
  CHECK(run(true).at("iterations") == 4 + 3);
}

TEST_CASE("FP8 GEMMs keep attention and the activations between them in BF16", "[iteration_cost]") {
  const DeepSeekOnH200 setup;
  const auto& [gpu, nvlink, model, layers] = setup;
  ModelSpec bf16 = model;
  bf16.set_activation_dtype(kvtier::config::BF16);
  const auto fp8_cost = IterationCostModel(model, gpu, &nvlink, 8).cost(prefill(8192, 8192));
  const auto bf16_cost = IterationCostModel(bf16, gpu, &nvlink, 8).cost(prefill(8192, 8192));
  CHECK(fp8_cost.attention == bf16_cost.attention);
  CHECK(fp8_cost.elementwise == bf16_cost.elementwise);
  CHECK(fp8_cost.all_reduce == bf16_cost.all_reduce);
  // Compute-bound at 8k tokens: the FP8 rate.
  CHECK(4 * fp8_cost.gemm.picoseconds() < 3 * bf16_cost.gemm.picoseconds());
}

TEST_CASE("a request must fit on the GPU that attends it", "[serving]") {
  // DeepSeek-V2-Lite at TP 2 on 19 GiB GPUs: 0.83 GiB of KV each. A request of 48k tokens
  // (1.4 GiB of latents) fits the two GPUs on average but no one of them.
  const std::vector<std::string> sets = {"model.preset=DeepSeek-V2-Lite",
                                         "tensor_parallel_degree=2",
                                         "hardware.node.gpu.memory_capacity_gib=19",
                                         "workload.closed_loop.concurrency=1",
                                         "workload.closed_loop.num_requests=1",
                                         "workload.closed_loop.prompt_tokens.fixed_tokens=47000",
                                         "workload.closed_loop.output_tokens.fixed_tokens=1000",
                                         "engine.data_parallel_attention=true"};
  const auto run =
      kvtier::test::load_spec<kvtier::config::RunSpec>(kvtier::test::quickstart_run(), sets);
  const auto plan = kvtier::serving::plan_memory(run);
  REQUIRE(48000 * plan.kv_bytes_per_token < plan.kv_capacity_bytes);
  REQUIRE(48000 * plan.kv_bytes_per_token * 2 > plan.kv_capacity_bytes);
  CHECK_THROWS_WITH(kvtier::serving::simulate(run), Catch::Contains("GiB of KV per GPU"));
}

TEST_CASE("data-parallel attention refuses what it does not model", "[serving]") {
  std::vector<std::string> sets = {"model.preset=DeepSeek-V2-Lite",
                                   "engine.data_parallel_attention=true",
                                   "memory.kv_block_tokens=16", "memory.prefix_caching=true"};
  std::string lines;
  for (const std::string& line :
       kvtier::test::problems<kvtier::config::RunSpec>(kvtier::test::quickstart_run(), sets)) {
    lines += line + "\n";
  }
  CHECK_THAT(lines, Catch::Contains(
                        "data-parallel attention with memory.prefix_caching is not modelled") &&
                        Catch::Contains("field engine.data_parallel_attention"));
  sets.pop_back();
  CHECK(kvtier::test::problems<kvtier::config::RunSpec>(kvtier::test::quickstart_run(), sets)
            .empty());
}
