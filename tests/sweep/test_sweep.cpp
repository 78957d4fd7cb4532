// Sweeps: point enumeration (GRID, ZIP), the policy axis, rows of points that cannot run,
// determinism across thread counts, resuming, refusing another spec's folder, shards + merge.

#include <hdf5.h>
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "common/errors.hpp"
#include "configs/schema/run.pb.h"
#include "serving/demand_memo.hpp"
#include "serving/simulation.hpp"
#include "sweep/sweep.hpp"
#include "tests/support/config_fixture.hpp"

namespace {

namespace fs = std::filesystem;
using kvtier::sweep::Row;
using kvtier::sweep::RunOptions;
using kvtier::sweep::Sweep;
using kvtier::test::joined;

// A run small enough that a point takes milliseconds: 4 requests of 128 + 32 tokens.
const std::string kBase = R"(
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
  tiering { synthetic_pattern: "reasoning" prefetch_lookahead_layers: 1 host_allocation: PINNED copy_method: COPY_ENGINES }
  memory { runtime_reserve_gib: 2 activation_workspace_gib: 1 }
  engine { iteration_overhead_us: 1000 }
  seed: 7
  BASE_EXTRA
}
)";

std::string spec_text(const std::string& axes, const std::string& mode = "GRID",
                      const std::string& base_extra = "") {
  std::string base = kBase;
  base.replace(base.find("BASE_EXTRA"), 10, base_extra);
  return "name: \"test\"\nmode: " + mode + "\n" + base + axes;
}

std::string axis(const std::string& path, const std::vector<std::string>& values) {
  std::string text = "axis { path: \"" + path + "\" values: [";
  for (std::size_t i = 0; i < values.size(); ++i) {
    text += (i == 0 ? "\"" : ", \"") + values[i] + "\"";
  }
  return text + "] }\n";
}

// Specs are loaded as if from a file in the source tree (relative paths resolve there).
Sweep load(const std::string& text) {
  return kvtier::sweep::load_sweep_text(text, "sweep.textproto", kvtier::test::loader());
}

std::vector<std::string> problems(const std::string& text) {
  try {
    (void)load(text);
  } catch (const kvtier::Error& error) {
    return error.lines();
  }
  return {};
}

fs::path fresh_folder(const std::string& name) {
  const fs::path folder = fs::temp_directory_path() / ("kvtier-sweep-test-" + name);
  fs::remove_all(folder);
  return folder;
}

std::string slurp(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE(in);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

kvtier::sweep::RunSummary run_into(const Sweep& sweep, const fs::path& out, unsigned jobs = 1,
                                   kvtier::sweep::Shard shard = {}) {
  RunOptions options;
  options.out = out;
  options.jobs = jobs;
  options.shard = shard;
  return kvtier::sweep::run_sweep(sweep, kvtier::test::loader(), options);
}

std::string metric(const Row& row, const std::string& name) {
  for (const auto& [metric_name, value] : row.metrics) {
    if (metric_name == name) {
      return value;
    }
  }
  return {};
}

// batch 1/2/4 x two policies x two contexts: 12 points, tiered ones replayed once per context.
const std::string kGridAxes = axis("workload.closed_loop.concurrency", {"1", "2", "4"}) +
                              axis("policy", {"full", "tiered:hbm=0.5,evict=0.1"}) +
                              axis("workload.closed_loop.output_tokens.fixed_tokens", {"16", "32"});

}  // namespace

