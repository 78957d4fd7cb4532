// Data-parallel attention with requests dispatched to GPUs (engine.data_parallel_dispatch):
// each GPU's own decodes in the iteration cost, and its own queue, batch share, prefill budget
// and KV memory in the engine.
#include <catch2/catch.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "configs/schema/run.pb.h"
#include "hwmodels/iteration_cost.hpp"
#include "serving/data_parallel_dispatch.hpp"
#include "serving/engine.hpp"
#include "serving/memory_plan.hpp"
#include "serving/workload.hpp"
#include "sim/simulator.hpp"
#include "tests/support/batch_shapes.hpp"
#include "tests/support/cluster_fixture.hpp"
#include "tests/support/config_fixture.hpp"
#include "tests/support/serving_metrics.hpp"

using kvtier::config::RunSpec;
using kvtier::hw::BatchShape;
using kvtier::hw::GpuDecodes;
using kvtier::hw::IterationCostModel;
using kvtier::serving::DataParallelDispatch;
using kvtier::serving::ServingEngine;
using kvtier::test::decode;
using kvtier::test::request_at;

namespace {

IterationCostModel deepseek_at_tp8(
    kvtier::hw::ExpertSplit experts = kvtier::hw::ExpertSplit::kSliced) {
  using kvtier::test::preset;
  static const auto gpu = preset<kvtier::config::GpuSpec>("gpu", "H200");
  static const auto nvlink = preset<kvtier::config::LinkSpec>("link", "NVLink4");
  static const auto model = preset<kvtier::config::ModelSpec>("model", "DeepSeek-V3");
  return {model, gpu, &nvlink,
          kvtier::hw::Parallelism{8, kvtier::hw::AttentionSplit::kRequests, experts}};
}

// `requests` decoding requests of `context` tokens each on every one of `gpus` GPUs.
BatchShape spread(std::uint32_t gpus, std::uint64_t requests, std::uint64_t context) {
  BatchShape batch = decode(gpus * requests, context);
  batch.decodes_by_gpu.assign(gpus, GpuDecodes{requests, requests * context, 0});
  return batch;
}

// DeepSeek-V2-Lite over two GPUs with data-parallel attention, dispatching as `dispatch` says
// ("" for none), with `sets` after.
RunSpec lite_run(const std::string& dispatch, std::vector<std::string> sets = {}) {
  // 19 GiB GPUs: 0.83 GiB of KV each, about 28,000 tokens.
  std::vector<std::string> all = {"model.preset=DeepSeek-V2-Lite",
                                  "tensor_parallel_degree=2",
                                  "hardware.node.gpu.memory_capacity_gib=19",
                                  "engine.data_parallel_attention=true",
                                  "policy.name=full",
                                  "compare=~",
                                  "tiering=~"};
  if (!dispatch.empty()) {
    all.push_back("engine.data_parallel_dispatch=" + dispatch);
  }
  all.insert(all.end(), sets.begin(), sets.end());
  return kvtier::test::load_spec<RunSpec>(kvtier::test::quickstart_run(), all);
}

struct Served {
  kvtier::sim::Simulator simulator;
  std::unique_ptr<ServingEngine> engine;
};

std::unique_ptr<Served> serve(const RunSpec& run,
                              std::vector<kvtier::serving::RequestSpec> requests) {
  auto served = std::make_unique<Served>();
  served->engine = std::make_unique<ServingEngine>(served->simulator, run,
                                                   kvtier::test::open_loop(std::move(requests)));
  served->engine->start();
  served->simulator.run();
  return served;
}

// Tokens of KV one GPU of `run` holds (its whole latents a token).
double tokens_per_gpu(const RunSpec& run) {
  const auto plan = kvtier::serving::plan_memory(run);
  return plan.kv_capacity_bytes / (plan.kv_bytes_per_token * run.tensor_parallel_degree());
}

}  // namespace

