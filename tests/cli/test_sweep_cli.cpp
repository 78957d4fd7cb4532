// `kvtier sweep` driven as a user would: outputs, --jobs, --shard and merge, resuming, and the
// exit codes of bad usage, bad specs and bad data.

#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>

#include "tests/support/cli_runner.hpp"

namespace {

namespace fs = std::filesystem;
using Result = kvtier::test::CliResult;
using kvtier::test::scratch_dir;
using kvtier::test::slurp;

Result run(const std::string& args) {
  return kvtier::test::run_kvtier(args);
}

// 2 batches x 2 policies x 2 seeds of 4 short requests: eight points in well under a second.
std::string spec_text(const std::string& seeds = "\"1\", \"2\"", const std::string& traces = "") {
  return R"(# proto-message: SweepSpec
name: "cli-test"
mode: GRID
base {
  hardware { node { preset: "hgx-h100-8" } num_nodes: 1 }
  model { preset: "Llama-3.1-8B" }
  tensor_parallel_degree: 1
  workload {
    closed_loop { concurrency: 2 num_requests: 4 prompt_tokens { fixed_tokens: 128 }
                  output_tokens { fixed_tokens: 32 } }
    max_batch_size: 64
    prefill_chunk_tokens: 512
  }
  policy { name: "full" }
  tiering { )" +
         traces +
         R"( synthetic_pattern: "reasoning" prefetch_lookahead_layers: 1 host_allocation: PINNED
         copy_method: COPY_ENGINES }
  memory { runtime_reserve_gib: 2 activation_workspace_gib: 1 }
  engine { iteration_overhead_us: 1000 }
  seed: 7
}
axis { path: "workload.closed_loop.concurrency" values: ["1", "4"] }
axis { path: "policy" values: ["full", "tiered:hbm=0.5,evict=0.1"] }
axis { path: "seed" values: [)" +
         seeds + R"(] }
)";
}

std::string write_spec(const std::string& name, const std::string& text) {
  const fs::path path = scratch_dir() / name;
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  return path.string();
}

std::string folder(const std::string& name) {
  const fs::path path = scratch_dir() / name;
  fs::remove_all(path);
  return path.string();
}

void expect_error(const Result& result, int exit_code, const std::string& text) {
  INFO("stderr: " << result.err);
  CHECK(result.exit_code == exit_code);
  CHECK(result.out.empty());
  CHECK_THAT(result.err, Catch::StartsWith("kvtier: error: ") && Catch::Contains(text));
}

}  // namespace

TEST_CASE("kvtier sweep writes results.csv and results.h5 and prints them", "[cli][sweep]") {
  const std::string spec = write_spec("sweep.textproto", spec_text());
  const std::string out = folder("out-csv");
  const Result result = run("sweep '" + spec + "' --out '" + out + "' --format csv");
  INFO("stderr: " << result.err);
  REQUIRE(result.exit_code == 0);
  CHECK(result.out == slurp(fs::path(out) / "results.csv"));
  CHECK(fs::exists(fs::path(out) / "results.h5"));
  CHECK(fs::exists(fs::path(out) / "sweep.json"));
  CHECK(std::count(result.out.begin(), result.out.end(), '\n') == 9);  // header + 8 points
  CHECK_THAT(result.out, Catch::StartsWith("point,workload.closed_loop.concurrency,policy_axis,"
                                           "seed,policy,error,"));
  CHECK_THAT(result.err, Catch::Contains("8 of 8 points (0 resumed, 8 run)"));
  // No progress line when stderr is not a terminal.
  CHECK(result.err.find('\r') == std::string::npos);

  const Result table = run("sweep '" + spec + "' --out '" + out + "'");
  REQUIRE(table.exit_code == 0);
  CHECK_THAT(table.out, Catch::Contains("throughput_output_tokens_per_s") &&
                            Catch::Contains("tiered:hbm=0.5,evict=0.1"));
  CHECK_THAT(table.err, Catch::Contains("(8 resumed, 0 run)"));
  const Result json = run("sweep '" + spec + "' --out '" + out + "' --format json");
  REQUIRE(json.exit_code == 0);
  CHECK_THAT(json.out, Catch::StartsWith("{\"schema\": \"kvtier.sweep.v1\""));
}

TEST_CASE("kvtier sweep gives the same bytes for --jobs 1 and 2", "[cli][sweep]") {
  const std::string spec = write_spec("sweep-jobs.textproto", spec_text());
  const std::string one = folder("out-jobs1");
  const std::string two = folder("out-jobs2");
  const Result first = run("sweep '" + spec + "' --jobs 1 --out '" + one + "' --format csv");
  const Result second = run("sweep '" + spec + "' --jobs 2 --out '" + two + "' --format csv");
  REQUIRE(first.exit_code == 0);
  REQUIRE(second.exit_code == 0);
  CHECK(first.out == second.out);
  CHECK(slurp(fs::path(one) / "results.h5") == slurp(fs::path(two) / "results.h5"));
}

