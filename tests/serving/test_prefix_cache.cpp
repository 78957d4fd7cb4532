// Prefix caching: the cache's bookkeeping, block contents, and the serving engine serving
// prompts from cached blocks.

#include <catch2/catch.hpp>

#include <map>

#include "common/errors.hpp"
#include "configs/schema/run.pb.h"
#include "hwmodels/iteration_cost.hpp"
#include "serving/engine.hpp"
#include "serving/prefix_cache.hpp"
#include "serving/simulation.hpp"
#include "serving/tier_timing.hpp"
#include "serving/workload.hpp"
#include "sim/simulator.hpp"
#include "tests/support/config_fixture.hpp"
#include "tests/support/serving_metrics.hpp"

using kvtier::config::RunSpec;
using kvtier::serving::BlockKey;
using kvtier::serving::PrefixCache;
using kvtier::serving::RequestSpec;
using kvtier::sim::Tick;

namespace {

RunSpec run_with(std::vector<std::string> sets) {
  sets.emplace_back("memory.kv_block_tokens=16");
  return kvtier::test::load_spec<RunSpec>(kvtier::test::quickstart_run(), sets);
}

std::map<std::string, double> metrics(const RunSpec& run) {
  return kvtier::test::serving_metrics(run);
}

// A request whose prompt starts with `shared` tokens of content `id` (one segment).
RequestSpec after_prefix(std::uint64_t id, std::uint64_t shared, std::uint64_t own,
                         std::uint64_t output) {
  RequestSpec request;
  request.prompt_tokens = shared + own;
  request.output_tokens = output;
  request.shared_tokens = shared;
  request.segment_tokens = shared;
  request.segments = {id};
  return request;
}

// One request at a time, of prefixes X, Y, Z, X (2,048 shared tokens, 128 of its own, 16 out).
kvtier::serving::Workload one_at_a_time_x_y_z_x() {
  kvtier::serving::Workload workload;
  workload.closed_loop_concurrency = 1;
  for (const std::uint64_t id : {0, 1, 2, 0}) {
    workload.requests.push_back(after_prefix(id, 2048, 128, 16));
  }
  return workload;
}

// Those requests served to the end by an engine of `run`.
struct ServedXyzx {
  explicit ServedXyzx(const RunSpec& run) : engine(simulator, run, one_at_a_time_x_y_z_x()) {
    engine.start();
    simulator.run();
  }
  kvtier::sim::Simulator simulator;
  kvtier::serving::ServingEngine engine;
};

}  // namespace

TEST_CASE("a released block stays cached until evicted, least recently released first",
          "[prefix]") {
  PrefixCache cache;
  const BlockKey a{1, 0};
  const BlockKey b{1, 1};
  const BlockKey c{2, 0};
  CHECK(cache.insert(a));
  CHECK(cache.insert(b));
  CHECK(cache.insert(c));
  CHECK_FALSE(cache.insert(a));  // cached once: a second copy stays its request's own
  CHECK(cache.held_blocks() == 3);
  cache.release(b);
  cache.release(a);
  cache.release(c);
  CHECK(cache.held_blocks() == 0);
  CHECK(cache.free_blocks() == 3);
  // Taking a free block makes it held: it is not evicted, and others go in release order.
  cache.acquire(c);
  CHECK(cache.held(c));
  CHECK(cache.evict_down_to(1) == 1);
  CHECK_FALSE(cache.cached(b));
  CHECK(cache.cached(a));
  CHECK(cache.evict_down_to(0) == 1);
  CHECK_FALSE(cache.cached(a));
  CHECK(cache.cached(c));
  // A block held twice is free only when both let go.
  cache.acquire(c);
  cache.release(c);
  CHECK(cache.held(c));
  cache.release(c);
  CHECK_FALSE(cache.held(c));
  CHECK_THROWS_AS(cache.release(c), std::logic_error);
}