TEST_CASE("dispatched decodes spread evenly cost what the even spread does", "[iteration_cost]") {
  const IterationCostModel costs = deepseek_at_tp8();
  const BatchShape even = decode(16, 3000);
  const BatchShape dispatched = spread(8, 2, 3000);
  CHECK(costs.cost(dispatched).total == costs.cost(even).total);
  CHECK(costs.cost(dispatched).hbm_bytes == costs.cost(even).hbm_bytes);
  CHECK(costs.cost(dispatched).flops == costs.cost(even).flops);
}

TEST_CASE("every layer waits for the GPU whose own requests attend the most", "[iteration_cost]") {
  const IterationCostModel costs = deepseek_at_tp8();
  const double layers = 61;
  // Two requests a GPU, GPU 5's with 10,000 tokens more context between them: it reads their
  // latents (576 BF16 values a token and layer) where the even spread would take the mean.
  BatchShape skewed = spread(8, 2, 3000);
  skewed.decodes_by_gpu[5].decode_context_tokens += 10000;
  skewed.decode_context_tokens += 10000;
  CHECK(costs.cost(skewed).hbm_bytes - costs.cost(spread(8, 2, 3000)).hbm_bytes ==
        Approx(10000.0 * layers * 576 * 2).epsilon(1e-9));
  BatchShape even = decode(16, 3000);
  even.decode_context_tokens += 10000;
  CHECK(costs.cost(skewed).layer_attention > costs.cost(even).layer_attention);
  // Four requests on GPU 0 and the other twelve spread: the busiest attends four, not two.
  BatchShape four = spread(8, 2, 3000);
  four.decodes_by_gpu[0] = GpuDecodes{4, 4 * 3000, 0};
  four.decodes_by_gpu[1] = GpuDecodes{0, 0, 0};
  CHECK(costs.cost(four).layer_attention > costs.cost(spread(8, 2, 3000)).layer_attention);
  CHECK(costs.cost(four).layer_attention == costs.cost(spread(8, 4, 3000)).layer_attention);
  // A GPU's drafts are its own requests'.
  BatchShape drafting = spread(8, 2, 3000);
  drafting.decodes_by_gpu[3].decode_draft_tokens = 6;
  drafting.decode_draft_tokens = 6;
  CHECK(costs.cost(drafting).layer_attention > costs.cost(spread(8, 2, 3000)).layer_attention);
}

TEST_CASE("each dispatched GPU's own part of a layer is given against the slowest's",
          "[iteration_cost]") {
  const IterationCostModel costs = deepseek_at_tp8();
  // GPU 5 reads 10,000 tokens more context: every other GPU is lighter by the same amount, GPU 5
  // by nothing.
  BatchShape skewed = spread(8, 2, 3000);
  skewed.decodes_by_gpu[5].decode_context_tokens += 10000;
  skewed.decode_context_tokens += 10000;
  const auto lighter = costs.cost(skewed).layer_lighter_by_gpu;
  REQUIRE(lighter.size() == 8);
  CHECK(lighter[5] == kvtier::sim::Tick::zero());
  CHECK(lighter[0] > kvtier::sim::Tick::zero());
  CHECK(lighter[0] < costs.cost(skewed).layer_attention);
  for (std::size_t gpu = 1; gpu < 8; ++gpu) {
    CHECK(lighter[gpu] == (gpu == 5 ? kvtier::sim::Tick::zero() : lighter[0]));
  }
  // As even as the even spread: none lighter. Not dispatched: none given.
  for (const kvtier::sim::Tick tick : costs.cost(spread(8, 2, 3000)).layer_lighter_by_gpu) {
    CHECK(tick == kvtier::sim::Tick::zero());
  }
  CHECK(costs.cost(decode(16, 3000)).layer_lighter_by_gpu.empty());
  // A GPU attending a prefill chunk is the slowest; the others are lighter by the chunk.
  BatchShape chunked = spread(8, 2, 3000);
  chunked.prefill.push_back(kvtier::hw::PrefillChunk{1024, 0, kvtier::hw::kAnyMicroBatch, 2});
  const auto beside_chunk = costs.cost(chunked).layer_lighter_by_gpu;
  CHECK(beside_chunk[2] == kvtier::sim::Tick::zero());
  CHECK(beside_chunk[0] > kvtier::sim::Tick::zero());
}

