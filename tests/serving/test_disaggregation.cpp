// Disaggregated clusters: prefill engines hand requests to decode engines, whose KV crosses the
// cluster's kv_link; the hand-off's cost, the link's queue and the refusals.

#include <catch2/catch.hpp>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/errors.hpp"
#include "configs/schema/run.pb.h"
#include "hwmodels/link_math.hpp"
#include "hwmodels/model_shape.hpp"
#include "serving/cluster.hpp"
#include "serving/simulation.hpp"
#include "serving/tier_demand.hpp"
#include "serving/tier_timing.hpp"
#include "serving/workload.hpp"
#include "sim/simulator.hpp"
#include "tests/support/cluster_fixture.hpp"
#include "tests/support/config_fixture.hpp"
#include "tests/support/disaggregated_runs.hpp"
#include "tests/support/serving_metrics.hpp"

using kvtier::config::RunSpec;
using kvtier::serving::Cluster;
using kvtier::serving::RequestSpec;
using kvtier::serving::Workload;
using kvtier::sim::Tick;
using kvtier::test::open_loop;
using kvtier::test::request_at;
using kvtier::test::serve;
using kvtier::test::split_run;
using kvtier::test::tiered_split;
using kvtier::test::TieredServed;

namespace {

RunSpec run_with(std::vector<std::string> sets) {
  return kvtier::test::load_spec<RunSpec>(kvtier::test::quickstart_run(), sets);
}

// A request at `seconds` whose prompt of `prompt` tokens starts with a `prefix`-token shared
// prefix (one segment, the same for every such request).
RequestSpec after_prefix(double seconds, std::uint64_t prefix, std::uint64_t prompt,
                         std::uint64_t output) {
  RequestSpec spec = request_at(seconds, prompt, output);
  spec.shared_tokens = prefix;
  spec.segment_tokens = prefix;
  spec.segments = {1};
  return spec;
}

// One copy of `prompt` tokens' KV per GPU over the run's kv_link.
Tick copy_time(const Cluster& cluster, const RunSpec& run, std::uint64_t prompt) {
  return kvtier::test::kv_link_copies(run, cluster.engine(0).memory().kv_bytes_for(prompt));
}

}  // namespace

TEST_CASE("a handed-off request costs its KV's copy and nothing else", "[disaggregation]") {
  // Whatever the engines' KV memory: a token at a time, or blocks cached by content (admitted
  // whole or on demand), where a decode engine must not take a received prompt for one to
  // prefill again.
  const std::vector<std::string> memory =
      GENERATE(std::vector<std::string>{},
               std::vector<std::string>{"memory.kv_block_tokens=16", "memory.prefix_caching=true"},
               std::vector<std::string>{"memory.kv_block_tokens=16", "memory.prefix_caching=true",
                                        "workload.on_demand_admission.watermark=0.01"});
  INFO("memory: " << memory.size() << " settings");
  const RunSpec split = split_run(2, 1, memory);
  RunSpec unified = split;
  unified.clear_cluster();
  const auto alone = serve(unified, open_loop({request_at(0, 1024, 32)}));
  const auto handed = serve(split, open_loop({request_at(0, 1024, 32)}));
  const Cluster& cluster = *handed->cluster;
  const auto& prefill = cluster.engine(0);
  const auto& decode = cluster.engine(1);
  const auto& one = alone->cluster->engine(0);
  // The first token where it was prefilled, as alone; the rest later by exactly the copy.
  CHECK(prefill.ttft().percentile(50) == one.ttft().percentile(50));
  CHECK(prefill.ttft().count() == 1);
  CHECK(decode.ttft().count() == 0);
  const Tick copy = copy_time(cluster, split, 1024);
  CHECK(cluster.kv_transfers().count == 1);
  CHECK(cluster.kv_transfers().busy == copy);
  CHECK(cluster.kv_transfers().handoff.percentile(50) == copy);
  CHECK(decode.e2e().percentile(50) == one.e2e().percentile(50) + copy);
  CHECK(cluster.kv_transfers().bytes == prefill.memory().kv_bytes_for(1024));
  // Each token counted once, where it was computed.
  CHECK(prefill.totals().requests_handed_off == 1);
  CHECK(prefill.totals().prompt_tokens == 1024);
  CHECK(prefill.totals().output_tokens == 1);
  CHECK(decode.totals().prompt_tokens == 0);
  CHECK(decode.totals().output_tokens == 31);
  CHECK(decode.totals().requests_completed == 1);
  CHECK(prefill.totals().requests_completed == 0);
  // The decode engine decoded only: 31 steps of one token, as many iterations.
  CHECK(decode.totals().iterations == 31);
  CHECK(decode.totals().prefix_queried_tokens == 0);
  // The prefill engine held the prompt's KV until it left, then freed it.
  CHECK(prefill.kv_used().max() == prefill.memory().kv_bytes_for(1024));
  CHECK(prefill.kv_used().value() == 0.0);
}

