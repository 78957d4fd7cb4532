// Capacity planning: SLO parsing, and a bisection whose answer is the edge of feasibility.

#include <catch2/catch.hpp>

#include <map>
#include <string>
#include <vector>

#include "common/errors.hpp"
#include "configs/schema/run.pb.h"
#include "serving/plan.hpp"
#include "tests/support/config_fixture.hpp"
#include "tests/support/serving_metrics.hpp"

using kvtier::config::RunSpec;
using kvtier::serving::parse_slos;
using kvtier::serving::plan_capacity;
using kvtier::serving::PlanOptions;

namespace {

RunSpec small_run(const std::vector<std::string>& extra = {}) {
  std::vector<std::string> sets = {"workload.closed_loop.prompt_tokens.fixed_tokens=256",
                                   "workload.closed_loop.output_tokens.fixed_tokens=32",
                                   "workload.max_batch_size=48"};
  sets.insert(sets.end(), extra.begin(), extra.end());
  return kvtier::test::load_spec<RunSpec>(kvtier::test::quickstart_run(), sets);
}

std::map<std::string, double> at_batch(RunSpec run, std::uint32_t batch, std::uint32_t rounds) {
  run.mutable_workload()->mutable_closed_loop()->set_concurrency(batch);
  run.mutable_workload()->mutable_closed_loop()->set_num_requests(batch * rounds);
  return kvtier::test::serving_metrics(run);
}

}  // namespace

TEST_CASE("SLOs are read with their units", "[plan]") {
  const auto slos = parse_slos("tpot_p99=50ms,ttft_p90=2s,e2e_latency_mean=1500us");
  REQUIRE(slos.size() == 3);
  CHECK(slos[0].metric == "tpot_p99_ms");
  CHECK(slos[0].limit_ms == 50.0);
  CHECK(slos[1].limit_ms == 2000.0);
  CHECK(slos[2].limit_ms == Approx(1.5));
  CHECK_THROWS_AS(parse_slos("tpot_p99=50"), kvtier::ConfigError);
  CHECK_THROWS_AS(parse_slos("tpot_p98=50ms"), kvtier::ConfigError);
  CHECK_THROWS_AS(parse_slos("tpot_p99=-5ms"), kvtier::ConfigError);
  CHECK_THROWS_AS(parse_slos(""), kvtier::ConfigError);
  CHECK_THROWS_AS(parse_slos("tpot_p99=50ms,"), kvtier::ConfigError);
  CHECK_THROWS_AS(parse_slos("tpot_p99=50ms,tpot_p99=40ms"), kvtier::ConfigError);
  CHECK_THROWS_AS(parse_slos("tpot_p99=infms"), kvtier::ConfigError);
}

TEST_CASE("rounds and targets outside what a plan can use are refused", "[plan]") {
  PlanOptions options;
  options.slos = {{"tpot_p99_ms", 1e9}};
  options.rounds = kvtier::serving::kMaxRounds + 1;
  CHECK_THROWS_AS(plan_capacity(small_run(), options), kvtier::ConfigError);
  options.rounds = 0;
  CHECK_THROWS_AS(plan_capacity(small_run(), options), kvtier::ConfigError);
  options.rounds = 1;
  options.target_output_tokens_per_s = 1e300;  // more engines than 2^53
  CHECK_THROWS_WITH(plan_capacity(small_run(), options), Catch::Contains("more than 2^53"));
}

TEST_CASE("the planned batch meets the SLO and one more request does not", "[plan]") {
  const RunSpec run = small_run();
  // An SLO between the TPOT of batch 1 and of the cap forces an interior answer.
  const double low = at_batch(run, 1, 2).at("tpot_p99_ms");
  const double high = at_batch(run, 48, 2).at("tpot_p99_ms");
  REQUIRE(high > low);
  PlanOptions options;
  options.rounds = 2;
  options.slos = {{"tpot_p99_ms", (low + high) / 2}};
  options.target_output_tokens_per_s = 10000.0;
  const auto result = plan_capacity(run, options);
  REQUIRE(result.max_batch > 1);
  REQUIRE(result.max_batch < 48);
  CHECK(at_batch(run, result.max_batch, 2).at("tpot_p99_ms") <= (low + high) / 2);
  CHECK(at_batch(run, result.max_batch + 1, 2).at("tpot_p99_ms") > (low + high) / 2);
  CHECK_THAT(result.binding, Catch::Contains("tpot_p99_ms"));
  CHECK(result.engines * result.output_tokens_per_s_per_engine >= 10000.0);
  CHECK((result.engines - 1) * result.output_tokens_per_s_per_engine < 10000.0);
  CHECK(result.gpus == result.engines);
  CHECK(result.nodes == (result.gpus + 7) / 8);
}