TEST_CASE("a dispatched prefill chunk is attended by its request's GPU", "[iteration_cost]") {
  const IterationCostModel costs = deepseek_at_tp8();
  // Two chunks dealt out in turn go to two GPUs; dispatched to one GPU, it attends both.
  BatchShape apart = kvtier::test::prefill(512, 0);
  apart.prefill.push_back({512, 0});
  BatchShape together = apart;
  together.prefill[0].gpu = 3;
  together.prefill[1].gpu = 3;
  CHECK(costs.cost(together).layer_attention > costs.cost(apart).layer_attention);
  together.prefill[1].gpu = 4;
  CHECK(costs.cost(together).layer_attention == costs.cost(apart).layer_attention);
  together.prefill[1].gpu = 8;
  CHECK_THROWS_WITH(costs.cost(together), Catch::Contains("is not one of the group's 8"));
}

TEST_CASE("with whole experts each GPU routes its own tokens, the busiest setting the pace",
          "[iteration_cost]") {
  const IterationCostModel costs = deepseek_at_tp8(kvtier::hw::ExpertSplit::kWhole);
  BatchShape four = spread(8, 2, 3000);
  four.decodes_by_gpu[0] = GpuDecodes{4, 4 * 3000, 0};
  four.decodes_by_gpu[1] = GpuDecodes{0, 0, 0};
  // GPU 0 sends its four tokens' picks where the even spread sends two.
  CHECK(costs.cost(four).interconnect_bytes > costs.cost(spread(8, 2, 3000)).interconnect_bytes);
}

TEST_CASE("with whole experts the busiest GPU is the one with the most tokens of its own",
          "[iteration_cost]") {
  // GPU 0 decodes 64 requests, GPU 1 prefills a 64-token chunk: no GPU has 128 tokens of its
  // own, as it would with both on GPU 0.
  const IterationCostModel costs = deepseek_at_tp8(kvtier::hw::ExpertSplit::kWhole);
  BatchShape apart = spread(8, 0, 3000);
  apart.decodes_by_gpu[0] = GpuDecodes{64, 64 * 3000, 0};
  apart.decode_tokens = 64;
  apart.decode_context_tokens = 64 * 3000;
  apart.prefill.push_back({64, 0, kvtier::hw::kAnyMicroBatch, 1});
  apart.logits_tokens = 65;
  BatchShape together = apart;
  together.prefill[0].gpu = 0;
  CHECK(costs.cost(apart).interconnect_bytes < costs.cost(together).interconnect_bytes);
  CHECK(costs.cost(apart).elementwise < costs.cost(together).elementwise);
}

TEST_CASE("per-GPU decodes need data-parallel attention over as many GPUs", "[iteration_cost]") {
  BatchShape wrong = spread(4, 2, 3000);
  CHECK_THROWS_WITH(deepseek_at_tp8().cost(wrong), Catch::Contains("decodes of 4 GPUs"));
  using kvtier::test::preset;
  const auto nvlink = preset<kvtier::config::LinkSpec>("link", "NVLink4");
  const IterationCostModel by_heads(preset<kvtier::config::ModelSpec>("model", "DeepSeek-V3"),
                                    preset<kvtier::config::GpuSpec>("gpu", "H200"), &nvlink, 8);
  CHECK_THROWS_WITH(by_heads.cost(spread(8, 2, 3000)), Catch::Contains("need data-parallel"));
}