TEST_CASE("a decode engine pulls only the prompt blocks its prefix cache lacks",
          "[disaggregation]") {
  // Two requests of one 1,024-token prefix and 128 tokens of their own, the second arriving once
  // the first has finished: the decode engine has the prefix's 64 blocks cached by then, and
  // pulls the second prompt's other 8 blocks only.
  const RunSpec run = split_run(2, 1, {"memory.kv_block_tokens=16", "memory.prefix_caching=true"});
  const auto served =
      serve(run, open_loop({after_prefix(0, 1024, 1152, 32), after_prefix(10, 1024, 1152, 32)}));
  const Cluster& cluster = *served->cluster;
  const auto& prefill = cluster.engine(0);
  const auto& decode = cluster.engine(1);
  REQUIRE(decode.totals().requests_completed == 2);
  const double block = prefill.memory().block_bytes();
  CHECK(cluster.kv_transfers().count == 2);
  CHECK(cluster.kv_transfers().bytes == Approx((72 + 8) * block));
  CHECK(cluster.kv_transfers().cached_bytes == Approx(64 * block));
  const Tick eight_blocks = kvtier::test::kv_link_copies(run, 8 * block);
  CHECK(cluster.kv_transfers().transfer.min() == eight_blocks);
  CHECK(cluster.kv_transfers().transfer.max() == copy_time(cluster, run, 1152));
  // The prefill engine found the prefix too; the decode engine's lookups are not prefills'.
  CHECK(prefill.totals().prefix_hit_tokens == 1024);
  CHECK(decode.totals().prefix_queried_tokens == 0);
  CHECK(decode.totals().prompt_tokens == 0);
}

TEST_CASE("a prompt whose every block a decode engine holds crosses no link", "[disaggregation]") {
  // Prompts of one 1,024-token prefix alone (64 whole blocks): the second finds them all on
  // the decode engine, and nothing is copied for it.
  const RunSpec run = split_run(2, 1, {"memory.kv_block_tokens=16", "memory.prefix_caching=true"});
  const auto served =
      serve(run, open_loop({after_prefix(0, 1024, 1024, 32), after_prefix(10, 1024, 1024, 32)}));
  const Cluster& cluster = *served->cluster;
  REQUIRE(cluster.engine(1).totals().requests_completed == 2);
  const double block = cluster.engine(0).memory().block_bytes();
  CHECK(cluster.kv_transfers().count == 1);
  CHECK(cluster.kv_transfers().bytes == Approx(64 * block));
  CHECK(cluster.kv_transfers().cached_bytes == Approx(64 * block));
  CHECK(cluster.kv_transfers().handoff.count() == 2);
  CHECK(cluster.kv_transfers().handoff.min() == Tick::zero());
  // The prefill engine let its copy go at once.
  CHECK(cluster.engine(0).totals().requests_handed_off == 2);
}

TEST_CASE("a request of one output token ends where it was prefilled", "[disaggregation]") {
  const auto served = serve(split_run(2, 1), open_loop({request_at(0, 512, 1)}));
  CHECK(served->cluster->kv_transfers().count == 0);
  CHECK(served->cluster->engine(0).totals().requests_completed == 1);
  CHECK(served->cluster->engine(1).totals().requests_completed == 0);
}