TEST_CASE("sweep: GRID points count like an odometer, the last axis fastest", "[sweep]") {
  const Sweep sweep = load(spec_text(axis("workload.closed_loop.concurrency", {"1", "2", "4"}) +
                                     axis("seed", {"1", "2"})));
  const auto& spec = sweep.spec;
  REQUIRE(kvtier::sweep::point_count(spec) == 6);
  CHECK(kvtier::sweep::point_coordinates(spec, 0) == std::vector<std::uint32_t>{0, 0});
  CHECK(kvtier::sweep::point_coordinates(spec, 1) == std::vector<std::uint32_t>{0, 1});
  CHECK(kvtier::sweep::point_coordinates(spec, 2) == std::vector<std::uint32_t>{1, 0});
  CHECK(kvtier::sweep::point_coordinates(spec, 5) == std::vector<std::uint32_t>{2, 1});
  CHECK(kvtier::sweep::point_values(spec, 3) == std::vector<std::string>{"2", "2"});
  CHECK_THROWS_AS(kvtier::sweep::point_coordinates(spec, 6), std::out_of_range);
  CHECK(sweep.axis_columns == std::vector<std::string>{"workload.closed_loop.concurrency", "seed"});

  const auto run = kvtier::sweep::point_run(sweep, 3, kvtier::test::loader());
  CHECK(run.workload().closed_loop().concurrency() == 2);
  CHECK(run.seed() == 2);
}

TEST_CASE("sweep: a point's run is the base with its values applied as --set would", "[sweep]") {
  const Sweep sweep = load(spec_text(axis("model.preset", {"Qwen2.5-14B"}) +
                                     axis("hardware.node.gpu.memory_capacity", {"40GiB"}) +
                                     axis("workload.closed_loop.concurrency", {"3"})));
  const Sweep plain = load(spec_text(axis("hardware.node.gpu.memory_capacity", {"40GiB"}) +
                                     axis("workload.closed_loop.concurrency", {"3"})));
  for (const Sweep* each : {&sweep, &plain}) {
    kvtier::config::RunSpec expected = each->spec.base();
    kvtier::config::LocationMap locations;
    std::vector<kvtier::config::Override> overrides;
    for (const auto& axis_spec : each->spec.axis()) {
      overrides.push_back(
          kvtier::config::parse_override(axis_spec.path() + "=" + axis_spec.values(0)));
    }
    kvtier::test::loader().apply_and_resolve(expected, locations, overrides);
    const auto run = kvtier::sweep::point_run(*each, 0, kvtier::test::loader());
    CHECK(run.SerializeAsString() == expected.SerializeAsString());
    CHECK(run.hardware().node().gpu().memory_capacity_gib() == 40.0);
    CHECK(run.workload().closed_loop().concurrency() == 3);
  }
}

TEST_CASE("sweep: a GRID of more than 2^64 - 1 points is refused, not wrapped", "[sweep]") {
  std::vector<std::string> values;
  for (int v = 1; v <= 600; ++v) {
    values.push_back(std::to_string(v));
  }
  std::string axes;
  for (const char* path : {"seed", "engine.iteration_overhead_us", "memory.runtime_reserve_gib",
                           "memory.activation_workspace_gib", "workload.max_batch_size",
                           "workload.prefill_chunk_tokens", "workload.closed_loop.num_requests"}) {
    axes += axis(path, values);  // 600^7 points
  }
  CHECK_THAT(joined(problems(spec_text(axes))),
             Catch::Contains("more than 2^64 - 1 points") && Catch::Contains("axis[6].values"));
}

TEST_CASE("sweep: a spec of more points than a sweep runs is refused before any work", "[sweep]") {
  std::vector<std::string> values;
  for (int v = 1; v <= 32; ++v) {
    values.push_back(std::to_string(v));
  }
  std::string axes;
  for (const char* path : {"seed", "engine.iteration_overhead_us", "workload.max_batch_size"}) {
    axes += axis(path, values);  // 32^3 = 32768 points: allowed
  }
  CHECK(problems(spec_text(axes)).empty());
  axes += axis("workload.prefill_chunk_tokens", values);  // 32^4 = 1048576
  CHECK_THAT(joined(problems(spec_text(axes))),
             Catch::Contains("the GRID's axes multiply to 1048576 points; a sweep runs at most "
                             "1000000") &&
                 Catch::Contains("axis[3].values"));
}

