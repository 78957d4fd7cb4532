// Pipeline parallelism: the layers split into stages, each a tensor-parallel group, the batch
// going through them as micro-batches; in the weights and KV per GPU, the cost of a round and
// the serving simulation.

#include <algorithm>
#include <catch2/catch.hpp>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "configs/schema/run.pb.h"
#include "hwmodels/collectives.hpp"
#include "hwmodels/iteration_cost.hpp"
#include "hwmodels/model_shape.hpp"
#include "hwmodels/pipeline_cost.hpp"
#include "serving/memory_plan.hpp"
#include "serving/tier_timing.hpp"
#include "tests/support/batch_shapes.hpp"
#include "tests/support/config_fixture.hpp"
#include "tests/support/hgx_h100_nodes.hpp"
#include "tests/support/serving_metrics.hpp"

using kvtier::config::ModelSpec;
using kvtier::config::RunSpec;
using kvtier::hw::BatchShape;
using kvtier::hw::GroupLinks;
using kvtier::hw::IterationCostModel;
using kvtier::hw::Parallelism;
using kvtier::hw::PipelineCostModel;
using kvtier::hw::PrefillChunk;
using kvtier::sim::Tick;
using kvtier::test::decode;
using kvtier::test::preset;

namespace {

Parallelism staged(std::uint32_t gpus, std::uint32_t stages) {
  Parallelism parallelism{gpus};
  parallelism.pipeline_stages = stages;
  return parallelism;
}

RunSpec run_with(const std::vector<std::string>& sets) {
  return kvtier::test::load_spec<RunSpec>(kvtier::test::quickstart_run(), sets);
}

}  // namespace

TEST_CASE("layers split into stages as vLLM splits them", "[model_shape]") {
  using kvtier::hw::pipeline_stage_layers;
  CHECK(pipeline_stage_layers(80, 2) == std::vector<std::uint32_t>{40, 40});
  // The remainder one more on each stage before the last, nearest it first.
  CHECK(pipeline_stage_layers(61, 2) == std::vector<std::uint32_t>{31, 30});
  CHECK(pipeline_stage_layers(80, 3) == std::vector<std::uint32_t>{27, 27, 26});
  CHECK(pipeline_stage_layers(126, 4) == std::vector<std::uint32_t>{31, 32, 32, 31});
  CHECK(pipeline_stage_layers(3, 3) == std::vector<std::uint32_t>{1, 1, 1});
  // DeepSeek-V3's three dense layers fall in the first stage.
  const ModelSpec deepseek = preset<ModelSpec>("model", "DeepSeek-V3");
  const ModelSpec first = kvtier::hw::pipeline_stage_model(deepseek, 2, 0);
  const ModelSpec second = kvtier::hw::pipeline_stage_model(deepseek, 2, 1);
  CHECK(first.num_hidden_layers() == 31);
  CHECK(first.moe().first_dense_layers() == 3);
  CHECK(second.num_hidden_layers() == 30);
  CHECK(second.moe().first_dense_layers() == 0);
  CHECK(kvtier::hw::pipeline_stage_model(deepseek, 61, 2).moe().first_dense_layers() == 1);
  CHECK(kvtier::hw::pipeline_stage_model(deepseek, 61, 3).moe().first_dense_layers() == 0);
}

TEST_CASE("a stage's GPU keeps its layers and the tables of its end of the model",
          "[model_shape]") {
  const ModelSpec llama = preset<ModelSpec>("model", "Llama-3.1-8B");  // 32 layers, untied
  const auto dtype = llama.weight_dtype();
  const auto count = kvtier::hw::count_parameters(llama);
  using kvtier::hw::weight_bytes_per_gpu;
  // Two stages of 16 layers: the first with the embedding, the last with the LM head and the
  // final norm (the larger by the norm).
  const double layers = static_cast<double>(count.layers) / 2;
  const double last = layers + static_cast<double>(count.lm_head + count.final_norm);
  CHECK(weight_bytes_per_gpu(llama, dtype, staged(1, 2)) == Approx(last * 2).epsilon(1e-12));
  CHECK(weight_bytes_per_gpu(llama, dtype, staged(2, 2)) == Approx(last).epsilon(1e-9));
  // Four stages: the middle ones hold neither table.
  CHECK(weight_bytes_per_gpu(llama, dtype, staged(1, 4)) ==
        Approx((static_cast<double>(count.layers) / 4 + count.lm_head + count.final_norm) * 2)
            .epsilon(1e-12));
  // Tied to the embedding, the LM head is the embedding the last stage holds as well.
  ModelSpec tied = llama;
  tied.set_tie_word_embeddings(true);
  const auto tied_count = kvtier::hw::count_parameters(tied);
  REQUIRE(tied_count.lm_head == 0);
  CHECK(weight_bytes_per_gpu(tied, dtype, staged(1, 2)) ==
        Approx((layers + static_cast<double>(tied_count.embedding + tied_count.final_norm)) * 2)
            .epsilon(1e-12));
}