TEST_CASE("an engine's GPUs receive one transfer at a time", "[disaggregation]") {
  // Two prompts prefilled at once on two prefill engines, decoded on the one decode engine: the
  // second copy waits for the first.
  const RunSpec run = split_run(3, 2);
  const auto served = serve(run, open_loop({request_at(0, 512, 8), request_at(0, 512, 8)}));
  const Cluster& cluster = *served->cluster;
  const Tick copy = copy_time(cluster, run, 512);
  CHECK(cluster.routed() == std::vector<std::uint64_t>{1, 1, 2});
  CHECK(cluster.engine(0).ttft().max() == cluster.engine(1).ttft().max());
  CHECK(cluster.kv_transfers().transfer.min() == copy);
  CHECK(cluster.kv_transfers().transfer.max() == copy + copy);
  CHECK(cluster.kv_transfers().handoff.max() == copy + copy);
  CHECK(cluster.kv_transfers().busy == copy + copy);
}

TEST_CASE("an engine's GPUs send one transfer at a time", "[disaggregation]") {
  // Two prompts prefilled one after the other on the one prefill engine, decoded on two decode
  // engines (least outstanding spreads them), over a link slow enough that the first copy
  // outlasts the second prefill: the second copy waits for the first to leave.
  const RunSpec run = split_run(3, 1,
                                {"cluster.disaggregation.kv_link.measured[0].effective_gb_per_s=1",
                                 "cluster.disaggregation.kv_link.peak_gb_per_s_per_direction=1"});
  const auto served = serve(run, open_loop({request_at(0, 512, 8), request_at(0, 512, 8)}));
  const Cluster& cluster = *served->cluster;
  const Tick copy = copy_time(cluster, run, 512);
  const auto& prefill = cluster.engine(0);
  const Tick gap = prefill.ttft().max() - prefill.ttft().min();
  REQUIRE(copy > gap);
  CHECK(cluster.engine(1).totals().requests_completed == 1);
  CHECK(cluster.engine(2).totals().requests_completed == 1);
  CHECK(cluster.kv_transfers().count == 2);
  CHECK(cluster.kv_transfers().transfer.min() == copy);
  CHECK(cluster.kv_transfers().transfer.max() == copy + copy - gap);
  CHECK(cluster.kv_transfers().busy == copy + copy);
}

TEST_CASE("with data-parallel attention each GPU moves its own requests' KV", "[disaggregation]") {
  // DeepSeek-V2-Lite (latent attention) on engines of two GPUs: two prompts prefilled at once on
  // two prefill engines, decoded on the one decode engine. Split by heads, both GPUs hold each
  // prompt's whole latent and send it, so the decode engine takes one copy after the other.
  // Split by requests, each prompt's latent is whole on one GPU, which sends it over its own
  // link to one of the decode engine's GPUs: both copies at once, each GPU's share half.
  std::vector<std::string> sets = {"model.preset=DeepSeek-V2-Lite", "tensor_parallel_degree=2"};
  const RunSpec heads = split_run(3, 2, sets);
  sets.emplace_back("engine.data_parallel_attention=true");
  const RunSpec requests = split_run(3, 2, sets);
  const auto workload = open_loop({request_at(0, 512, 8), request_at(0, 512, 8)});
  const auto by_heads = serve(heads, workload);
  const auto by_requests = serve(requests, workload);
  const auto& moved = by_requests->cluster->kv_transfers();
  const auto& queued = by_heads->cluster->kv_transfers();
  const Tick copy = copy_time(*by_heads->cluster, heads, 512);
  CHECK(queued.transfer.max() == copy + copy);
  CHECK(queued.busy == copy + copy);
  CHECK(moved.sending_lanes == 2);
  CHECK(moved.receiving_lanes == 2);
  CHECK(moved.count == 2);
  CHECK(moved.transfer.min() == copy);
  CHECK(moved.transfer.max() == copy);
  CHECK(moved.busy == copy + copy);
  CHECK(moved.bytes == queued.bytes / 2);
  CHECK(by_requests->cluster->engine(2).totals().requests_completed == 2);
}

