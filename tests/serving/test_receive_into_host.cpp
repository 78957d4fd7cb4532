// Decode engines that receive prompts' KV into host memory
// (cluster.disaggregation.receive_into_host_memory), or only the tokens their policy keeps
// (send_kept_only): what crosses the link, what their first step loads, what their admission
// reserves, and the refusals.

#include <catch2/catch.hpp>

#include <cmath>
#include <string>
#include <vector>

#include "configs/schema/run.pb.h"
#include "serving/cluster.hpp"
#include "serving/memory_plan.hpp"
#include "serving/simulation.hpp"
#include "serving/tier_demand.hpp"
#include "tests/support/cluster_fixture.hpp"
#include "tests/support/config_fixture.hpp"
#include "tests/support/disaggregated_runs.hpp"
#include "tests/support/serving_metrics.hpp"

using kvtier::config::RunSpec;
using kvtier::test::open_loop;
using kvtier::test::request_at;
using kvtier::test::tiered_split;
using kvtier::test::TieredServed;

namespace {

// tiered_split's cluster, its decode engines receiving into host memory.
RunSpec into_host(const std::string& policy, const std::vector<std::string>& extra = {}) {
  RunSpec run = tiered_split(policy, extra);
  run.mutable_cluster()->mutable_disaggregation()->set_receive_into_host_memory(true);
  return run;
}

// `run` with its prefill engines sending only the tokens the decode engines' policy keeps.
RunSpec kept_only(RunSpec run) {
  run.mutable_cluster()->mutable_disaggregation()->set_send_kept_only(true);
  return run;
}

// Request 0's prompt tokens its policy keeps before its first step, summed over the layers, and
// the same in whole blocks of each layer with `extra` tokens more.
struct Kept {
  double tokens = 0.0;
  double in_blocks = 0.0;
};

Kept kept_at_start(const RunSpec& run, const kvtier::serving::TierDemand& tiers,
                   std::uint64_t prompt, std::uint64_t extra, std::uint32_t block_tokens) {
  Kept kept;
  for (std::uint32_t layer = 0; layer < run.model().num_hidden_layers(); ++layer) {
    const auto start = tiers.at(0, prompt + 1, layer, true);
    const double tokens = start.hbm + start.host + start.compressed_held;
    kept.tokens += tokens;
    kept.in_blocks +=
        kvtier::serving::in_whole_blocks(tokens + static_cast<double>(extra), block_tokens);
  }
  return kept;
}

// 4,096-token prompts, 1,024 tokens generated, on one prefill and one decode engine; 96 requests
// in flight, more than the decode engine's 40 GiB GPU holds whole beside its weights (44) and
// fewer than it holds as StreamingLLM places them.
const std::vector<std::string> kCrowdedDecode = {
    "cluster.engines=2",
    "hardware.node.gpu.memory_capacity=40GiB",
    "workload.closed_loop.concurrency=96",
    "workload.closed_loop.num_requests=96",
    "workload.closed_loop.prompt_tokens.fixed_tokens=4096",
    "workload.closed_loop.output_tokens.fixed_tokens=1024"};

}  // namespace

TEST_CASE(
    "a decode engine loads from host memory what its first step reads, and copies nothing out",
    "[disaggregation]") {
  // One request of 2,048 prompt tokens decoded twice. Monarch (cold pages read back, int8)
  // keeps the window's and sticky pages hot and the rest cold. The prompt lands in host memory
  // at full precision: the first step loads every token the policy keeps before its layer
  // computes (hot ones into HBM, cold ones staged), its promotions come in after it, and its
  // cold tokens are recoded there (nothing offloaded). The second step is any tiered step.
  const RunSpec run = into_host("monarch:attend=all,compression=int8");
  const TieredServed served(run, open_loop({request_at(0, 2048, 3)}));
  const kvtier::serving::TierDemand& tiers = served.tiers;
  const kvtier::serving::ServingEngine& decode = served.cluster.engine(1);
  REQUIRE(decode.totals().requests_completed == 1);
  const double full = kvtier::test::full_token_layer_bytes(run);
  double loaded = 0.0;
  double hot = 0.0;
  double recoded = 0.0;
  for (std::uint32_t layer = 0; layer < run.model().num_hidden_layers(); ++layer) {
    const auto first = tiers.at(0, 2049, layer, true);
    loaded += (first.hbm + first.host + first.compressed + first.promoted) * full;
    hot += first.hbm;
    recoded += first.compressed_after + tiers.at(0, 2050, layer, true).recoded_to_compressed;
  }
  const auto [second_in, second_out] = kvtier::test::step_copies(run, tiers, 2050);
  REQUIRE(hot > 0.0);
  REQUIRE(recoded > 0.0);
  CHECK(decode.totals().h2d_bytes == Approx(loaded + second_in).epsilon(1e-12));
  CHECK(decode.totals().d2h_bytes == Approx(second_out).epsilon(1e-12));
  CHECK(decode.totals().host_recode_bytes == Approx(recoded * full).epsilon(1e-12));
  // The prompt is in host memory whole from its admission until its first step has placed it.
  const double prompt = 2048.0 * run.model().num_hidden_layers() * full;
  CHECK(decode.host_kv_reserved().max() >= prompt);
  CHECK(decode.host_kv_used().max() == Approx(prompt).epsilon(1e-12));
  // HBM holds what the policy places, never the prompt whole.
  CHECK(decode.kv_reserved().max() < decode.memory().kv_bytes_for(2048));
  CHECK(decode.kv_used().max() < decode.memory().kv_bytes_for(2048));
}

