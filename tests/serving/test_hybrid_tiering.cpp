// Tier policies over hybrid attention (model.sliding_window_pattern): the policy places the
// global layers' tokens, while the windowed layers keep their window in HBM.

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "configs/schema/run.pb.h"
#include "serving/engine.hpp"
#include "serving/memory_plan.hpp"
#include "serving/simulation.hpp"
#include "serving/tier_demand.hpp"
#include "serving/workload.hpp"
#include "sim/simulator.hpp"
#include "sim/tick.hpp"
#include "tests/support/cluster_fixture.hpp"
#include "tests/support/config_fixture.hpp"
#include "tests/support/disaggregated_runs.hpp"
#include "tests/support/serving_metrics.hpp"
#include "tests/support/tiered_runs.hpp"

using kvtier::config::RunSpec;
using kvtier::serving::TierDemand;
using kvtier::sim::Tick;
using kvtier::test::open_loop;
using kvtier::test::request_at;
using kvtier::test::tiered_run;
using kvtier::test::TieredServed;

namespace {

// Llama-3.1-8B cut to four layers, every second one global (layers 1 and 3) and the others
// within a 256-token window; beside it the same cut to its two global layers, without a window.
// Both replay the same two-layer synthetic trace, and a token-layer has the same bytes.
const std::vector<std::string> kHybrid = {"model.num_hidden_layers=4", "model.sliding_window=256",
                                          "model.sliding_window_pattern=2"};
const std::vector<std::string> kGlobalOnly = {"model.num_hidden_layers=2"};

// The hybrid model and the model of its global layers alone as split_run's disaggregated cluster
// under `policy`, its decode engines receiving into host memory or being sent only the kept
// tokens, each having served one request of 512 + 32 tokens.
enum class Receiving { kIntoHostMemory, kKeptOnly };

RunSpec split(const std::string& policy, const std::vector<std::string>& model,
              Receiving receiving) {
  RunSpec run = kvtier::test::tiered_split(policy, model);
  auto& disaggregation = *run.mutable_cluster()->mutable_disaggregation();
  disaggregation.set_receive_into_host_memory(receiving == Receiving::kIntoHostMemory);
  disaggregation.set_send_kept_only(receiving == Receiving::kKeptOnly);
  return run;
}

struct SplitPair {
  SplitPair(const std::string& policy, Receiving receiving)
      : hybrid_run(split(policy, kHybrid, receiving)),
        global_run(split(policy, kGlobalOnly, receiving)),
        hybrid(hybrid_run, open_loop({request_at(0, 512, 32)})),
        global(global_run, open_loop({request_at(0, 512, 32)})) {}
  RunSpec hybrid_run;
  RunSpec global_run;
  TieredServed hybrid;
  TieredServed global;
};

}  // namespace

TEST_CASE("a tier policy places a hybrid model's global layers and no other", "[serving]") {
  const RunSpec hybrid = tiered_run("tiered:hbm=0.5,evict=0.1", kHybrid);
  CHECK(kvtier::serving::tiered_layers(hybrid) == std::vector<std::uint32_t>{1, 3});
  CHECK(kvtier::serving::tiered_layers(tiered_run("tiered", {"model.num_hidden_layers=3"})) ==
        std::vector<std::uint32_t>{0, 1, 2});
  // A window in every layer: the policy places them all, within the window.
  CHECK(kvtier::serving::tiered_layers(
            tiered_run("tiered", {"model.num_hidden_layers=3", "model.sliding_window=4096"})) ==
        std::vector<std::uint32_t>{0, 1, 2});
  // The demand projects the trace onto those two layers, and a request attending far past the
  // window is no error: the global layers attend it all.
  const kvtier::serving::Workload workload = open_loop({request_at(0, 2000, 300)});
  const TierDemand tiers(hybrid, hybrid.policy(), workload);
  REQUIRE(tiers.traces().size() == 1);
  CHECK(tiers.traces()[0].layer_map.size() == 2);
  // The report says so.
  const std::vector<std::string> notes = kvtier::serving::simulate(hybrid).notes;
  CHECK(std::count(notes.begin(), notes.end(),
                   "hybrid attention: the policy places the 2 global layers' tokens (its "
                   "attention mass kept is theirs); the 2 windowed layers keep their 256-token "
                   "window in HBM") == 1);
}