TEST_CASE("with data-parallel attention an engine's GPUs send two transfers at once, not three",
          "[disaggregation]") {
  // One prefill and one decode engine of two GPUs over a link slow enough that a copy outlasts
  // the prefills: of three prompts, two cross at once and the third waits for a GPU on each side.
  const std::vector<std::string> sets = {
      "model.preset=DeepSeek-V2-Lite", "tensor_parallel_degree=2",
      "engine.data_parallel_attention=true",
      "cluster.disaggregation.kv_link.measured[0].effective_gb_per_s=0.1",
      "cluster.disaggregation.kv_link.peak_gb_per_s_per_direction=0.1"};
  const RunSpec run = split_run(2, 1, sets);
  const auto served =
      serve(run, open_loop({request_at(0, 512, 8), request_at(0, 512, 8), request_at(0, 512, 8)}));
  const auto& transfers = served->cluster->kv_transfers();
  const Tick copy =
      kvtier::test::kv_link_copies(run, 2 * served->cluster->engine(0).memory().kv_bytes_for(512));
  const auto& prefill = served->cluster->engine(0);
  REQUIRE(copy > prefill.ttft().max() - prefill.ttft().min());
  CHECK(transfers.count == 3);
  CHECK(transfers.busy == copy * 3);
  CHECK(transfers.transfer.min() == copy);
  CHECK(transfers.transfer.percentile(50) == copy);  // two of three did not wait
  CHECK(transfers.transfer.max() > copy);
  CHECK(transfers.transfer.max() < copy + copy);
  CHECK(served->cluster->engine(1).totals().requests_completed == 3);
}

TEST_CASE("a disaggregated run reports its pools, transfers and engines", "[disaggregation]") {
  const RunSpec run = split_run(3, 1);
  const auto report = kvtier::serving::simulate(run);
  std::map<std::string, double> metrics;
  for (const auto& metric : report.metrics) {
    metrics[metric.name] = metric.value;
  }
  CHECK(metrics.at("cluster_prefill_engines") == 1);
  CHECK(metrics.at("cluster_decode_engines") == 2);
  CHECK(metrics.at("kv_transfers") > 0);
  CHECK(metrics.at("kv_handoff_p99_ms") >= metrics.at("kv_transfer_p99_ms"));
  RunSpec unified = run;
  unified.clear_cluster();
  const auto alone = kvtier::serving::simulate(unified);
  CHECK(metrics.at("requests_completed") == alone.metrics[0].value);
  CHECK(metrics.at("output_tokens") == alone.metrics[2].value);
  REQUIRE(report.engines.size() == 3);
  CHECK(report.engines[0][1].name == "prefill_engine");
  CHECK(report.engines[0][1].value == 1);
  CHECK(report.engines[2][1].value == 0);
  CHECK(kvtier::serving::report_json({report}, run, "test") ==
        kvtier::serving::report_json({kvtier::serving::simulate(run)}, run, "test"));
}

TEST_CASE("a disaggregation the engines cannot serve is refused", "[disaggregation]") {
  const auto refused = [](std::vector<std::string> sets, const std::string& why) {
    std::vector<std::string> all = {"cluster.engines=2", "cluster.routing=ROUND_ROBIN",
                                    "cluster.disaggregation.prefill_engines=1",
                                    "cluster.disaggregation.decode_routing=ROUND_ROBIN",
                                    "cluster.disaggregation.kv_link.preset=NVLink4"};
    all.insert(all.end(), sets.begin(), sets.end());
    CHECK_THROWS_WITH(run_with(all), Catch::Contains(why));
  };
  refused({"cluster.disaggregation.prefill_engines=2"}, "leaves no decode engine");
  refused({"cluster.disaggregation.decode_routing=PREFIX_HASH"}, "choose ROUND_ROBIN or");
  refused({"cluster.disaggregation.kv_link.preset=PCIe-Gen5-x16"}, "NVLINK within a node");
  // Nine engines of one GPU take two nodes of eight: NVLink does not reach between them.
  refused({"cluster.engines=9"},
          "an NVLINK kv_link joins the GPUs of one node, but the "
          "cluster's 9 engines take 9 GPUs of nodes of 8");
  CHECK_NOTHROW(run_with({"cluster.engines=8", "cluster.routing=ROUND_ROBIN",
                          "cluster.disaggregation.prefill_engines=1",
                          "cluster.disaggregation.decode_routing=ROUND_ROBIN",
                          "cluster.disaggregation.kv_link.preset=NVLink4"}));
  // Runs built in code are held to the same rules.
  RunSpec unchecked = split_run(2, 1);
  unchecked.mutable_cluster()->mutable_disaggregation()->set_prefill_engines(2);
  kvtier::sim::Simulator simulator;
  CHECK_THROWS_AS(Cluster(simulator, unchecked, open_loop({request_at(0, 64, 4)}), nullptr),
                  kvtier::ConfigError);
}