TEST_CASE("a loose SLO plans up to the batch cap or the memory limit", "[plan]") {
  PlanOptions options;
  options.slos = {{"tpot_p99_ms", 1e9}};
  const auto capped = plan_capacity(small_run(), options);
  CHECK(capped.max_batch == 48);
  CHECK_THAT(capped.binding, Catch::StartsWith("max_batch_size"));
  // Long requests on a big model, each prompt prefilled in one iteration: HBM runs out first.
  const std::vector<std::string> long_requests = {
      "model.preset=Llama-3.1-70B", "tensor_parallel_degree=2",
      "workload.closed_loop.prompt_tokens.fixed_tokens=8192", "workload.max_batch_size=256"};
  std::vector<std::string> whole_prompts = long_requests;
  whole_prompts.emplace_back("workload.prefill_chunk_tokens=8192");
  const auto memory = plan_capacity(small_run(whole_prompts), options);
  CHECK(memory.max_batch < 256);
  CHECK(memory.binding == "HBM");
  // The same requests through a 512-token prefill budget: a prompt takes 16 iterations to enter
  // and its 32 tokens follow, so the first requests finish before a fourth is admitted. Memory
  // held nobody back, and the plan says what did.
  const auto scheduled = plan_capacity(small_run(long_requests), options);
  CHECK(scheduled.max_batch < memory.max_batch);
  CHECK_THAT(scheduled.binding,
             Catch::StartsWith("scheduling: at most " + std::to_string(scheduled.max_batch) +
                               " of " + std::to_string(scheduled.max_batch + 1)));
}

TEST_CASE("with on-demand admission a plan runs more at once than whole lives fit", "[plan]") {
  PlanOptions options;
  options.slos = {{"tpot_p99_ms", 1e9}};
  // 4,444 tokens of KV: 15 whole lives of 256 + 32 tokens, 17 prompts.
  const std::vector<std::string> small_hbm = {"hardware.node.gpu.memory_capacity=18.5GiB"};
  const auto reserving = plan_capacity(small_run(small_hbm), options);
  CHECK(reserving.max_batch == 15);
  CHECK(reserving.binding == "HBM");
  std::vector<std::string> on_demand_sets = small_hbm;
  on_demand_sets.emplace_back("workload.on_demand_admission.watermark=0.01");
  const RunSpec on_demand_run = small_run(on_demand_sets);
  const auto on_demand = plan_capacity(on_demand_run, options);
  INFO("on demand: " << on_demand.max_batch << ", " << on_demand.binding);
  CHECK(on_demand.max_batch > reserving.max_batch);
  CHECK(on_demand.binding == "HBM");
  // Running them all at once took preemptions.
  CHECK(at_batch(on_demand_run, on_demand.max_batch, options.rounds).at("preemptions") > 0);
}

TEST_CASE("a policy whose single request does not fit plans a batch of 0, saying why", "[plan]") {
  PlanOptions options;
  options.slos = {{"tpot_p99_ms", 1e9}};
  // 128 + 64 tokens of Llama-3.1-8B need 24 MiB of KV; leave 16 MiB.
  const auto roomy = at_batch(small_run(), 1, 1);
  const double reserve = roomy.at("hbm_reserve_gib") + roomy.at("hbm_kv_capacity_gib") - 1.0 / 64;
  const auto result =
      plan_capacity(small_run({"workload.closed_loop.prompt_tokens.fixed_tokens=128",
                               "workload.closed_loop.output_tokens.fixed_tokens=64",
                               "memory.runtime_reserve_gib=" + std::to_string(reserve)}),
                    options);
  CHECK(result.max_batch == 0);
  CHECK(result.policy == "full");
  CHECK_THAT(result.binding, Catch::StartsWith("HBM: request 0 (192 tokens) needs 0.02 GiB"));
  CHECK(result.metrics.empty());
}