TEST_CASE("a decode engine receiving into host memory reserves the policy's HBM, not the prompt's",
          "[disaggregation]") {
  // StreamingLLM keeps 1,024 tokens of a 2,048-token prompt: received into HBM the prompt lands
  // whole there, received into host memory only what the policy keeps is loaded.
  const auto workload = open_loop({request_at(0, 2048, 16)});
  const TieredServed in_hbm(tiered_split("streaming"), workload);
  const TieredServed in_host(into_host("streaming"), workload);
  const auto& hbm_engine = in_hbm.cluster.engine(1);
  const auto& host_engine = in_host.cluster.engine(1);
  REQUIRE(hbm_engine.hbm_reservation(0) == hbm_engine.memory().kv_bytes_for(2049));
  const kvtier::serving::RequestPeaks& peaks = in_host.tiers.peaks(0);
  CHECK(peaks.placed_hbm_token_layers < peaks.hbm_token_layers);
  CHECK(host_engine.hbm_reservation(0) < hbm_engine.hbm_reservation(0) * 0.6);
  const RunSpec run = into_host("streaming");
  CHECK(host_engine.host_reservation(0) ==
        Approx(2048.0 * run.model().num_hidden_layers() * kvtier::test::full_token_layer_bytes(run))
            .epsilon(1e-12));
  CHECK(hbm_engine.host_reservation(0) == 0.0);
  // The prefill engine holds the prompt whole either way.
  CHECK(in_host.cluster.engine(0).hbm_reservation(0) == hbm_engine.memory().kv_bytes_for(2048));
  // The evicted half never crosses PCIe, nor does anything after the first step.
  double kept = 0.0;
  for (std::uint32_t layer = 0; layer < run.model().num_hidden_layers(); ++layer) {
    kept += in_host.tiers.at(0, 2049, layer, true).hbm;
  }
  CHECK(host_engine.totals().h2d_bytes == Approx(kept * kvtier::test::full_token_layer_bytes(run)));
  CHECK(host_engine.totals().d2h_bytes == 0.0);
  CHECK(hbm_engine.totals().h2d_bytes == 0.0);
}

TEST_CASE("a decode engine's request received into host memory and done at once loads and leaves",
          "[disaggregation]") {
  const RunSpec run = into_host("streaming");
  const TieredServed served(run, open_loop({request_at(0, 2048, 2)}));
  const kvtier::serving::ServingEngine& decode = served.cluster.engine(1);
  REQUIRE(decode.totals().requests_completed == 1);
  const double full = kvtier::test::full_token_layer_bytes(run);
  double kept = 0.0;
  for (std::uint32_t layer = 0; layer < run.model().num_hidden_layers(); ++layer) {
    const auto first = served.tiers.at(0, 2049, layer, true);
    REQUIRE(first.host + first.compressed == 0.0);  // StreamingLLM keeps or evicts
    kept += first.hbm;
  }
  CHECK(decode.totals().h2d_bytes == Approx(kept * full).epsilon(1e-12));
  CHECK(decode.totals().d2h_bytes == 0.0);
  CHECK(decode.totals().host_recode_bytes == 0.0);
  CHECK(decode.host_kv_used().max() ==
        Approx(2048.0 * run.model().num_hidden_layers() * full).epsilon(1e-12));
}