TEST_CASE("decode engines with everything in HBM tier exactly as the full cache",
          "[disaggregation]") {
  const auto full = kvtier::test::serving_metrics(tiered_split("full"));
  const auto tiered = kvtier::test::serving_metrics(tiered_split("tiered:hbm=1.0,evict=0.0"));
  for (const char* name : {"duration_s", "ttft_p50_ms", "tpot_p50_ms", "tpot_p99_ms",
                           "kv_transfer_gb", "hbm_kv_used_peak_gib", "hbm_kv_used_mean_gib"}) {
    CAPTURE(name);
    CHECK(tiered.at(name) == Approx(full.at(name)).epsilon(1e-12));
  }
  CHECK(tiered.at("pcie_h2d_gb") == 0.0);
  CHECK(tiered.at("pcie_d2h_gb") == 0.0);
}

TEST_CASE("a decode engine places the KV it receives after its first step", "[disaggregation]") {
  // One request of 2,048 prompt tokens decoded twice on a decode engine: its KV lands whole in
  // HBM, its first step reads it there (no prefetch), and then what the policy's placement holds
  // off HBM is offloaded: Monarch's cold pages, compressed (T2). Its second step copies them in
  // (attend=all: attention reads them) and makes its own moves.
  const RunSpec run = tiered_split("monarch:attend=all");
  const TieredServed served(run, open_loop({request_at(0, 2048, 3)}));
  const kvtier::serving::TierDemand& tiers = served.tiers;
  const Cluster& cluster = served.cluster;
  REQUIRE(!tiers.differential_prefetch());
  const auto& prefill = cluster.engine(0).totals();
  REQUIRE(prefill.requests_handed_off == 1);
  CHECK(prefill.h2d_bytes == 0.0);  // a prefill engine holds the prompt whole
  CHECK(prefill.d2h_bytes == 0.0);
  CHECK(cluster.engine(0).tiers() == nullptr);
  // The decode engine the request went to (least outstanding: the first).
  const kvtier::serving::ServingEngine& decode = cluster.engine(1);
  REQUIRE(decode.totals().requests_completed == 1);
  const kvtier::test::TokenLayerBytes bytes = kvtier::test::token_layer_bytes(run, tiers);
  double placed = 0.0;
  double cold = 0.0;
  for (std::uint32_t layer = 0; layer < run.model().num_hidden_layers(); ++layer) {
    const auto first = tiers.at(0, 2049, layer, true);
    placed += first.host_after * bytes.full + first.compressed_after * bytes.compressed;
    cold += first.compressed_after;
  }
  const auto [second_in, second_out] = kvtier::test::step_copies(run, tiers, 2050);
  CHECK(cold > 0.0);
  CHECK(decode.totals().d2h_bytes == Approx(placed + second_out).epsilon(1e-12));
  CHECK(decode.totals().h2d_bytes == Approx(second_in).epsilon(1e-12));
  CHECK(second_in > 0.0);
  // Its host share is reserved from its admission on, and held once placed.
  CHECK(decode.host_kv_reserved().max() >= placed);
  CHECK(decode.host_kv_used().max() >= placed);
  // HBM held the prompt whole and the step's token before the placement.
  CHECK(decode.kv_reserved().max() >= decode.memory().kv_bytes_for(2049));
  CHECK(decode.kv_used().max() >= decode.memory().kv_bytes_for(2048));
}

TEST_CASE("a decode engine's request whose first step is its last is not placed",
          "[disaggregation]") {
  const TieredServed served(tiered_split("monarch"), open_loop({request_at(0, 2048, 2)}));
  const kvtier::serving::ServingEngine& decode = served.cluster.engine(1);
  REQUIRE(decode.totals().requests_completed == 1);
  CHECK(decode.totals().d2h_bytes == 0.0);
  CHECK(decode.totals().h2d_bytes == 0.0);
  CHECK(decode.host_kv_used().max() == 0.0);
  // Its KV is counted from its admission, before any iteration of this engine runs.
  CHECK(decode.kv_used().max() >= decode.memory().kv_bytes_for(2048));
}

