// Tier policies over pipeline stages: each stage's GPUs hold, copy and stage their own layers'
// KV, one micro-batch after another.

#include <catch2/catch.hpp>

#include <string>
#include <utility>
#include <vector>

#include "configs/schema/run.pb.h"
#include "serving/tier_demand.hpp"
#include "serving/workload.hpp"
#include "tests/support/config_fixture.hpp"
#include "tests/support/serving_metrics.hpp"

using kvtier::config::RunSpec;

namespace {

// Llama-3.1-70B on four H100s a stage, 32 requests of 2,048 + 1,024 tokens at once under
// `tiered`, its copies pinned on the copy engines two layers ahead; `extra` last.
RunSpec tiered_seventy(const std::vector<std::string>& extra) {
  std::vector<std::string> sets = {"model.preset=Llama-3.1-70B",
                                   "tensor_parallel_degree=4",
                                   "workload.closed_loop.concurrency=32",
                                   "workload.closed_loop.num_requests=32",
                                   "workload.closed_loop.prompt_tokens.fixed_tokens=2048",
                                   "workload.closed_loop.output_tokens.fixed_tokens=1024",
                                   "workload.prefill_chunk_tokens=2048",
                                   "engine.iteration_overhead_us=1750",
                                   "policy.name=tiered",
                                   "tiering.synthetic_pattern=reasoning",
                                   "tiering.prefetch_lookahead_layers=2",
                                   "tiering.host_allocation=PINNED",
                                   "tiering.copy_method=COPY_ENGINES"};
  sets.insert(sets.end(), extra.begin(), extra.end());
  return kvtier::test::load_spec<RunSpec>(kvtier::test::quickstart_run(), sets);
}

}  // namespace

TEST_CASE("over two stages each GPU copies and holds its own layers' share", "[tiers]") {
  const auto one = kvtier::test::serving_metrics(tiered_seventy({}));
  const auto two = kvtier::test::serving_metrics(tiered_seventy({"pipeline_parallel_degree=2"}));
  REQUIRE(one.at("requests_completed") == 32);
  REQUIRE(two.at("requests_completed") == 32);
  // The same requests take the same steps, so the same copies over the engine: a GPU of either
  // stage copies its 40 layers' half.
  CHECK(two.at("pcie_h2d_gb") == Approx(one.at("pcie_h2d_gb") / 2).epsilon(1e-12));
  CHECK(two.at("pcie_d2h_gb") == Approx(one.at("pcie_d2h_gb") / 2).epsilon(1e-12));
  // Its host memory holds those layers' T1; its HBM their T0 (the heaviest stage's: at least
  // half, and the synthetic pattern's layers differ little).
  CHECK(two.at("host_kv_used_peak_gib") >= 0.5 * one.at("host_kv_used_peak_gib"));
  CHECK(two.at("host_kv_used_peak_gib") < 0.55 * one.at("host_kv_used_peak_gib"));
  CHECK(two.at("hbm_kv_used_peak_gib") >= 0.5 * one.at("hbm_kv_used_peak_gib"));
  CHECK(two.at("hbm_kv_used_peak_gib") < 0.55 * one.at("hbm_kv_used_peak_gib"));
  CHECK(two.at("largest_batch_hbm_limit") > 2 * one.at("largest_batch_hbm_limit"));
}

TEST_CASE("stages copy side by side: a copy-bound step shortens with its stages", "[tiers]") {
  // With every T1 token copied each step (prefetch=full) the step waits on PCIe. Two stages
  // copy half the layers each over their own links, one micro-batch of half the requests after
  // the other: each link carries a quarter of the engine's copies per micro-batch, and a round
  // about half of one group's. 64 requests of 2,048 + 2,048 tokens.
  const std::vector<std::string> longer = {"workload.closed_loop.concurrency=64",
                                           "workload.closed_loop.num_requests=64",
                                           "workload.closed_loop.output_tokens.fixed_tokens=2048"};
  auto with = [&longer](std::vector<std::string> sets) {
    sets.insert(sets.begin(), longer.begin(), longer.end());
    return kvtier::test::serving_metrics(tiered_seventy(sets));
  };
  const auto one = with({});
  const auto two = with({"pipeline_parallel_degree=2"});
  REQUIRE(one.at("max_running_requests") == 64);
  REQUIRE(two.at("max_running_requests") == 64);
  REQUIRE(one.at("prefetch_stall_fraction") > 0.5);
  CHECK(two.at("tpot_p50_ms") < 0.6 * one.at("tpot_p50_ms"));
  CHECK(two.at("tpot_p50_ms") > 0.4 * one.at("tpot_p50_ms"));
  // Per GPU the links stay about as busy: half the bytes in about half the time.
  CHECK(two.at("pcie_h2d_utilisation") == Approx(one.at("pcie_h2d_utilisation")).epsilon(0.1));
  // The full cache's step barely changes (each GPU reads half the KV for each of two
  // micro-batches); the tier policy's cost over it falls with the copies.
  const auto full_one = with({"policy.name=full"});
  const auto full_two = with({"policy.name=full", "pipeline_parallel_degree=2"});
  CHECK(two.at("tpot_p50_ms") / full_two.at("tpot_p50_ms") <
        one.at("tpot_p50_ms") / full_one.at("tpot_p50_ms"));
}

