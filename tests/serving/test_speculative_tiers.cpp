// Speculative decoding under a tier policy: a step that gives several tokens stages what its
// attention reads once and makes the policy's moves for each token; its drafts' KV counts in HBM.

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "configs/schema/run.pb.h"
#include "serving/memory_plan.hpp"
#include "serving/tier_demand.hpp"
#include "serving/workload.hpp"
#include "tests/support/cluster_fixture.hpp"
#include "tests/support/config_fixture.hpp"
#include "tests/support/disaggregated_runs.hpp"
#include "tests/support/serving_metrics.hpp"
#include "tests/support/speculative_runs.hpp"
#include "tests/support/tiered_runs.hpp"

using kvtier::config::RunSpec;
using kvtier::serving::LayerDemand;
using kvtier::serving::TierDemand;
using kvtier::test::open_loop;
using kvtier::test::request_at;
using kvtier::test::speculative_sets;
using kvtier::test::tiered_run;
using kvtier::test::TieredServed;
using kvtier::test::TokenLayerBytes;

namespace {

// What the prefill's placement offloads: what request 0's first step (attending `context`
// tokens) finds off HBM.
double placed_at(const RunSpec& run, const TierDemand& tiers, std::uint64_t context) {
  const TokenLayerBytes bytes = kvtier::test::token_layer_bytes(run, tiers);
  double placed = 0.0;
  for (std::uint32_t layer = 0; layer < run.model().num_hidden_layers(); ++layer) {
    const LayerDemand start = tiers.at(0, context, layer, true);
    placed += start.host * bytes.full + start.compressed_held * bytes.compressed;
  }
  return placed;
}

}  // namespace

TEST_CASE("under a tier policy a speculating step stages once and makes every token's moves",
          "[speculative]") {
  // One request of 512 prompt tokens and 13 output tokens, every one of three drafts accepted:
  // steps attending 513, 517 and 521 tokens, each giving four. Monarch with small pages (window
  // 18, 25 hot tokens, pages of 5) reads its cold pages, and pages them out and back in as the
  // context grows. Each step's attention copies in what the placement before it holds off HBM
  // (full prefetch); the policy then steps once for each of its four tokens, and every one of
  // those steps' moves crosses.
  const RunSpec run = tiered_run("monarch:attend=all,compression=int8,window=18,max_hot=25,page=5",
                                 speculative_sets(3, 1.0));
  const TieredServed served(run, open_loop({request_at(0, 512, 13)}));
  const auto& totals = served.cluster.engine(0).totals();
  REQUIRE(totals.requests_completed == 1);
  REQUIRE(totals.speculative_steps == 3);
  const TokenLayerBytes bytes = kvtier::test::token_layer_bytes(run, served.tiers);
  double in = 0.0;
  double out = placed_at(run, served.tiers, 513);
  double skipped_reads = 0.0;  // what the steps the drafts stand in for would have staged
  for (std::uint64_t context = 513; context < 525; ++context) {
    double staged = 0.0;
    for (std::uint32_t layer = 0; layer < run.model().num_hidden_layers(); ++layer) {
      const LayerDemand step = served.tiers.at(0, context, layer, false);
      staged += step.host * bytes.full + step.compressed * bytes.compressed;
    }
    ((context - 513) % 4 == 0 ? in : skipped_reads) += staged;
    const kvtier::test::StepCopies moves = kvtier::test::step_moves(run, served.tiers, context);
    in += moves.in;
    out += moves.out;
  }
  REQUIRE(skipped_reads > 0.0);
  CHECK(totals.h2d_bytes == Approx(in).epsilon(1e-12));
  CHECK(totals.d2h_bytes == Approx(out).epsilon(1e-12));
  // The same request decoding a token a step moves the same tokens and stages every step.
  const TieredServed plain(tiered_run("monarch:attend=all,compression=int8,window=18,max_hot=25,"
                                      "page=5"),
                           open_loop({request_at(0, 512, 13)}));
  CHECK(plain.cluster.engine(0).totals().d2h_bytes == Approx(out).epsilon(1e-12));
  CHECK(plain.cluster.engine(0).totals().h2d_bytes == Approx(in + skipped_reads).epsilon(1e-12));
}