TEST_CASE("sweep: ZIP points take the i-th value of every axis, whose lengths must agree",
          "[sweep]") {
  const Sweep sweep = load(spec_text(
      axis("workload.closed_loop.concurrency", {"1", "2", "4"}) + axis("seed", {"5", "6", "7"}),
      "ZIP"));
  REQUIRE(kvtier::sweep::point_count(sweep.spec) == 3);
  CHECK(kvtier::sweep::point_coordinates(sweep.spec, 2) == std::vector<std::uint32_t>{2, 2});
  CHECK(kvtier::sweep::point_values(sweep.spec, 1) == std::vector<std::string>{"2", "6"});
  CHECK_THAT(
      joined(problems(spec_text(
          axis("seed", {"1", "2"}) + axis("workload.closed_loop.concurrency", {"1"}), "ZIP"))),
      Catch::Contains("ZIP sweeps need axes of equal length"));
}

TEST_CASE("sweep: a ZIP's values of ~ remove a field, so points can switch between forms",
          "[sweep]") {
  // Acceptance given as one rate at the first point, by position at the second: each point
  // removes the form it does not use.
  const auto speculating = [](const std::string& axes) {
    std::string text = spec_text(axes, "ZIP");
    const std::string engine = "engine { iteration_overhead_us: 1000 }";
    text.replace(text.find(engine), engine.size(),
                 "engine { iteration_overhead_us: 1000 speculative { draft_tokens: 2 "
                 "acceptance_rate: 0.7 draft_layers: 1 } }");
    return text;
  };
  const Sweep sweep =
      load(speculating(axis("engine.speculative.acceptance_rate", {"0.8", "~"}) +
                       axis("engine.speculative.acceptance_by_position", {"~", "0.9,0.6"})));
  const auto rate = kvtier::sweep::point_run(sweep, 0, kvtier::test::loader());
  CHECK(rate.engine().speculative().acceptance_rate() == 0.8);
  CHECK(rate.engine().speculative().acceptance_by_position_size() == 0);
  const auto by_position = kvtier::sweep::point_run(sweep, 1, kvtier::test::loader());
  CHECK_FALSE(by_position.engine().speculative().has_acceptance_rate());
  CHECK(by_position.engine().speculative().acceptance_by_position_size() == 2);
  // An axis setting a field under one that another axis removes is refused: their order would
  // decide.
  CHECK_THAT(joined(problems(speculating(axis("engine.speculative", {"~", "~"}) +
                                         axis("engine.speculative.draft_tokens", {"1", "2"})))),
             Catch::Contains("axis[0].values") &&
                 Catch::Contains("axis[1] sets engine.speculative.draft_tokens under it"));
  // A point left with neither form is refused before the sweep runs.
  CHECK_THAT(joined(problems(speculating(axis("engine.speculative.acceptance_rate", {"0.8", "~"}) +
                                         axis("seed", {"1", "2"})))),
             Catch::Contains("ZIP point 1") && Catch::Contains("acceptance_rate"));
}

TEST_CASE("sweep: a sweep is refused before it runs when an axis value or a policy is wrong",
          "[sweep]") {
  CHECK_THAT(joined(problems(spec_text(axis("seed", {"1"}) + axis("seed", {"2"})))),
             Catch::Contains("also swept by axis[0]"));
  CHECK_THAT(joined(problems(spec_text(axis("policy", {"tiered:hbmm=0.5"})))),
             Catch::Contains("axis[0].values[0]") && Catch::Contains("hbmm"));
  CHECK_THAT(joined(problems(spec_text(axis("policy", {"tiered:hbm=2"})))),
             Catch::Contains("policy axis value 'tiered:hbm=2'"));
  CHECK_THAT(joined(problems(spec_text(axis("policy", {"nosuch"})))),
             Catch::Contains("unknown policy 'nosuch'"));
  CHECK_THAT(joined(problems(spec_text(axis("seed", {"1"}), "GRID",
                                       "compare { name: \"h2o\" param { name: \"bugdet\" "
                                       "integer: 4 } }"))),
             Catch::Contains("base.compare[0]"));
  CHECK_THAT(joined(problems(spec_text(axis("workload.closed_loop.concurrency", {"0"})))),
             Catch::Contains("axis[0].values[0]"));
  // A tier policy needs the tiering block, which this base lacks.
  std::string no_tiering = spec_text(axis("policy", {"tiered"}));
  const auto begin = no_tiering.find("  tiering {");
  no_tiering.erase(begin, no_tiering.find('\n', begin) - begin);
  CHECK_THAT(joined(problems(no_tiering)),
             Catch::Contains("makes an invalid run") && Catch::Contains("tiering"));
  CHECK(problems(spec_text(axis("policy", {"full", "tiered:hbm=0.25,evict=0.1"}))).empty());
  // In a ZIP the policy goes with the point's other values: here the tiering block it needs.
  std::string zip = spec_text(axis("policy", {"full", "tiered"}) +
                                  axis("tiering.synthetic_pattern", {"chat", "reasoning"}) +
                                  axis("tiering.prefetch_lookahead_layers", {"1", "1"}) +
                                  axis("tiering.host_allocation", {"PINNED", "PINNED"}) +
                                  axis("tiering.copy_method", {"COPY_ENGINES", "COPY_ENGINES"}),
                              "ZIP");
  const auto zip_begin = zip.find("  tiering {");
  zip.erase(zip_begin, zip.find('\n', zip_begin) - zip_begin);
  CHECK(problems(zip).empty());
}

