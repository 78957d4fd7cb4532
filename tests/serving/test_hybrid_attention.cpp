// Hybrid attention (model.sliding_window_pattern): global layers among sliding-window ones, in
// the model's shape, the cost model, the memory plan and the serving engine.

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "common/errors.hpp"
#include "configs/schema/run.pb.h"
#include "hwmodels/iteration_cost.hpp"
#include "hwmodels/model_shape.hpp"
#include "serving/engine.hpp"
#include "serving/memory_plan.hpp"
#include "serving/workload.hpp"
#include "sim/simulator.hpp"
#include "tests/support/config_fixture.hpp"
#include "tests/support/serving_metrics.hpp"

using kvtier::config::ModelSpec;
using kvtier::config::RunSpec;
using kvtier::sim::Tick;
using kvtier::test::preset;

namespace {

// Llama-3.1-8B cut to six layers with a 1,000-token window: every layer windowed, every third
// global (layers 2 and 5), or none windowed.
struct Variants {
  ModelSpec hybrid;
  ModelSpec windowed;
  ModelSpec global;
};

Variants six_layers() {
  Variants variants;
  ModelSpec model = preset<ModelSpec>("model", "Llama-3.1-8B");
  model.set_num_hidden_layers(6);
  model.set_sliding_window(1000);
  variants.windowed = model;
  model.set_sliding_window_pattern(3);
  variants.hybrid = model;
  model.clear_sliding_window();
  model.clear_sliding_window_pattern();
  variants.global = model;
  return variants;
}

RunSpec run_with(const std::vector<std::string>& sets) {
  return kvtier::test::load_spec<RunSpec>(kvtier::test::quickstart_run(), sets);
}

double engine_reservation_tokens(const std::vector<std::string>& sets) {
  const RunSpec run = run_with(sets);
  kvtier::sim::Simulator simulator;
  const kvtier::serving::ServingEngine engine(
      simulator, run, kvtier::serving::make_workload(run.workload(), run.seed()));
  return engine.hbm_reservation(0) / engine.memory().kv_bytes_per_token;
}

}  // namespace

TEST_CASE("every pattern-th layer attends globally, the others within the window",
          "[model_shape]") {
  const Variants models = six_layers();
  std::vector<bool> global;
  for (std::uint32_t layer = 0; layer < 6; ++layer) {
    global.push_back(kvtier::hw::attends_globally(models.hybrid, layer));
  }
  CHECK(global == std::vector<bool>{false, false, true, false, false, true});
  CHECK(kvtier::hw::global_attention_layers(models.hybrid, 6) == 2);
  CHECK(kvtier::hw::global_attention_layers(models.hybrid, 5) == 1);
  CHECK(kvtier::hw::global_attention_layers(models.hybrid, 2) == 0);
  CHECK(kvtier::hw::global_attention_layers(models.windowed, 6) == 0);
  CHECK(kvtier::hw::global_attention_layers(models.global, 6) == 6);
  CHECK_FALSE(kvtier::hw::attends_globally(models.windowed, 5));
  CHECK(kvtier::hw::attends_globally(models.global, 0));
  // A token's attention FLOPs: a third of the layers over the whole context.
  const double per_context_token = kvtier::hw::attention_flops_per_context_token(models.global);
  const double linear = kvtier::hw::linear_flops_per_token(models.global);
  CHECK(kvtier::hw::flops_per_token(models.hybrid, 4000) ==
        Approx(linear + per_context_token * (2.0 * 4000 + 4.0 * 1000) / 6.0).epsilon(1e-12));
  CHECK(kvtier::hw::flops_per_token(models.hybrid, 500) ==
        Approx(linear + per_context_token * 500).epsilon(1e-12));
  // A pattern below 2 from code is refused, not divided by.
  ModelSpec broken = models.hybrid;
  broken.set_sliding_window_pattern(0);
  CHECK_THROWS_AS(kvtier::hw::global_attention_layers(broken, 6), kvtier::ConfigError);
}

