// Sweeps that plan (SweepSpec.plan): each point's rows are the plans `kvtier plan` makes of its
// run, and a plan block that cannot apply is refused before the sweep runs.

#include <catch2/catch.hpp>

#include <algorithm>
#include <string>
#include <vector>

#include "common/errors.hpp"
#include "common/text_output.hpp"
#include "serving/demand_memo.hpp"
#include "serving/plan.hpp"
#include "sweep/sweep.hpp"
#include "tests/support/config_fixture.hpp"

namespace {

using kvtier::sweep::Row;

// Llama-3.1-8B on an H100 or an H200 node's GPU, 1,024 + 256-token requests; `workload` and
// `plan` are the spec's.
std::string spec_text(const std::string& workload, const std::string& plan) {
  return R"(name: "plan" mode: GRID
base {
  hardware { node { preset: "hgx-h100-8" } num_nodes: 1 }
  model { preset: "Llama-3.1-8B" }
  tensor_parallel_degree: 1
  workload { )" +
         workload + R"( max_batch_size: 256 prefill_chunk_tokens: 2048 }
  policy { name: "full" }
  compare { name: "streaming" }
  tiering { synthetic_pattern: "reasoning" prefetch_lookahead_layers: 1 host_allocation: PINNED copy_method: COPY_ENGINES }
  memory { runtime_reserve_gib: 2 activation_workspace_gib: 1 }
  engine { iteration_overhead_us: 1000 }
  seed: 7
}
axis { path: "hardware.node.preset" values: ["hgx-h100-8", "hgx-h200-8"] }
)" + plan;
}

const std::string kClosedLoop =
    "closed_loop { concurrency: 4 num_requests: 8 prompt_tokens { fixed_tokens: 1024 } "
    "output_tokens { fixed_tokens: 256 } }";
const std::string kOpenLoop =
    "poisson { rate_per_s: 4 num_requests: 200 prompt_tokens { fixed_tokens: 512 } "
    "output_tokens { fixed_tokens: 64 } }";

kvtier::sweep::Sweep load(const std::string& text) {
  return kvtier::sweep::load_sweep_text(text, "sweep.textproto", kvtier::test::loader());
}

std::string metric(const Row& row, const std::string& name) {
  for (const auto& [metric_name, value] : row.metrics) {
    if (metric_name == name) {
      return value;
    }
  }
  return {};
}

std::string problems(const std::string& text) {
  try {
    (void)load(text);
  } catch (const kvtier::Error& error) {
    return kvtier::test::joined(error.lines());
  }
  return {};
}

}  // namespace

TEST_CASE("sweep: a point that plans gives the plan kvtier plan makes of its run", "[sweep]") {
  const kvtier::sweep::Sweep sweep = load(
      spec_text(kClosedLoop, R"(plan { slo: "tpot_p99=30ms" target_output_tokens_per_s: 50000 })"));
  kvtier::serving::PlanOptions options;
  options.slos = kvtier::serving::parse_slos("tpot_p99=30ms");
  options.target_output_tokens_per_s = 50000;
  kvtier::serving::DemandMemo memo;
  for (std::uint64_t point = 0; point < 2; ++point) {
    CAPTURE(point);
    const std::vector<Row> rows =
        kvtier::sweep::simulate_point(sweep, point, kvtier::test::loader(), memo);
    REQUIRE(rows.size() == 2);  // full, then streaming
    kvtier::config::RunSpec run = kvtier::sweep::point_run(sweep, point, kvtier::test::loader());
    run.clear_compare();
    const kvtier::serving::PlanResult plan = kvtier::serving::plan_capacity(run, options);
    const Row& row = rows.front();
    CHECK(row.error.empty());
    CHECK(row.policy == "full");
    REQUIRE(plan.max_batch > 0);
    CHECK(metric(row, "plan_max_batch") == kvtier::format_double(plan.max_batch));
    CHECK(metric(row, "plan_output_tokens_per_s_per_gpu") ==
          kvtier::format_double(plan.output_tokens_per_s_per_gpu));
    CHECK(metric(row, "plan_gpus") == kvtier::format_double(static_cast<double>(plan.gpus)));
    // The run at the planned load: its TPOT p99 within the SLO.
    const std::string tpot = metric(row, "tpot_p99_ms");
    REQUIRE(!tpot.empty());
    CHECK(std::stod(tpot) <= 30.0);
    CHECK(metric(row, "requests_completed") == kvtier::format_double(3.0 * plan.max_batch));
    CHECK(rows.back().policy.rfind("streaming", 0) == 0);
    CHECK(!metric(rows.back(), "plan_max_batch").empty());
  }
  // An H200 holds more requests within the same TPOT.
  const auto h100 = kvtier::sweep::simulate_point(sweep, 0, kvtier::test::loader(), memo);
  const auto h200 = kvtier::sweep::simulate_point(sweep, 1, kvtier::test::loader(), memo);
  CHECK(std::stod(metric(h200.front(), "plan_max_batch")) >
        std::stod(metric(h100.front(), "plan_max_batch")));
}

