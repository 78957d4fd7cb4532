// Disaggregated pools split differently (cluster.disaggregation.prefill_parallelism): how a
// prompt's KV crosses between GPUs holding it otherwise (KvHandoff), the prefill engines built
// and reported as their own split, the cluster's GPUs and nodes, and the checks.

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "configs/pools.hpp"
#include "configs/schema/run.pb.h"
#include "hwmodels/link_math.hpp"
#include "serving/cluster.hpp"
#include "serving/kv_handoff.hpp"
#include "serving/memory_plan.hpp"
#include "serving/plan.hpp"
#include "serving/simulation.hpp"
#include "serving/tier_timing.hpp"
#include "tests/support/cluster_fixture.hpp"
#include "tests/support/config_fixture.hpp"
#include "tests/support/disaggregated_runs.hpp"

using kvtier::config::RunSpec;
using kvtier::serving::KvHandoff;
using kvtier::sim::Tick;
using kvtier::test::open_loop;
using kvtier::test::request_at;
using kvtier::test::serve;

namespace {

RunSpec run_with(const std::vector<std::string>& sets) {
  return kvtier::test::load_spec<RunSpec>(kvtier::test::quickstart_run(), sets);
}

// A run of `model` split `tp` x `stages` (one engine: KvHandoff reads the split only).
RunSpec split(const std::string& model, std::uint32_t tp, std::uint32_t stages = 1,
              std::vector<std::string> extra = {}) {
  extra.insert(extra.begin(),
               {"model.preset=" + model, "tensor_parallel_degree=" + std::to_string(tp),
                "pipeline_parallel_degree=" + std::to_string(stages)});
  return run_with(extra);
}

kvtier::config::LinkSpec network() {
  return run_with({"cluster.engines=2", "cluster.routing=ROUND_ROBIN",
                   "cluster.disaggregation.prefill_engines=1",
                   "cluster.disaggregation.decode_routing=ROUND_ROBIN",
                   "cluster.disaggregation.kv_link.preset=InfiniBand-NDR"})
      .cluster()
      .disaggregation()
      .kv_link();
}

// `copies` copies moving `bytes` over the network link, one after another.
Tick copies_of(double bytes, std::uint64_t copies) {
  return kvtier::test::kv_link_copies(network(), bytes, copies);
}

struct Part {
  double share;
  std::uint64_t copies;
};

// The parts of `handoff`, prefill stages' first, as plain pairs to compare.
std::vector<Part> parts_of(const KvHandoff& handoff) {
  std::vector<Part> parts;
  for (const auto& part : handoff.parts()) {
    parts.push_back({part.share, part.copies});
  }
  return parts;
}

void check_parts(const KvHandoff& handoff, const std::vector<Part>& expected) {
  const std::vector<Part> parts = parts_of(handoff);
  REQUIRE(parts.size() == expected.size());
  for (std::size_t i = 0; i < parts.size(); ++i) {
    INFO("part " << i);
    CHECK(parts[i].share == Approx(expected[i].share));
    CHECK(parts[i].copies == expected[i].copies);
  }
}

constexpr double kBytes = 64e6;

}  // namespace

TEST_CASE("pools split alike move one copy a GPU of its own share", "[pools]") {
  // Every split the simulator had before pools could differ: the transfer is what it was.
  const RunSpec run =
      GENERATE(split("Llama-3.1-8B", 2), split("Llama-3.1-8B", 4, 2), split("Qwen3-30B-A3B", 8),
               split("DeepSeek-V2-Lite", 2, 1, {"engine.data_parallel_attention=true"}));
  const KvHandoff handoff(run, run, network());
  for (const auto& part : handoff.parts()) {
    CHECK(part.copies == 1);
  }
  CHECK(handoff.time(kBytes) == copies_of(kBytes, 1));
}

TEST_CASE("a decode GPU holding more heads than a prefill GPU gathers them from each", "[pools]") {
  // Llama-3.1-8B, 8 KV heads. Prefill TP 8 (a head a GPU) to decode TP 2 (four heads a GPU):
  // each decode GPU receives four copies, each prefill GPU sends its head once, a quarter of
  // what a decode GPU takes.
  const KvHandoff handoff(split("Llama-3.1-8B", 8), split("Llama-3.1-8B", 2), network());
  check_parts(handoff, {{0.25, 1}, {1.0, 4}});
  CHECK(handoff.time(kBytes) == copies_of(kBytes, 4));
}

