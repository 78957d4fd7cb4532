#pragma once
// What-if grids: a SweepSpec (a base RunSpec and axes of values, configs/schema/sweep.proto)
// expanded into points, each simulated with every policy of its run, on threads, into a table
// written as CSV and HDF5, and charted in an HTML page (docs/SWEEPS.md).
//
// A sweep folder (OUT) holds sweep.json (the spec's identity), points/<index>.csv (one file per
// finished point, written under a temporary name and renamed, so a killed run leaves only whole
// points), demand-cache/ (replay demands, unless the base names a folder) and, at the end,
// results.csv, results.h5 and results.html, assembled from the point files in point order.
// Results never depend on the thread count or on how often the sweep was interrupted.

#include <cstdint>
#include <filesystem>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "configs/loader.hpp"
#include "configs/locations.hpp"
#include "configs/schema/run.pb.h"
#include "configs/schema/sweep.pb.h"

namespace kvtier::serving {
class DemandMemo;
}  // namespace kvtier::serving

namespace kvtier::sweep {

// An axis with this path takes policy strings ("tiered:hbm=0.5,evict=0.1") for run.policy.
inline constexpr std::string_view kPolicyAxis = "policy";
inline constexpr std::string_view kSchema = "kvtier.sweep.v1";

// A loaded, validated sweep.
struct Sweep {
  config::SweepSpec spec;                 // base presets resolved
  config::LocationMap base_locations;     // positions of the base's values, RunSpec paths
  std::filesystem::path file;             // relative paths in the base are relative to its folder
  std::string hash;                       // identity of the resolved spec (32 hex digits)
  std::vector<std::string> axis_columns;  // one column name per axis
};

// Loads and validates a SweepSpec (`overrides` apply to the SweepSpec: base.seed=2). Beyond
// config::validate, checks what configs/ cannot: every policy string of a `policy` axis (its
// syntax and parameters against the policy registry, and the base run with it), the policies
// the base names, and that the spec has at most kMaxSweepPoints points. InvalidConfig listing
// every problem.
[[nodiscard]] Sweep load_sweep(const std::string& path, const config::ConfigLoader& loader,
                               std::span<const config::Override> overrides = {});
[[nodiscard]] Sweep load_sweep_text(std::string_view text, const std::string& file_name,
                                    const config::ConfigLoader& loader,
                                    std::span<const config::Override> overrides = {});

// The most points a sweep spec may have. Every point is a serving simulation with a file of its
// own and a row of the results held in memory: a million is days of work, and anything larger
// is a typo or wants splitting into sweeps that can run (and fail) on their own.
inline constexpr std::uint64_t kMaxSweepPoints = 1'000'000;

// GRID: the product of the axes' lengths; ZIP: the common length.
[[nodiscard]] std::uint64_t point_count(const config::SweepSpec& spec);
// The value index of each axis at `point`: GRID counts like an odometer whose last axis varies
// fastest; ZIP takes the point-th value of every axis.
[[nodiscard]] std::vector<std::uint32_t> point_coordinates(const config::SweepSpec& spec,
                                                           std::uint64_t point);
[[nodiscard]] std::vector<std::string> point_values(const config::SweepSpec& spec,
                                                    std::uint64_t point);

// The run of one point: the base with the point's values applied (`--set` overrides, policy
// strings for the policy axis), request files and traces found relative to the spec's folder,
// and `demand_cache` as tiering.demand_cache_directory when the run has a tiering block
// naming none (empty: left alone). InvalidConfig when the combination is not a valid run.
[[nodiscard]] config::RunSpec point_run(const Sweep& sweep, std::uint64_t point,
                                        const config::ConfigLoader& loader,
                                        const std::filesystem::path& demand_cache = {});

// The metrics a sweep's table prints and its report charts (results.csv has them all), with
// the decimals a table gives them, what they measure and their unit.
struct HeadlineMetric {
  std::string_view name;
  int decimals;
  std::string_view title;
  std::string_view unit;
};
inline constexpr HeadlineMetric kHeadlineMetrics[] = {
    {"plan_max_batch", 0, "Largest batch within the SLOs", "requests"},
    {"plan_max_requests_per_s", 3, "Largest arrival rate within the SLOs", "requests/s"},
    {"plan_cluster_max_requests_per_s", 3, "Largest arrival rate to the cluster within the SLOs",
     "requests/s"},
    {"plan_output_tokens_per_s_per_gpu", 1, "Output tokens per second per GPU within the SLOs",
     "tokens/s"},
    {"plan_gpus", 0, "GPUs that serve the target", "GPUs"},
    {"throughput_output_tokens_per_s", 1, "Output tokens per second", "tokens/s"},
    {"ttft_p99_ms", 1, "Time to first token, p99", "ms"},
    {"tpot_p50_ms", 2, "Time per output token, p50", "ms"},
    {"hbm_peak_gib", 2, "HBM per GPU at the peak", "GiB"},
    {"hbm_saved_peak_gib", 2, "HBM saved against the full cache, at the peak", "GiB"},
    {"pcie_h2d_utilisation", 3, "PCIe host-to-device utilisation", "fraction of the link"},
    {"attention_mass_kept_mean", 4, "Attention mass kept, mean", "fraction"},
    {"largest_batch_that_fits", 0, "Largest batch that fits", "requests"},
};

// One row of results: one policy of one point.
struct Row {
  std::uint64_t point = 0;
  std::vector<std::string> axis_values;
  std::string policy;  // canonical when it ran, as written when it could not
  std::string error;   // why the point could not run; empty when it ran
  // Metric name and value as its shortest round-trip text (common/text_output.hpp).
  std::vector<std::pair<std::string, std::string>> metrics;
};

// Simulates one point with every policy of its run (serving::simulate_all), sharing `memo`; with
// SweepSpec.plan, plans it instead (plan_point.hpp: plan_* figures, then the metrics at the
// planned load).
// A point that is not a valid run or that the simulator refuses (a ConfigError: the model does
// not fit, a request outlives its trace) gives one row per policy carrying the error, so that a
// grid may cross combinations that do not fit; other errors (bad trace data) propagate.
[[nodiscard]] std::vector<Row> simulate_point(const Sweep& sweep, std::uint64_t point,
                                              const config::ConfigLoader& loader,
                                              serving::DemandMemo& memo,
                                              const std::filesystem::path& demand_cache = {});

// Rows of a whole sweep (or shard) in point order, with the union of their metric columns in
// the order the simulator reports them.
struct ResultTable {
  std::string name;
  std::string spec_hash;
  std::string kvtier_version;
  std::vector<std::string> axis_columns;
  std::vector<std::string> metric_columns;
  std::vector<Row> rows;
  // point, axis columns, policy, error, metric columns.
  [[nodiscard]] std::vector<std::string> columns() const;
};

[[nodiscard]] ResultTable make_table(std::string name, std::string spec_hash,
                                     std::vector<std::string> axis_columns, std::vector<Row> rows);

// RFC 4180: a header, then one line per row; missing metrics are empty cells.
[[nodiscard]] std::string results_csv(const ResultTable& table);
// {"schema": "kvtier.sweep.v1", "name", "kvtier_version", "spec_hash", "columns", "rows": [...]}
[[nodiscard]] std::string results_json(const ResultTable& table);
// One dataset per column at the root (uint64 point, UTF-8 strings for axes, policy and error,
// float64 metrics with NaN where missing); root attributes schema, name, kvtier_version,
// spec_hash and columns (the column order). Written under hdf5_mutex to a temporary name and
// renamed; no timestamps, so the same table gives the same bytes.
void write_results_h5(const std::filesystem::path& path, const ResultTable& table);

// Reads one point file back (DataError when it is not a point file of `axis_columns`).
[[nodiscard]] std::vector<Row> read_point_file(const std::filesystem::path& path,
                                               std::span<const std::string> axis_columns);
[[nodiscard]] std::string point_file_csv(std::span<const Row> rows,
                                         std::span<const std::string> axis_columns);

struct Shard {
  std::uint64_t index = 0;
  std::uint64_t count = 1;
};
// "K/N" with 0 <= K < N; ConfigError otherwise.
[[nodiscard]] Shard parse_shard(const std::string& text);

struct Progress {
  std::uint64_t done = 0;     // points of this run finished, resumed ones included
  std::uint64_t total = 0;    // points of this run (the shard's)
  std::uint64_t resumed = 0;  // found finished in OUT
  double elapsed_s = 0.0;
  double eta_s = -1.0;  // negative until a point has been computed
};

struct RunOptions {
  std::filesystem::path out;
  unsigned jobs = 1;
  Shard shard;
  // Called on the calling thread a few times a second while points run, and once at the end.
  std::function<void(const Progress&)> progress;
};

struct RunSummary {
  std::uint64_t total_points = 0;  // of the whole sweep
  std::uint64_t selected = 0;      // of this shard
  std::uint64_t resumed = 0;       // found finished in the folder
  std::uint64_t replaced = 0;      // found damaged in the folder, computed again
  std::uint64_t computed = 0;
  std::uint64_t failed_points = 0;  // points whose rows carry an error
  ResultTable table;                // the selected points
};

// Runs the sweep into options.out: refuses (ConfigError) a folder holding another spec's
// points, skips points already finished there, computes the rest on `jobs` threads with one
// DemandMemo, and writes results.csv, results.h5 and results.html for the selected points.
[[nodiscard]] RunSummary run_sweep(const Sweep& sweep, const config::ConfigLoader& loader,
                                   const RunOptions& options);

// Combines the point files of shard folders into results.csv, results.h5, results.html and
// sweep.json in `out`. ConfigError when the folders hold different specs or some points are in
// none of them (naming which).
[[nodiscard]] ResultTable merge_sweeps(std::span<const std::filesystem::path> folders,
                                       const std::filesystem::path& out);

// "0.1.0": what sweep.json and results.h5 record, and what a resumed run must match.
[[nodiscard]] std::string kvtier_version();

}  // namespace kvtier::sweep