TEST_CASE("with differential prefetch a step copies in what entered T1 over the step before it",
          "[speculative]") {
  // 512 prompt tokens and 39 output tokens, three drafts a step all accepted: nine steps of
  // four tokens, attending 513, 517, ..., 545, then one of two at 549 (a draft, the one token
  // left after its newest). The policy places every step, and generated tokens leave its recent
  // window of 8 as the next ones come. The first step stages all of its T1; each later one the
  // T1 tokens that no earlier attention read: those that entered T1 at any of the previous
  // step's four policy steps (no more than T1 holds).
  // Without T2, tokens move between HBM and T1 as their scores change; with half of what
  // leaves HBM going to T2 (compress=0.5), mostly into T2 and from there into T1, recoded by
  // the host.
  const std::string compress = GENERATE(as<std::string>{}, "0", "0.5");
  const RunSpec run = tiered_run(
      "tiered:hbm=0.3,evict=0.1,delta=1,recent=8,prefetch=differential,compress=" + compress,
      speculative_sets(3, 1.0));
  const TieredServed served(run, open_loop({request_at(0, 512, 39)}));
  const auto& totals = served.cluster.engine(0).totals();
  REQUIRE(totals.speculative_steps == 10);
  REQUIRE(totals.speculative_tokens == 38);
  REQUIRE(served.tiers.differential_prefetch());
  const TokenLayerBytes bytes = kvtier::test::token_layer_bytes(run, served.tiers);
  double in = 0.0;
  double out = placed_at(run, served.tiers, 513);
  double recoded = 0.0;
  double carried = 0.0;        // entered T1 at the previous step's policy steps before its last
  double demoted_later = 0.0;  // demoted at the policy steps after a step's first
  for (std::uint64_t context = 513; context < 551; ++context) {
    const kvtier::test::StepCopies moves = kvtier::test::step_moves(run, served.tiers, context);
    in += moves.in;
    out += moves.out;
    for (std::uint32_t layer = 0; layer < run.model().num_hidden_layers(); ++layer) {
      const LayerDemand step = served.tiers.at(0, context, layer, false);
      recoded += step.recoded_to_compressed * bytes.full + step.recoded_to_full * bytes.compressed;
      demoted_later += (context - 513) % 4 != 0 ? step.demoted : 0.0;
    }
    if ((context - 513) % 4 != 0) {
      continue;
    }
    const bool first = context == 513;
    for (std::uint32_t layer = 0; layer < run.model().num_hidden_layers(); ++layer) {
      const LayerDemand step = served.tiers.at(0, context, layer, first);
      double unstaged = step.unstaged_host;
      for (std::uint64_t back = 1; back < 4 && !first; ++back) {
        const double entered = served.tiers.at(0, context - back, layer, false).unstaged_host;
        unstaged += entered;
        carried += entered;
      }
      in += std::min(unstaged, step.host) * bytes.full + step.compressed * bytes.compressed;
    }
  }
  REQUIRE(carried > 0.0);
  REQUIRE((compress == "0" ? demoted_later : recoded) > 0.0);
  CHECK(totals.h2d_bytes == Approx(in).epsilon(1e-12));
  CHECK(totals.d2h_bytes == Approx(out).epsilon(1e-12));
  CHECK(totals.host_recode_bytes == Approx(recoded).epsilon(1e-12));
}

TEST_CASE("tiered with everything in HBM speculates exactly like the full cache", "[speculative]") {
  const std::vector<std::string> sets = speculative_sets(3, 0.7);
  const auto full = kvtier::test::serving_metrics(tiered_run("full", sets));
  const auto tiered = kvtier::test::serving_metrics(tiered_run("tiered:hbm=1.0,evict=0.0", sets));
  for (const char* name : {"duration_s", "tpot_p50_ms", "tpot_p99_ms", "ttft_p99_ms",
                           "speculative_tokens_per_step", "speculative_draft_busy_fraction"}) {
    CAPTURE(name);
    CHECK(tiered.at(name) == full.at(name));
  }
  CHECK(tiered.at("hbm_kv_used_mean_gib") == Approx(full.at("hbm_kv_used_mean_gib")).epsilon(1e-9));
  CHECK(tiered.at("pcie_h2d_gb") == 0.0);
  // Admitted on demand, a step's footprint holds its drafts' KV as the full cache's does: two
  // 500-token prompts decoding 8 and 100 tokens with eight drafts, none accepted; at the first
  // request's last step the second, a step behind, holds 500 + 6 and writes 8 drafts.
  const RunSpec on_demand =
      tiered_run("tiered:hbm=1.0,evict=0.0",
                 speculative_sets(8, 0.0, {"workload.on_demand_admission.watermark=0.01"}));
  const TieredServed served(on_demand, open_loop({request_at(0, 500, 8), request_at(0, 500, 100)}));
  const auto& engine = served.cluster.engine(0);
  REQUIRE(engine.totals().requests_completed == 2);
  CHECK(engine.kv_reserved().max() ==
        Approx(engine.memory().kv_bytes_for(507) + engine.memory().kv_bytes_for(514)));
}