TEST_CASE("a batch is dealt out to micro-batches", "[iteration_cost]") {
  BatchShape batch;
  batch.decode_tokens = 5;
  batch.decode_context_tokens = 5000;
  batch.prefill = {PrefillChunk{700, 0}, PrefillChunk{100, 300}, PrefillChunk{200, 0}};
  batch.logits_tokens = 5 + 2;  // two prompts finish
  const auto micro = kvtier::hw::split_into_micro_batches(batch, 2);
  REQUIRE(micro.size() == 2);
  CHECK(micro[0].decode_tokens == 3);
  CHECK(micro[1].decode_tokens == 2);
  CHECK(micro[0].decode_context_tokens == 3000);
  CHECK(micro[1].decode_context_tokens == 2000);
  // Each chunk to the micro-batch with the fewest tokens so far: 700 to the second (2 tokens),
  // then 100 and 200 to the first.
  CHECK(micro[1].prefill.size() == 1);
  CHECK(micro[1].prefill[0].tokens == 700);
  CHECK(micro[0].prefill.size() == 2);
  CHECK(micro[0].tokens() + micro[1].tokens() == batch.tokens());
  CHECK(micro[0].logits_tokens + micro[1].logits_tokens == batch.logits_tokens);
  CHECK(micro[0].logits_tokens - micro[0].decode_tokens <= micro[0].prefill.size());
  CHECK(micro[1].logits_tokens - micro[1].decode_tokens <= micro[1].prefill.size());
  // Micro-batch m is element m, those left empty too (the tier-aware engine's copies of
  // micro-batch m go with element m).
  const auto one = kvtier::hw::split_into_micro_batches(decode(1, 100), 4);
  REQUIRE(one.size() == 4);
  CHECK(one[0].tokens() == 1);
  CHECK(one[1].tokens() + one[2].tokens() + one[3].tokens() == 0);
  const auto six = kvtier::hw::split_into_micro_batches(decode(6, 600), 4);
  REQUIRE(six.size() == 4);
  CHECK(std::all_of(six.begin(), six.end(), [](const BatchShape& b) { return b.tokens() > 0; }));
}