TEST_CASE("sweep: an open-loop point plans its arrival rate", "[sweep]") {
  const kvtier::sweep::Sweep sweep =
      load(spec_text(kOpenLoop, R"(plan { slo: "ttft_p99=500ms" rate_precision: 0.1 })"));
  kvtier::serving::DemandMemo memo;
  const std::vector<Row> rows =
      kvtier::sweep::simulate_point(sweep, 0, kvtier::test::loader(), memo);
  REQUIRE(rows.size() == 2);
  CHECK(!metric(rows.front(), "plan_max_requests_per_s").empty());
  CHECK(metric(rows.front(), "plan_max_batch").empty());
  CHECK(metric(rows.front(), "plan_gpus").empty());  // no target
}

TEST_CASE("sweep: a policy that serves no load within the SLOs is a row saying why", "[sweep]") {
  kvtier::serving::DemandMemo memo;
  // No batch of one meets a 1 ms TPOT: what binds it is the row's error, for each policy.
  const auto missed =
      kvtier::sweep::simulate_point(load(spec_text(kClosedLoop, R"(plan { slo: "tpot_p99=1ms" })")),
                                    0, kvtier::test::loader(), memo);
  REQUIRE(missed.size() == 2);
  for (const Row& row : missed) {
    CHECK_THAT(row.error, Catch::StartsWith("no load within the SLOs: compute: tpot_p99_ms"));
    CHECK(row.metrics.empty());
  }
  // A request whose KV does not fit one GPU (Llama-3.1-70B at TP 2, a 100k-token prompt): HBM
  // binds, as a simulation's row would say.
  const std::string huge =
      "closed_loop { concurrency: 4 num_requests: 8 prompt_tokens { fixed_tokens: 100000 } "
      "output_tokens { fixed_tokens: 8 } }";
  const auto unfit =
      kvtier::sweep::simulate_point(load(spec_text(huge, R"(plan { slo: "tpot_p99=1s" })") +
                                         R"(axis { path: "model.preset" values: ["Llama-3.1-70B"] }
axis { path: "tensor_parallel_degree" values: ["2"] })"),
                                    0, kvtier::test::loader(), memo);
  REQUIRE(unfit.size() == 2);
  CHECK_THAT(unfit.front().error, Catch::Contains("no load within the SLOs: HBM: ") &&
                                      Catch::Contains("GiB of KV per GPU"));
}

TEST_CASE("sweep: a policy the planner refuses keeps the others' rows", "[sweep]") {
  // Two requests arriving 1/4 s apart meet a 60 s TTFT however fast they come: the full cache's
  // plan is refused as too short a workload. Its row says so; StreamingLLM's is its own.
  const std::string two =
      "poisson { rate_per_s: 4 num_requests: 2 prompt_tokens { "
      "fixed_tokens: 512 } output_tokens { fixed_tokens: 64 } }";
  kvtier::serving::DemandMemo memo;
  const auto rows = kvtier::sweep::simulate_point(
      load(spec_text(two, R"(plan { slo: "ttft_p99=60s" })")), 0, kvtier::test::loader(), memo);
  REQUIRE(rows.size() == 2);
  CHECK_THAT(rows.front().error, Catch::Contains("policy full meets every SLO"));
  CHECK(rows.back().policy.rfind("streaming", 0) == 0);
  CHECK_THAT(rows.back().error, Catch::Contains("meets every SLO") &&
                                    Catch::Contains("streaming") && !Catch::Contains("full"));
}

TEST_CASE("sweep: a plan block that cannot apply is refused before the sweep runs", "[sweep]") {
  CHECK_THAT(problems(spec_text(kClosedLoop, R"(plan { slo: "tpot=30ms" })")),
             Catch::Contains("plan.slo") && Catch::Contains("unknown metric"));
  CHECK_THAT(
      problems(spec_text(kClosedLoop, R"(plan { slo: "tpot_p99=30ms" rate_precision: 0.1 })")),
      Catch::Contains("plan.rate_precision") && Catch::Contains("open-loop"));
  CHECK_THAT(problems(spec_text(kOpenLoop, R"(plan { slo: "ttft_p99=1s" rounds: 2 })")),
             Catch::Contains("plan.rounds"));
  CHECK_THAT(problems(spec_text(kOpenLoop, R"(plan { slo: "tpot_p99=30ms" })")),
             Catch::Contains("an SLO on ttft, queue_wait or e2e_latency"));
  CHECK_THAT(problems(spec_text(kClosedLoop, R"(plan { rounds: 2 })")),
             Catch::Contains("plan.slo"));
  CHECK(problems(spec_text(kClosedLoop, R"(plan { slo: "tpot_p99=30ms" rounds: 2 })")).empty());
  // The schema's problem with the block is its one line.
  const std::string missing = problems(spec_text(kClosedLoop, R"(plan { rounds: 2 })"));
  CHECK(std::count(missing.begin(), missing.end(), '\n') == 1);
  // An axis on what the plan searches would repeat the same rows.
  CHECK_THAT(problems(spec_text(kClosedLoop, R"(plan { slo: "tpot_p99=30ms" })") +
                      R"(axis { path: "workload.closed_loop.concurrency" values: ["4", "8"] })"),
             Catch::Contains("axis[1].path") && Catch::Contains("searches"));
  CHECK_THAT(problems(spec_text(kOpenLoop, R"(plan { slo: "ttft_p99=1s" })") +
                      R"(axis { path: "workload.poisson.rate_per_s" values: ["4", "8"] })"),
             Catch::Contains("axis[1].path"));
}
