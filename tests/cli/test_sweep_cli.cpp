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

// A build registers the cases it can run: with MPI (the presets require it) the MPI jobs, without
// it the refusal.
#ifdef KVTIER_TEST_MPI

namespace {

// What an MPI job of these tests runs under. OpenMPI refuses root without the first two (CI
// containers run as root). In the ASan build: OpenMPI never frees what it allocates at MPI_Init
// nor what its components' threads do, and tests/support/lsan-openmpi.supp names its libraries,
// which only fully unwound stacks reach (fast_unwind_on_malloc=0); and LeakSanitizer's tracer
// in GCC 12's runtime crashes on the dynamic TLS of OpenMPI's threads ("Tracer caught signal
// 11", google/sanitizers#1267) unless __tls_get_addr is left alone. These variables do nothing
// in other builds.
std::string mpi_environment() {
  return "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "
         "ASAN_OPTIONS=\"${ASAN_OPTIONS:-}:fast_unwind_on_malloc=0:intercept_tls_get_addr=0\" "
         "LSAN_OPTIONS=\"suppressions='" +
         (fs::path(kvtier::test::source_dir()) / "tests/support/lsan-openmpi.supp").string() +
         "'\"";
}

// `kvtier ARGS` as every process of an MPI job of `processes` on this machine (more than its
// cores: --oversubscribe).
Result run_mpi(int processes, const std::string& args) {
  return kvtier::test::run_kvtier(args, mpi_environment() + " '" +
                                            std::string(kvtier::test::mpiexec_binary()) + "' -n " +
                                            std::to_string(processes) + " --oversubscribe");
}

// The launcher adds its own lines about the failed job, before or after kvtier's as its
// processes' output happens to reach it; kvtier's must be one whole line.
void expect_one_report(const Result& result, int exit_code, const std::string& text) {
  INFO("stderr: " << result.err);
  CHECK(result.exit_code == exit_code);
  CHECK(result.out.empty());
  std::size_t reports = 0;
  std::size_t report = std::string::npos;
  for (std::size_t at = result.err.find("kvtier: error: "); at != std::string::npos;
       at = result.err.find("kvtier: error: ", at + 1)) {
    ++reports;
    report = at;
  }
  REQUIRE(reports == 1);
  CHECK((report == 0 || result.err[report - 1] == '\n'));
  const std::size_t end = result.err.find('\n', report);
  REQUIRE(end != std::string::npos);
  CHECK_THAT(result.err.substr(report, end - report), Catch::Contains(text));
}

}  // namespace

TEST_CASE("kvtier sweep --mpi shares the points among processes, to the bytes of one process",
          "[cli][sweep][mpi]") {
  const std::string spec = write_spec("sweep-mpi.textproto", spec_text("\"1\", \"2\", \"3\""));
  const std::string alone = folder("out-mpi-alone");
  const Result one = run("sweep '" + spec + "' --out '" + alone + "' --format csv");
  REQUIRE(one.exit_code == 0);
  for (const int processes : {2, 3}) {
    const std::string out = folder("out-mpi-" + std::to_string(processes));
    const Result many =
        run_mpi(processes, "sweep '" + spec + "' --mpi --jobs 2 --out '" + out + "' --format csv");
    INFO("stderr: " << many.err);
    REQUIRE(many.exit_code == 0);
    CHECK(many.out == one.out);  // printed once, by rank 0
    CHECK_THAT(many.err, Catch::Contains("12 of 12 points (0 resumed, 12 run on " +
                                         std::to_string(processes) + " MPI processes)"));
    CHECK(slurp(fs::path(out) / "results.csv") == slurp(fs::path(alone) / "results.csv"));
    CHECK(slurp(fs::path(out) / "results.h5") == slurp(fs::path(alone) / "results.h5"));
    CHECK(slurp(fs::path(out) / "sweep.json") == slurp(fs::path(alone) / "sweep.json"));
    for (int point = 0; point < 12; ++point) {
      const fs::path file = fs::path("points") / (std::to_string(point) + ".csv");
      CHECK(slurp(fs::path(out) / file) == slurp(fs::path(alone) / file));
    }
    CHECK_FALSE(fs::exists(fs::path(out) / ".tmp"));
  }

  // Resuming: the points left are computed, the others kept, the same bytes again.
  const std::string resumed = folder("out-mpi-resumed");
  fs::copy(alone, resumed, fs::copy_options::recursive);
  fs::remove(fs::path(resumed) / "points" / "4.csv");
  fs::remove(fs::path(resumed) / "points" / "9.csv");
  fs::remove(fs::path(resumed) / "results.csv");
  const Result again = run_mpi(3, "sweep '" + spec + "' --mpi --out '" + resumed + "'");
  INFO("stderr: " << again.err);
  CHECK(again.exit_code == 0);
  CHECK_THAT(again.err, Catch::Contains("(10 resumed, 2 run on 3 MPI processes)"));
  CHECK(slurp(fs::path(resumed) / "results.csv") == slurp(fs::path(alone) / "results.csv"));

  // A shard of an MPI job is that shard; one process without a launcher is a job of one.
  const Result shard = run_mpi(2, "sweep '" + spec + "' --mpi --shard 1/3 --out '" +
                                      folder("out-mpi-shard") + "' --format csv");
  const Result shard_alone = run("sweep '" + spec + "' --shard 1/3 --out '" +
                                 folder("out-mpi-shard-alone") + "' --format csv");
  CHECK(shard.exit_code == 0);
  CHECK(shard.out == shard_alone.out);
  const Result single = kvtier::test::run_kvtier(
      "sweep '" + spec + "' --mpi --out '" + folder("out-mpi-single") + "' --format csv",
      mpi_environment());
  CHECK(single.exit_code == 0);
  CHECK(single.out == one.out);
  CHECK_THAT(single.err, Catch::Contains("12 run on 1 MPI process)"));
}