TEST_CASE(
    "a hybrid model's iteration costs its windowed layers as windowed and its global "
    "layers as global",
    "[iteration_cost]") {
  const auto gpu = preset<kvtier::config::GpuSpec>("gpu", "H100-SXM");
  const Variants models = six_layers();
  const kvtier::hw::IterationCostModel hybrid(models.hybrid, gpu, nullptr, 1);
  const kvtier::hw::IterationCostModel windowed(models.windowed, gpu, nullptr, 1);
  const kvtier::hw::IterationCostModel global(models.global, gpu, nullptr, 1);
  // Eight requests of 3,000 tokens decoding beside a 2,048-token chunk after 4,096 tokens.
  kvtier::hw::BatchShape batch;
  batch.decode_tokens = 8;
  batch.decode_context_tokens = 8 * 1000;
  batch.decode_global_context_tokens = 8 * 3000;
  batch.prefill.push_back({2048, 4096});
  batch.logits_tokens = 9;
  kvtier::hw::BatchShape whole = batch;  // what a model without a window reads
  whole.decode_context_tokens = batch.decode_global_context_tokens;
  whole.decode_global_context_tokens = 0;
  const kvtier::hw::IterationCost mixed = hybrid.cost(batch);
  const kvtier::hw::IterationCost in_window = windowed.cost(batch);
  const kvtier::hw::IterationCost everything = global.cost(whole);
  // Each variant's layers cost alike, so a layer is a sixth of their sum exactly.
  CHECK(mixed.attention == in_window.attention / 6 * 4 + everything.attention / 6 * 2);
  CHECK(mixed.gemm == in_window.gemm);  // the projections and MLP do not see the window
  CHECK(mixed.layer_attention == mixed.attention / 6);
  CHECK(in_window.layer_attention == in_window.attention / 6);
  const double head_flops = everything.head_flops;
  CHECK(mixed.flops - head_flops == Approx((in_window.flops - head_flops) * 4.0 / 6.0 +
                                           (everything.flops - head_flops) * 2.0 / 6.0)
                                        .epsilon(1e-12));
  CHECK(mixed.hbm_bytes == Approx((in_window.hbm_bytes - in_window.head_hbm_bytes) * 4.0 / 6.0 +
                                  (everything.hbm_bytes - everything.head_hbm_bytes) * 2.0 / 6.0 +
                                  mixed.head_hbm_bytes)
                               .epsilon(1e-12));
  // The global layers read decode_global_context_tokens, not the windowed sum.
  kvtier::hw::BatchShape longer = batch;
  longer.decode_global_context_tokens = 8 * 6000;
  CHECK(hybrid.cost(longer).attention > mixed.attention);
  CHECK(windowed.cost(longer).attention == in_window.attention);
}