TEST_CASE(
    "a hybrid model's tier copies are its global layers', and its windowed layers' window "
    "is held in HBM",
    "[serving]") {
  // One request of 512 + 64 tokens, prompt and context past the window.
  const kvtier::serving::Workload workload = open_loop({request_at(0, 512, 64)});
  const std::string policy = "tiered:hbm=0.4,evict=0.1,delta=16,recent=32";
  const RunSpec hybrid = tiered_run(policy, kHybrid);
  const RunSpec global = tiered_run(policy, kGlobalOnly);
  const TieredServed hybrid_served(hybrid, workload);
  const TieredServed global_served(global, workload);
  const auto& mixed = hybrid_served.cluster.engine(0);
  const auto& plain = global_served.cluster.engine(0);
  REQUIRE(mixed.totals().requests_completed == 1);
  REQUIRE(plain.totals().requests_completed == 1);
  // The same steps at the same contexts in the two global layers: the same copies both ways.
  CHECK(plain.totals().h2d_bytes > 0.0);
  CHECK(plain.totals().d2h_bytes > 0.0);
  CHECK(mixed.totals().h2d_bytes == plain.totals().h2d_bytes);
  CHECK(mixed.totals().d2h_bytes == plain.totals().d2h_bytes);
  CHECK(mixed.host_kv_used().max() == plain.host_kv_used().max());
  // The copies go to layers 1 and 3, each free to start with the windowed layer before it (one
  // layer of lookahead), which hides them; the two-layer model's layer 0 waits for its own.
  CHECK(plain.totals().prefetch_stall > Tick::zero());
  CHECK(mixed.totals().prefetch_stall == Tick::zero());
  // Its reservation: the two-layer model's, beside the windowed layers' window (2 layers × 256
  // tokens × 4 KiB), with the staging of one layer at a time rather than two (layers 1 and 3
  // are never within one layer of lookahead of each other).
  const double token_layer = kvtier::test::full_token_layer_bytes(hybrid);
  CHECK(mixed.memory().peak_untiered_kv_bytes_for(575) == 2 * 256 * token_layer);
  const double staged = hybrid_served.tiers.peaks(0).staged_tokens;
  CHECK(staged > 0.0);
  CHECK(mixed.hbm_reservation(0) ==
        Approx(plain.hbm_reservation(0) - staged * token_layer + 2 * 256 * token_layer)
            .epsilon(1e-12));
}