TEST_CASE("kvtier sweep --mpi reports a failure on any rank once, with its exit code",
          "[cli][sweep][mpi]") {
  const std::string spec = write_spec("sweep-mpi-codes.textproto", spec_text());
  const Result help = run_mpi(2, "sweep --mpi --help");
  CHECK(help.exit_code == 0);
  CHECK(help.out.find("usage: kvtier sweep") == help.out.rfind("usage: kvtier sweep"));
  expect_one_report(run_mpi(2, "sweep '" + spec + "' --mpi --jobs 0"), 2, "--jobs 0");
  expect_one_report(run_mpi(3, "sweep '" + (scratch_dir() / "none.textproto").string() + "' --mpi"),
                    2, "none.textproto");

  // Ranks that read different specs (a file that differs between nodes) are refused.
  const std::string other = write_spec("sweep-mpi-other.textproto", spec_text("\"1\", \"3\""));
  const std::string launcher =
      mpi_environment() + " '" + std::string(kvtier::test::mpiexec_binary()) + "' -n 1";
  const std::string out = folder("out-mpi-two-specs");
  const Result two_specs = kvtier::test::run_kvtier(
      "sweep '" + spec + "' --mpi --out '" + out + "' : -n 1 '" + kvtier::test::kvtier_binary() +
          "' sweep '" + other + "' --mpi --out '" + out + "'",
      launcher);
  expect_one_report(two_specs, 2, "rank 1 loaded another spec");
  CHECK_FALSE(fs::exists(fs::path(out) / "sweep.json"));

  // Refused by rank 0 once the ranks agree (a folder of another spec): the others stop too.
  const std::string taken = folder("out-mpi-taken");
  REQUIRE(run("sweep '" + other + "' --out '" + taken + "'").exit_code == 0);
  expect_one_report(run_mpi(3, "sweep '" + spec + "' --mpi --out '" + taken + "'"), 2,
                    "another sweep spec");

  // Bad data met while points run, wherever they run, stops the job with exit 3.
  const fs::path bad_trace = scratch_dir() / "not-a-trace.h5";
  {
    std::ofstream junk(bad_trace, std::ios::binary);
    junk << "this is not an HDF5 file";
  }
  const std::string bad =
      write_spec("sweep-mpi-bad-trace.textproto",
                 spec_text("\"1\", \"2\", \"3\"", "traces: \"not-a-trace.h5\""));
  const std::string bad_out = folder("out-mpi-bad-trace");
  expect_one_report(run_mpi(3, "sweep '" + bad + "' --mpi --out '" + bad_out + "'"), 3,
                    "not-a-trace.h5");
  CHECK_FALSE(fs::exists(fs::path(bad_out) / "results.csv"));
}

#else

TEST_CASE("kvtier sweep --mpi without MPI in the build says so", "[cli][sweep][mpi]") {
  const std::string spec = write_spec("sweep-no-mpi.textproto", spec_text());
  expect_error(run("sweep '" + spec + "' --mpi --out '" + folder("out-no-mpi") + "'"), 2,
               "built without MPI");
}

#endif  // KVTIER_TEST_MPI
