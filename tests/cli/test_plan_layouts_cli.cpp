// `kvtier plan --layouts`: the same plan for several splits of an engine, side by side.

#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "tests/support/cli_runner.hpp"
#include "tests/support/paths.hpp"
#include "tests/support/small_run.hpp"

namespace {

namespace fs = std::filesystem;
using Result = kvtier::test::CliResult;

Result run(const std::string& args) {
  return kvtier::test::run_kvtier(args);
}

fs::path small_run_file() {
  const fs::path path = kvtier::test::scratch_dir() / "plan-layouts.textproto";
  std::ofstream(path) << kvtier::test::small_run_text();
  return path;
}

// The text between `begin` and the first `end` after it.
std::string between(const std::string& text, const std::string& begin, const std::string& end) {
  const auto from = text.find(begin);
  REQUIRE(from != std::string::npos);
  const auto to = text.find(end, from + begin.size());
  REQUIRE(to != std::string::npos);
  return text.substr(from + begin.size(), to - from - begin.size());
}

void expect_config_error(const Result& result, const std::string& fragment) {
  INFO("stderr: " << result.err);
  CHECK(result.exit_code == 2);
  CHECK(result.out.empty());
  CHECK_THAT(result.err, Catch::StartsWith("kvtier: error: ") && Catch::Contains(fragment));
}

}  // namespace

TEST_CASE("plan --layouts plans each split as a plan of it alone would", "[cli]") {
  const std::string path = small_run_file().string();
  const Result layouts =
      run("plan " + path + " --slo tpot_p99=20ms --layouts 1x1,2x1,1x2,3x1 --format json");
  INFO("stderr: " << layouts.err);
  REQUIRE(layouts.exit_code == 0);
  // Each layout's plan is byte for byte the plan of the run set to it.
  for (const auto& [layout, sets] :
       {std::pair<std::string, std::string>{"2x1", "--set tensor_parallel_degree=2"},
        {"1x2", "--set pipeline_parallel_degree=2"}}) {
    CAPTURE(layout);
    const Result alone = run("plan " + path + " --slo tpot_p99=20ms --format json " + sets);
    REQUIRE(alone.exit_code == 0);
    const std::string plan = between(alone.out, "\"plans\": [", "]}\n");
    CHECK_THAT(layouts.out, Catch::Contains("{\"layout\": \"" + layout + "\"") &&
                                Catch::Contains("\"gpus_per_engine\": 2, \"refused\": null, "
                                                "\"plans\": [" +
                                                plan + "]}"));
  }
  // TP 3 does not divide Llama-3.1-8B's KV heads: listed with the reason, not planned.
  CHECK_THAT(layouts.out,
             Catch::Contains("{\"layout\": \"3x1\", \"tensor_parallel_degree\": 3, "
                             "\"pipeline_parallel_degree\": 1, \"gpus_per_engine\": 3, "
                             "\"refused\": \"tensor_parallel_degree: tensor_parallel_degree 3 "
                             "neither divides") &&
                 Catch::Contains("\"plans\": []}"));
  // One GPU serves the most tokens a GPU: the model fits it, and splitting it only adds
  // all-reduces or a second pass over the weights.
  CHECK_THAT(layouts.out,
             Catch::Contains("\"best\": [{\"policy\": \"full\", \"per_gpu\": \"1x1\"}]"));
  const Result text = run("plan " + path + " --slo tpot_p99=20ms --layouts 1x1,2x1,1x2,3x1");
  REQUIRE(text.exit_code == 0);
  CHECK_THAT(text.out, Catch::Contains("layout") && Catch::Contains("TP 1 x PP 2  2 ") &&
                           Catch::Contains("best per GPU, full: TP 1 x PP 1") &&
                           Catch::Contains("not planned, TP 3 x PP 1: tensor_parallel_degree: "
                                           "tensor_parallel_degree 3"));
  const Result html = run("plan " + path + " --slo tpot_p99=20ms --layouts 1x1,1x2 --format html");
  REQUIRE(html.exit_code == 0);
  CHECK_THAT(html.out, Catch::Contains("TP 1 x PP 2: full") &&
                           Catch::Contains("best per GPU, full: TP 1 x PP 1"));
}