TEST_CASE("admission reserves a speculating tiered request's drafts and its drafter's KV in HBM",
          "[speculative]") {
  // Whole-request reservation: the request's T0 peak and staging share, and beside them the
  // newest token and three drafts in every layer, which a step writes before the policy steps
  // (in a paged cache, in whole blocks of 16), and the one-layer drafter's KV of the request's
  // 512 + 511 tokens, which the policy does not place.
  for (const std::uint32_t block : {0U, 16U}) {
    INFO("block tokens " << block);
    std::vector<std::string> sets = speculative_sets(
        3, 0.7, {"workload.closed_loop.concurrency=1", "workload.closed_loop.num_requests=1"});
    if (block > 0) {
      sets.push_back("memory.kv_block_tokens=" + std::to_string(block));
    }
    const RunSpec run = tiered_run("tiered:hbm=0.5,evict=0,delta=64,recent=32", sets);
    const kvtier::serving::Workload workload =
        kvtier::serving::make_workload(run.workload(), run.seed());
    const TierDemand demand(run, run.policy(), workload);
    const kvtier::serving::RequestPeaks& peaks = demand.peaks(0);
    const double layers = run.model().num_hidden_layers();
    const double writes = (block > 0 ? 16.0 : 4.0) * layers;
    const double drafter = block > 0 ? 1024.0 : 1023.0;
    const double expected = (peaks.hbm_token_layers + writes + peaks.staged_tokens * 2 + drafter) *
                            kvtier::test::full_token_layer_bytes(run);
    const auto values = kvtier::test::serving_metrics(run);
    CHECK(values.at("hbm_kv_reserved_peak_gib") == Approx(expected / (1U << 30U)).epsilon(1e-12));
  }
}

TEST_CASE("a decode engine's first speculating step places the KV after each token it gives",
          "[speculative]") {
  // 2,048 prompt tokens and 7 output tokens on a decode engine, two drafts a step all accepted:
  // steps attending 2,049 (its KV received whole in HBM, read there) and 2,052, three tokens
  // each. The first offloads what the placement after its third token holds off HBM; the second
  // stages all of that placement's T1 and T2 (nothing of it staged before, even with
  // differential prefetch) and makes its three tokens' moves.
  // Monarch with small pages pages the context out to T2; the tiered policy, its generated
  // tokens unprotected, places each in HBM or T1 as it comes.
  const std::string policy =
      GENERATE(as<std::string>{}, "monarch:attend=all,compression=int8,window=18,max_hot=25,page=2",
               "tiered:hbm=0.3,evict=0,delta=1,recent=0,sinks=0,prefetch=differential");
  INFO(policy);
  const RunSpec run = kvtier::test::tiered_split(policy, speculative_sets(2, 1.0));
  const TieredServed served(run, open_loop({request_at(0, 2048, 7)}));
  const auto& decode = served.cluster.engine(1);
  REQUIRE(decode.totals().requests_completed == 1);
  REQUIRE(decode.totals().speculative_steps == 2);
  const TokenLayerBytes bytes = kvtier::test::token_layer_bytes(run, served.tiers);
  const auto placed_after = [&](std::uint64_t context) {
    double placed = 0.0;
    for (std::uint32_t layer = 0; layer < run.model().num_hidden_layers(); ++layer) {
      const LayerDemand step = served.tiers.at(0, context, layer, false);
      placed += step.host_after * bytes.full + step.compressed_after * bytes.compressed;
    }
    return placed;
  };
  const double placed = placed_after(2051);
  REQUIRE(placed != placed_after(2049));
  const kvtier::test::StepCopies second = kvtier::test::step_copies(run, served.tiers, 2052);
  double in = second.in;
  double out = placed + second.out;
  for (const std::uint64_t context : {2053U, 2054U}) {
    const kvtier::test::StepCopies moves = kvtier::test::step_moves(run, served.tiers, context);
    in += moves.in;
    out += moves.out;
  }
  REQUIRE(in > 0.0);
  CHECK(decode.totals().d2h_bytes == Approx(out).epsilon(1e-12));
  CHECK(decode.totals().h2d_bytes == Approx(in).epsilon(1e-12));
  // With 4 output tokens its first step there gives its last three: it leaves unplaced.
  const TieredServed short_lived(run, open_loop({request_at(0, 2048, 4)}));
  const auto& last = short_lived.cluster.engine(1).totals();
  REQUIRE(last.requests_completed == 1);
  REQUIRE(last.speculative_steps == 1);
  CHECK(last.d2h_bytes == 0.0);
  CHECK(last.h2d_bytes == 0.0);
}

