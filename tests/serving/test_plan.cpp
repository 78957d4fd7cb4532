// Capacity planning: SLO parsing, and a bisection whose answer is the edge of feasibility.

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "common/errors.hpp"
#include "common/text_output.hpp"
#include "configs/schema/run.pb.h"
#include "serving/plan.hpp"
#include "serving/workload.hpp"
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

// The quickstart request shape arriving open-loop: `requests` Poisson arrivals at 4/s.
RunSpec open_run(std::uint32_t requests, const std::vector<std::string>& extra = {}) {
  std::string text = kvtier::test::quickstart_run();
  const auto begin = text.find("closed_loop");
  text.replace(begin, text.find("max_batch_size") - begin,
               "poisson { rate_per_s: 4 num_requests: " + std::to_string(requests) +
                   " prompt_tokens { lognormal { median_tokens: 512 sigma: 0.6 min_tokens: 16 "
                   "max_tokens: 4096 } } output_tokens { fixed_tokens: 64 } }\n  ");
  return kvtier::test::load_spec<RunSpec>(text, extra);
}

double report_value(const std::vector<kvtier::serving::Metric>& metrics, const std::string& name) {
  for (const auto& metric : metrics) {
    if (metric.name == name) {
      return metric.value;
    }
  }
  FAIL("no metric " << name);
  return 0.0;
}