TEST_CASE("blocks inside a shared segment are named by it and the others by the request",
          "[prefix]") {
  RequestSpec first;
  first.prompt_tokens = 1200;
  first.shared_tokens = 1024;
  first.segment_tokens = 512;
  first.segments = {7, 8};
  RequestSpec second = first;
  second.segments = {7, 9};  // the same first 512 tokens, then other content
  using kvtier::serving::block_key;
  // Blocks of 16: 0..31 lie in segment 7, 32..63 in the second segment.
  CHECK(block_key(first, 0, 31, 16) == block_key(second, 1, 31, 16));
  CHECK_FALSE(block_key(first, 0, 32, 16) == block_key(second, 1, 32, 16));
  CHECK(block_key(first, 0, 63, 16) == BlockKey{8, 63});
  // Block 64 holds tokens past the shared part: each request's own.
  CHECK_FALSE(block_key(first, 0, 64, 16) == block_key(second, 1, 64, 16));
  CHECK(block_key(first, 0, 64, 16) == block_key(first, 0, 64, 16));
  // Blocks of 48 do not divide 512: block 10 (tokens 480-527) ends in the second segment and is
  // named by it, which names everything before it too.
  CHECK(block_key(first, 0, 10, 48) == BlockKey{8, 10});
}

TEST_CASE("requests after a cached prefix prefill only what the cache lacks", "[prefix]") {
  const std::vector<std::string> sets = {"workload.closed_loop.concurrency=1",
                                         "workload.closed_loop.num_requests=4",
                                         "workload.closed_loop.prompt_tokens.fixed_tokens=128",
                                         "workload.closed_loop.output_tokens.fixed_tokens=16",
                                         "workload.shared_prefix.tokens=1024",
                                         "workload.shared_prefix.groups=1",
                                         "workload.shared_prefix.zipf_exponent=0",
                                         "workload.prefill_chunk_tokens=2048"};
  std::vector<std::string> caching = sets;
  caching.emplace_back("memory.prefix_caching=true");
  const RunSpec run = run_with(caching);
  kvtier::sim::Simulator simulator;
  kvtier::serving::ServingEngine engine(simulator, run,
                                        kvtier::serving::make_workload(run.workload(), run.seed()));
  engine.start();
  simulator.run();
  // One after another: the first prefills its 1,152 tokens; the others find the prefix's 64
  // blocks cached (its own 8 blocks are the first request's alone).
  CHECK(engine.totals().prefix_hit_tokens == 3 * 1024);
  CHECK(engine.totals().prefix_queried_tokens == 4 * 1152);
  CHECK(engine.totals().prompt_tokens == 4 * 1152);
  CHECK(engine.totals().iterations == 4 * 16);
  const Tick overhead = Tick::us(1000);
  kvtier::hw::BatchShape whole;
  whole.prefill.push_back({1152, 0});
  whole.logits_tokens = 1;
  kvtier::hw::BatchShape rest;
  rest.prefill.push_back({128, 1024});  // its own 128 tokens, attending to the cached prefix
  rest.logits_tokens = 1;
  CHECK(engine.ttft().max() == engine.cost_model().cost(whole).total + overhead);
  CHECK(engine.ttft().min() == engine.cost_model().cost(rest).total + overhead);
  CHECK(engine.ttft().percentile(50) == engine.ttft().min());

  const auto without = metrics(run_with(sets));
  const auto with = metrics(run);
  CHECK(without.at("prefix_cache_hit_tokens") == 0);
  CHECK(without.at("ttft_p50_ms") > with.at("ttft_p50_ms"));
  CHECK(with.at("prefix_cache_hit_rate") == Approx(3072.0 / 4608.0).margin(1e-4));
}

TEST_CASE("whole-request reservations count a cached prefix once, so more requests run",
          "[prefix]") {
  // 18.5 GiB leaves 277 blocks of 16 tokens of KV. Each request's life is 2,048 + 16 + 16 - 1
  // tokens: 130 blocks, so two fit without sharing. With caching the first two are admitted
  // together and both compute the prefix (neither finds it cached); the first caches it, the
  // second keeps its copy. Each later request takes the 128 cached blocks and reserves 2 of its
  // own: 129 cached + 1 + 130 + 6 x 2 = 272 of 277 blocks for all eight.
  const std::vector<std::string> sets = {"hardware.node.gpu.memory_capacity=18.5GiB",
                                         "workload.closed_loop.concurrency=8",
                                         "workload.closed_loop.num_requests=8",
                                         "workload.closed_loop.prompt_tokens.fixed_tokens=16",
                                         "workload.closed_loop.output_tokens.fixed_tokens=16",
                                         "workload.prefill_chunk_tokens=4096",
                                         "workload.shared_prefix.tokens=2048",
                                         "workload.shared_prefix.groups=1",
                                         "workload.shared_prefix.zipf_exponent=0"};
  const auto without = metrics(run_with(sets));
  CHECK(without.at("max_running_requests") == 2);
  std::vector<std::string> caching = sets;
  caching.emplace_back("memory.prefix_caching=true");
  const auto with = metrics(run_with(caching));
  CHECK(with.at("max_running_requests") == 8);
  CHECK(with.at("prefix_cache_hit_tokens") == 6 * 2048);
  const double block_gib = 16.0 * with.at("kv_bytes_per_token_per_gpu") / (1 << 30);
  CHECK(with.at("hbm_kv_reserved_peak_gib") == Approx(272 * block_gib).margin(1e-3));
  CHECK(with.at("hbm_kv_used_peak_gib") <= with.at("hbm_kv_reserved_peak_gib"));
  // largest_batch_* count reservations without sharing.
  CHECK(with.at("largest_batch_that_fits") == without.at("largest_batch_that_fits"));
  CHECK(with.at("requests_completed") == 8);
}