TEST_CASE("a prefill GPU holding more heads than a decode GPU sends to each", "[pools]") {
  // Prefill TP 2 (four heads a GPU) to decode TP 8: each prefill GPU sends four copies, four
  // times what a decode GPU takes.
  const KvHandoff handoff(split("Llama-3.1-8B", 2), split("Llama-3.1-8B", 8), network());
  check_parts(handoff, {{4.0, 4}, {1.0, 1}});
  CHECK(handoff.time(kBytes) == copies_of(4 * kBytes, 4));
}

TEST_CASE(
    "a head replicated on the decode side is sent to each copy, shared by the prefill "
    "copies",
    "[pools]") {
  // Qwen3-30B-A3B, 4 KV heads. Decode TP 8 keeps each head on two GPUs: from prefill TP 4 (a
  // head a GPU, held once) each head goes twice. From prefill TP 8 (each head on two GPUs) each
  // prefill copy sends to one decode copy. Decode TP 4 from prefill TP 8: one of a head's two
  // prefill copies sends it.
  const std::string model = "Qwen3-30B-A3B";
  const KvHandoff doubled(split(model, 4), split(model, 8), network());
  check_parts(doubled, {{2.0, 2}, {1.0, 1}});
  CHECK(doubled.time(kBytes) == copies_of(2 * kBytes, 2));
  const KvHandoff paired(split(model, 8), split(model, 8), network());
  check_parts(paired, {{1.0, 1}, {1.0, 1}});
  const KvHandoff halved(split(model, 8), split(model, 4), network());
  check_parts(halved, {{1.0, 1}, {1.0, 1}});
}

TEST_CASE("head groups that do not nest meet as their runs of heads overlap", "[pools]") {
  // Llama-2-13B's 40 KV heads: TP 4 takes runs of 10, TP 5 of 8, TP 8 of 5. A run of 10 meets
  // two of 8 ([0, 10) meets [0, 8) and [8, 16)); a run of 8 meets two of 10 and up to three of 5
  // ([8, 16) meets [5, 10), [10, 15) and [15, 20)).
  const std::string model = "Llama-2-13B";
  check_parts(KvHandoff(split(model, 4), split(model, 5), network()), {{1.25, 2}, {1.0, 2}});
  check_parts(KvHandoff(split(model, 8), split(model, 5), network()), {{0.625, 2}, {1.0, 3}});
  check_parts(KvHandoff(split(model, 5), split(model, 8), network()), {{1.6, 3}, {1.0, 2}});
}

TEST_CASE("latent attention split by heads on both sides sends the latent to every GPU",
          "[pools]") {
  // DeepSeek-V2-Lite: every GPU keeps the whole latent. From TP 2 to TP 4 each prefill GPU
  // sends it to two decode GPUs; from TP 4 to TP 2 one of two prefill GPUs sends it to each.
  const std::string model = "DeepSeek-V2-Lite";
  check_parts(KvHandoff(split(model, 2), split(model, 4), network()), {{2.0, 2}, {1.0, 1}});
  check_parts(KvHandoff(split(model, 4), split(model, 2), network()), {{1.0, 1}, {1.0, 1}});
}

TEST_CASE("stages that split the layers otherwise exchange a copy per overlapping stage",
          "[pools]") {
  // Llama-3.1-8B's 32 layers. Prefill TP 4 x 2 stages (two heads of 16 layers a GPU) to decode
  // TP 8 (a head of 32 layers): the same bytes a GPU, each prefill GPU sending to two decode
  // GPUs, each decode GPU receiving from a GPU of each stage.
  check_parts(KvHandoff(split("Llama-3.1-8B", 4, 2), split("Llama-3.1-8B", 8), network()),
              {{1.0, 2}, {1.0, 2}, {1.0, 2}});
  // Three stages of 11, 11 and 10 layers to two of 16: the middle prefill stage meets both
  // decode stages, each decode stage two prefill stages.
  check_parts(KvHandoff(split("Llama-3.1-8B", 2, 3), split("Llama-3.1-8B", 2, 2), network()),
              {{11.0 / 16, 1}, {11.0 / 16, 2}, {10.0 / 16, 1}, {1.0, 2}, {1.0, 2}});
}