TEST_CASE("speculative decoding under a tier policy is accepted", "[speculative]") {
  std::vector<std::string> sets = kvtier::test::kTieringSets;
  sets.emplace_back("policy.name=tiered");
  CHECK(kvtier::test::problems<RunSpec>(kvtier::test::quickstart_run(),
                                        speculative_sets(2, 0.8, sets))
            .empty());
}

TEST_CASE("a disaggregated cluster tiered with everything in HBM speculates like the full cache",
          "[speculative]") {
  // The decode engines' requests received whole in HBM: the KV they hold (their drafts', and
  // their drafter's, beside it) at every moment and what a step plans, admitted by whole-request
  // reservation or on demand.
  for (const bool on_demand : {false, true}) {
    INFO((on_demand ? "on demand" : "reserving"));
    std::vector<std::string> sets = speculative_sets(2, 0.7);
    if (on_demand) {
      sets.emplace_back("workload.on_demand_admission.watermark=0.01");
    }
    const auto full = kvtier::test::serving_metrics(kvtier::test::tiered_split("full", sets));
    const auto tiered =
        kvtier::test::serving_metrics(kvtier::test::tiered_split("tiered:hbm=1.0,evict=0.0", sets));
    for (const char* name : {"duration_s", "tpot_p50_ms", "speculative_tokens_per_step"}) {
      CAPTURE(name);
      CHECK(tiered.at(name) == full.at(name));
    }
    CHECK(tiered.at("hbm_kv_used_mean_gib") ==
          Approx(full.at("hbm_kv_used_mean_gib")).epsilon(1e-9));
    CHECK(tiered.at("hbm_kv_used_peak_gib") ==
          Approx(full.at("hbm_kv_used_peak_gib")).epsilon(1e-9));
    if (on_demand) {
      CHECK(tiered.at("hbm_kv_reserved_peak_gib") ==
            Approx(full.at("hbm_kv_reserved_peak_gib")).epsilon(1e-9));
    }
  }
}

TEST_CASE("speculating tiered requests hold no more than admission reserved for them",
          "[speculative]") {
  // Whole-request reservations bound what each request holds at every step, in HBM and in host
  // memory, on one engine and on decode engines receiving into HBM, into host memory, or only
  // the tokens their policy keeps.
  const std::string policy =
      GENERATE(as<std::string>{}, "tiered:hbm=0.3,evict=0.1,delta=1,recent=8",
               "monarch:attend=all,compression=int8,window=18,max_hot=25,page=5");
  const std::vector<std::string> sets = speculative_sets(3, 0.7, {"memory.kv_block_tokens=16"});
  std::vector<RunSpec> runs = {tiered_run(policy, sets), kvtier::test::tiered_split(policy, sets)};
  for (const bool into_host : {true, false}) {
    RunSpec split = kvtier::test::tiered_split(policy, sets);
    auto* disaggregation = split.mutable_cluster()->mutable_disaggregation();
    (into_host ? disaggregation->set_receive_into_host_memory(true)
               : disaggregation->set_send_kept_only(true));
    runs.push_back(split);
  }
  for (const RunSpec& run : runs) {
    INFO(policy << ", " << run.cluster().ShortDebugString());
    const kvtier::serving::Workload workload =
        kvtier::serving::make_workload(run.workload(), run.seed());
    const TieredServed served(run, workload);
    for (std::size_t e = 0; e < served.cluster.size(); ++e) {
      const auto& engine = served.cluster.engine(e);
      CAPTURE(e);
      CHECK(engine.kv_used().max() <= engine.kv_reserved().max());
      CHECK(engine.kv_reserved().max() <= engine.memory().kv_capacity_bytes);
      CHECK(engine.host_kv_used().max() <= engine.host_kv_reserved().max());
    }
  }
}