TEST_CASE("a hybrid model's first dense layers and experts layers each count their global layers",
          "[iteration_cost]") {
  const auto gpu = preset<kvtier::config::GpuSpec>("gpu", "H100-SXM");
  ModelSpec model = preset<ModelSpec>("model", "Qwen3-30B-A3B");
  model.set_num_hidden_layers(6);
  model.mutable_moe()->set_first_dense_layers(2);
  model.set_sliding_window(500);
  ModelSpec hybrid = model;
  hybrid.set_sliding_window_pattern(2);  // layers 1, 3 and 5: one dense, two with experts
  ModelSpec global = model;
  global.clear_sliding_window();
  kvtier::hw::BatchShape batch;
  batch.decode_tokens = 4;
  batch.decode_context_tokens = 4 * 500;
  batch.decode_global_context_tokens = 4 * 8000;
  batch.logits_tokens = 4;
  kvtier::hw::BatchShape whole = batch;
  whole.decode_context_tokens = batch.decode_global_context_tokens;
  const Tick mixed = kvtier::hw::IterationCostModel(hybrid, gpu, nullptr, 1).cost(batch).attention;
  const Tick in_window =
      kvtier::hw::IterationCostModel(model, gpu, nullptr, 1).cost(batch).attention;
  const Tick everything =
      kvtier::hw::IterationCostModel(global, gpu, nullptr, 1).cost(whole).attention;
  // Attention does not depend on the MLP: three layers of each kind.
  CHECK(mixed == in_window / 2 + everything / 2);
  // Half of each kind of MLP's layers attend globally (layer 1 of the dense 0-1, layers 3 and 5
  // of the experts 2-5), so every figure is the mean of the two uniform models'. (Which kind of
  // layer a global one is does not show in the totals: attention does not depend on the MLP.)
  const auto cost = [&](const ModelSpec& spec, const kvtier::hw::BatchShape& shape) {
    return kvtier::hw::IterationCostModel(spec, gpu, nullptr, 1).cost(shape);
  };
  const kvtier::hw::IterationCost h = cost(hybrid, batch);
  const kvtier::hw::IterationCost w = cost(model, batch);
  const kvtier::hw::IterationCost g = cost(global, whole);
  CHECK(h.flops == Approx((w.flops + g.flops) / 2).epsilon(1e-12));
  CHECK(h.hbm_bytes == Approx((w.hbm_bytes + g.hbm_bytes) / 2).epsilon(1e-12));
  CHECK(h.gemm == w.gemm);
}

TEST_CASE("hybrid attention is refused where it is not modelled", "[config]") {
  // `problem` among the problems, naming `field`.
  const auto refused = [](const std::vector<std::string>& sets, const std::string& problem,
                          const std::string& field) {
    INFO(problem);
    const std::vector<std::string> lines =
        kvtier::test::problems<RunSpec>(kvtier::test::quickstart_run(), sets);
    CHECK(std::any_of(lines.begin(), lines.end(), [&](const std::string& line) {
      return line.find(problem) != std::string::npos &&
             line.find("field " + field + ")") != std::string::npos;
    }));
  };
  const std::vector<std::string> hybrid = {"model.sliding_window=1000",
                                           "model.sliding_window_pattern=6"};
  const auto with = [&hybrid](const std::vector<std::string>& more) {
    std::vector<std::string> sets = hybrid;
    sets.insert(sets.end(), more.begin(), more.end());
    return sets;
  };
  refused({"model.sliding_window_pattern=6"},
          "sliding_window_pattern 6 needs the sliding_window its other layers attend within",
          "model.sliding_window_pattern");
  refused(with({"tensor_parallel_degree=2", "pipeline_parallel_degree=2"}),
          "pipeline_parallel_degree 2 is not modelled with hybrid attention",
          "pipeline_parallel_degree");
  refused({"model.sliding_window=1000", "model.sliding_window_pattern=1"},
          "value 1 is out of range", "model.sliding_window_pattern");
  refused({"model.architecture=GEMMA3"}, "GEMMA3 models have qk_norm: true", "model.qk_norm");
  refused({"model.sliding_window=1000", "model.sliding_window_pattern=33"},
          "sliding_window_pattern 33 exceeds the 32 layers: none would attend globally",
          "model.sliding_window_pattern");
  // A disaggregated prefill pool's stages too.
  refused(with({"cluster.engines=3", "cluster.routing=ROUND_ROBIN",
                "cluster.disaggregation.prefill_engines=1",
                "cluster.disaggregation.decode_routing=ROUND_ROBIN",
                "cluster.disaggregation.kv_link.preset=InfiniBand-NDR",
                "cluster.disaggregation.prefill_parallelism.tensor_parallel_degree=2",
                "cluster.disaggregation.prefill_parallelism.pipeline_parallel_degree=2"}),
          "pipeline_parallel_degree 2 is not modelled with hybrid attention",
          "cluster.disaggregation.prefill_parallelism.pipeline_parallel_degree");
  // Prefix caching stays refused with any window.
  refused(with({"memory.kv_block_tokens=16", "memory.prefix_caching=true"}),
          "prefix caching is not modelled with a sliding window", "memory.prefix_caching");
  CHECK(kvtier::test::problems<RunSpec>(kvtier::test::quickstart_run(), hybrid).empty());
}