TEST_CASE("with data-parallel attention on one side, one GPU of it sends or takes the whole",
          "[pools]") {
  // DeepSeek-V2-Lite (latent attention). Split by requests, a prompt's latent is whole on one
  // prefill GPU; split by heads, each decode GPU holds the whole latent: the one prefill GPU
  // sends it to both, and an engine sends two prompts at once but receives one.
  const RunSpec by_requests =
      split("DeepSeek-V2-Lite", 2, 1, {"engine.data_parallel_attention=true"});
  const RunSpec by_heads = split("DeepSeek-V2-Lite", 2);
  const KvHandoff to_heads(by_requests, by_heads, network());
  check_parts(to_heads, {{2.0, 2}, {1.0, 1}});
  CHECK(to_heads.sending_lanes() == 2);
  CHECK(to_heads.receiving_lanes() == 1);
  // The other way round, one of the prefill engine's copies sends it to the one GPU.
  const KvHandoff to_requests(by_heads, by_requests, network());
  check_parts(to_requests, {{1.0, 1}, {1.0, 1}});
  CHECK(to_requests.sending_lanes() == 1);
  CHECK(to_requests.receiving_lanes() == 2);
}

namespace {

// Llama-3.1-8B on one HGX H100 node: one prefill engine of `prefill_tp` GPUs, two decode
// engines of one GPU each, over InfiniBand.
RunSpec pools(std::uint32_t prefill_tp, std::vector<std::string> extra = {}) {
  std::vector<std::string> sets = {
      "cluster.engines=3",
      "cluster.routing=ROUND_ROBIN",
      "cluster.disaggregation.prefill_engines=1",
      "cluster.disaggregation.decode_routing=LEAST_OUTSTANDING",
      "cluster.disaggregation.kv_link.preset=InfiniBand-NDR",
      "cluster.disaggregation.prefill_parallelism.tensor_parallel_degree=" +
          std::to_string(prefill_tp)};
  sets.insert(sets.end(), extra.begin(), extra.end());
  return run_with(sets);
}

}  // namespace

TEST_CASE("the prefill engines are built as their pool is split", "[pools]") {
  const RunSpec run = pools(4);
  REQUIRE(kvtier::config::pools_differ(run));
  const auto served = serve(run, open_loop({request_at(0, 2048, 8)}));
  const auto& cluster = *served->cluster;
  const auto& prefill = cluster.engine(0);
  const auto& decode = cluster.engine(1);
  CHECK(prefill.run().tensor_parallel_degree() == 4);
  CHECK(decode.run().tensor_parallel_degree() == 1);
  CHECK(prefill.memory().weights_bytes == Approx(decode.memory().weights_bytes / 4).epsilon(0.02));
  CHECK(prefill.memory().kv_bytes_per_token == decode.memory().kv_bytes_per_token / 4);
  // The decode GPU holds all 8 heads, each prefill GPU two: four copies into the one GPU.
  const KvHandoff handoff(kvtier::config::prefill_pool_run(run), run,
                          run.cluster().disaggregation().kv_link());
  const double bytes = decode.memory().kv_bytes_for(2048);
  CHECK(cluster.kv_transfers().count == 1);
  CHECK(cluster.kv_transfers().busy == handoff.time(bytes));
  CHECK(handoff.time(bytes) == copies_of(bytes, 4));
  CHECK(cluster.kv_transfers().bytes == bytes);
  // Four GPUs prefill the prompt sooner than one.
  const auto alike = serve(pools(1), open_loop({request_at(0, 2048, 8)}));
  CHECK(prefill.ttft().max() < alike->cluster->engine(0).ttft().max());
}