TEST_CASE("admitted on demand, a first step from host memory counts the T0 it loads",
          "[disaggregation]") {
  // H2O's placement before its first step holds the prompt whole in T0 and evicts to its budget
  // at that step: the step loads all of it, so the iteration's footprint holds it all in HBM,
  // not just what stays.
  const RunSpec run = into_host("h2o:budget=256", {"workload.on_demand_admission.watermark=0.01"});
  const TieredServed served(run, open_loop({request_at(0, 2048, 8)}));
  const kvtier::serving::ServingEngine& decode = served.cluster.engine(1);
  REQUIRE(decode.totals().requests_completed == 1);
  const double full = kvtier::test::full_token_layer_bytes(run);
  const std::uint32_t block = decode.memory().block_tokens;
  double read = 0.0;
  double loaded = 0.0;
  double kept = 0.0;
  for (std::uint32_t layer = 0; layer < run.model().num_hidden_layers(); ++layer) {
    const auto first = served.tiers.at(0, 2049, layer, true);
    read += first.hbm * full;
    loaded += kvtier::serving::in_whole_blocks(first.hbm + 1.0, block) * full;
    kept += kvtier::serving::in_whole_blocks(first.hbm_after, block) * full;
  }
  REQUIRE(loaded > 2.0 * kept);
  CHECK(decode.kv_reserved().max() >= loaded);
  CHECK(decode.totals().h2d_bytes == Approx(read).epsilon(1e-12));
}

TEST_CASE("a decode pool of pipeline stages loads from host memory stage by stage",
          "[disaggregation]") {
  // Each GPU loads its stage's layers: per GPU, half of what one stage of every layer loads.
  const auto workload = open_loop({request_at(0, 2048, 4)});
  const TieredServed one(into_host("streaming"), workload);
  const TieredServed two(into_host("streaming", {"pipeline_parallel_degree=2"}), workload);
  REQUIRE(one.cluster.engine(1).totals().h2d_bytes > 0.0);
  CHECK(two.cluster.engine(1).totals().h2d_bytes ==
        Approx(one.cluster.engine(1).totals().h2d_bytes / 2).epsilon(1e-9));
  CHECK(two.cluster.engine(1).totals().requests_completed == 1);
}

TEST_CASE("a prompt that host memory cannot hold is refused by name", "[disaggregation]") {
  // 4,096 tokens of Llama-3.1-8B's KV are 512 MiB; 1 GiB of DDR leaves 128 MiB a GPU.
  const RunSpec run =
      into_host("streaming", {"hardware.node.host.capacity_gib=1",
                              "workload.closed_loop.prompt_tokens.fixed_tokens=4096"});
  CHECK_THROWS_WITH(
      kvtier::serving::simulate_all(run),
      Catch::Contains("needs 0.50 GiB of host memory for its prompt received there") &&
          Catch::Contains("leaves 0.12 GiB"));
}

TEST_CASE("receiving into host memory fits more decoding requests when the policy keeps little",
          "[disaggregation]") {
  // StreamingLLM keeps 1,024 tokens of each prompt (kCrowdedDecode).
  const std::vector<std::string>& sets = kCrowdedDecode;
  const auto in_hbm = kvtier::test::serving_metrics(tiered_split("streaming", sets));
  const auto in_host = kvtier::test::serving_metrics(into_host("streaming", sets));
  CHECK(in_host.at("requests_completed") == in_hbm.at("requests_completed"));
  CHECK(in_host.at("kv_transfer_gb") == in_hbm.at("kv_transfer_gb"));
  CHECK(in_host.at("largest_batch_hbm_limit") > 3 * in_hbm.at("largest_batch_hbm_limit"));
  CHECK(in_hbm.at("admissions_held_by_hbm") > 0);
  CHECK(in_host.at("admissions_held_by_hbm") == 0);
  CHECK(in_host.at("max_running_requests") > in_hbm.at("max_running_requests"));
  CHECK(in_host.at("throughput_output_tokens_per_s") >
        1.1 * in_hbm.at("throughput_output_tokens_per_s"));
  CHECK(in_host.at("hbm_kv_used_peak_gib") < in_hbm.at("hbm_kv_used_peak_gib"));
  CHECK(in_host.at("pcie_h2d_gb") > 0.0);
  CHECK(in_hbm.at("pcie_h2d_gb") == 0.0);
  // Admitted on demand, a prompt received into HBM takes its whole room only until its first
  // step; received into host memory it never does, and both keep within HBM and host memory.
  std::vector<std::string> on_demand = sets;
  on_demand.emplace_back("workload.on_demand_admission.watermark=0.01");
  on_demand.emplace_back("hardware.node.host.capacity_gib=64");
  const auto admitted = kvtier::test::serving_metrics(into_host("streaming", on_demand));
  CHECK(admitted.at("requests_completed") == in_hbm.at("requests_completed"));
  CHECK(admitted.at("hbm_kv_used_peak_gib") <= admitted.at("hbm_kv_capacity_gib"));
  CHECK(admitted.at("host_kv_used_peak_gib") > 0.0);
  CHECK(admitted.at("host_kv_used_peak_gib") <= admitted.at("host_kv_capacity_gib"));
}