TEST_CASE("a request's tier peaks per GPU are its heaviest stage's", "[tiers]") {
  // Over two stages of 40 layers a GPU's peak is at least half of the 80 layers' and less than
  // the whole; over four stages of 20 at least a quarter.
  const RunSpec one = tiered_seventy({});
  const auto workload = kvtier::serving::make_workload(one.workload(), one.seed());
  const kvtier::serving::TierDemand whole(one, one.policy(), workload);
  for (const std::uint32_t stages : {2U, 4U}) {
    CAPTURE(stages);
    // Four stages of two GPUs fill a node as two of four do.
    const RunSpec staged = tiered_seventy({"pipeline_parallel_degree=" + std::to_string(stages),
                                           "tensor_parallel_degree=" + std::to_string(8 / stages)});
    const kvtier::serving::TierDemand split(staged, staged.policy(), workload);
    for (std::uint32_t request = 0; request < workload.requests.size(); ++request) {
      const auto& all = whole.peaks(request);
      const auto& part = split.peaks(request);
      CHECK(part.hbm_token_layers >= all.hbm_token_layers / stages);
      CHECK(part.hbm_token_layers < all.hbm_token_layers);
      CHECK(part.host_token_layers >= all.host_token_layers / stages);
      CHECK(part.host_token_layers < all.host_token_layers);
      // The most one layer stages does not depend on the stages.
      CHECK(part.staged_tokens == all.staged_tokens);
    }
  }
}

TEST_CASE("over three stages each GPU copies a third, its recodes too", "[tiers]") {
  // 80 layers as 27, 27 and 26: two stages cost alike, the last holds the LM head. A policy
  // that compresses part of T1 recodes tokens between T1 and T2 in host memory.
  const auto compressing = [](const std::vector<std::string>& sets) {
    RunSpec run = tiered_seventy(sets);
    for (const auto& [name, value] :
         {std::pair<std::string, double>{"hbm", 0.5}, {"evict", 0.1}, {"compress", 0.2}}) {
      auto* param = run.mutable_policy()->add_param();
      param->set_name(name);
      param->set_number(value);
    }
    return kvtier::test::serving_metrics(run);
  };
  const auto one = compressing({"tensor_parallel_degree=2"});
  const auto three = compressing({"tensor_parallel_degree=2", "pipeline_parallel_degree=3"});
  REQUIRE(one.at("requests_completed") == 32);
  REQUIRE(three.at("requests_completed") == 32);
  REQUIRE(one.at("host_recode_gb") > 0);
  CHECK(three.at("pcie_h2d_gb") == Approx(one.at("pcie_h2d_gb") / 3).epsilon(1e-12));
  CHECK(three.at("pcie_d2h_gb") == Approx(one.at("pcie_d2h_gb") / 3).epsilon(1e-12));
  CHECK(three.at("host_recode_gb") == Approx(one.at("host_recode_gb") / 3).epsilon(1e-12));
}

TEST_CASE("host recodes with pipeline stages are refused", "[tiers]") {
  CHECK_THROWS_WITH(tiered_seventy({"pipeline_parallel_degree=2", "tiering.host_recode.threads=2",
                                    "tiering.host_recode.timing=STEP_PATH",
                                    "tiering.host_recode.chunk_token_layers=1",
                                    "tiering.host_recode.parallel_min_values=0"}),
                    Catch::Contains("host recodes are not modelled with pipeline parallelism"));
  CHECK_NOTHROW(tiered_seventy({"pipeline_parallel_degree=2"}));
}