std::map<std::string, double> at_rate(RunSpec run, double rate) {
  run.mutable_workload()->mutable_poisson()->set_rate_per_s(rate);
  return kvtier::test::serving_metrics(run);
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
  // Every probe is recorded as run: 1, the memory limit, then bisection; the planned batch is
  // the largest feasible one, and every infeasible one lies above it.
  REQUIRE(result.probes.size() == result.evaluations);
  CHECK(result.probes.front().load == 1.0);
  CHECK(result.probes.front().slo_values_ms == std::vector<double>{low});
  double largest_feasible = 0.0;
  for (const auto& probe : result.probes) {
    INFO("batch " << probe.load);
    CHECK(probe.feasible == (probe.slo_values_ms.at(0) <= (low + high) / 2));
    CHECK(probe.feasible == probe.binding.empty());
    if (probe.feasible) {
      largest_feasible = std::max(largest_feasible, probe.load);
    } else {
      CHECK(probe.load > result.max_batch);
    }
  }
  CHECK(largest_feasible == result.max_batch);
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

TEST_CASE("an open-loop plan finds the rate at the SLO's edge, within the precision", "[plan]") {
  const RunSpec run = open_run(400);
  PlanOptions options;
  options.slos = {{"ttft_p99_ms", 250.0}, {"tpot_p99_ms", 1e6}};
  options.target_requests_per_s = 1000.0;
  const auto result = plan_capacity(run, options);
  INFO(result.requests_per_s_per_engine << " req/s, " << result.binding);
  CHECK(result.search == kvtier::serving::PlanSearch::kRate);
  REQUIRE(result.requests_per_s_per_engine > 4.0);  // the run's own rate is well inside
  const auto planned = at_rate(run, result.requests_per_s_per_engine);
  CHECK(planned.at("ttft_p99_ms") <= 250.0);
  CHECK(at_rate(run, result.infeasible_requests_per_s).at("ttft_p99_ms") > 250.0);
  CHECK(result.infeasible_requests_per_s > result.requests_per_s_per_engine);
  CHECK(result.infeasible_requests_per_s <= result.requests_per_s_per_engine * 1.01);
  CHECK_THAT(result.binding, Catch::Contains("ttft_p99_ms"));
  // The report is the planned probe's, and the tokens per engine those the rate brings.
  CHECK(report_value(result.metrics, "ttft_p99_ms") == planned.at("ttft_p99_ms"));
  CHECK(result.max_batch == planned.at("max_running_requests"));
  CHECK(result.output_tokens_per_s_per_engine == Approx(64 * result.requests_per_s_per_engine));
  CHECK(result.engines * result.requests_per_s_per_engine >= 1000.0);
  CHECK((result.engines - 1) * result.requests_per_s_per_engine < 1000.0);
  CHECK(result.notes.empty());
  // The probes: the run's own rate first, its TTFT as a run at that rate gives it; the planned
  // rate among them, and its neighbour past the precision missing the SLO.
  REQUIRE(result.probes.size() == result.evaluations);
  CHECK(result.probes.front().load == 4.0);
  CHECK(result.probes.front().slo_values_ms.at(0) == at_rate(run, 4.0).at("ttft_p99_ms"));
  const auto planned_probe = std::find_if(
      result.probes.begin(), result.probes.end(),
      [&result](const auto& probe) { return probe.load == result.requests_per_s_per_engine; });
  REQUIRE(planned_probe != result.probes.end());
  CHECK(planned_probe->feasible);
  CHECK(planned_probe->output_tokens_per_s == planned.at("throughput_output_tokens_per_s"));
  CHECK(std::any_of(result.probes.begin(), result.probes.end(), [&result](const auto& probe) {
    return !probe.feasible && probe.load == result.infeasible_requests_per_s;
  }));
  // Two targets: the engines serve both. Tokens at 64 a request ask for twice the engines.
  options.target_output_tokens_per_s = 2 * 64 * 1000.0;
  const auto both = plan_capacity(run, options);
  CHECK(both.engines >= 2 * result.engines - 1);
  CHECK(both.engines * both.output_tokens_per_s_per_engine >= 2 * 64 * 1000.0);
  // A coarser precision probes less and brackets wider.
  options.rate_precision = 0.25;
  const auto coarse = plan_capacity(run, options);
  CHECK(coarse.evaluations < result.evaluations);
  CHECK(coarse.infeasible_requests_per_s <= coarse.requests_per_s_per_engine * 1.25);
  CHECK(at_rate(run, coarse.requests_per_s_per_engine).at("ttft_p99_ms") <= 250.0);
}

TEST_CASE("an open-loop plan starting past capacity halves the rate until it fits", "[plan]") {
  RunSpec run = open_run(400);
  run.mutable_workload()->mutable_poisson()->set_rate_per_s(4000);
  PlanOptions options;
  options.slos = {{"ttft_p99_ms", 250.0}};
  const auto result = plan_capacity(run, options);
  REQUIRE(result.requests_per_s_per_engine > 0);
  CHECK(result.requests_per_s_per_engine < 4000);
  CHECK(at_rate(run, result.requests_per_s_per_engine).at("ttft_p99_ms") <= 250.0);
  CHECK(at_rate(run, result.infeasible_requests_per_s).at("ttft_p99_ms") > 250.0);
}

TEST_CASE("an open-loop plan says what bound the rate", "[plan]") {
  PlanOptions options;
  options.slos = {{"ttft_p99_ms", 250.0}};
  // Four requests at once: the queue forms behind the batch cap.
  const auto capped = plan_capacity(open_run(400, {"workload.max_batch_size=4"}), options);
  CHECK_THAT(capped.binding,
             Catch::StartsWith("max_batch_size 4 (requests queued behind a full batch): "
                               "ttft_p99_ms"));
  CHECK(capped.max_batch <= 4);
  // KV memory for about 15 whole lives of these requests' median.
  const auto memory =
      plan_capacity(open_run(400, {"hardware.node.gpu.memory_capacity=18.5GiB"}), options);
  CHECK_THAT(memory.binding, Catch::StartsWith("HBM (admissions waited for KV memory in ") &&
                                 Catch::Contains(" iterations, 0 preemptions): ttft_p99_ms"));
  // Neither: iterations grow with the batch until the first tokens come late.
  const auto compute = plan_capacity(open_run(400), options);
  CHECK_THAT(compute.binding, Catch::StartsWith("compute: ttft_p99_ms"));
  CHECK(compute.requests_per_s_per_engine > memory.requests_per_s_per_engine);
  CHECK(compute.requests_per_s_per_engine > capped.requests_per_s_per_engine);
}

TEST_CASE("an open-loop plan that no rate meets serves no target", "[plan]") {
  PlanOptions options;
  options.slos = {{"ttft_p99_ms", 0.001}};
  options.target_requests_per_s = 10.0;
  const auto result = plan_capacity(open_run(50), options);
  CHECK(result.requests_per_s_per_engine == 0.0);
  CHECK_FALSE(kvtier::serving::serves_any(result));
  CHECK(result.engines == 0);
  CHECK(result.metrics.empty());
  // The slowest rate probed: the run's 4/s halved as often as its last request still arrives
  // within 10^6 s of simulated time (and at most 20 times), where requests run alone.
  const auto workload = kvtier::serving::make_workload(open_run(50).workload(), 7);
  const double last_s = kvtier::sim::to_seconds(*workload.requests.back().arrival);
  int halvings = 0;
  while (halvings < 20 && last_s * (1 << (halvings + 1)) <= 1e6) {
    ++halvings;
  }
  CHECK(halvings >= 10);
  CHECK(result.infeasible_requests_per_s == 4.0 / (1 << halvings));
  CHECK_THAT(result.binding,
             Catch::StartsWith("even at " + kvtier::format_fixed(4.0 / (1 << halvings), 6) +
                               " requests/s: compute: ttft_p99_ms") &&
                 Catch::Contains(" > 0.001"));
}

TEST_CASE("an open-loop plan over a short workload says how much overload it may hide", "[plan]") {
  PlanOptions options;
  options.slos = {{"ttft_p99_ms", 250.0}};
  // 60 requests: at the planned rate they arrive within a second, and a queue that grows by
  // the SLO's 250 ms over that span goes unseen.
  const auto result = plan_capacity(open_run(60), options);
  REQUIRE(result.notes.size() == 1);
  CHECK_THAT(result.notes[0], Catch::StartsWith("the workload's 60 requests arrive within ") &&
                                  Catch::Contains("(250 ms of SLO over that span)"));
}

TEST_CASE("open-loop plans refuse what the rate search cannot use", "[plan]") {
  PlanOptions options;
  // TPOT holds past capacity: the queue grows instead.
  options.slos = {{"tpot_p99_ms", 50.0}, {"iteration_p99_ms", 50.0}};
  CHECK_THROWS_WITH(plan_capacity(open_run(50), options),
                    Catch::Contains("needs an SLO on ttft, queue_wait or e2e_latency"));
  options.slos = {{"queue_wait_p99_ms", 1e6}};
  for (const double precision : {0.0, 1e-7, 1.5}) {
    options.rate_precision = precision;
    CHECK_THROWS_WITH(plan_capacity(open_run(50), options), Catch::StartsWith("--rate-precision"));
  }
  // Eight requests that all meet the SLOs arriving at once: no rate loads the engine.
  options.rate_precision = 0.01;
  CHECK_THROWS_WITH(plan_capacity(open_run(8), options),
                    Catch::Contains("meets every SLO with the workload's 8 requests arriving "
                                    "within") &&
                        Catch::Contains("give it more requests"));
  options.target_requests_per_s = -1.0;
  CHECK_THROWS_WITH(plan_capacity(open_run(50), options),
                    Catch::StartsWith("--target-requests-per-s must be a positive"));
}

TEST_CASE("an open-loop plan over a request file scales its time_scale", "[plan]") {
  std::string pattern =
      (std::filesystem::temp_directory_path() / "kvtier-plan-test-XXXXXX").string();
  REQUIRE(mkdtemp(pattern.data()) != nullptr);
  const std::filesystem::path folder(pattern);
  // 300 requests half a second apart: (300 - 1) / 149.5 s = 2 requests/s.
  std::string lines = "arrival_s,prompt_tokens,output_tokens\n";
  for (int i = 0; i < 300; ++i) {
    lines += std::to_string(0.5 * i) + "," + std::to_string(128 + 61 * (i % 17)) + ",64\n";
  }
  std::ofstream(folder / "requests.csv") << lines;
  std::ofstream(folder / "burst.csv")
      << "arrival_s,prompt_tokens,output_tokens\n3,100,10\n3,90,5\n";
  const auto file_run = [&folder](const char* name) {
    return kvtier::test::load_spec<RunSpec>(
        kvtier::test::quickstart_run(),
        {"workload.request_file.path=" + (folder / name).string(),
         "workload.request_file.format=KVTIER_CSV", "workload.request_file.time_scale=1"});
  };
  const RunSpec run = file_run("requests.csv");
  const auto at_scale = [&run](double time_scale) {
    RunSpec scaled = run;
    scaled.mutable_workload()->mutable_request_file()->set_time_scale(time_scale);
    return kvtier::test::serving_metrics(scaled).at("ttft_p99_ms");
  };
  PlanOptions options;
  options.slos = {{"ttft_p99_ms", 200.0}};
  const auto result = plan_capacity(run, options);
  INFO(result.requests_per_s_per_engine << " req/s, " << result.binding);
  REQUIRE(result.requests_per_s_per_engine > 2.0);
  CHECK(at_scale(2.0 / result.requests_per_s_per_engine) <= 200.0);
  CHECK(at_scale(2.0 / result.infeasible_requests_per_s) > 200.0);
  CHECK(result.output_tokens_per_s_per_engine == Approx(64 * result.requests_per_s_per_engine));
  CHECK_THROWS_WITH(plan_capacity(file_run("burst.csv"), options),
                    Catch::Contains("burst.csv: its requests all arrive at one instant"));
  std::filesystem::remove_all(folder);
}

TEST_CASE("a cluster's plan searches the rate the cluster serves whole", "[plan][cluster]") {
  const RunSpec alone = open_run(400);
  const RunSpec cluster = open_run(400, {"cluster.engines=2", "cluster.routing=LEAST_OUTSTANDING"});
  PlanOptions options;
  options.slos = {{"ttft_p99_ms", 250.0}};
  options.target_requests_per_s = 1000.0;
  const auto single = plan_capacity(alone, options);
  const auto result = plan_capacity(cluster, options);
  CHECK(single.cluster_engines == 1);
  REQUIRE(result.cluster_engines == 2);
  const double rate = result.cluster_requests_per_s;
  INFO(rate << " req/s by the cluster, " << single.requests_per_s_per_engine << " by one engine, "
            << result.engines << " engines, " << result.evaluations << " probes");
  CHECK(result.requests_per_s_per_engine == rate / 2);
  CHECK(at_rate(cluster, rate).at("ttft_p99_ms") <= 250.0);
  CHECK(at_rate(cluster, 2 * result.infeasible_requests_per_s).at("ttft_p99_ms") > 250.0);
  // Two engines behind a router serve more than one, if not quite twice as much.
  CHECK(rate > 1.5 * single.requests_per_s_per_engine);
  CHECK(result.output_tokens_per_s_per_engine == Approx(64 * rate / 2));
  // Its probes are per engine too: the planned one's load and tokens/s are half the cluster's.
  const auto planned = std::find_if(result.probes.begin(), result.probes.end(), [&](const auto& p) {
    return p.load == result.requests_per_s_per_engine;
  });
  REQUIRE(planned != result.probes.end());
  CHECK(planned->output_tokens_per_s ==
        Approx(report_value(result.metrics, "throughput_output_tokens_per_s") / 2));
  // Whole clusters serve the target.
  CHECK(result.engines % 2 == 0);
  CHECK(static_cast<double>(result.engines / 2) * rate >= 1000.0);
  CHECK(static_cast<double>(result.engines / 2 - 1) * rate < 1000.0);
  CHECK(result.gpus == result.engines);
  REQUIRE_FALSE(result.notes.empty());
  CHECK_THAT(result.notes.back(), Catch::Contains("the cluster of 2 engines, routed "
                                                  "LEAST_OUTSTANDING, serves"));
  // A closed loop sizes one engine's batch: a cluster's is not planned that way.
  CHECK_THROWS_WITH(
      plan_capacity(small_run({"cluster.engines=2", "cluster.routing=ROUND_ROBIN"}), options),
      Catch::Contains("planned by the arrival rate it serves"));
}