TEST_CASE("sweep: a policy a point would run twice is refused before the sweep runs", "[sweep]") {
  const std::string streaming = "compare { name: \"streaming\" }";
  // The base's policy compared again.
  CHECK_THAT(joined(problems(spec_text(axis("seed", {"1"}), "GRID", "compare { name: \"full\" }"))),
             Catch::Contains("policy 'full' is given twice (base.policy and base.compare[0])"));
  // Two compared policies written the same way.
  CHECK_THAT(joined(problems(spec_text(axis("seed", {"1"}), "GRID", streaming + " " + streaming))),
             Catch::Contains("(base.compare[0] and base.compare[1])"));
  // A policy axis value that is also compared, and one the axis names twice.
  CHECK_THAT(joined(problems(spec_text(axis("policy", {"full", "streaming"}), "GRID", streaming))),
             Catch::Contains("policy 'streaming' is given twice (base.compare[0] and "
                             "axis[0].values[1])"));
  CHECK_THAT(
      joined(problems(spec_text(axis("policy", {"h2o:budget=64", "full", "h2o:budget=64"})))),
      Catch::Contains("(axis[0].values[0] and axis[0].values[2])"));
  // With a policy axis the base's own policy is not run, so comparing it is no repeat.
  CHECK(problems(spec_text(axis("policy", {"streaming"}), "GRID", "compare { name: \"full\" }"))
            .empty());
}

TEST_CASE("sweep: a policy axis sets the run's policy, and compare policies add rows", "[sweep]") {
  const Sweep sweep =
      load(spec_text(axis("policy", {"full", "tiered:hbm=0.5,evict=0.1,delta=8,recent=16"}), "GRID",
                     "compare { name: \"streaming\" }"));
  kvtier::serving::DemandMemo memo;
  const auto full = kvtier::sweep::simulate_point(sweep, 0, kvtier::test::loader(), memo);
  REQUIRE(full.size() == 2);
  CHECK(full[0].policy == "full");
  CHECK_THAT(full[1].policy, Catch::StartsWith("streaming:"));
  const auto tiered = kvtier::sweep::simulate_point(sweep, 1, kvtier::test::loader(), memo);
  REQUIRE(tiered.size() == 2);
  CHECK_THAT(tiered[0].policy, Catch::StartsWith("tiered:hbm=0.5,evict=0.1,"));
  CHECK(tiered[0].axis_values ==
        std::vector<std::string>{"tiered:hbm=0.5,evict=0.1,delta=8,recent=16"});
  CHECK(tiered[0].error.empty());
  CHECK(metric(full[0], "hbm_saved_peak_gib") == "0");
  CHECK(std::stod(metric(tiered[0], "hbm_saved_peak_gib")) > 0.0);
  CHECK(metric(tiered[0], "requests_completed") == "4");
}