TEST_CASE("sending only the kept tokens leaves the evicted ones behind", "[disaggregation]") {
  // StreamingLLM keeps 1,024 tokens of a 2,048-token prompt: half the prompt crosses the link,
  // and the decode engine reserves and holds that half with one token more, nothing else.
  const auto workload = open_loop({request_at(0, 2048, 16)});
  const RunSpec run = kept_only(tiered_split("streaming"));
  const TieredServed whole(tiered_split("streaming"), workload);
  const TieredServed kept(run, workload);
  const auto& decode = kept.cluster.engine(1);
  const double full = kvtier::test::full_token_layer_bytes(run);
  const std::uint32_t block = decode.memory().block_tokens;
  const Kept sent = kept_at_start(run, kept.tiers, 2048, 0, block);
  REQUIRE(sent.tokens < 0.6 * 2048.0 * run.model().num_hidden_layers());
  CHECK(kept.cluster.kv_transfers().bytes == Approx(sent.in_blocks * full).epsilon(1e-12));
  CHECK(whole.cluster.kv_transfers().bytes == decode.memory().kv_bytes_for(2048));
  CHECK(decode.received_kv_bytes(0) == Approx(sent.in_blocks * full).epsilon(1e-12));
  CHECK(decode.hbm_reservation(0) <
        0.6 * whole.cluster.engine(1).hbm_reservation(0));  // prompt + 1 whole there
  CHECK(decode.hbm_reservation(0) >=
        kept_at_start(run, kept.tiers, 2048, 1, block).in_blocks * full);
  CHECK(decode.kv_used().max() < 0.6 * whole.cluster.engine(1).kv_used().max());
  // Nothing to offload: StreamingLLM's placement is all in HBM.
  CHECK(decode.totals().d2h_bytes == 0.0);
  CHECK(decode.totals().h2d_bytes == 0.0);
  // The prefill engine still holds the prompt whole until it is sent.
  CHECK(kept.cluster.engine(0).hbm_reservation(0) == decode.memory().kv_bytes_for(2048));
}

TEST_CASE("admitted on demand, a request sent its kept tokens counts only those in HBM",
          "[disaggregation]") {
  const RunSpec run =
      kept_only(tiered_split("streaming", {"workload.on_demand_admission.watermark=0.01"}));
  const TieredServed served(run, open_loop({request_at(0, 2048, 16)}));
  const auto& decode = served.cluster.engine(1);
  REQUIRE(decode.totals().requests_completed == 1);
  // Its admission's footprint: the kept tokens and the first step's own.
  CHECK(decode.kv_reserved().max() == Approx(decode.received_kv_bytes(0, 1)).epsilon(1e-12));
  CHECK(decode.kv_reserved().max() < 0.6 * decode.memory().kv_bytes_for(2049));
}

TEST_CASE("a policy that evicts nothing at the start is sent every token, T2 included",
          "[disaggregation]") {
  // Monarch's cold pages are T2, held though not attended (attend=hot): they are sent.
  const auto workload = open_loop({request_at(0, 2048, 4)});
  const RunSpec run = kept_only(tiered_split("monarch"));
  const TieredServed whole(tiered_split("monarch"), workload);
  const TieredServed kept(run, workload);
  double cold = 0.0;
  for (std::uint32_t layer = 0; layer < run.model().num_hidden_layers(); ++layer) {
    cold += kept.tiers.at(0, 2049, layer, true).compressed_held;
  }
  REQUIRE(cold > 0.0);
  CHECK(kept.cluster.kv_transfers().bytes == whole.cluster.kv_transfers().bytes);
  CHECK(kept.cluster.engine(1).hbm_reservation(0) >= whole.cluster.engine(1).hbm_reservation(0));
}