TEST_CASE("a round lasts the busiest stage's work or one micro-batch's trip", "[iteration_cost]") {
  const kvtier::test::HgxH100Nodes nodes;
  const ModelSpec llama = preset<ModelSpec>("model", "Llama-3.1-70B");  // 80 layers
  const auto batch = decode(64, 2000);
  // One stage: the iteration cost model's cost exactly.
  const PipelineCostModel one(llama, nodes.gpu, nodes.links, staged(4, 1));
  const IterationCostModel tp4(llama, nodes.gpu, nodes.links, Parallelism{4});
  CHECK(one.cost(batch).total == tp4.cost(batch).total);
  CHECK(one.cost(batch).flops == tp4.cost(batch).flops);
  // Two stages of 40 layers in a node: two micro-batches of 32, each stage's time for each, and
  // the hidden states and residual of 32 tokens (BF16) sent on, a quarter from each GPU, and
  // gathered.
  const PipelineCostModel two(llama, nodes.gpu, nodes.links, staged(4, 2));
  const auto micro = decode(32, 2000);
  const ModelSpec half = kvtier::hw::pipeline_stage_model(llama, 2, 0);
  const IterationCostModel stage(half, nodes.gpu, nodes.links, Parallelism{4});
  const auto c = stage.cost(micro);
  const Tick first = c.total - c.head;
  const Tick last = c.total;
  const double bytes = 2.0 * 32 * 8192 * 2;
  const Tick send = kvtier::hw::point_to_point_time(nodes.nvlink, bytes / 4) +
                    kvtier::hw::ring_all_gather_time(nodes.nvlink, 4, bytes);
  const auto round = two.cost(batch);
  CHECK(round.total == std::max(last * std::int64_t{2}, first + last + send));
  // Decoding reads each stage's weights once a micro-batch: about the time of the whole model
  // on one group of four, a little less, each GPU reading half the requests' KV (0.86).
  const double ratio =
      kvtier::sim::to_seconds(round.total) / kvtier::sim::to_seconds(tp4.cost(batch).total);
  CHECK(ratio < 1.0);
  CHECK(ratio > 0.8);
  // The busiest stage's GPU does its layers' work for both micro-batches.
  CHECK(round.flops == Approx(2 * c.flops).epsilon(1e-12));
  CHECK(round.network_bytes == 0.0);
  // Over two nodes (TP 8, a stage a node) the micro-batches cross the adapters.
  const PipelineCostModel across(llama, nodes.gpu, nodes.links, staged(8, 2));
  const auto spanning = across.cost(batch);
  CHECK(spanning.network_bytes == Approx(bytes / 8).epsilon(1e-12));  // the mean GPU's
  const GroupLinks one_node{&nodes.nvlink, &nodes.network, 16};
  const auto within = PipelineCostModel(llama, nodes.gpu, one_node, staged(8, 2)).cost(batch);
  CHECK(within.network_bytes == 0.0);
  CHECK(spanning.total >= within.total);
}

TEST_CASE("a caller's stage timer sets each stage's time on each micro-batch", "[iteration_cost]") {
  // As the test above: two stages of 40 layers, two micro-batches of 32. A timer that adds 1 ms
  // to the first stage's every micro-batch makes it the busiest.
  const kvtier::test::HgxH100Nodes nodes;
  const ModelSpec llama = preset<ModelSpec>("model", "Llama-3.1-70B");
  const PipelineCostModel two(llama, nodes.gpu, nodes.links, staged(4, 2));
  const auto batch = decode(64, 2000);
  const auto plain = two.cost(batch);
  std::vector<std::string> calls;
  const auto timed = two.cost(batch, [&](const kvtier::hw::StageWork& work) {
    calls.push_back(std::to_string(work.stage) + ":" + std::to_string(work.first_layer) + "+" +
                    std::to_string(work.layers) + "@" + std::to_string(work.micro_batch));
    return work.compute->total + (work.stage == 0 ? Tick::ms(1) : Tick::zero());
  });
  CHECK(calls == std::vector<std::string>{"0:0+40@0", "1:40+40@0", "0:0+40@1", "1:40+40@1"});
  const IterationCostModel stage(kvtier::hw::pipeline_stage_model(llama, 2, 0), nodes.gpu,
                                 nodes.links, Parallelism{4});
  const auto c = stage.cost(decode(32, 2000));
  const Tick first = c.total - c.head + Tick::ms(1);
  CHECK(timed.total == std::max(plain.total, first * std::int64_t{2}));
  CHECK(timed.total > plain.total);
  // The busiest stage's figures: now the first's, without the LM head.
  CHECK(timed.flops == Approx(2 * (c.flops - c.head_flops)).epsilon(1e-12));
  CHECK(timed.head == Tick::zero());
  // Without work a micro-batch is not timed.
  calls.clear();
  (void)two.cost(decode(1, 2000), [&](const kvtier::hw::StageWork& work) {
    calls.push_back(std::to_string(work.micro_batch));
    return work.compute->total;
  });
  CHECK(calls == std::vector<std::string>{"0", "0"});
}