TEST_CASE("a cluster of pools split differently counts each pool's GPUs", "[pools]") {
  const RunSpec run = pools(4);
  CHECK(kvtier::serving::cluster_gpus(run) == 4 + 2);
  CHECK(kvtier::serving::cluster_nodes(run) == 1);  // half a node and a quarter
  CHECK(kvtier::serving::mean_gpus_per_engine(run) == 2.0);
  CHECK(kvtier::serving::mean_engines_per_node(run) == Approx(3 / 0.75));
  const auto report = kvtier::serving::simulate(run);
  CHECK(kvtier::serving::find_metric(report.metrics, "cluster_gpus")->value == 6);
  CHECK(kvtier::serving::find_metric(report.metrics, "cluster_nodes")->value == 1);
  REQUIRE(report.engines.size() == 3);
  const auto* prefill_weights = kvtier::serving::find_metric(report.engines[0], "hbm_weights_gib");
  const auto* decode_weights = kvtier::serving::find_metric(report.engines[1], "hbm_weights_gib");
  REQUIRE(prefill_weights != nullptr);
  REQUIRE(decode_weights != nullptr);
  CHECK(prefill_weights->value < decode_weights->value / 3);
  // The merged figures: the highest engine's HBM peak, the mean engines a node, NVLink used by
  // the prefill engines' all-reduces.
  const auto merged = [&report](const char* name) {
    const auto* metric = kvtier::serving::find_metric(report.metrics, name);
    REQUIRE(metric != nullptr);
    return metric->value;
  };
  double highest = 0.0;
  for (const auto& engine : report.engines) {
    highest = std::max(highest, kvtier::serving::find_metric(engine, "hbm_peak_gib")->value);
  }
  CHECK(merged("hbm_peak_gib") == highest);
  CHECK(merged("engines_per_node") == Approx(4.0));
  CHECK(merged("nvlink_utilisation") > 0.0);
  CHECK(kvtier::serving::find_metric(report.engines[0], "engines_per_node")->value == 2);
  CHECK(kvtier::serving::find_metric(report.engines[1], "engines_per_node")->value == 8);
  // Alike pools: one engine's split.
  const RunSpec alike = pools(1);
  CHECK_FALSE(kvtier::config::pools_differ(alike));
  CHECK(kvtier::serving::cluster_gpus(alike) == 3);
  CHECK(kvtier::serving::mean_engines_per_node(alike) == 8);
  CHECK(kvtier::serving::largest_gpus_per_engine(run) == 4);
  CHECK(kvtier::serving::largest_gpus_per_engine(alike) == 1);
}

TEST_CASE("the prefill pool's split is checked as the run's, at its own fields", "[pools]") {
  const std::string text = kvtier::test::quickstart_run();
  const std::vector<std::string> cluster = {"cluster.engines=3", "cluster.routing=ROUND_ROBIN",
                                            "cluster.disaggregation.prefill_engines=1",
                                            "cluster.disaggregation.decode_routing=ROUND_ROBIN",
                                            "cluster.disaggregation.kv_link.preset=InfiniBand-NDR"};
  const auto with = [&](std::vector<std::string> sets) {
    sets.insert(sets.begin(), cluster.begin(), cluster.end());
    return kvtier::test::joined(kvtier::test::problems<RunSpec>(text, sets));
  };
  const std::string three =
      with({"cluster.disaggregation.prefill_parallelism.tensor_parallel_degree=3"});
  CHECK_THAT(three, Catch::Contains("cluster.disaggregation.prefill_parallelism."
                                    "tensor_parallel_degree"));
  CHECK_THAT(three, Catch::Contains("prefill engines: tensor_parallel_degree 3 neither divides "
                                    "the model's 8 KV heads"));
  const std::string latent =
      with({"cluster.disaggregation.prefill_parallelism.data_parallel_attention=true"});
  CHECK_THAT(latent, Catch::Contains("prefill_parallelism.data_parallel_attention"));
  CHECK_THAT(latent, Catch::Contains("prefill engines: data-parallel attention is modelled for "
                                     "models with latent attention"));
  // A problem of the run's own split is named once, not again for the pool that inherits it.
  const auto lines = kvtier::test::problems<RunSpec>(
      text, {"cluster.engines=3", "cluster.routing=ROUND_ROBIN",
             "cluster.disaggregation.prefill_engines=1",
             "cluster.disaggregation.decode_routing=ROUND_ROBIN",
             "cluster.disaggregation.kv_link.preset=InfiniBand-NDR", "tensor_parallel_degree=3",
             "cluster.disaggregation.prefill_parallelism.pipeline_parallel_degree=2"});
  std::size_t heads = 0;
  for (const auto& line : lines) {
    heads += line.find("neither divides") != std::string::npos ? 1 : 0;
  }
  CHECK(heads == 1);
  // Over NVLink, the pools' GPUs together must fit the node: 8 prefill + 2 decode do not.
  CHECK_THAT(with({"cluster.disaggregation.prefill_parallelism.tensor_parallel_degree=8",
                   "cluster.disaggregation.kv_link.preset=NVLink4"}),
             Catch::Contains("take 10 GPUs of nodes of 8"));
  CHECK(with({"cluster.disaggregation.prefill_parallelism.tensor_parallel_degree=4",
              "cluster.disaggregation.kv_link.preset=NVLink4"})
            .empty());
  // A problem of the pool's split whose field it inherits is at prefill_parallelism, whose
  // other fields make it: data-parallel attention over the run's stages.
  const std::string inherited = with(
      {"model.preset=DeepSeek-V2-Lite", "tensor_parallel_degree=2", "pipeline_parallel_degree=2",
       "cluster.disaggregation.prefill_parallelism.data_parallel_attention=true"});
  CHECK_THAT(inherited, Catch::Contains("field cluster.disaggregation.prefill_parallelism)") &&
                            Catch::Contains("prefill engines: pipeline_parallel_degree 2 with "
                                            "engine.data_parallel_attention is not modelled"));
}