TEST_CASE("a decode engine reserves a received prompt whole whatever its policy keeps",
          "[disaggregation]") {
  // StreamingLLM keeps 1,024 tokens of a 2,048-token prompt; the prompt still lands whole.
  const TieredServed served(tiered_split("streaming"), open_loop({request_at(0, 2048, 16)}));
  const kvtier::serving::ServingEngine& decode = served.cluster.engine(1);
  CHECK(decode.hbm_reservation(0) == decode.memory().kv_bytes_for(2049));
  CHECK(served.cluster.engine(0).hbm_reservation(0) == decode.memory().kv_bytes_for(2048));
}

TEST_CASE("decode engines admitted on demand keep their host shares within host memory",
          "[disaggregation]") {
  // Monarch moves a prompt's cold pages to the host at once; host memory cut to 16 GiB (2 GiB a
  // GPU), less than 24 requests' cold pages on each decode engine.
  const auto metrics = kvtier::test::serving_metrics(tiered_split(
      "monarch:attend=all",
      {"workload.on_demand_admission.watermark=0.01", "hardware.node.host.capacity_gib=16",
       "workload.closed_loop.concurrency=48", "workload.closed_loop.num_requests=48",
       "workload.closed_loop.prompt_tokens.fixed_tokens=8192",
       "workload.closed_loop.output_tokens.fixed_tokens=64"}));
  CHECK(metrics.at("requests_completed") == 48);
  CHECK(metrics.at("admissions_held_by_host") > 0);
  CHECK(metrics.at("host_kv_used_peak_gib") > 0.0);
  CHECK(metrics.at("host_kv_used_peak_gib") <= metrics.at("host_kv_capacity_gib"));
  CHECK(metrics.at("hbm_kv_used_peak_gib") <= metrics.at("hbm_kv_capacity_gib"));
}

TEST_CASE("decode engines tier the KV they receive, and the report gives theirs",
          "[disaggregation]") {
  // Long enough for tiered to move tokens past its recent window of 128.
  const std::vector<std::string> longer = {"workload.closed_loop.prompt_tokens.fixed_tokens=512",
                                           "workload.closed_loop.output_tokens.fixed_tokens=256"};
  const auto full = kvtier::test::serving_metrics(tiered_split("full", longer));
  const auto tiered =
      kvtier::test::serving_metrics(tiered_split("tiered:hbm=0.3,evict=0.1,delta=8", longer));
  CHECK(tiered.at("requests_completed") == full.at("requests_completed"));
  CHECK(tiered.at("kv_transfer_gb") == Approx(full.at("kv_transfer_gb")).epsilon(1e-12));
  CHECK(tiered.at("hbm_kv_used_peak_gib") < full.at("hbm_kv_used_peak_gib"));
  CHECK(tiered.at("host_kv_used_peak_gib") > 0.0);
  CHECK(tiered.at("pcie_h2d_gb") > 0.0);
  CHECK(tiered.at("pcie_d2h_gb") > 0.0);
  // The policy's figures are the decode engines' (the prefill engines keep every token).
  CHECK(tiered.at("attention_mass_kept_mean") < 1.0);
  // A decode engine's request reserves at least its prompt whole and one token more.
  CHECK(tiered.at("largest_batch_hbm_limit") > full.at("largest_batch_hbm_limit"));
  // Admitted on demand, a request on its way counts its prompt whole in HBM and its host share.
  std::vector<std::string> on_demand = longer;
  on_demand.emplace_back("workload.on_demand_admission.watermark=0.01");
  const auto admitted =
      kvtier::test::serving_metrics(tiered_split("tiered:hbm=0.3,evict=0.1,delta=8", on_demand));
  CHECK(admitted.at("requests_completed") == tiered.at("requests_completed"));
  CHECK(admitted.at("host_kv_used_peak_gib") > 0.0);
  CHECK(admitted.at("pcie_d2h_gb") > 0.0);
}