TEST_CASE("kvtier sweep --shard and merge give the unsharded results", "[cli][sweep]") {
  const std::string spec = write_spec("sweep-shard.textproto", spec_text());
  const std::string whole = folder("out-whole");
  REQUIRE(run("sweep '" + spec + "' --out '" + whole + "' --format csv").exit_code == 0);
  std::string shards;
  for (int k = 0; k < 3; ++k) {
    const std::string out = folder("out-shard" + std::to_string(k));
    const Result shard = run("sweep '" + spec + "' --shard " + std::to_string(k) + "/3 --out '" +
                             out + "' --format csv");
    REQUIRE(shard.exit_code == 0);
    shards += " '" + out + "'";
  }
  const std::string merged = folder("out-merged");
  const Result merge = run("sweep merge" + shards + " --out '" + merged + "' --format csv");
  INFO("stderr: " << merge.err);
  REQUIRE(merge.exit_code == 0);
  CHECK(merge.out == slurp(fs::path(whole) / "results.csv"));
  CHECK(slurp(fs::path(merged) / "results.csv") == slurp(fs::path(whole) / "results.csv"));

  const Result gap = run("sweep merge '" + folder("out-shard-missing") + "'" + " --out '" +
                         folder("out-merged-gap") + "'");
  expect_error(gap, 2, "not a sweep folder");
  const std::string first_two = shards.substr(0, shards.rfind(" '"));
  expect_error(run("sweep merge" + first_two + " --out '" + folder("out-merged-gap") + "'"), 2,
               "missing points 2, 5 (2 of 8)");

  // The whole sweep's folder holds every point again: equal copies merge, a copy edited by hand
  // is refused whatever the order of the folders.
  const Result twice = run("sweep merge" + shards + " '" + whole + "' --out '" +
                           folder("out-merged-twice") + "' --format csv");
  CHECK(twice.exit_code == 0);
  CHECK(twice.out == merge.out);
  const fs::path edited = fs::path(folder("out-edited"));
  fs::copy(whole, edited, fs::copy_options::recursive);
  std::string point = slurp(edited / "points" / "1.csv");
  const auto last_digit = point.find_last_of("0123456789");
  REQUIRE(last_digit != std::string::npos);
  point[last_digit] = point[last_digit] == '9' ? '8' : '9';
  std::ofstream(edited / "points" / "1.csv", std::ios::binary | std::ios::trunc) << point;
  for (const std::string& order :
       {shards + " '" + edited.string() + "'", " '" + edited.string() + "'" + shards}) {
    const Result conflict =
        run("sweep merge" + order + " --out '" + folder("out-merged-conflict") + "'");
    expect_error(conflict, 3, "point 1 differs from its copy");
  }
}

TEST_CASE("kvtier sweep's default folder is one folder, whatever the spec's name", "[cli][sweep]") {
  std::string text = spec_text();
  text.replace(text.find("name: \"cli-test\""), 16, "name: \"../escaped\"");
  const std::string spec = write_spec("sweep-escape.textproto", text);
  const Result result = run("sweep '" + spec + "'");
  expect_error(result, 2, "cannot name the default folder sweep-NAME");
  CHECK_FALSE(fs::exists("sweep-.."));
  CHECK_FALSE(fs::exists("../escaped"));
}

TEST_CASE("kvtier sweep refuses a folder in the way of its results before any work",
          "[cli][sweep]") {
  const std::string spec = write_spec("sweep-blocked.textproto", spec_text());
  const std::string out = folder("out-blocked");
  fs::create_directories(fs::path(out) / "results.h5");
  expect_error(run("sweep '" + spec + "' --out '" + out + "'"), 2,
               "--out holds results.h5 as something other than a file");
  CHECK_FALSE(fs::exists(fs::path(out) / "sweep.json"));
  CHECK_FALSE(fs::exists(fs::path(out) / "results.csv"));
}

TEST_CASE("kvtier sweep refuses a folder of another spec", "[cli][sweep]") {
  const std::string out = folder("out-mismatch");
  REQUIRE(
      run("sweep '" + write_spec("a.textproto", spec_text()) + "' --out '" + out + "'").exit_code ==
      0);
  expect_error(run("sweep '" + write_spec("b.textproto", spec_text("\"1\", \"3\"")) + "' --out '" +
                   out + "'"),
               2, "another sweep spec");
}

TEST_CASE("kvtier sweep exit codes: usage and specs 2, data 3", "[cli][sweep]") {
  const std::string spec = write_spec("sweep-codes.textproto", spec_text());
  const std::string out = folder("out-codes");
  CHECK(run("sweep --help").exit_code == 0);
  expect_error(run("sweep"), 2, "needs a SweepSpec file");
  expect_error(run("sweep '" + (scratch_dir() / "none.textproto").string() + "'"), 2,
               "none.textproto");
  expect_error(run("sweep '" + spec + "' --jobs 0 --out '" + out + "'"), 2, "--jobs 0");
  expect_error(run("sweep '" + spec + "' --shard 3/3 --out '" + out + "'"), 2, "--shard '3/3'");
  expect_error(run("sweep '" + spec + "' --format yaml --out '" + out + "'"), 2, "yaml");
  expect_error(
      run("sweep '" +
          write_spec("bad-policy.textproto", spec_text("\"1\"") + "axis { path: \"model.preset\" "
                                                                  "values: [\"NoSuchModel\"] }\n") +
          "' --out '" + out + "'"),
      2, "NoSuchModel");
  expect_error(run("sweep merge --out '" + out + "'"), 2, "needs the shard folders");
  // A trace that is not HDF5 is bad input data.
  const fs::path bad_trace = scratch_dir() / "not-a-trace.h5";
  {
    std::ofstream junk(bad_trace, std::ios::binary);
    junk << "this is not an HDF5 file";
  }
  const Result data =
      run("sweep '" +
          write_spec("bad-trace.textproto", spec_text("\"1\"", "traces: \"not-a-trace.h5\"")) +
          "' --out '" + folder("out-bad-trace") + "'");
  expect_error(data, 3, "not-a-trace.h5");
}