TEST_CASE("requests are dispatched in turn or to the GPU holding the fewest", "[serving]") {
  DataParallelDispatch turns(kvtier::config::ROUND_ROBIN, 3, 64, 100);
  CHECK(turns.dispatch() == 0);
  CHECK(turns.dispatch() == 1);
  turns.completed(1);
  CHECK(turns.dispatch() == 2);
  CHECK(turns.dispatch() == 0);
  DataParallelDispatch fewest(kvtier::config::LEAST_OUTSTANDING, 3, 64, 100);
  CHECK(fewest.dispatch() == 0);
  CHECK(fewest.dispatch() == 1);
  CHECK(fewest.dispatch() == 2);
  fewest.completed(1);
  CHECK(fewest.dispatch() == 1);  // the one with a request fewer
  CHECK(fewest.dispatch() == 0);  // all even again: the lowest
  // Each GPU's share of the batch (rounded down, at least one), its KV memory, its prefill room.
  CHECK(fewest.exceeds(1.0e9 + 1.0, 3.0e9));
  CHECK(!fewest.exceeds(1.0e9, 3.0e9));
  fewest.started_running(2);
  fewest.reserve(2, 5.0);
  fewest.release(2, 2.0);
  CHECK(fewest.reserved(2) == 3.0);
  fewest.stopped_running(2);
  fewest.release(2, 2.9999);
  CHECK(fewest.reserved(2) == 0.0);  // running nothing, it reserves nothing
  fewest.started_running(2);
  CHECK(!fewest.batch_full(2));
  DataParallelDispatch small(kvtier::config::ROUND_ROBIN, 4, 6, 100);
  small.started_running(1);
  CHECK(small.batch_full(1));
  small.plan_iteration();
  small.take_prefill(0, 100);
  small.start_admission();
  CHECK(small.prefill_room(0) == 0);
  CHECK(!small.held(0));  // a request resuming its decoding needs no prefill room
  CHECK(small.held(1));   // its batch share taken
  CHECK(!small.held(2));
  small.hold(2);
  CHECK(small.held(2));
  CHECK(!small.all_held());
  small.hold(0);
  small.hold(3);
  CHECK(small.all_held());
  small.plan_iteration();
  small.start_admission();
  CHECK(!small.held(0));
  CHECK(small.prefill_room(0) == 100);
  CHECK_THROWS(DataParallelDispatch(kvtier::config::KV_AWARE, 2, 8, 100));
}

TEST_CASE("identical requests dispatched in turn run as the even spread does", "[serving]") {
  // Eight identical requests at once over two GPUs: four each, as the even spread takes them.
  // A budget of 4,096 tokens, 2,048 a GPU: every prompt in the first iteration.
  std::vector<kvtier::serving::RequestSpec> requests(8, request_at(0.0, 500, 40));
  const std::vector<std::string> budget = {"workload.prefill_chunk_tokens=4096"};
  const auto even = serve(lite_run("", budget), requests);
  for (const std::string dispatch : {"ROUND_ROBIN", "LEAST_OUTSTANDING"}) {
    INFO(dispatch);
    const auto dispatched = serve(lite_run(dispatch, budget), requests);
    CHECK(dispatched->engine->totals().iterations == even->engine->totals().iterations);
    CHECK(dispatched->engine->totals().busy == even->engine->totals().busy);
    CHECK(dispatched->engine->e2e().percentile(100) == even->engine->e2e().percentile(100));
    CHECK(dispatched->engine->dispatched_gpu(6) == 0);
    CHECK(dispatched->engine->dispatched_gpu(7) == 1);
  }
}