TEST_CASE("a tier policy that keeps every token simulates a hybrid model as its full cache does",
          "[serving]") {
  // Four requests of 512 + 128 tokens, in flight together: the windowed layers read their
  // window, the global layers every token, from HBM in either run; counted a token at a time,
  // in 16-token blocks (the 256-token window then spans 16 or 17 blocks), and speculating.
  const kvtier::serving::Workload workload =
      open_loop({request_at(0, 512, 128), request_at(0, 700, 128), request_at(0, 300, 128),
                 request_at(0.01, 900, 128)});
  const std::vector<std::vector<std::string>> variants = {
      {},
      {"memory.kv_block_tokens=16"},
      {"memory.kv_block_tokens=16", "engine.speculative.draft_tokens=2",
       "engine.speculative.draft_layers=1", "engine.speculative.acceptance_rate=0.6"}};
  for (const std::vector<std::string>& variant : variants) {
    INFO(variant.size() << " sets");
    std::vector<std::string> sets = kHybrid;
    sets.insert(sets.end(), variant.begin(), variant.end());
    const RunSpec tiered = tiered_run("tiered:hbm=1,evict=0", sets);
    RunSpec full = tiered;
    full.mutable_policy()->Clear();
    full.mutable_policy()->set_name("full");
    const TieredServed kept(tiered, workload);
    kvtier::sim::Simulator simulator;
    kvtier::serving::ServingEngine engine(simulator, full, workload);
    engine.start();
    simulator.run();
    const auto& all_kept = kept.cluster.engine(0);
    REQUIRE(all_kept.totals().requests_completed == 4);
    REQUIRE(engine.totals().requests_completed == 4);
    CHECK(all_kept.totals().h2d_bytes == 0.0);
    REQUIRE(all_kept.totals().iterations == engine.totals().iterations);
    // The tier copies' pipeline times each layer as the layers' mean, a whole number of
    // picoseconds: at most a picosecond a layer of each iteration apart.
    const std::int64_t apart =
        all_kept.totals().busy.picoseconds() - engine.totals().busy.picoseconds();
    CHECK(std::abs(apart) <= static_cast<std::int64_t>(4 * engine.totals().iterations));
    CHECK(all_kept.kv_used().max() == Approx(engine.kv_used().max()).epsilon(1e-12));
    if (variant.size() < 3) {
      // A speculating request reserves its drafts' blocks beside its placements' peak (whole
      // blocks of each layer's own; "Speculative decoding"), a block a global layer more.
      CHECK(all_kept.hbm_reservation(3) == Approx(engine.hbm_reservation(3)).epsilon(1e-12));
    }
  }
}

TEST_CASE("a speculating step's KV stays within HBM when a window's blocks shift", "[serving]") {
  // A window of 1,024 tokens in 16-token blocks spans 64 or 65 blocks as it slides: a step that
  // writes three drafts' KV may hold fewer blocks than one that keeps fewer of them. Admitted
  // on demand, 64 requests of 2,000 + 1,500 tokens preempt one another on 24 GiB; what they
  // hold never passes the KV capacity, with the full cache or a policy keeping every token.
  std::vector<std::string> sets = {"hardware.node.gpu.memory_capacity=24GiB",
                                   "model.sliding_window=1024",
                                   "model.sliding_window_pattern=6",
                                   "memory.kv_block_tokens=16",
                                   "workload.on_demand_admission.watermark=0.01",
                                   "engine.speculative.draft_tokens=3",
                                   "engine.speculative.draft_layers=1",
                                   "engine.speculative.acceptance_rate=0.7",
                                   "workload.closed_loop.concurrency=64",
                                   "workload.closed_loop.num_requests=64",
                                   "workload.closed_loop.output_tokens.fixed_tokens=1500"};
  RunSpec run = tiered_run("tiered:hbm=1,evict=0", sets);
  run.mutable_workload()->mutable_closed_loop()->mutable_prompt_tokens()->set_fixed_tokens(2000);
  for (const bool full : {true, false}) {
    RunSpec variant = run;
    if (full) {
      variant.mutable_policy()->Clear();
      variant.mutable_policy()->set_name("full");
    }
    INFO((full ? "full" : "tiered"));
    const auto values = kvtier::test::serving_metrics(variant);
    REQUIRE(values.at("preemptions") > 0);
    CHECK(values.at("hbm_kv_used_peak_gib") <= values.at("hbm_kv_capacity_gib"));
  }
}