TEST_CASE("sweep: points share replay demands through one memo", "[sweep]") {
  const Sweep sweep = load(spec_text(axis("workload.closed_loop.concurrency", {"1", "2", "4"}) +
                                     axis("policy", {"tiered:hbm=0.5,evict=0.1"})));
  kvtier::serving::DemandMemo memo;
  for (std::uint64_t point = 0; point < 3; ++point) {
    const auto rows = kvtier::sweep::simulate_point(sweep, point, kvtier::test::loader(), memo);
    REQUIRE(rows.size() == 1);
    CHECK(rows[0].error.empty());
  }
  // The batch does not change the requests' lengths: one synthetic replay serves all points.
  CHECK(memo.size() == 1);
}

TEST_CASE("sweep: points that cannot run give rows with the error, not a failed sweep", "[sweep]") {
  // Llama-3.1-70B's weights do not fit one H100.
  const Sweep sweep = load(spec_text(axis("model.preset", {"Llama-3.1-8B", "Llama-3.1-70B"}),
                                     "GRID", "compare { name: \"streaming\" }"));
  kvtier::serving::DemandMemo memo;
  const auto fits = kvtier::sweep::simulate_point(sweep, 0, kvtier::test::loader(), memo);
  REQUIRE(fits.size() == 2);
  CHECK(fits[0].error.empty());
  const auto too_big = kvtier::sweep::simulate_point(sweep, 1, kvtier::test::loader(), memo);
  REQUIRE(too_big.size() == 2);
  CHECK(!too_big[0].error.empty());
  CHECK(too_big[0].metrics.empty());
  CHECK(too_big[0].policy == "full");
  CHECK(too_big[1].policy.rfind("streaming", 0) == 0);
  CHECK(too_big[1].error == too_big[0].error);
}

TEST_CASE("sweep: the default demand cache goes to runs with a tiering block only", "[sweep]") {
  const Sweep sweep = load(spec_text(axis("seed", {"1"})));
  const auto run = kvtier::sweep::point_run(sweep, 0, kvtier::test::loader(), "OUT/demand-cache");
  CHECK(run.tiering().demand_cache_directory() == "OUT/demand-cache");
  std::string no_tiering = spec_text(axis("seed", {"1"}));
  const auto begin = no_tiering.find("  tiering {");
  no_tiering.erase(begin, no_tiering.find('\n', begin) - begin);
  const auto plain =
      kvtier::sweep::point_run(load(no_tiering), 0, kvtier::test::loader(), "OUT/demand-cache");
  CHECK(!plain.has_tiering());
}

TEST_CASE("sweep: point files round-trip commas, quotes and missing metrics", "[sweep]") {
  const std::vector<std::string> columns{"model.preset", "policy_axis"};
  const std::vector<Row> rows = {
      {3, {"a,b", "tiered:hbm=0.5,evict=0.1"}, "tiered:hbm=0.5", "", {{"x", "1"}, {"y", "2.5"}}},
      {3, {"a,b", "tiered:hbm=0.5,evict=0.1"}, "full", "said \"no\", twice", {{"y", "1e-06"}}},
  };
  const fs::path folder = fresh_folder("point-file");
  fs::create_directories(folder);
  {
    std::ofstream out(folder / "3.csv", std::ios::binary);
    out << kvtier::sweep::point_file_csv(rows, columns);
  }
  const auto back = kvtier::sweep::read_point_file(folder / "3.csv", columns);
  REQUIRE(back.size() == 2);
  CHECK(back[0].axis_values == rows[0].axis_values);
  CHECK(back[0].metrics == rows[0].metrics);
  CHECK(back[1].error == rows[1].error);
  CHECK(back[1].metrics == rows[1].metrics);
  // A truncated file is refused, not half read.
  const std::string whole = slurp(folder / "3.csv");
  {
    std::ofstream out(folder / "3.csv", std::ios::binary | std::ios::trunc);
    out << whole.substr(0, whole.size() - 5);
  }
  CHECK_THROWS_AS(kvtier::sweep::read_point_file(folder / "3.csv", columns), kvtier::DataError);
  CHECK_THROWS_AS(kvtier::sweep::read_point_file(folder / "3.csv", std::vector<std::string>{"z"}),
                  kvtier::DataError);
  fs::remove_all(folder);
}