TEST_CASE(
    "a hybrid model's request reserves its window in the windowed layers and every block "
    "in the global ones",
    "[serving]") {
  // Llama-3.1-8B's 32 layers, every second one global: half the KV holds the window's blocks (at
  // most 64 of 16 tokens for 1,000 tokens, as in test_engine.cpp), half every token's blocks.
  const std::vector<std::string> hybrid = {
      "model.sliding_window=1000", "model.sliding_window_pattern=2",
      "workload.closed_loop.prompt_tokens.fixed_tokens=900", "memory.kv_block_tokens=16"};
  const auto reservation = [&hybrid](const std::string& output) {
    std::vector<std::string> sets = hybrid;
    sets.push_back("workload.closed_loop.output_tokens.fixed_tokens=" + output);
    return engine_reservation_tokens(sets);
  };
  CHECK(reservation("50") == 960);                          // 949 tokens: inside the window
  CHECK(reservation("110") == 0.5 * 1024 + 0.5 * 1024);     // 1,009 tokens: 64 blocks either way
  CHECK(reservation("2000") == 0.5 * 1024 + 0.5 * 2912);    // 2,899 tokens: 182 blocks globally
  CHECK(reservation("10000") == 0.5 * 1024 + 0.5 * 10912);  // 10,899 tokens: 682 blocks
  // Gemma 3 27B: 10 of its 62 layers global (not 1 in 6).
  CHECK(engine_reservation_tokens({"model.preset=Gemma-3-27B",
                                   "workload.closed_loop.prompt_tokens.fixed_tokens=4000",
                                   "workload.closed_loop.output_tokens.fixed_tokens=1001"}) ==
        Approx(10.0 / 62 * 5000 + 52.0 / 62 * 1024).epsilon(1e-12));
  // Without blocks: the window's tokens and every token.
  CHECK(engine_reservation_tokens({"model.sliding_window=1000", "model.sliding_window_pattern=4",
                                   "workload.closed_loop.prompt_tokens.fixed_tokens=900",
                                   "workload.closed_loop.output_tokens.fixed_tokens=2000"}) ==
        0.75 * 1000 + 0.25 * 2899);
}

TEST_CASE(
    "a hybrid model's decode steps read the window in some layers and the whole context in "
    "the others",
    "[serving]") {
  const RunSpec run = run_with(
      {"model.sliding_window=1000", "model.sliding_window_pattern=2",
       "workload.closed_loop.concurrency=1", "workload.closed_loop.num_requests=1",
       "workload.closed_loop.prompt_tokens.fixed_tokens=1500",
       "workload.closed_loop.output_tokens.fixed_tokens=4", "workload.prefill_chunk_tokens=2048"});
  kvtier::sim::Simulator simulator;
  kvtier::serving::ServingEngine engine(simulator, run,
                                        kvtier::serving::make_workload(run.workload(), run.seed()));
  engine.start();
  simulator.run();
  REQUIRE(engine.totals().iterations == 4);  // 1 prefill + 3 decodes
  kvtier::hw::BatchShape prefill;
  prefill.prefill.push_back({1500, 0});
  prefill.logits_tokens = 1;
  Tick busy = engine.cost_model().cost(prefill).total;
  for (std::uint64_t generated = 1; generated < 4; ++generated) {
    kvtier::hw::BatchShape decode;
    decode.decode_tokens = 1;
    decode.decode_context_tokens = 1000;
    decode.decode_global_context_tokens = 1500 + generated;
    decode.logits_tokens = 1;
    busy += engine.cost_model().cost(decode).total;
  }
  CHECK(engine.totals().busy == busy);
}