TEST_CASE("a run's problems keep their order: its cluster's before its tensor-parallel group's",
          "[pools]") {
  const auto lines = kvtier::test::problems<RunSpec>(
      kvtier::test::quickstart_run(),
      {"tensor_parallel_degree=3", "cluster.engines=2", "cluster.routing=KV_AWARE"});
  REQUIRE(lines.size() >= 3);
  CHECK_THAT(lines[0], Catch::Contains("kv_overlap_weight"));
  CHECK_THAT(lines.back(), Catch::Contains("tensor_parallel_degree 3"));
}

TEST_CASE("plan --layouts names a disaggregated run's pools, and auto fills the hardware with them",
          "[pools]") {
  using kvtier::serving::Layout;
  const RunSpec run = pools(4);
  const auto layouts = kvtier::serving::parse_layouts("2@4x1+1@8x2,8x1", run);
  REQUIRE(layouts.size() == 2);
  CHECK(layouts[0].pools());
  CHECK(layouts[0].prefill_engines == 2);
  CHECK(layouts[0].prefill_tensor_parallel == 4);
  CHECK(layouts[0].prefill_pipeline_stages == 1);
  CHECK(layouts[0].decode_engines == 1);
  CHECK(layouts[0].tensor_parallel == 8);
  CHECK(layouts[0].pipeline_stages == 2);
  CHECK(kvtier::serving::layout_key(layouts[0]) == "2@4x1+1@8x2");
  CHECK(kvtier::serving::describe_layout(layouts[0]) ==
        "prefill 2 x TP 4 x PP 1 + decode 1 x TP 8 x PP 2");
  CHECK_FALSE(layouts[1].pools());
  // The run split so: its cluster's engines, the prefill pool's degrees, the decode engines'.
  const RunSpec split = kvtier::serving::with_layout(run, layouts[0]);
  CHECK(split.cluster().engines() == 3);
  CHECK(split.cluster().disaggregation().prefill_engines() == 2);
  CHECK(kvtier::config::prefill_pool_run(split).tensor_parallel_degree() == 4);
  CHECK(kvtier::serving::pipeline_stages(kvtier::config::prefill_pool_run(split)) == 1);
  CHECK(split.tensor_parallel_degree() == 8);
  CHECK(split.pipeline_parallel_degree() == 2);
  CHECK(kvtier::serving::cluster_gpus(split) == 2 * 4 + 16);
  // An engine's layout keeps the run's pools and splits the decode engines (the prefill
  // engines keep their TP 4).
  const RunSpec engines = kvtier::serving::with_layout(run, layouts[1]);
  CHECK(engines.cluster().engines() == 3);
  CHECK(kvtier::config::prefill_pool_run(engines).tensor_parallel_degree() == 4);
  // Auto on one node of 8: unified clusters of one stage filling it (8 x TP 1 ... 1 x TP 8),
  // then every pair of pools that takes its 8 GPUs, by prefill TP, decode TP, prefill engines.
  const auto candidates = kvtier::serving::candidate_layouts(run);
  REQUIRE(candidates.size() == 4 + 21);
  std::vector<std::string> keys;
  for (const Layout& layout : candidates) {
    keys.push_back(kvtier::serving::layout_key(layout));
    CHECK(kvtier::serving::cluster_gpus(kvtier::serving::with_layout(run, layout)) == 8);
  }
  const std::vector<std::string> first = {"8@1x1", "4@2x1",       "2@4x1",
                                          "1@8x1", "1@1x1+7@1x1", "2@1x1+6@1x1"};
  CHECK(std::vector<std::string>(keys.begin(), keys.begin() + 6) == first);
  CHECK(keys[11] == "2@1x1+3@2x1");  // after the seven of decode TP 1
  CHECK(keys.back() == "1@4x1+1@4x1");
  CHECK(std::find(keys.begin(), keys.end(), "2@2x1+1@4x1") != keys.end());
  CHECK(std::find(keys.begin(), keys.end(), "1@8x1+1@1x1") == keys.end());  // 9 GPUs
  // A unified layout drops the disaggregation: every engine prefills and decodes.
  const RunSpec unified = kvtier::serving::with_layout(run, candidates[1]);
  CHECK_FALSE(unified.cluster().has_disaggregation());
  CHECK(unified.cluster().engines() == 4);
  CHECK(unified.tensor_parallel_degree() == 2);
  // Without a cluster, engine splits only; one GPU without pools still has a layout.
  CHECK(kvtier::serving::layout_key(kvtier::serving::candidate_layouts(run_with({})).front()) ==
        "1x1");
  RunSpec one_gpu = run;
  one_gpu.mutable_hardware()->mutable_node()->set_gpus_per_node(1);
  const auto lone = kvtier::serving::candidate_layouts(one_gpu);
  REQUIRE(lone.size() == 1);
  CHECK(kvtier::serving::layout_key(lone.front()) == "1@1x1");
  // Four nodes hold too many pairs to plan: name them.
  RunSpec wide = run;
  wide.mutable_hardware()->set_num_nodes(4);
  CHECK_THROWS_WITH(
      kvtier::serving::candidate_layouts(wide),
      Catch::Contains("would compare 147 layouts, more than 64: name the ones to compare "
                      "(e.g. 4@2x1,2@4x1+1@8x1)"));
  // Pools only for a disaggregated run, and well formed.
  const RunSpec alone = run_with({});
  CHECK_THROWS_WITH(kvtier::serving::parse_layouts("1@1x1+1@1x1", alone),
                    Catch::Contains("has no cluster.disaggregation"));
  for (const char* bad :
       {"2@4x", "0@4x1+1@8x1", "0@4x1", "2@4x1+1@8", "2@4x1+1@8x1+1@8x1", "2@4x1+"}) {
    CAPTURE(bad);
    CHECK_THROWS_WITH(kvtier::serving::parse_layouts(bad, run), Catch::Contains("is not a layout"));
  }
  CHECK_THROWS_WITH(kvtier::serving::parse_layouts("2@4x1+1@8x1,2@4x1+1@8x1", run),
                    Catch::Contains("names 2@4x1+1@8x1 twice"));
  CHECK_THROWS_WITH(kvtier::serving::parse_layouts("4@1x1", alone),
                    Catch::Contains("sets a cluster's engines, and the run has no cluster"));
  // Engines past cluster.engines' most, summed without wrapping.
  CHECK_THROWS_WITH(kvtier::serving::parse_layouts("2@1x1+4294967295@1x1", run),
                    Catch::Contains("'2@1x1+4294967295@1x1' has more than 4096 engines in all"));
  CHECK_THROWS_WITH(kvtier::serving::parse_layouts("4097@1x1", run),
                    Catch::Contains("has more than 4096 engines"));
  CHECK(kvtier::serving::parse_layouts("4000@1x1+96@1x1", run).size() == 1);
}