TEST_CASE("sweep: metric columns keep the simulator's order when rows lack some", "[sweep]") {
  std::vector<Row> rows = {
      {1, {}, "full", "", {{"a", "1"}, {"c", "3"}}},
      {0, {}, "full", "", {{"a", "1"}, {"b", "2"}, {"c", "3"}, {"d", "4"}}},
      {2, {}, "full", "boom", {}},
  };
  const auto table = kvtier::sweep::make_table("t", "hash", {}, rows);
  CHECK(table.metric_columns == std::vector<std::string>{"a", "b", "c", "d"});
  CHECK(table.rows.front().point == 0);
  CHECK(kvtier::sweep::results_csv(table) ==
        "point,policy,error,a,b,c,d\n0,full,,1,2,3,4\n1,full,,1,,3,\n2,full,boom,,,,\n");
  // The first row (by point) lacking some: each later name goes after the one before it.
  const std::vector<Row> sparse_first = {
      {0, {}, "full", "", {{"a", "1"}, {"c", "3"}}},
      {1, {}, "full", "", {{"a", "1"}, {"b", "2"}, {"c", "3"}, {"d", "4"}}},
  };
  CHECK(kvtier::sweep::make_table("t", "hash", {}, sparse_first).metric_columns ==
        std::vector<std::string>{"a", "b", "c", "d"});
}

TEST_CASE("sweep: results are the same bytes for any number of threads", "[sweep]") {
  const Sweep sweep = load(spec_text(kGridAxes));
  const fs::path one = fresh_folder("jobs1");
  const fs::path two = fresh_folder("jobs2");
  RunOptions options;
  options.out = one;
  std::vector<kvtier::sweep::Progress> reports;
  options.progress = [&](const kvtier::sweep::Progress& progress) { reports.push_back(progress); };
  const auto summary = kvtier::sweep::run_sweep(sweep, kvtier::test::loader(), options);
  REQUIRE(!reports.empty());
  CHECK(reports.back().done == 12);
  CHECK(reports.back().total == 12);
  CHECK(summary.total_points == 12);
  CHECK(summary.computed == 12);
  CHECK(summary.failed_points == 0);
  REQUIRE(summary.table.rows.size() == 12);
  (void)run_into(sweep, two, 2);
  const std::string csv = slurp(one / "results.csv");
  CHECK(csv == slurp(two / "results.csv"));
  CHECK(slurp(one / "results.h5") == slurp(two / "results.h5"));
  CHECK(slurp(one / "results.html") == slurp(two / "results.html"));
  CHECK(csv == kvtier::sweep::results_csv(summary.table));
  CHECK_THAT(csv, Catch::StartsWith("point,workload.closed_loop.concurrency,policy_axis,"
                                    "workload.closed_loop.output_tokens.fixed_tokens,policy,"
                                    "error,requests_completed,"));
  // Rows in point order, each point's values as the odometer gives them.
  CHECK(summary.table.rows[5].point == 5);
  CHECK(summary.table.rows[5].axis_values == std::vector<std::string>{"2", "full", "32"});
  fs::remove_all(one);
  fs::remove_all(two);
}