TEST_CASE("a hybrid model's untiered KV is its windowed layers' window and its drafter's",
          "[serving]") {
  // Six layers, every third global, a 1,000-token window, a one-layer drafter (of the model's
  // mix: a third of a layer global), tokens counted one at a time.
  const RunSpec run = kvtier::test::load_spec<RunSpec>(
      kvtier::test::quickstart_run(),
      {"model.num_hidden_layers=6", "model.sliding_window=1000", "model.sliding_window_pattern=3",
       "engine.speculative.draft_tokens=2", "engine.speculative.draft_layers=1",
       "engine.speculative.acceptance_rate=0.5"});
  const kvtier::serving::MemoryPlan plan = kvtier::serving::plan_memory(run);
  const double token_layer = kvtier::test::full_token_layer_bytes(run);
  const double drafter = (3000.0 / 3 + 1000.0 * 2 / 3) * token_layer;
  CHECK(plan.untiered_kv_bytes_for(3000) == Approx(4 * 1000 * token_layer + drafter));
  CHECK(plan.peak_untiered_kv_bytes_for(3000) == Approx(4 * 1000 * token_layer + drafter));
  CHECK(plan.untiered_kv_bytes_for(600) == Approx(4 * 600 * token_layer + 600 * token_layer));
  // Without hybrid attention, the drafter's alone.
  const RunSpec uniform = kvtier::test::load_spec<RunSpec>(
      kvtier::test::quickstart_run(),
      {"model.num_hidden_layers=6", "engine.speculative.draft_tokens=2",
       "engine.speculative.draft_layers=1", "engine.speculative.acceptance_rate=0.5"});
  CHECK(kvtier::serving::plan_memory(uniform).untiered_kv_bytes_for(3000) ==
        Approx(3000 * token_layer));
}

TEST_CASE(
    "a decode engine receiving a hybrid model's KV into host memory loads only the global "
    "layers' from there",
    "[serving]") {
  // The windowed layers' KV comes into HBM, where it stays; the global layers' lands in host
  // memory and the first step loads what the policy keeps, as for a model of those layers alone.
  const SplitPair served("tiered:hbm=0.4,evict=0.1,delta=16,recent=32", Receiving::kIntoHostMemory);
  const TieredServed& hybrid_served = served.hybrid;
  const TieredServed& global_served = served.global;
  double mixed_h2d = 0.0;
  double plain_h2d = 0.0;
  double mixed_host = 0.0;
  double plain_host = 0.0;
  for (std::uint32_t e = 1; e < 3; ++e) {  // the decode engines
    mixed_h2d += hybrid_served.cluster.engine(e).totals().h2d_bytes;
    plain_h2d += global_served.cluster.engine(e).totals().h2d_bytes;
    mixed_host += hybrid_served.cluster.engine(e).host_kv_used().max();
    plain_host += global_served.cluster.engine(e).host_kv_used().max();
  }
  CHECK(plain_h2d > 0.0);
  CHECK(mixed_h2d == plain_h2d);
  CHECK(plain_host > 0.0);
  CHECK(mixed_host == plain_host);
}

TEST_CASE("a tier policy is accepted with hybrid attention", "[config]") {
  std::vector<std::string> sets = kvtier::test::kTieringSets;
  const std::vector<std::string> hybrid = {"model.sliding_window=1000",
                                           "model.sliding_window_pattern=6", "policy.name=tiered",
                                           "compare[0].name=h2o"};
  sets.insert(sets.end(), hybrid.begin(), hybrid.end());
  const std::vector<std::string> problems =
      kvtier::test::problems<RunSpec>(kvtier::test::quickstart_run(), sets);
  INFO(kvtier::test::joined(problems));
  CHECK(problems.empty());
}

TEST_CASE("sending only the kept tokens of a hybrid model sends its windowed layers' window whole",
          "[serving]") {
  // What crosses the kv_link: the global layers' kept tokens, as for a model of those layers
  // alone, and the windowed layers' window (2 layers of 256 tokens).
  const SplitPair served("streaming:sinks=4,window=124", Receiving::kKeptOnly);
  const TieredServed& hybrid_served = served.hybrid;
  const TieredServed& global_served = served.global;
  const double token_layer = kvtier::test::full_token_layer_bytes(served.hybrid_run);
  REQUIRE(global_served.cluster.kv_transfers().count == 1);
  CHECK(global_served.cluster.kv_transfers().bytes < 2 * 512 * token_layer);
  CHECK(hybrid_served.cluster.kv_transfers().bytes ==
        Approx(global_served.cluster.kv_transfers().bytes + 2 * 256 * token_layer).epsilon(1e-12));
}