TEST_CASE("a Mooncake trace's requests share the blocks their hash ids have in common",
          "[prefix]") {
  // Hash blocks of 512 tokens, KV blocks of 16. The second request shares the first's first
  // hash block; the third its first two. Each arrives after the one before has finished.
  const RunSpec run =
      run_with({"memory.prefix_caching=true", "workload.prefill_chunk_tokens=4096"});
  kvtier::serving::Workload workload;
  workload.request_file = "t.jsonl";
  workload.requests = kvtier::serving::parse_mooncake_trace(
      R"({"timestamp": 0, "input_length": 1100, "output_length": 8, "hash_ids": [1, 2, 3]}
{"timestamp": 10000, "input_length": 1100, "output_length": 8, "hash_ids": [1, 4, 5]}
{"timestamp": 20000, "input_length": 1536, "output_length": 8, "hash_ids": [1, 2, 6]}
)",
      "t.jsonl", 1.0, 512);
  kvtier::sim::Simulator simulator;
  kvtier::serving::ServingEngine engine(simulator, run, workload);
  engine.start();
  simulator.run();
  CHECK(engine.totals().prefix_hit_tokens == 512 + 1024);
  CHECK(engine.totals().prefix_queried_tokens == 1100 + 1100 + 1536);
  CHECK(engine.totals().prefix_evicted_blocks == 0);
}

TEST_CASE("free cached blocks are evicted as running requests need the memory, oldest first",
          "[prefix]") {
  // One request at a time, of prefixes X, Y, Z, X: 2,048 shared + 128 own prompt tokens and
  // 16 output tokens, 137 blocks at most, 136 of them full and cached when it ends. Of 277
  // blocks, X's 136 and Y's 136 stay cached through Y. Z needs 136 then 137 blocks: 131 and 1 of
  // the free ones are evicted, the oldest released first. X's request let go of its last block
  // first, so X keeps only its first 4 blocks, which the second X request finds.
  const RunSpec run =
      run_with({"hardware.node.gpu.memory_capacity=18.5GiB", "workload.prefill_chunk_tokens=4096",
                "memory.prefix_caching=true"});
  kvtier::sim::Simulator simulator;
  kvtier::serving::ServingEngine engine(simulator, run, one_at_a_time_x_y_z_x());
  REQUIRE(std::llround(engine.memory().kv_capacity_bytes / engine.memory().block_bytes()) == 277);
  engine.start();
  simulator.run();
  CHECK(engine.totals().prefix_hit_tokens == 4 * 16);
  // The second X request then takes those 4 and fills 132 blocks of its own at its prefill:
  // 136 in use leave room for 141 of the 272 free ones (Y's, Z's), so 131 are evicted, and 1
  // more at its first decode step.
  CHECK(engine.totals().prefix_evicted_blocks == 131 + 1 + 131 + 1);
  CHECK(engine.totals().requests_completed == 4);
}