TEST_CASE("plan --layouts auto takes every power-of-two split the node holds", "[cli]") {
  const Result result = run("plan " + small_run_file().string() +
                            " --slo tpot_p99=20ms --layouts auto --format json");
  REQUIRE(result.exit_code == 0);
  // Eight GPUs: TP 1 with 1, 2, 4 or 8 stages, TP 2 with 1, 2 or 4, TP 4 with 1 or 2, TP 8.
  std::size_t count = 0;
  for (auto at = result.out.find("{\"layout\": "); at != std::string::npos;
       at = result.out.find("{\"layout\": ", at + 1)) {
    ++count;
  }
  CHECK(count == 10);
  CHECK_THAT(result.out, Catch::Contains("\"layout\": \"1x8\"") &&
                             Catch::Contains("\"layout\": \"8x1\"") &&
                             !Catch::Contains("\"layout\": \"2x8\""));
}

TEST_CASE("plan --layouts refuses what is not a list of layouts", "[cli]") {
  const std::string plan = "plan " + small_run_file().string() + " --slo tpot_p99=20ms --layouts ";
  expect_config_error(run(plan + "8x"), "--layouts '8x' is not a layout");
  expect_config_error(run(plan + "0x1"), "--layouts '0x1' is not a layout");
  expect_config_error(run(plan + "2x1,"), "--layouts '' is not a layout");
  expect_config_error(run(plan + "2x1,2x1"), "--layouts names 2x1 twice");
  expect_config_error(run(plan + "3x1"), "--layouts: no layout can be planned; TP 3 x PP 1");
  // The options' own mistakes are the command's, not a layout's, even beside a refused one.
  expect_config_error(run(plan + "3x1,1x1 --rounds 0"), "--rounds 0: from 1 to");
  expect_config_error(run(plan + "3x1,1x1 --target-tokens-per-s inf"),
                      "--target-tokens-per-s must be a positive finite number");
}

TEST_CASE("plan --layouts with a target names the layout needing fewest GPUs", "[cli]") {
  // Llama-3.1-70B with the full cache (the run's `compare`): TP 4 serves 278 output tokens/s a GPU
  // (its batch capped at 64), TP 2 241 (HBM holds 28 requests). 400 tokens/s take one engine either
  // way: two GPUs at TP 2, four at TP 4.
  const Result result =
      run("plan '" + std::string(kvtier::test::source_dir()) +
          "/configs/examples/llama70b-tp4-tiered.textproto' "
          "--slo tpot_p99=80ms --set workload.closed_loop.output_tokens.fixed_tokens=256 "
          "--layouts 2x1,4x1 --target-tokens-per-s 400 --format json");
  INFO("stderr: " << result.err);
  REQUIRE(result.exit_code == 0);
  CHECK_THAT(between(result.out, "\"layout\": \"2x1\"", "\"notes\""),
             Catch::Contains("\"engines\": 1, \"gpus\": 2,"));
  CHECK_THAT(between(result.out, "\"layout\": \"4x1\"", "\"notes\""),
             Catch::Contains("\"engines\": 1, \"gpus\": 4,"));
  CHECK_THAT(result.out, Catch::Contains("{\"policy\": \"full\", \"per_gpu\": \"4x1\", "
                                         "\"fewest_gpus\": \"2x1\"}"));
}