TEST_CASE("pipeline stages in a run: room for more requests, a step no shorter", "[serving]") {
  const std::vector<std::string> seventy = {"model.preset=Llama-3.1-70B",
                                            "tensor_parallel_degree=4",
                                            "workload.closed_loop.concurrency=16",
                                            "workload.closed_loop.num_requests=16",
                                            "workload.closed_loop.prompt_tokens.fixed_tokens=512",
                                            "workload.closed_loop.output_tokens.fixed_tokens=64"};
  std::vector<std::string> staged_sets = seventy;
  staged_sets.emplace_back("pipeline_parallel_degree=2");
  const auto one = kvtier::test::serving_metrics(run_with(seventy));
  const auto two = kvtier::test::serving_metrics(run_with(staged_sets));
  CHECK(two.at("requests_completed") == 16);
  // Each GPU holds 40 of the 80 layers: half the KV a token and (nearly) half the weights, so
  // more than twice the requests fit.
  CHECK(two.at("kv_bytes_per_token_per_gpu") == one.at("kv_bytes_per_token_per_gpu") / 2);
  CHECK(two.at("hbm_weights_gib") < 0.52 * one.at("hbm_weights_gib"));
  CHECK(two.at("largest_batch_hbm_limit") > 2 * one.at("largest_batch_hbm_limit"));
  // An engine takes eight GPUs, a node.
  CHECK(one.at("engines_per_node") == 2);
  CHECK(two.at("engines_per_node") == 1);
  // Every micro-batch reads its stage's weights, so a step takes about as long as on one group
  // (a little less: each GPU reads half the requests' KV); prefills, compute-bound, go twice
  // as fast on twice the GPUs.
  CHECK(two.at("tpot_p50_ms") > 0.85 * one.at("tpot_p50_ms"));
  CHECK(two.at("tpot_p50_ms") < one.at("tpot_p50_ms"));
  CHECK(two.at("ttft_p50_ms") < 0.6 * one.at("ttft_p50_ms"));
}

TEST_CASE("pipeline stages the hardware or the model cannot take are refused", "[serving]") {
  const auto refused = [](const std::vector<std::string>& sets, const std::string& message) {
    CAPTURE(sets);
    CHECK_THROWS_WITH(run_with(sets), Catch::Contains(message));
  };
  refused({"pipeline_parallel_degree=33"}, "exceeds the model's 32 layers");
  refused({"tensor_parallel_degree=4", "pipeline_parallel_degree=4"},
          "needs 2 nodes of 8 GPUs; hardware.num_nodes is 1");
  refused({"tensor_parallel_degree=4", "pipeline_parallel_degree=4", "hardware.num_nodes=2"},
          "give the network between them");
  refused({"tensor_parallel_degree=16", "pipeline_parallel_degree=2", "hardware.num_nodes=4",
           "hardware.network.preset=InfiniBand-NDR"},
          "with a tensor-parallel group that spans nodes");
  // Nodes of two GPUs without a GPU link: two one-GPU stages in each.
  refused({"hardware.node.preset=workstation-rtx5080", "hardware.node.gpus_per_node=2",
           "hardware.node.gpu_interconnect=PCIE_PEER", "pipeline_parallel_degree=4",
           "hardware.num_nodes=2", "hardware.network.preset=InfiniBand-NDR"},
          "meet over the node's GPU link");
  CHECK_NOTHROW(run_with({"tensor_parallel_degree=4", "pipeline_parallel_degree=4",
                          "hardware.num_nodes=2", "hardware.network.preset=InfiniBand-NDR"}));
}

TEST_CASE("a swap over pipeline stages copies each GPU's blocks of its stage's layers",
          "[serving]") {
  // Two requests of 2,000 + 500 tokens short of KV on two stages of 16 layers: the second is
  // swapped out with its 2,208 tokens (138 blocks of 16) and back in, a copy per block of each
  // of its GPU's 16 layers' keys or values.
  const RunSpec run =
      run_with({"pipeline_parallel_degree=2", "hardware.node.gpu.memory_capacity=10.75GiB",
                "workload.closed_loop.concurrency=2", "workload.closed_loop.num_requests=2",
                "workload.closed_loop.prompt_tokens.fixed_tokens=2000",
                "workload.closed_loop.output_tokens.fixed_tokens=500",
                "workload.prefill_chunk_tokens=4096", "workload.on_demand_admission.watermark=0.01",
                "memory.kv_block_tokens=16", "workload.on_demand_admission.swap.space_gib=1"});
  const auto values = kvtier::test::serving_metrics(run);
  REQUIRE(values.at("swapped_preemptions") == 1);
  const double bytes = 2208 * kvtier::serving::kv_bytes_per_token_per_gpu(run);
  CHECK(values.at("swap_out_gb") == Approx(bytes / 1e9));
  const kvtier::serving::CopyRates rates = kvtier::serving::measure_swap_rates(run);
  const std::uint64_t copies = 2 * 16 * 138;
  const Tick swaps =
      kvtier::serving::swap_time(bytes, copies, rates.d2h_bytes_per_s, rates.d2h_setup) +
      kvtier::serving::swap_time(bytes, copies, rates.h2d_bytes_per_s, rates.h2d_setup);
  CHECK(values.at("swap_s") == Approx(kvtier::sim::to_seconds(swaps)).epsilon(1e-12));
}