TEST_CASE("hybrid attention admits more requests than global attention and fewer than a window",
          "[serving]") {
  // 8k + 2k requests on a 24 GiB GPU: Llama-3.1-8B's 6 GiB of KV room (49,152 tokens of
  // 128 KiB) hold 4 whole lives attending globally; a quarter of the layers global hold 14
  // (8 × 10,239 + 24 × 1,024 token-layers each), every layer windowed 48.
  const std::vector<std::string> load = {"hardware.node.gpu.memory_capacity=24GiB",
                                         "workload.closed_loop.concurrency=32",
                                         "workload.closed_loop.num_requests=32",
                                         "workload.closed_loop.prompt_tokens.fixed_tokens=8192",
                                         "workload.closed_loop.output_tokens.fixed_tokens=2048",
                                         "workload.prefill_chunk_tokens=8192"};
  const auto most_running = [&load](const std::vector<std::string>& window) {
    std::vector<std::string> sets = load;
    sets.insert(sets.end(), window.begin(), window.end());
    return kvtier::test::serving_metrics(run_with(sets)).at("max_running_requests");
  };
  const double global = most_running({});
  const double hybrid =
      most_running({"model.sliding_window=1024", "model.sliding_window_pattern=4"});
  const double windowed = most_running({"model.sliding_window=1024"});
  CHECK(global == 4);
  CHECK(hybrid == 14);
  CHECK(windowed == 32);  // every request in flight
}

TEST_CASE("a hybrid model's preempted request drops every token its global layers hold",
          "[serving]") {
  // Two requests of 3,000 + 2,000 tokens on 18.5 GiB of HBM (4,444 tokens of KV over all layers,
  // as in test_engine.cpp), half the layers global, a 1,000-token window in the others: a
  // decode step with g tokens out writes 0.5 x (3,000 + g) + 0.5 x 1,000 = 2,000 + g / 2 tokens'
  // worth a request. Both fit through g = 444; at g = 445 the second is preempted, holding the
  // prompt and 443 generated tokens in its global layers: 3,443 tokens to recompute (the
  // window's 1,000 in the others).
  const auto values = kvtier::test::serving_metrics(
      run_with({"hardware.node.gpu.memory_capacity=18.5GiB", "workload.closed_loop.concurrency=2",
                "workload.closed_loop.num_requests=2",
                "workload.closed_loop.prompt_tokens.fixed_tokens=3000",
                "workload.closed_loop.output_tokens.fixed_tokens=2000",
                "workload.prefill_chunk_tokens=8192", "workload.on_demand_admission.watermark=0.01",
                "model.sliding_window=1000", "model.sliding_window_pattern=2"}));
  CHECK(values.at("preemptions") == 1);
  CHECK(values.at("preempted_kv_tokens") == 3443);
  CHECK(values.at("requests_completed") == 2);
}

TEST_CASE("a hybrid model's drafter reads the whole context in its global layers", "[serving]") {
  // One request of 3,000 + 64 tokens drafting 2 a step: the drafter's passes read 1,000 tokens
  // in the windowed layers and the whole context in the global ones, more than a model with the
  // window in every layer reads and less than one without a window.
  const auto draft_busy = [](const std::vector<std::string>& window) {
    std::vector<std::string> sets = {"workload.closed_loop.concurrency=1",
                                     "workload.closed_loop.num_requests=1",
                                     "workload.closed_loop.prompt_tokens.fixed_tokens=3000",
                                     "workload.prefill_chunk_tokens=4096",
                                     "engine.speculative.draft_tokens=2",
                                     "engine.speculative.draft_layers=1",
                                     "engine.speculative.acceptance_rate=0.5"};
    sets.insert(sets.end(), window.begin(), window.end());
    const RunSpec run = run_with(sets);
    kvtier::sim::Simulator simulator;
    kvtier::serving::ServingEngine engine(
        simulator, run, kvtier::serving::make_workload(run.workload(), run.seed()));
    engine.start();
    simulator.run();
    return engine.totals().draft_busy;
  };
  const Tick hybrid = draft_busy({"model.sliding_window=1000", "model.sliding_window_pattern=2"});
  CHECK(draft_busy({"model.sliding_window=1000"}) < hybrid);
  CHECK(hybrid < draft_busy({}));
}