TEST_CASE("long requests dispatched to one GPU slow every layer", "[serving]") {
  // Long and short prompts in turn: dispatched in turn, GPU 0 attends both long ones. Every
  // prompt is prefilled in the first iteration (8,192 tokens a GPU): the decodes alone differ.
  const std::vector<std::string> budget = {"workload.prefill_chunk_tokens=16384"};
  const std::vector<kvtier::serving::RequestSpec> requests = {
      request_at(0.0, 4000, 64), request_at(0.0, 100, 64), request_at(0.0, 4000, 64),
      request_at(0.0, 100, 64)};
  const auto even = serve(lite_run("", budget), requests);
  const auto turns = serve(lite_run("ROUND_ROBIN", budget), requests);
  CHECK(turns->engine->totals().iterations == even->engine->totals().iterations);
  CHECK(turns->engine->ttft().percentile(100) == even->engine->ttft().percentile(100));
  CHECK(turns->engine->dispatched_gpu(2) == 0);
  CHECK(turns->engine->tpot().percentile(100) > even->engine->tpot().percentile(100));
  // Long, long, short, short: in turn, each GPU one of each.
  const std::vector<kvtier::serving::RequestSpec> paired = {
      request_at(0.0, 4000, 64), request_at(0.0, 4000, 64), request_at(0.0, 100, 64),
      request_at(0.0, 100, 64)};
  CHECK(serve(lite_run("ROUND_ROBIN", budget), paired)->engine->tpot().percentile(100) <
        turns->engine->tpot().percentile(100));
}

TEST_CASE("the busiest GPU's KV peak is reported beside the mean GPU's", "[serving]") {
  // Long and short prompts in turn: dispatched in turn, GPU 0 holds both long ones, 96% of all
  // the KV, where the mean GPU holds half of it.
  const std::vector<kvtier::serving::RequestSpec> requests = {
      request_at(0.0, 4000, 64), request_at(0.0, 100, 64), request_at(0.0, 4000, 64),
      request_at(0.0, 100, 64)};
  const std::vector<std::string> budget = {"workload.prefill_chunk_tokens=16384"};
  const auto even = serve(lite_run("", budget), requests);
  CHECK_FALSE(even->engine->busiest_gpu_kv_peak().has_value());
  const auto turns = serve(lite_run("ROUND_ROBIN", budget), requests);
  const double mean = turns->engine->kv_used().max();
  const auto plan = kvtier::serving::plan_memory(lite_run("ROUND_ROBIN"));
  // Counted between iterations, the peak is before the last, which ends every request: GPU 0
  // holds two requests of 4,062 tokens, GPU 1 two of 162; the mean GPU half of the four
  // (kv_bytes_for gives a GPU's 1/TP).
  CHECK(mean == Approx(2.0 * (plan.kv_bytes_for(4062) + plan.kv_bytes_for(162))).epsilon(1e-9));
  REQUIRE(turns->engine->busiest_gpu_kv_peak().has_value());
  CHECK(*turns->engine->busiest_gpu_kv_peak() ==
        Approx(2.0 * 2.0 * plan.kv_bytes_for(4062)).epsilon(1e-9));
  // Identical requests spread evenly: the busiest GPU holds what the mean GPU does.
  std::vector<kvtier::serving::RequestSpec> identical(8, request_at(0.0, 500, 40));
  const auto spread = serve(lite_run("ROUND_ROBIN", budget), identical);
  REQUIRE(spread->engine->busiest_gpu_kv_peak().has_value());
  CHECK(*spread->engine->busiest_gpu_kv_peak() ==
        Approx(spread->engine->kv_used().max()).epsilon(1e-12));
  // In the report, only when dispatched.
  const auto reported = kvtier::test::serving_metrics(lite_run("ROUND_ROBIN"));
  CHECK(reported.at("hbm_kv_used_peak_busiest_gpu_gib") >=
        reported.at("hbm_kv_used_peak_gib") - 1e-3);
  CHECK(kvtier::test::serving_metrics(lite_run("")).count("hbm_kv_used_peak_busiest_gpu_gib") == 0);
}

TEST_CASE("a GPU drafts for its own requests", "[serving]") {
  // Long and short requests in turn, each step drafting two tokens: dispatched in turn, GPU 0's
  // drafter passes attend both long contexts. Every prompt is prefilled in the first iteration
  // (8,192 tokens a GPU), so both runs draft the same requests at each step.
  const std::vector<std::string> drafting = {
      "engine.speculative.draft_tokens=2", "engine.speculative.draft_layers=1",
      "engine.speculative.acceptance_rate=0.7", "workload.prefill_chunk_tokens=16384"};
  const std::vector<kvtier::serving::RequestSpec> requests = {
      request_at(0.0, 4000, 64), request_at(0.0, 100, 64), request_at(0.0, 4000, 64),
      request_at(0.0, 100, 64)};
  const auto even = serve(lite_run("", drafting), requests);
  const auto turns = serve(lite_run("ROUND_ROBIN", drafting), requests);
  CHECK(turns->engine->totals().speculative_steps == even->engine->totals().speculative_steps);
  CHECK(turns->engine->totals().draft_busy > even->engine->totals().draft_busy);
}