TEST_CASE("an SLO missed while the GPU waits for its copies is PCIe-bound", "[plan]") {
  // A long reasoning chain, all but its last 16 generated tokens in host memory and staged
  // every step by SM kernels, which take turns with compute: the copies take over a third of
  // the GPU's time.
  RunSpec tiered =
      small_run({"workload.closed_loop.prompt_tokens.fixed_tokens=64",
                 "workload.closed_loop.output_tokens.fixed_tokens=1024",
                 "tiering.prefetch_lookahead_layers=1", "tiering.host_allocation=PINNED",
                 "tiering.copy_method=SM_KERNELS", "tiering.synthetic_pattern=reasoning"});
  tiered.mutable_policy()->set_name("tiered");
  const auto param = [&tiered](const char* name) {
    auto* added = tiered.mutable_policy()->add_param();
    added->set_name(name);
    return added;
  };
  param("hbm")->set_number(0.05);
  param("evict")->set_number(0.0);
  param("recent")->set_integer(16);
  param("delta")->set_integer(8);
  const auto measured = at_batch(tiered, 1, 1);
  REQUIRE(measured.at("copy_wait_fraction") > 0.25);
  PlanOptions options;
  options.rounds = 1;
  options.slos = {{"tpot_p99_ms", measured.at("tpot_p99_ms") / 2}};
  const auto result = plan_capacity(tiered, options);
  CHECK(result.max_batch == 0);
  CHECK_THAT(result.binding, Catch::StartsWith("PCIe (") &&
                                 Catch::Contains("% of GPU time waits for copies): tpot_p99_ms"));
  // The same SLO missed by the full cache, which copies nothing, is compute-bound.
  RunSpec full = tiered;
  full.mutable_policy()->Clear();
  full.mutable_policy()->set_name("full");
  options.slos = {{"tpot_p99_ms", at_batch(full, 1, 1).at("tpot_p99_ms") / 2}};
  CHECK_THAT(plan_capacity(full, options).binding, Catch::StartsWith("compute: tpot_p99_ms"));
}

TEST_CASE("planning needs a closed loop", "[plan]") {
  RunSpec run = small_run();
  run.mutable_workload()->clear_closed_loop();
  run.mutable_workload()->mutable_poisson();
  PlanOptions options;
  options.slos = {{"tpot_p99_ms", 50}};
  CHECK_THROWS_AS(plan_capacity(run, options), kvtier::ConfigError);
}

TEST_CASE("an SLO missed while the GPU waits for the host's recodes is bound by them", "[plan]") {
  // T2 tokens recoded on the step's path by one slow host thread: most of the run waits.
  RunSpec tiered = small_run(
      {"workload.closed_loop.prompt_tokens.fixed_tokens=64",
       "workload.closed_loop.output_tokens.fixed_tokens=512", "tiering.prefetch_lookahead_layers=1",
       "tiering.host_allocation=PINNED", "tiering.copy_method=COPY_ENGINES",
       "tiering.synthetic_pattern=reasoning",
       "hardware.node.host.kv_recode.to_compressed_ns_per_value=20000",
       "hardware.node.host.kv_recode.to_full_ns_per_value=20000",
       "hardware.node.host.kv_recode.source=a test's figures", "tiering.host_recode.threads=1",
       "tiering.host_recode.timing=STEP_PATH", "tiering.host_recode.chunk_token_layers=1",
       "tiering.host_recode.parallel_min_values=0"});
  tiered.mutable_policy()->set_name("tiered");
  for (const auto& [name, value] :
       {std::pair{"hbm", 0.3}, std::pair{"evict", 0.0}, std::pair{"compress", 0.5}}) {
    auto* param = tiered.mutable_policy()->add_param();
    param->set_name(name);
    param->set_number(value);
  }
  const auto measured = at_batch(tiered, 1, 1);
  REQUIRE(measured.at("host_recode_stall_s") > 0.25 * measured.at("duration_s"));
  PlanOptions options;
  options.rounds = 1;
  options.slos = {{"tpot_p99_ms", measured.at("tpot_p99_ms") / 2}};
  const auto result = plan_capacity(tiered, options);
  CHECK(result.max_batch == 0);
  CHECK_THAT(result.binding,
             Catch::StartsWith("host recodes (") &&
                 Catch::Contains("% of the run waits for T1 <-> T2 recodes): tpot_p99_ms"));
}
