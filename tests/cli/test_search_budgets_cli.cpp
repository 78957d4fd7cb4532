// `kvtier replay search-budgets` driven as a user would: output, the front file, byte-identical
// results whatever --jobs, one-line diagnostics and exit codes, no output file after a failure.

#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>

#include "tests/support/cli_runner.hpp"

namespace {

namespace fs = std::filesystem;
using Result = kvtier::test::CliResult;
using kvtier::test::expect_one_line_error;
using kvtier::test::scratch_dir;
using kvtier::test::slurp;

Result run(const std::string& args) {
  return kvtier::test::run_kvtier(args);
}

std::string path_of(const std::string& name) {
  return (scratch_dir() / name).string();
}

// Small stories260K traces (5 layers), made once: two calibration, one held-out.
const std::string& traces() {
  static const std::string made = [] {
    std::string names;
    for (const int seed : {1, 2, 3}) {
      const std::string file = path_of("search" + std::to_string(seed) + ".h5");
      const Result synth =
          run("trace synth --model stories260K --prompt-tokens 96 --steps 64 "
              "--pattern reasoning --seed " +
              std::to_string(seed) + " --out '" + file + "'");
      REQUIRE(synth.exit_code == 0);
    }
    return std::string("--traces '") + path_of("search1.h5") + "' '" + path_of("search2.h5") +
           "' --held-out '" + path_of("search3.h5") + "'";
  }();
  return made;
}

const std::string kSmall = " --base-policy h2o --floor 4 --cap 160 --evaluations 24 --seed 5";

}  // namespace

TEST_CASE("replay search-budgets help", "[cli][search]") {
  const Result help = run("replay search-budgets --help");
  CHECK(help.exit_code == 0);
  CHECK_THAT(help.out, Catch::Contains("usage: kvtier replay search-budgets") &&
                           Catch::Contains("--target-mean"));
}

TEST_CASE("replay search-budgets prints the front, the winner and the comparison",
          "[cli][search]") {
  const std::string csv = path_of("front.csv");
  const Result text = run("replay search-budgets " + traces() + kSmall +
                          " --target-mean 16 32 --jobs 1 --out '" + csv + "'");
  INFO("stderr: " << text.err);
  REQUIRE(text.exit_code == 0);
  CHECK(text.err.empty());
  CHECK_THAT(text.out, Catch::Contains("Pareto front") && Catch::Contains("winner (*)") &&
                           Catch::Contains("held-out traces") && Catch::Contains("wrote"));
  const std::string front = slurp(csv);
  CHECK_THAT(front, Catch::StartsWith("mean_budget,recall,evaluation,generation,winner,budgets\n"));
  CHECK(std::count(front.begin(), front.end(), '\n') >= 3);

  // Byte-identical output and front file whatever the thread count.
  const std::string csv2 = path_of("front2.csv");
  const Result threads = run("replay search-budgets " + traces() + kSmall +
                             " --target-mean 16 32 --jobs 3 --out '" + csv2 + "'");
  REQUIRE(threads.exit_code == 0);
  CHECK(slurp(csv2) == front);
  std::string expected = text.out;
  expected.replace(expected.find(csv), csv.size(), csv2);
  CHECK(threads.out == expected);

  // Streaming the calibration traces from their files instead of memory changes nothing but
  // the line that says so.
  const std::string csv3 = path_of("front3.csv");
  const Result streamed = run("replay search-budgets " + traces() + kSmall +
                              " --target-mean 16 32 --memory 0 --out '" + csv3 + "'");
  REQUIRE(streamed.exit_code == 0);
  CHECK(slurp(csv3) == front);
  CHECK_THAT(streamed.out, Catch::Contains("replayed from the files"));
  CHECK_THAT(text.out, Catch::Contains("replayed from memory"));

  const Result json = run("replay search-budgets " + traces() + kSmall + " --format json --jobs 2");
  REQUIRE(json.exit_code == 0);
  CHECK_THAT(json.out,
             Catch::StartsWith("{\"base_policy\": \"h2o\"") && Catch::Contains("\"front\": [") &&
                 Catch::Contains("\"winner\": {") && Catch::Contains("\"uniform_recall\": ") &&
                 Catch::Contains("\"layer_recall\": [") && Catch::Contains("\"front_csv\": null"));
  // Without --held-out, the comparison runs on the calibration traces and says so.
  const Result calibration = run("replay search-budgets --traces '" + path_of("search1.h5") +
                                 "' --base-policy h2o --floor 4 --cap 160 --evaluations 10");
  REQUIRE(calibration.exit_code == 0);
  CHECK_THAT(calibration.out, Catch::Contains("the calibration traces"));
}

TEST_CASE("replay search-budgets errors", "[cli][search]") {
  const std::string csv = path_of("never.csv");
  const std::string out = " --out '" + csv + "'";
  // Usage and configuration: exit 2.
  expect_one_line_error(run("replay search-budgets --base-policy h2o"), 2, "traces");
  expect_one_line_error(run("replay search-budgets " + traces()), 2, "base-policy");
  expect_one_line_error(run("replay search-budgets " + traces() + " --base-policy nonesuch" + out),
                        2, "nonesuch");
  expect_one_line_error(run("replay search-budgets " + traces() + " --base-policy tiered" + out), 2,
                        "per-layer budgets");
  expect_one_line_error(
      run("replay search-budgets " + traces() + " --base-policy h2o:budget=64" + out), 2, "budget");
  expect_one_line_error(
      run("replay search-budgets " + traces() + " --base-policy h2o:recent=7" + out), 2, "recent");
  expect_one_line_error(
      run("replay search-budgets " + traces() + kSmall + " --target-mean 2" + out), 2,
      "--target-mean 2");
  expect_one_line_error(
      run("replay search-budgets " + traces() + " --base-policy h2o --floor 100 --cap 50" + out), 2,
      "floor");
  expect_one_line_error(run("replay search-budgets " + traces() + kSmall + " --jobs 0" + out), 2,
                        "--jobs");
  expect_one_line_error(
      run("replay search-budgets " + traces() + kSmall + " --evaluations 0" + out), 2,
      "--evaluations");
  expect_one_line_error(run("replay search-budgets " + traces() + kSmall + " --format yaml" + out),
                        2, "yaml");
  // Traces of different layer counts cannot share a budget vector: exit 2.
  const std::string sliced = path_of("sliced.h5");
  REQUIRE(run("trace convert '" + path_of("search1.h5") + "' --layers 0:3 --out '" + sliced + "'")
              .exit_code == 0);
  expect_one_line_error(
      run("replay search-budgets " + traces() + " --held-out '" + sliced + "'" + kSmall + out), 2,
      "layers");
  // Bad data: exit 3.
  expect_one_line_error(
      run("replay search-budgets --traces '" + path_of("missing.h5") + "'" + kSmall + out), 3,
      "missing.h5");
  const std::string garbage = path_of("garbage.h5");
  std::ofstream(garbage) << "not a trace\n";
  expect_one_line_error(run("replay search-budgets --traces '" + garbage + "'" + kSmall + out), 3,
                        "garbage.h5");
  // A policy that needs data the traces lack (snapkv: the prefill window).
  expect_one_line_error(run("replay search-budgets " + traces() +
                            " --base-policy snapkv --floor 4 --cap 160 --evaluations 8" + out),
                        3, "prefill");
  CHECK_FALSE(fs::exists(csv));
}