TEST_CASE("the host tier keeps every cached block, and a prefill loads what HBM evicted",
          "[prefix]") {
  // The X, Y, Z, X requests of the test above with 1 GiB of host tier (512 blocks, room for
  // all): each request's 136 cached blocks are stored there as they fill. The second X request
  // finds blocks 0-3 in HBM and 4-127 (X's prefix) in the host tier, loaded back instead of
  // recomputed; its own 8 full blocks are stored too.
  const RunSpec run =
      run_with({"hardware.node.gpu.memory_capacity=18.5GiB", "workload.prefill_chunk_tokens=4096",
                "memory.prefix_caching=true", "memory.prefix_cache_host_gib=1"});
  const ServedXyzx served(run);
  const kvtier::serving::ServingEngine& engine = served.engine;
  const auto& totals = engine.totals();
  CHECK(totals.prefix_hit_tokens == 128 * 16);
  CHECK(totals.prefix_host_hit_tokens == 124 * 16);
  const double block = engine.memory().block_bytes();
  CHECK(totals.prefix_store_bytes == (3 * 136 + 8) * block);
  CHECK(totals.prefix_load_bytes == 124 * block);
  // Each block moves as a copy per layer of its keys and of its values (32 layers), from pinned
  // memory on the copy engines, as a swap's copies do.
  const kvtier::serving::CopyRates rates = kvtier::serving::measure_swap_rates(run);
  CHECK(totals.prefix_load_busy ==
        kvtier::serving::swap_time(124 * block, 124 * 64, rates.h2d_bytes_per_s, rates.h2d_setup));
  CHECK(totals.h2d_bytes == totals.prefix_load_bytes);
  CHECK(totals.d2h_bytes == totals.prefix_store_bytes);
  // The loads hold up the prefill's iteration.
  CHECK(totals.copy_wait >= totals.prefix_load_busy);
  CHECK(totals.requests_completed == 4);
  CHECK(engine.memory().host_kv_capacity_bytes ==
        Approx(192.0 * (1 << 30) - 1.0 * (1 << 30)).epsilon(1e-12));
}

TEST_CASE("over pipeline stages a block's host-tier copies are its GPU's layers'", "[prefix]") {
  // The requests above over two stages of 16 layers: each GPU stores its share of every block
  // (write-through), a copy per block of each of its 16 layers' keys or values.
  const RunSpec run = run_with({"pipeline_parallel_degree=2", "workload.prefill_chunk_tokens=4096",
                                "memory.prefix_caching=true", "memory.prefix_cache_host_gib=1"});
  const ServedXyzx served(run);
  const kvtier::serving::ServingEngine& engine = served.engine;
  const auto& totals = engine.totals();
  const double block = engine.memory().block_bytes();
  const double blocks = (totals.prefix_store_bytes + totals.prefix_load_bytes) / block;
  REQUIRE(blocks > 0);
  CHECK(static_cast<double>(totals.prefix_copies) == blocks * 2 * 16);
}

TEST_CASE("a speculating engine's host-tier copies carry its drafter's layer too", "[prefix]") {
  // The requests above, drafting with a one-layer drafter whose KV sits in the same blocks: a
  // block moves as a copy of keys and one of values for each of 32 + 1 layers.
  const RunSpec run =
      run_with({"workload.prefill_chunk_tokens=4096", "memory.prefix_caching=true",
                "memory.prefix_cache_host_gib=1", "engine.speculative.draft_tokens=2",
                "engine.speculative.acceptance_rate=0.5", "engine.speculative.draft_layers=1"});
  const ServedXyzx served(run);
  const auto& totals = served.engine.totals();
  const double block = served.engine.memory().block_bytes();
  const double blocks = (totals.prefix_store_bytes + totals.prefix_load_bytes) / block;
  REQUIRE(blocks > 0);
  CHECK(static_cast<double>(totals.prefix_copies) == blocks * 2 * 33);
}

