// The tier-aware simulation under Monarch's pages: what its copies cost in its compressed
// format, what crosses PCIe when its attention reads its cold pages or leaves them out, and its
// page-ins.

#include <catch2/catch.hpp>

#include <cstdint>
#include <map>
#include <string>

#include "configs/schema/run.pb.h"
#include "serving/tier_demand.hpp"
#include "serving/workload.hpp"
#include "tests/support/cluster_fixture.hpp"
#include "tests/support/disaggregated_runs.hpp"
#include "tests/support/serving_metrics.hpp"
#include "tests/support/tiered_runs.hpp"

using kvtier::config::RunSpec;
using kvtier::test::tiered_run;

namespace {

std::map<std::string, double> metrics(const RunSpec& run) {
  return kvtier::test::serving_metrics(run);
}

}  // namespace

TEST_CASE("every decode step copies in what it stages and the cold pages it promotes", "[tiers]") {
  // One request under Monarch with pages small enough to come back (window 18, 25 hot tokens,
  // pages of 5), full prefetch. What crosses to HBM is, step by step, the T2 its attention
  // reads (with attend=all; none with attend=hot) as compressed bytes and the pages it brings
  // back, as compressed bytes too.
  const std::string attend = GENERATE(as<std::string>{}, "all", "hot");
  const RunSpec run =
      tiered_run("monarch:attend=" + attend + ",compression=int8,window=18,max_hot=25,page=5");
  const kvtier::test::TieredServed served(
      run, kvtier::test::open_loop({kvtier::test::request_at(0, 512, 64)}));
  REQUIRE(served.cluster.engine(0).totals().requests_completed == 1);
  double expected = 0.0;
  double paged_in = 0.0;
  for (std::uint64_t context = 513; context < 512 + 64; ++context) {
    expected += kvtier::test::step_copies(run, served.tiers, context).in;
    for (std::uint32_t layer = 0; layer < run.model().num_hidden_layers(); ++layer) {
      paged_in += served.tiers.at(0, context, layer, false).promoted_from_compressed;
    }
  }
  REQUIRE(paged_in > 0.0);
  CHECK(served.cluster.engine(0).totals().h2d_bytes == Approx(expected).epsilon(1e-12));
}

TEST_CASE("T2 copies cost the policy's compressed format on the simulated model", "[tiers]") {
  // Monarch copies only T2 tokens (staged, paged in, paged out), and its format does not change
  // where tokens go: the volumes scale by the format's bytes per token-layer. Llama-3.1-8B has 8
  // KV heads of 128: int8 with a float32 scale per head vector is 2·8·(128 + 4) = 2,112 bytes,
  // turboquant's 16 bits 2·8·256 = 4,096.
  const auto int8 = metrics(tiered_run("monarch:attend=all,compression=int8"));
  const auto turboquant = metrics(tiered_run("monarch:attend=all,compression=turboquant"));
  REQUIRE(turboquant.at("pcie_h2d_gb") > 0.0);
  REQUIRE(turboquant.at("pcie_d2h_gb") > 0.0);
  CHECK(int8.at("pcie_h2d_gb") / turboquant.at("pcie_h2d_gb") ==
        Approx(2112.0 / 4096.0).epsilon(1e-12));
  CHECK(int8.at("pcie_d2h_gb") / turboquant.at("pcie_d2h_gb") ==
        Approx(2112.0 / 4096.0).epsilon(1e-12));
  CHECK(int8.at("host_kv_used_peak_gib") / turboquant.at("host_kv_used_peak_gib") ==
        Approx(2112.0 / 4096.0).epsilon(1e-12));
}

TEST_CASE("Monarch attending its hot pages alone stages no cold page", "[tiers]") {
  // attend=hot, Monarch's default: its cold pages are held in T2 but attention leaves them out
  // (their mass is lost), so no step stages them. No page-in fires here (promotion needs 0.12 of
  // a step's attention, docs/FINDINGS.md §3): nothing crosses to HBM at all, only page-outs.
  const RunSpec run = tiered_run("monarch:compression=int8");
  const kvtier::serving::Workload workload =
      kvtier::serving::make_workload(run.workload(), run.seed());
  const kvtier::serving::TierDemand hot(run, run.policy(), workload);
  const kvtier::serving::TierDemand all(
      run, tiered_run("monarch:attend=all,compression=int8").policy(), workload);
  const std::uint64_t context = 1000;  // past the window of 512: cold pages exist
  double held = 0.0;
  double staged_hot = 0.0;
  double staged_all = 0.0;
  for (std::uint32_t layer = 0; layer < run.model().num_hidden_layers(); ++layer) {
    const auto step = hot.at(0, context, layer, false);
    held += step.compressed_held;
    staged_hot += step.compressed;
    staged_all += all.at(0, context, layer, false).compressed;
  }
  CHECK(held > 0.0);
  CHECK(staged_hot == 0.0);
  CHECK(staged_all > 0.0);
  CHECK(hot.peaks(0).staged_tokens == 0.0);  // Monarch has no T1: nothing staged at all
  CHECK(all.peaks(0).staged_tokens > 0.0);
  // Served: nothing into HBM, the cold pages still paged out to host memory.
  const auto served_hot = metrics(run);
  const auto served_all = metrics(tiered_run("monarch:attend=all,compression=int8"));
  CHECK(served_hot.at("pcie_h2d_gb") == 0.0);
  CHECK(served_all.at("pcie_h2d_gb") > 0.0);
  CHECK(served_hot.at("pcie_d2h_gb") > 0.0);
  CHECK(served_hot.at("host_kv_used_peak_gib") > 0.0);
  CHECK(served_hot.at("tpot_p50_ms") < served_all.at("tpot_p50_ms"));
  CHECK(served_hot.at("attention_mass_kept_mean") < served_all.at("attention_mass_kept_mean"));
}