TEST_CASE("the GPU holding the fewest requests takes the next one", "[serving]") {
  // Request 0 decodes long on GPU 0, request 1 ends early on GPU 1; request 2 arrives after it:
  // in turn it goes to GPU 0, to the shortest queue GPU 1.
  const std::vector<kvtier::serving::RequestSpec> requests = {
      request_at(0.0, 100, 2000), request_at(0.0, 100, 2), request_at(1.0, 100, 2)};
  CHECK(serve(lite_run("ROUND_ROBIN"), requests)->engine->dispatched_gpu(2) == 0);
  CHECK(serve(lite_run("LEAST_OUTSTANDING"), requests)->engine->dispatched_gpu(2) == 1);
}

TEST_CASE("a GPU's own KV memory holds back its requests while the other GPU admits", "[serving]") {
  // Two GPUs in turn: GPU 0 gets the even requests, GPU 1 the odd. Request 1 takes 60% of GPU
  // 1's KV for seconds; at 2 s, its prompt long prefilled, request 3, as large, arrives for GPU
  // 1 and waits for it, and
  // so does request 5 behind it (first come, first served on each GPU), while GPU 0 admits
  // requests 2, 4 and 6 at once though they queued behind request 3. Pooled, request 3 fits
  // (1.2 GPUs' worth of two): nothing waits for memory.
  const RunSpec probe = lite_run("");
  const auto big = static_cast<std::uint64_t>(0.6 * tokens_per_gpu(probe));
  const std::vector<kvtier::serving::RequestSpec> requests = {
      request_at(0.0, 100, 64), request_at(0.0, big - 1999, 2000),
      request_at(2.0, 100, 64), request_at(2.0, big - 1999, 2000),
      request_at(2.0, 100, 64), request_at(2.0, 100, 64),
      request_at(2.0, 100, 64)};
  const auto pooled = serve(probe, requests);
  CHECK(pooled->engine->totals().admissions_held_by_hbm == 0);
  const auto own = serve(lite_run("ROUND_ROBIN"), requests);
  CHECK(own->engine->dispatched_gpu(3) == 1);
  CHECK(own->engine->dispatched_gpu(5) == 1);
  CHECK(own->engine->totals().admissions_held_by_hbm > 0);
  // Requests 3 and 5 wait for request 1's end; the other five start at once.
  CHECK(own->engine->queue_wait().percentile(100) > kvtier::sim::Tick::ms(1000));
  CHECK(own->engine->queue_wait().percentile(50) < kvtier::sim::Tick::ms(50));
  CHECK(own->engine->totals().requests_completed == 7);
}

TEST_CASE("on demand, the GPU out of KV memory preempts one of its own requests", "[serving]") {
  // Two requests on GPU 0 grow to 60% of its KV each; GPU 1's two stay small. Pooled, nothing
  // is preempted; dispatched, GPU 0 preempts its later request, never GPU 1's.
  const std::vector<std::string> on_demand = {"workload.on_demand_admission.watermark=0.01"};
  const RunSpec probe = lite_run("", on_demand);
  const auto grown = static_cast<std::uint64_t>(0.6 * tokens_per_gpu(probe));
  const std::vector<kvtier::serving::RequestSpec> requests = {
      request_at(0.0, 100, grown), request_at(0.0, 100, 64), request_at(0.0, 100, grown),
      request_at(0.0, 100, 64)};
  const auto pooled = serve(probe, requests);
  CHECK(pooled->engine->totals().preemptions == 0);
  const auto own = serve(lite_run("ROUND_ROBIN", on_demand), requests);
  CHECK(own->engine->totals().preemptions > 0);
  CHECK(own->engine->totals().requests_completed == 4);
}