TEST_CASE("the host tier's copies in chunks: one call per chunk a load or store touches",
          "[prefix]") {
  // The host-tier test above in chunks of 256 tokens (16 blocks). Each of X, Y and Z stores its
  // 136 blocks after its prefill, chunks 0-8; the second X loads blocks 4-127, chunks 0-7, and
  // stores its own blocks 128-135, chunk 8. Before a store's copy a kernel gathers its bytes,
  // after a load's one scatters them, each reading and writing them in HBM.
  const RunSpec run =
      run_with({"hardware.node.gpu.memory_capacity=18.5GiB", "workload.prefill_chunk_tokens=4096",
                "memory.prefix_caching=true", "memory.prefix_cache_host_gib=1",
                "memory.prefix_cache_host_chunk_tokens=256"});
  const ServedXyzx served(run);
  const kvtier::serving::ServingEngine& engine = served.engine;
  const auto& totals = engine.totals();
  const double block = engine.memory().block_bytes();
  REQUIRE(totals.prefix_host_hit_tokens == 124 * 16);
  CHECK(totals.prefix_copies == 3 * 9 + 8 + 1);
  const kvtier::serving::CopyRates rates = kvtier::serving::measure_swap_rates(run);
  using kvtier::serving::swap_time;
  CHECK(totals.prefix_load_busy ==
        swap_time(124 * block, 8, rates.h2d_bytes_per_s, rates.h2d_setup));
  CHECK(totals.prefix_store_busy ==
        swap_time(136 * block, 9, rates.d2h_bytes_per_s, rates.d2h_setup) * 3 +
            swap_time(8 * block, 1, rates.d2h_bytes_per_s, rates.d2h_setup));
  const double hbm = engine.cost_model().gpu().memory_bytes_per_second();
  const auto in_hbm = [hbm](double bytes) {
    return kvtier::sim::from_seconds(2 * bytes / hbm, kvtier::sim::Rounding::kUp);
  };
  CHECK(totals.prefix_gather_busy ==
        in_hbm(136 * block) * 3 + in_hbm(8 * block) + in_hbm(124 * block));
  // The second X's scatter follows its loads before its forward pass.
  CHECK(totals.copy_wait >= totals.prefix_load_busy + in_hbm(124 * block));
  // Per block and layer's keys or values, the same bytes take 64 calls a block.
  kvtier::sim::Simulator per_block_simulator;
  RunSpec per_block = run;
  per_block.mutable_memory()->clear_prefix_cache_host_chunk_tokens();
  kvtier::serving::ServingEngine per_block_engine(per_block_simulator, per_block,
                                                  one_at_a_time_x_y_z_x());
  per_block_engine.start();
  per_block_simulator.run();
  CHECK(per_block_engine.totals().prefix_copies == (3 * 136 + 124 + 8) * 64);
  CHECK(per_block_engine.totals().prefix_store_bytes == totals.prefix_store_bytes);
  CHECK(per_block_engine.totals().prefix_gather_busy == kvtier::sim::Tick::zero());
  CHECK(per_block_engine.totals().prefix_load_busy > totals.prefix_load_busy);
  // A run built in code is refused as a config is.
  RunSpec uneven = run;
  uneven.mutable_memory()->set_prefix_cache_host_chunk_tokens(40);
  kvtier::sim::Simulator unused;
  CHECK_THROWS_WITH(kvtier::serving::ServingEngine(unused, uneven, one_at_a_time_x_y_z_x()),
                    Catch::Contains("not a whole number of kv_block_tokens 16 blocks"));
}

TEST_CASE("a full host tier drops its least recently used block", "[prefix]") {
  kvtier::serving::HostBlockStore store(2);
  const BlockKey a{1, 0};
  const BlockKey b{1, 1};
  const BlockKey c{1, 2};
  CHECK(store.store(a));
  CHECK(store.store(b));
  CHECK_FALSE(store.store(a));  // held already: marked used, nothing copied
  CHECK(store.store(c));        // drops b, the least recently used
  CHECK(store.holds(a));
  CHECK_FALSE(store.holds(b));
  store.touch(a);
  CHECK(store.store(b));  // drops c
  CHECK_FALSE(store.holds(c));
  CHECK(store.dropped() == 2);
  CHECK(store.blocks() == 2);
  kvtier::serving::HostBlockStore none(0);
  CHECK_FALSE(none.store(a));
  CHECK_FALSE(none.holds(a));
}