TEST_CASE("plan --layouts refuses a layout whose prefill engines have no room, and plans the rest",
          "[cli]") {
  // The pools example with its prefill engines in one stage of the layout's TP: Llama-3.1-70B
  // prefill engines of TP 1 hold no KV beside their weights, those of TP 4 do.
  std::ifstream example(fs::path(kvtier::test::source_dir()) /
                        "configs/examples/disaggregated-pool-parallelism.textproto");
  std::string text((std::istreambuf_iterator<char>(example)), std::istreambuf_iterator<char>());
  const std::string pool = "prefill_parallelism { tensor_parallel_degree: 4 }";
  REQUIRE(text.find(pool) != std::string::npos);
  text.replace(text.find(pool), pool.size(), "prefill_parallelism { pipeline_parallel_degree: 1 }");
  const fs::path path = kvtier::test::scratch_dir() / "plan-layouts-pools.textproto";
  std::ofstream(path) << text;
  const Result result = run("plan " + path.string() +
                            " --slo ttft_p99=3s --set workload.poisson.num_requests=100 "
                            "--layouts 1x4,4x1 --format json");
  INFO("stderr: " << result.err);
  REQUIRE(result.exit_code == 0);
  CHECK_THAT(
      between(result.out, "\"layout\": \"1x4\"", "\"plans\""),
      Catch::Contains("\"refused\": \"prefill engines (tensor parallel 1): nothing can run"));
  CHECK_THAT(between(result.out, "\"layout\": \"4x1\"", "\"plans\""),
             Catch::Contains("\"refused\": null"));
  // Every layout's prefill engines without room: the command's error.
  expect_config_error(
      run("plan " + path.string() + " --slo ttft_p99=3s --layouts 1x4,1x8"),
      "--layouts: no layout can be planned; TP 1 x PP 4: prefill engines (tensor parallel 1): "
      "nothing can run");
}

TEST_CASE("plan --layouts plans a disaggregated run's pools as a plan of that cluster would",
          "[cli]") {
  // The disaggregated example (Llama-3.1-8B, an H100 an engine) with fewer requests: one
  // prefill engine of TP 2 and two decode engines of one GPU, as --layouts names it and as the
  // run set so.
  const std::string example = std::string(kvtier::test::source_dir()) +
                              "/configs/examples/disaggregated-prefill-decode.textproto";
  const std::string common = "plan '" + example +
                             "' --slo ttft_p99=2s,tpot_p99=50ms "
                             "--set workload.poisson.num_requests=150 --format json ";
  const Result layouts = run(common + "--layouts 1@2x1+2@1x1,1@1x1+3@1x1");
  INFO("stderr: " << layouts.err);
  REQUIRE(layouts.exit_code == 0);
  const Result alone =
      run(common +
          "--set cluster.engines=3 --set cluster.disaggregation.prefill_engines=1 "
          "--set cluster.disaggregation.prefill_parallelism.tensor_parallel_degree=2");
  REQUIRE(alone.exit_code == 0);
  const std::string plan = between(alone.out, "\"plans\": [", "]}\n");
  CHECK_THAT(layouts.out,
             Catch::Contains("{\"layout\": \"1@2x1+2@1x1\", \"tensor_parallel_degree\": 1, "
                             "\"pipeline_parallel_degree\": 1, \"gpus_per_engine\": 1, "
                             "\"prefill_engines\": 1, \"prefill_tensor_parallel_degree\": 2, "
                             "\"prefill_pipeline_parallel_degree\": 1, \"decode_engines\": 2, "
                             "\"cluster_gpus\": 4, \"refused\": null, \"plans\": [" +
                             plan + "]}"));
  CHECK_THAT(layouts.out, Catch::Contains("{\"layout\": \"1@1x1+3@1x1\""));
  const Result text = run("plan '" + example +
                          "' --slo ttft_p99=2s,tpot_p99=50ms --set "
                          "workload.poisson.num_requests=150 --layouts 1@2x1+2@1x1");
  REQUIRE(text.exit_code == 0);
  CHECK_THAT(text.out, Catch::Contains("of a cluster of each layout's engines routed") &&
                           Catch::Contains("cluster GPUs") &&
                           Catch::Contains("prefill 1 x TP 2 x PP 1 + decode 2 x TP 1 x PP 1  4"));
}