TEST_CASE("speculating tiered requests preempted by recompute or by swapping give every token",
          "[speculative]") {
  // 32 requests of 2,048 + 2,048 tokens admitted on demand into 10 GiB of KV (the tiered cache
  // holds about a third of it in host memory): some are preempted, recomputed or swapped out,
  // and every one still gives its tokens, a step at a time from where it stopped.
  for (const char* swap : {"0", "8"}) {
    INFO("swap space " << swap << " GiB");
    std::vector<std::string> sets = speculative_sets(
        3, 0.7,
        {"workload.closed_loop.concurrency=32", "workload.closed_loop.num_requests=32",
         "workload.closed_loop.prompt_tokens.fixed_tokens=2048",
         "workload.closed_loop.output_tokens.fixed_tokens=2048",
         "workload.prefill_chunk_tokens=2048", "workload.on_demand_admission.watermark=0.01",
         "hardware.node.gpu.memory_capacity=24GiB", "memory.kv_block_tokens=16"});
    if (std::string(swap) != "0") {
      sets.push_back(std::string("workload.on_demand_admission.swap.space_gib=") + swap);
    }
    const auto values = kvtier::test::serving_metrics(tiered_run("tiered:hbm=0.3,evict=0.0", sets));
    CHECK(values.at("preemptions") > 0);
    CHECK((values.at("swapped_preemptions") > 0) == (std::string(swap) != "0"));
    CHECK(values.at("requests_completed") == 32);
    CHECK(values.at("output_tokens") == 32 * 2048);
    CHECK(values.at("hbm_kv_used_peak_gib") <= values.at("hbm_kv_capacity_gib"));
    CHECK(values.at("host_kv_used_peak_gib") <= values.at("host_kv_capacity_gib"));
  }
}

TEST_CASE("a drafter's KV crosses the kv_link whole and waits in HBM", "[speculative]") {
  // A decode engine receiving only the tokens StreamingLLM keeps of a 2,100-token prompt is
  // sent those and the one-layer drafter's KV of every prompt token.
  const std::vector<std::string> sets = speculative_sets(2, 1.0);
  RunSpec kept = kvtier::test::tiered_split("streaming", sets);
  kept.mutable_cluster()->mutable_disaggregation()->set_send_kept_only(true);
  const TieredServed sent(kept, open_loop({request_at(0, 2100, 7)}));
  REQUIRE(sent.cluster.engine(1).totals().requests_completed == 1);
  const double full = kvtier::test::full_token_layer_bytes(kept);
  double kept_tokens = 0.0;
  for (std::uint32_t layer = 0; layer < kept.model().num_hidden_layers(); ++layer) {
    const LayerDemand start = sent.tiers.at(0, 2101, layer, true);
    kept_tokens += start.hbm + start.host + start.compressed_held;
  }
  REQUIRE(kept_tokens < 2100.0 * kept.model().num_hidden_layers());
  CHECK(sent.cluster.kv_transfers().bytes == Approx((kept_tokens + 2100.0) * full).epsilon(1e-12));
  // Received into host memory, the prompt's KV waits there and the drafter's in HBM, from the
  // request's admission on. With 2 output tokens its one step there drafts nothing and is its
  // last: what HBM holds while its KV is on the way is its drafter's KV alone.
  RunSpec into_host = kvtier::test::tiered_split("streaming", sets);
  into_host.mutable_cluster()->mutable_disaggregation()->set_receive_into_host_memory(true);
  const TieredServed landed(into_host, open_loop({request_at(0, 2100, 2)}));
  const auto& decode = landed.cluster.engine(1);
  REQUIRE(decode.totals().requests_completed == 1);
  CHECK(decode.kv_used().max() == Approx(2100.0 * full).epsilon(1e-12));
}

TEST_CASE("a step of several tokens counts the most T0 any of its policy steps leaves",
          "[speculative]") {
  // Monarch with small pages pages tokens out and back in. After a step's j-th policy step of
  // four, T0 holds that placement and the 3 - j tokens whose policy steps are still to come; what
  // the step reads is the placement before it, what it holds after is its last token's.
  const RunSpec run = tiered_run("monarch:attend=all,compression=int8,window=18,max_hot=25,page=5");
  const TierDemand tiers(run, run.policy(), open_loop({request_at(0, 512, 64)}));
  for (std::uint64_t context = 513; context + 4 <= 512 + 64; ++context) {
    for (std::uint32_t layer = 0; layer < run.model().num_hidden_layers(); ++layer) {
      const LayerDemand step = tiers.step(0, context, 4, 4, layer, false);
      double most = 0.0;
      for (std::uint64_t j = 0; j < 4; ++j) {
        most = std::max(
            most, tiers.at(0, context + j, layer, false).hbm_after + static_cast<double>(3 - j));
      }
      CHECK(step.hbm_after_most == most);
      CHECK(step.hbm_after == tiers.at(0, context + 3, layer, false).hbm_after);
      CHECK(step.hbm == tiers.at(0, context, layer, false).hbm);
    }
  }
  // A step of one token after one of one is at()'s.
  const LayerDemand one = tiers.step(0, 530, 1, 1, 0, false);
  CHECK(one.hbm_after_most == one.hbm_after);
  CHECK(one.unstaged_host == tiers.at(0, 530, 0, false).unstaged_host);
}