TEST_CASE("sweep: results.h5 holds one dataset per column and the spec's identity", "[sweep]") {
  const Sweep sweep = load(spec_text(axis("workload.closed_loop.concurrency", {"1", "2"})));
  const fs::path out = fresh_folder("h5");
  const auto summary = run_into(sweep, out);
  const hid_t file = H5Fopen((out / "results.h5").c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  REQUIRE(file >= 0);
  for (const std::string& column : summary.table.columns()) {
    INFO(column);
    CHECK(H5Lexists(file, column.c_str(), H5P_DEFAULT) > 0);
  }
  const hid_t dataset = H5Dopen2(file, "throughput_output_tokens_per_s", H5P_DEFAULT);
  REQUIRE(dataset >= 0);
  std::vector<double> values(2);
  REQUIRE(H5Dread(dataset, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()) >= 0);
  CHECK(values[0] == std::stod(metric(summary.table.rows[0], "throughput_output_tokens_per_s")));
  CHECK(values[1] > values[0]);  // two requests at a time beat one
  H5Dclose(dataset);
  CHECK(H5Aexists(file, "name") > 0);
  CHECK(H5Aexists(file, "kvtier_version") > 0);
  H5Fclose(file);
  fs::remove_all(out);
}

TEST_CASE("sweep: an interrupted sweep resumes and ends with the same results", "[sweep]") {
  const Sweep sweep = load(spec_text(kGridAxes));
  const fs::path fresh = fresh_folder("resume-fresh");
  const fs::path resumed = fresh_folder("resume");
  (void)run_into(sweep, fresh, 2);
  (void)run_into(sweep, resumed, 1);
  // A kill: some points lost, a temporary file left behind, one point file damaged.
  fs::remove(resumed / "points" / "3.csv");
  fs::remove(resumed / "points" / "10.csv");
  fs::remove(resumed / "results.csv");
  fs::remove(resumed / "results.h5");
  for (const fs::path& stray_path :
       {resumed / "points" / "4.csv.tmp.99999", resumed / ".tmp" / "99999-0" / "5.csv.tmp"}) {
    fs::create_directories(stray_path.parent_path());
    std::ofstream stray(stray_path, std::ios::binary);
    stray << "point,half a line";
  }
  const std::string whole = slurp(resumed / "points" / "7.csv");
  {
    std::ofstream damaged(resumed / "points" / "7.csv", std::ios::binary | std::ios::trunc);
    damaged << whole.substr(0, whole.size() / 2);
  }
  const auto summary = run_into(sweep, resumed, 2);
  CHECK(summary.resumed == 9);
  CHECK(summary.replaced == 1);
  CHECK(summary.computed == 3);
  CHECK(slurp(resumed / "results.csv") == slurp(fresh / "results.csv"));
  CHECK(slurp(resumed / "results.h5") == slurp(fresh / "results.h5"));
  // A finished sweep run again computes nothing.
  CHECK(run_into(sweep, resumed).computed == 0);
  fs::remove_all(fresh);
  fs::remove_all(resumed);
}

TEST_CASE("sweep: a folder holding another spec's points is refused", "[sweep]") {
  const fs::path out = fresh_folder("mismatch");
  (void)run_into(load(spec_text(axis("seed", {"1", "2"}))), out);
  try {
    (void)run_into(load(spec_text(axis("seed", {"1", "3"}))), out);
    FAIL("a different spec ran in the same folder");
  } catch (const kvtier::ConfigError& error) {
    CHECK_THAT(std::string(error.what()), Catch::Contains("another sweep spec"));
    CHECK_THAT(error.where(), Catch::Contains("sweep.json"));
  }
  // Point files without a manifest are not trusted either.
  fs::remove(out / "sweep.json");
  CHECK_THROWS_AS(run_into(load(spec_text(axis("seed", {"1", "2"}))), out), kvtier::ConfigError);
  fs::remove_all(out);
}

TEST_CASE("sweep: shards merged equal the unsharded sweep, and gaps and strangers are refused",
          "[sweep]") {
  const Sweep sweep = load(spec_text(kGridAxes));
  const fs::path whole = fresh_folder("unsharded");
  (void)run_into(sweep, whole, 1);
  std::vector<fs::path> shards;
  for (std::uint64_t k = 0; k < 3; ++k) {
    shards.push_back(fresh_folder("shard" + std::to_string(k)));
    const auto summary = run_into(sweep, shards.back(), 1, {k, 3});
    CHECK(summary.selected == 4);
    for (const Row& row : summary.table.rows) {
      CHECK(row.point % 3 == k);
    }
  }
  const fs::path merged = fresh_folder("merged");
  const auto table = kvtier::sweep::merge_sweeps(shards, merged);
  CHECK(table.rows.size() == 12);
  CHECK(slurp(merged / "results.csv") == slurp(whole / "results.csv"));
  CHECK(slurp(merged / "results.h5") == slurp(whole / "results.h5"));
  CHECK(slurp(merged / "results.html") == slurp(whole / "results.html"));

  const std::vector<fs::path> two(shards.begin(), shards.begin() + 2);
  try {
    (void)kvtier::sweep::merge_sweeps(two, fresh_folder("merged-gap"));
    FAIL("merged with points missing");
  } catch (const kvtier::ConfigError& error) {
    CHECK_THAT(std::string(error.what()), Catch::Contains("missing points 2, 5, 8, 11 (4 of 12)"));
  }
  const fs::path stranger = fresh_folder("stranger");
  (void)run_into(load(spec_text(axis("seed", {"1"}))), stranger);
  const std::vector<fs::path> mixed{shards[0], stranger};
  CHECK_THROWS_AS(kvtier::sweep::merge_sweeps(mixed, fresh_folder("merged-mixed")),
                  kvtier::ConfigError);
  for (const fs::path& folder : shards) {
    fs::remove_all(folder);
  }
  fs::remove_all(whole);
  fs::remove_all(merged);
  fs::remove_all(stranger);
}

TEST_CASE("sweep: shards parse as K/N", "[sweep]") {
  CHECK(kvtier::sweep::parse_shard("2/5").index == 2);
  CHECK(kvtier::sweep::parse_shard("2/5").count == 5);
  for (const char* bad : {"5/5", "1", "a/2", "1/0", "-1/3", "1/2x", "", "1/-1", " 1/2", "1/ 2",
                          "/2", "1/", "1/99999999999999999999"}) {
    INFO(bad);
    CHECK_THROWS_AS(kvtier::sweep::parse_shard(bad), kvtier::ConfigError);
  }
}

TEST_CASE("sweep: a compared policy that does not fit has the error while the point's others run",
          "[sweep]") {
  // Leave 18 MiB for KV: a request of 160 tokens needs 20 MiB whole, 16.5 MiB with its last 28
  // generated tokens on the host.
  const Sweep probe = load(spec_text(axis("policy", {"full"})));
  std::map<std::string, double> roomy;
  for (const auto& metric : kvtier::serving::simulate(probe.spec.base()).metrics) {
    roomy[metric.name] = metric.value;
  }
  const double reserve =
      roomy.at("hbm_reserve_gib") + roomy.at("hbm_kv_capacity_gib") - 18.0 / 1024;
  const Sweep sweep =
      load(spec_text(axis("policy", {"tiered:hbm=0,evict=0,delta=1,sinks=0,recent=4"}) +
                         axis("memory.runtime_reserve_gib", {std::to_string(reserve)}),
                     "GRID", "compare { name: \"full\" }"));
  kvtier::serving::DemandMemo memo;
  const auto rows = kvtier::sweep::simulate_point(sweep, 0, kvtier::test::loader(), memo);
  REQUIRE(rows.size() == 2);
  CHECK(rows[0].error.empty());
  CHECK(metric(rows[0], "requests_completed") == "4");
  CHECK(rows[1].policy == "full");
  CHECK_THAT(rows[1].error, Catch::Contains("GiB of KV per GPU"));
  CHECK(rows[1].metrics.empty());
}

TEST_CASE("sweep: a figure a policy has no value for is left out of its row", "[sweep]") {
  // The host's recodes of a T2 policy, not timed (no tiering.host_recode): counted, no time.
  // A longer run than the base's, so that T2 tokens come back to T1.
  const Sweep sweep =
      load(spec_text(axis("policy", {"tiered:hbm=0.5,evict=0.1,compress=0.3,delta=8,recent=16",
                                     "tiered:hbm=0.5,evict=0.1,delta=8,recent=16"}) +
                     axis("workload.closed_loop.output_tokens.fixed_tokens", {"512"})));
  kvtier::serving::DemandMemo memo;
  const auto recoding = kvtier::sweep::simulate_point(sweep, 0, kvtier::test::loader(), memo);
  REQUIRE(recoding.size() == 1);
  CHECK(std::stod(metric(recoding[0], "host_recode_gb")) > 0.0);
  CHECK(metric(recoding[0], "host_recode_s").empty());  // absent, not "nan"
  CHECK(metric(recoding[0], "host_recode_stall_s").empty());
  const auto none = kvtier::sweep::simulate_point(sweep, 1, kvtier::test::loader(), memo);
  REQUIRE(none.size() == 1);
  CHECK(metric(none[0], "host_recode_s") == "0");
}