TEST_CASE("plan --layouts names up to 16 layouts and gives refusals of one reason one line",
          "[cli]") {
  const Result result =
      run("plan " + small_run_file().string() + " --slo tpot_p99=20ms --layouts 1x1,3x1,3x2");
  INFO("stderr: " << result.err);
  REQUIRE(result.exit_code == 0);
  CHECK_THAT(result.out, Catch::Contains("layouts TP 1 x PP 1, TP 3 x PP 1, TP 3 x PP 2, SLO"));
  CHECK_THAT(result.out, Catch::Contains("not planned, TP 3 x PP 1, TP 3 x PP 2: "
                                         "tensor_parallel_degree: tensor_parallel_degree 3 "
                                         "neither divides"));
}

TEST_CASE("plan --layouts on a disaggregated run: engines, unified clusters and auto", "[cli]") {
  const std::string example = std::string(kvtier::test::source_dir()) +
                              "/configs/examples/disaggregated-prefill-decode.textproto";
  const std::string common = "plan '" + example +
                             "' --slo ttft_p99=2s,tpot_p99=50ms "
                             "--set workload.poisson.num_requests=400 "
                             "--set cluster.disaggregation.prefill_parallelism."
                             "tensor_parallel_degree=2 ";
  // An engine's split keeps the run's engines and the prefill engines' TP 2: as the run set so.
  const Result split = run(common + "--layouts 2x1,4@2x1 --format json");
  INFO("stderr: " << split.err);
  REQUIRE(split.exit_code == 0);
  const Result alone = run(common + "--set tensor_parallel_degree=2 --format json");
  REQUIRE(alone.exit_code == 0);
  CHECK_THAT(split.out, Catch::Contains("{\"layout\": \"2x1\", \"tensor_parallel_degree\": 2, "
                                        "\"pipeline_parallel_degree\": 1, \"gpus_per_engine\": "
                                        "2, \"cluster_gpus\": 8, \"refused\": null, \"plans\": [" +
                                        between(alone.out, "\"plans\": [", "]}\n") + "]}"));
  // Four engines of TP 2 that each prefill and decode: the cluster without its disaggregation.
  CHECK_THAT(split.out, Catch::Contains("{\"layout\": \"4@2x1\", \"tensor_parallel_degree\": 2, "
                                        "\"pipeline_parallel_degree\": 1, \"gpus_per_engine\": "
                                        "2, \"engines\": 4, \"cluster_gpus\": 8, \"refused\": "
                                        "null"));
  // The page and the text say the engines are each layout's, and the run's where a layout
  // names none.
  const Result mixed = run(common + "--layouts 2x1,4@2x1");
  REQUIRE(mixed.exit_code == 0);
  CHECK_THAT(mixed.out, Catch::Contains("of a cluster of each layout's engines (the run's 4 where "
                                        "one names none) routed KV_AWARE"));
  const Result html = run(common + "--layouts 4@2x1 --format html");
  REQUIRE(html.exit_code == 0);
  CHECK_THAT(html.out, Catch::Contains("each layout&apos;s engines routed"));
  // Auto on the example's one node: 4 unified clusters and 21 pairs of pools.
  const Result automatic = run(common + "--layouts auto");
  REQUIRE(automatic.exit_code == 0);
  CHECK_THAT(automatic.out,
             Catch::Contains("25 layouts, SLO") &&
                 Catch::Contains("of a cluster of each layout's engines routed KV_AWARE") &&
                 Catch::Contains("best per GPU, full: "));
  // A refused layout has no cluster GPUs: its split may not count.
  const Result refused = run(common + "--layouts 3x1,1x1 --format json");
  REQUIRE(refused.exit_code == 0);
  CHECK_THAT(refused.out, Catch::Contains("\"layout\": \"3x1\"") &&
                              Catch::Contains("\"cluster_gpus\": null, \"refused\": \""));
}