TEST_CASE("a request's prefill takes one micro-batch's budget a round", "[serving]") {
  // The small run's budget is 512 tokens a micro-batch: a 2,048-token prompt alone takes four
  // rounds of two stages, not two, then its one decode step.
  const auto metrics = kvtier::test::serving_metrics(
      run_with({"pipeline_parallel_degree=2", "workload.closed_loop.concurrency=1",
                "workload.closed_loop.num_requests=1",
                "workload.closed_loop.prompt_tokens.fixed_tokens=2048",
                "workload.closed_loop.output_tokens.fixed_tokens=2"}));
  CHECK(metrics.at("iterations") == 5);
}

TEST_CASE("micro-batches fill their budgets in order", "[iteration_cost]") {
  // Budgets of 8,192: two chunks of 4,000 fill the first, the 8,192-token one the second.
  BatchShape batch;
  batch.prefill = {PrefillChunk{4000, 0}, PrefillChunk{4000, 0}, PrefillChunk{8192, 0}};
  batch.logits_tokens = 0;
  const auto micro = kvtier::hw::split_into_micro_batches(batch, 2, 8192);
  REQUIRE(micro.size() == 2);
  CHECK(micro[0].tokens() == 8000);
  CHECK(micro[1].tokens() == 8192);
}

TEST_CASE("a stage without the LM head leaves out its work", "[iteration_cost]") {
  // Llama-2-70B in three stages of 27, 27 and 26 layers and a small vocabulary: a first stage is
  // the busiest, and the round counts its layers' FLOPs only.
  const kvtier::test::HgxH100Nodes nodes;
  const ModelSpec llama = preset<ModelSpec>("model", "Llama-2-70B");
  const PipelineCostModel three(llama, nodes.gpu, nodes.links, staged(2, 3));
  const auto batch = decode(3, 1000);
  const IterationCostModel first(kvtier::hw::pipeline_stage_model(llama, 3, 0), nodes.gpu,
                                 nodes.links, Parallelism{2});
  const auto one = first.cost(decode(1, 1000));
  const auto round = three.cost(batch);
  CHECK(round.head == Tick::zero());
  CHECK(round.head_flops == 0.0);
  CHECK(round.flops == Approx(3 * (one.flops - one.head_flops)).epsilon(1e-12));
  CHECK(round.hbm_bytes == Approx(3 * (one.hbm_bytes - one.head_hbm_bytes)).epsilon(1e-12));
}

TEST_CASE("a round lasts at least the host's scheduling of every micro-batch", "[serving]") {
  // Llama-3.1-8B over eight one-GPU stages, 16 requests decoding: eight micro-batches, each
  // scheduled in turn (3 ms of overhead each), longer than the GPUs' work.
  const auto metrics = kvtier::test::serving_metrics(
      run_with({"pipeline_parallel_degree=8", "engine.iteration_overhead_us=3000",
                "workload.closed_loop.concurrency=16", "workload.closed_loop.num_requests=16",
                "workload.closed_loop.output_tokens.fixed_tokens=32"}));
  CHECK(metrics.at("tpot_p50_ms") == Approx(24.0).epsilon(1e-9));
  // A cluster of two such engines takes 16 GPUs on two nodes.
  const auto cluster = kvtier::test::serving_metrics(
      run_with({"pipeline_parallel_degree=8", "cluster.engines=2", "cluster.routing=ROUND_ROBIN"}));
  CHECK(cluster.at("cluster_gpus") == 16);
  CHECK(cluster.at("cluster_nodes") == 2);
}