TEST_CASE("a request recomputed after a preemption takes its own blocks still cached", "[prefix]") {
  const std::vector<std::string> sets = {"hardware.node.gpu.memory_capacity=18.5GiB",
                                         "workload.closed_loop.concurrency=2",
                                         "workload.closed_loop.num_requests=2",
                                         "workload.closed_loop.prompt_tokens.fixed_tokens=2000",
                                         "workload.closed_loop.output_tokens.fixed_tokens=500",
                                         "workload.prefill_chunk_tokens=4096",
                                         "workload.on_demand_admission.watermark=0.01"};
  const auto recompute = metrics(run_with(sets));
  std::vector<std::string> caching = sets;
  caching.emplace_back("memory.prefix_caching=true");
  const RunSpec run = run_with(caching);
  const auto with = metrics(run);
  REQUIRE(recompute.at("preemptions") == 1);
  CHECK(with.at("preemptions") == 1);
  CHECK(with.at("preempted_kv_tokens") == recompute.at("preempted_kv_tokens"));
  // 277 blocks. Both prefill 2,000 tokens; at 209 tokens out each needs 139 blocks and the
  // second is preempted, its 138 full blocks cached. The first grows alone to 157 blocks
  // (2,499 tokens), which leaves room for 120 of them, its last evicted first. Its recompute
  // of 2,209 tokens finds its first 120 blocks. Nothing is shared between the two.
  CHECK(with.at("prefix_cache_hit_tokens") == 120 * 16);
  CHECK(with.at("duration_s") < recompute.at("duration_s"));
  CHECK(with.at("hbm_kv_used_peak_gib") <= with.at("hbm_kv_capacity_gib"));
  CHECK(kvtier::serving::report_json({kvtier::serving::simulate(run)}, run, "v") ==
        kvtier::serving::report_json({kvtier::serving::simulate(run)}, run, "v"));
}

TEST_CASE("prefix caching needs blocks and the full cache, without windows or swapping",
          "[prefix]") {
  const auto refused = [](const std::vector<std::string>& sets, const std::string& expected) {
    try {
      (void)kvtier::test::load_spec<RunSpec>(kvtier::test::quickstart_run(), sets);
      FAIL("expected a config error for " << sets.back());
    } catch (const kvtier::ConfigError& error) {
      CHECK_THAT(error.what(), Catch::Contains(expected));
      CHECK(error.exit_code() == kvtier::ExitCode::kUsageOrConfig);
    }
  };
  refused({"memory.prefix_caching=true"}, "set memory.kv_block_tokens");
  refused({"memory.kv_block_tokens=16", "memory.prefix_cache_host_gib=8"},
          "needs memory.prefix_caching: true");
  refused({"memory.kv_block_tokens=16", "memory.prefix_caching=true",
           "memory.prefix_cache_host_gib=500"},
          "exceeds the GPU's share of host");
  refused({"memory.kv_block_tokens=16", "memory.prefix_caching=true",
           "memory.prefix_cache_host_chunk_tokens=256"},
          "chunks of the prefix cache's host tier need memory.prefix_cache_host_gib");
  refused({"memory.kv_block_tokens=16", "memory.prefix_caching=true",
           "memory.prefix_cache_host_gib=8", "memory.prefix_cache_host_chunk_tokens=100"},
          "prefix_cache_host_chunk_tokens 100 is not a whole number of kv_block_tokens 16 blocks");
  refused({"memory.kv_block_tokens=16", "model.sliding_window=4096", "memory.prefix_caching=true"},
          "not modelled with a sliding window");
  refused({"memory.kv_block_tokens=16", "workload.on_demand_admission.watermark=0.01",
           "workload.on_demand_admission.swap.space_gib=4", "memory.prefix_caching=true"},
          "not modelled with preemption by swapping");
  refused({"workload.request_file.path=r.csv", "workload.request_file.format=KVTIER_CSV",
           "workload.request_file.time_scale=1", "workload.request_file.hash_block_tokens=512"},
          "only MOONCAKE_JSONL request files carry hash ids");
  refused({"workload.request_file.path=r.jsonl", "workload.request_file.format=MOONCAKE_JSONL",
           "workload.request_file.time_scale=1"},
          "hash_block_tokens: 512");
  refused({"workload.request_file.path=r.csv", "workload.request_file.format=KVTIER_CSV",
           "workload.request_file.time_scale=1", "workload.shared_prefix.tokens=64",
           "workload.shared_prefix.groups=2", "workload.shared_prefix.zipf_exponent=0"},
          "shared_prefix is for generated workloads");
  // The policy is the simulation's: a tier policy is refused when its engine is built.
  RunSpec run = run_with({"memory.prefix_caching=true", "tiering.prefetch_lookahead_layers=1",
                          "tiering.host_allocation=PINNED", "tiering.copy_method=COPY_ENGINES",
                          "tiering.synthetic_pattern=reasoning"});
  run.mutable_policy()->set_name("tiered");
  try {
    (void)kvtier::serving::simulate(run);
    FAIL("expected a config error");
  } catch (const kvtier::ConfigError& error) {
    CHECK_THAT(error.what(), Catch::Contains("full cache only, not with policy 'tiered'"));
  }
}