TEST_CASE("received into host memory, only the kept tokens are held there and loaded",
          "[disaggregation]") {
  const auto workload = open_loop({request_at(0, 2048, 16)});
  const RunSpec run = kept_only(into_host("streaming"));
  const TieredServed served(run, workload);
  const auto& decode = served.cluster.engine(1);
  const double full = kvtier::test::full_token_layer_bytes(run);
  const Kept sent = kept_at_start(run, served.tiers, 2048, 0, decode.memory().block_tokens);
  CHECK(decode.host_reservation(0) == Approx(sent.tokens * full).epsilon(1e-12));
  CHECK(decode.host_kv_used().max() == Approx(sent.tokens * full).epsilon(1e-12));
  CHECK(decode.totals().h2d_bytes == Approx(sent.tokens * full).epsilon(1e-12));
}

TEST_CASE("sending only the kept tokens fits what the policy keeps in the decode pool",
          "[disaggregation]") {
  // The decode engine fits what StreamingLLM keeps (kCrowdedDecode), as received into host
  // memory, without copying anything over PCIe.
  const std::vector<std::string>& sets = kCrowdedDecode;
  const auto whole = kvtier::test::serving_metrics(tiered_split("streaming", sets));
  const auto kept = kvtier::test::serving_metrics(kept_only(tiered_split("streaming", sets)));
  CHECK(kept.at("requests_completed") == whole.at("requests_completed"));
  CHECK(kept.at("kv_transfer_gb") < 0.3 * whole.at("kv_transfer_gb"));
  CHECK(kept.at("largest_batch_hbm_limit") > 3 * whole.at("largest_batch_hbm_limit"));
  CHECK(kept.at("max_running_requests") > whole.at("max_running_requests"));
  CHECK(kept.at("pcie_h2d_gb") == 0.0);
  CHECK(kept.at("hbm_kv_used_peak_gib") <= kept.at("hbm_kv_capacity_gib"));
}

TEST_CASE("the full cache receives every token into HBM whatever the flags say",
          "[disaggregation]") {
  const auto plain = kvtier::test::serving_metrics(tiered_split("full"));
  // And is sent every token whatever send_kept_only says.
  const auto flagged = kvtier::test::serving_metrics(kept_only(into_host("full")));
  REQUIRE(flagged.size() == plain.size());
  for (const auto& [name, value] : plain) {
    CAPTURE(name);
    CHECK((flagged.at(name) == value || (std::isnan(value) && std::isnan(flagged.at(name)))));
  }
}

TEST_CASE("receiving into host memory or sending the kept tokens needs a tier policy",
          "[disaggregation]") {
  const std::vector<std::string> sets = {"cluster.engines=2",
                                         "cluster.routing=ROUND_ROBIN",
                                         "cluster.disaggregation.prefill_engines=1",
                                         "cluster.disaggregation.decode_routing=ROUND_ROBIN",
                                         "cluster.disaggregation.kv_link.preset=NVLink4",
                                         "cluster.disaggregation.receive_into_host_memory=true"};
  const std::string text =
      kvtier::test::joined(kvtier::test::problems<RunSpec>(kvtier::test::quickstart_run(), sets));
  CHECK_THAT(text, Catch::Contains("cluster.disaggregation.receive_into_host_memory") &&
                       Catch::Contains("needs a tier policy in policy or compare"));
  std::vector<std::string> kept = sets;
  kept.back() = "cluster.disaggregation.send_kept_only=true";
  CHECK_THAT(
      kvtier::test::joined(kvtier::test::problems<RunSpec>(kvtier::test::quickstart_run(), kept)),
      Catch::Contains("cluster.disaggregation.send_kept_only") &&
          Catch::Contains("sending only the kept tokens needs a tier policy"));
  // A tier policy among those compared is enough.
  std::vector<std::string> tiered = sets;
  tiered.insert(tiered.end(), kvtier::test::kTieringSets.begin(), kvtier::test::kTieringSets.end());
  CHECK(kvtier::test::problems<RunSpec>(
            kvtier::test::quickstart_run() + "\ncompare { name: \"streaming\" }\n", tiered)
            .empty());
}