TEST_CASE("each GPU runs its share of the batch", "[serving]") {
  // max_batch_size 2 over two GPUs: one request each. Request 2 goes to GPU 0 (in turn), busy
  // with request 0, and waits though GPU 1 is free; the even spread runs it at once.
  const std::vector<std::string> one_each = {"workload.max_batch_size=2"};
  const std::vector<kvtier::serving::RequestSpec> requests = {
      request_at(0.0, 100, 2000), request_at(0.0, 100, 2), request_at(1.0, 100, 2)};
  CHECK(serve(lite_run("", one_each), requests)->engine->queue_wait().percentile(100) <
        kvtier::sim::Tick::ms(50));
  CHECK(serve(lite_run("ROUND_ROBIN", one_each), requests)->engine->queue_wait().percentile(100) >
        kvtier::sim::Tick::ms(500));
}

TEST_CASE("data-parallel dispatch refuses what it does not model", "[config]") {
  const auto lines = [](std::vector<std::string> sets) {
    return kvtier::test::joined(
        kvtier::test::problems<RunSpec>(kvtier::test::quickstart_run(), sets));
  };
  CHECK_THAT(lines({"engine.data_parallel_dispatch=ROUND_ROBIN"}),
             Catch::Contains("set engine.data_parallel_attention") &&
                 Catch::Contains("field engine.data_parallel_dispatch"));
  const std::vector<std::string> dp = {"model.preset=DeepSeek-V2-Lite", "tensor_parallel_degree=2",
                                       "engine.data_parallel_attention=true"};
  std::vector<std::string> kv_aware = dp;
  kv_aware.insert(kv_aware.end(), {"engine.data_parallel_dispatch=KV_AWARE", "policy.name=full",
                                   "compare=~", "tiering=~"});
  CHECK_THAT(lines(kv_aware), Catch::Contains("choose ROUND_ROBIN or LEAST_OUTSTANDING"));
  std::vector<std::string> swapping = dp;
  swapping.insert(swapping.end(), {"engine.data_parallel_dispatch=ROUND_ROBIN", "policy.name=full",
                                   "compare=~", "tiering=~", "memory.kv_block_tokens=16",
                                   "workload.on_demand_admission.watermark=0.01",
                                   "workload.on_demand_admission.swap.space_gib=4"});
  CHECK_THAT(lines(swapping), Catch::Contains("with preemption by swapping"));
  // A run built in code is held to it by the engine.
  RunSpec built = kvtier::test::load_spec<RunSpec>(
      kvtier::test::quickstart_run(),
      {"model.preset=DeepSeek-V2-Lite", "tensor_parallel_degree=2",
       "engine.data_parallel_attention=true", "memory.kv_block_tokens=16",
       "workload.on_demand_admission.watermark=0.01",
       "workload.on_demand_admission.swap.space_gib=4"});
  built.mutable_engine()->set_data_parallel_dispatch(kvtier::config::ROUND_ROBIN);
  kvtier::sim::Simulator simulator;
  CHECK_THROWS_WITH(
      ServingEngine(simulator, built, kvtier::test::open_loop({request_at(0.0, 100, 4)})),
      Catch::Contains("with preemption by swapping (workload.on_demand_admission.swap) is not "
                      "modelled"));
  built.mutable_engine()->set_data_parallel_attention(false);
  CHECK_THROWS_WITH(
      ServingEngine(simulator, built, kvtier::test::open_loop({request_at(0.0, 100, 4)})),
      Catch::Contains("needs engine.data_parallel_attention"));
  std::vector<std::string> fine = dp;
  fine.insert(fine.end(), {"engine.data_parallel_dispatch=ROUND_ROBIN", "policy.name=full",
                           "compare=~", "tiering=~"});
  CHECK(lines(fine).empty());
}
