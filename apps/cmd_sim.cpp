// `kvtier sim [RUN] [--set ...] [--format table|json|csv] [--out DIR]`: the serving simulation.

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <iostream>
#include <optional>
#include <utility>

#include "apps/cli.hpp"
#include "common/atomic_file.hpp"
#include "common/errors.hpp"
#include "common/text_output.hpp"
#include "configs/parse.hpp"
#include "configs/schema/run.pb.h"
#include "configs/validate.hpp"
#include "serving/memory_plan.hpp"
#include "serving/simulation.hpp"

namespace kvtier::app {

namespace po = boost::program_options;

namespace {

// What `--out` (or outputs.directory) receives.
constexpr std::initializer_list<const char*> kReportFiles = {
    "report.json", "metrics.csv", "timeseries.csv", "engines.csv", "report.html"};

// A cluster's engines in the table: these of each engine's metrics, for the first policy that
// ran.
constexpr std::initializer_list<const char*> kEngineColumns = {
    "requests_routed",   "ttft_p99_ms",           "tpot_p99_ms",          "queue_wait_p99_ms",
    "gpu_busy_fraction", "prefix_cache_hit_rate", "hbm_kv_used_peak_gib", "preemptions"};

constexpr const char* kDefaultRun = "configs/examples/quickstart.textproto";

// The default config: relative to the working directory, else in the source tree built from.
std::string default_run_file() {
  const std::filesystem::path candidates[] = {
      std::filesystem::path(kDefaultRun), std::filesystem::path(KVTIER_SOURCE_DIR) / kDefaultRun};
  for (const auto& candidate : candidates) {
    if (std::filesystem::exists(candidate)) {
      return candidate.string();
    }
  }
  throw ConfigError("no RUN file given and the default config is missing", kDefaultRun);
}

void print_table(std::ostream& out, const std::vector<serving::SimulationReport>& reports,
                 const config::RunSpec& run, const std::string& file) {
  out << "kvtier sim: " << file << "\n  " << run.model().name() << " on "
      << run.hardware().node().gpu().name() << " (" << run.hardware().node().name() << "), "
      << serving::describe_engines(run) << ", seed " << run.seed()
      << "\n  workload: " << reports.front().workload << "\n";
  std::vector<std::string> header{"metric"};
  std::vector<bool> right{false};
  const std::vector<std::string> policies = serving::policy_names(run);
  for (std::size_t i = 0; i < reports.size(); ++i) {
    header.push_back(policies[i]);
    right.push_back(true);
    out << "  policy " << header.back() << ": " << reports[i].policy << "\n";
    for (const std::string& note : reports[i].notes) {
      out << "    note: " << note << "\n";
    }
  }
  out << "\n";
  TextTable table(header, right);
  for (std::size_t m = 0; m < reports.front().metrics.size(); ++m) {
    std::vector<std::string> row{reports.front().metrics[m].name};
    for (const auto& report : reports) {
      const double value = report.metrics[m].value;
      row.push_back(std::isnan(value) ? "-" : format_fixed(value, report.metrics[m].decimals));
    }
    table.add_row(row);
  }
  table.render(out);
  const auto ran = std::find_if(reports.begin(), reports.end(),
                                [](const auto& report) { return !report.engines.empty(); });
  if (ran == reports.end()) {
    return;
  }
  out << "\n  engines of policy " << ran->policy << ":\n";
  std::vector<std::string> engine_header{"engine"};
  std::vector<bool> engine_right{true};
  for (const char* column : kEngineColumns) {
    engine_header.emplace_back(column);
    engine_right.push_back(true);
  }
  TextTable engines(engine_header, engine_right);
  for (std::size_t e = 0; e < ran->engines.size(); ++e) {
    std::vector<std::string> row{std::to_string(e)};
    for (const char* column : kEngineColumns) {
      const serving::Metric* metric = serving::find_metric(ran->engines[e], column);
      row.push_back(metric == nullptr || std::isnan(metric->value)
                        ? "-"
                        : format_fixed(metric->value, metric->decimals));
    }
    engines.add_row(row);
  }
  engines.render(out);
}

// --policy, --trace, --extend, --compare and --cache-dir: edits of the loaded run, checked
// like the file itself.
void apply_tier_options(const po::variables_map& values, config::RunSpec& run,
                        const std::string& file) {
  // They edit the run's tiering block; made up here, its required fields would be reported
  // missing from the config file.
  for (const char* option : {"trace", "extend", "cache-dir"}) {
    if (values.count(option) != 0U && !run.has_tiering()) {
      throw ConfigError("--" + std::string(option) +
                            " edits the run's tiering block, which this run lacks: add one "
                            "(docs/SIMULATION.md, \"Tier-aware simulation\")",
                        file);
    }
  }
  apply_policy_options(values, run);
  if (values.count("trace") != 0U) {
    run.mutable_tiering()->clear_traces();
    for (const std::string& trace : values["trace"].as<std::vector<std::string>>()) {
      run.mutable_tiering()->add_traces(trace);
    }
  }
  if (values.count("extend") != 0U) {
    const std::string extend = values["extend"].as<std::string>();
    if (extend != "synthetic" && extend != "none") {
      throw ConfigError("unknown --extend '" + extend + "': expected synthetic or none");
    }
    run.mutable_tiering()->set_extend_synthetic(extend == "synthetic");
  }
  if (values.count("cache-dir") != 0U) {
    run.mutable_tiering()->set_demand_cache_directory(values["cache-dir"].as<std::string>());
  }
}

}  // namespace

int run_sim(const Arguments& args, Context& context) {
  po::options_description options("sim options");
  options.add_options()("run", po::value<std::string>(),
                        "RunSpec file (default: configs/examples/quickstart.textproto)")(
      "out", po::value<std::string>(),
      "also write report.json, metrics.csv, (with outputs.timeseries_interval_us) "
      "timeseries.csv, (with a cluster) engines.csv and report.html, a page with charts, into "
      "this folder (default: the run's "
      "outputs.directory), replacing them together (an earlier run's timeseries.csv or "
      "engines.csv is removed when this run has none); "
      "outputs.formats chooses among them");
  options.add_options()("format", po::value<std::string>()->default_value("table"),
                        "output: table, json, csv or html (the page report.html holds)");
  options.add_options()("policy", po::value<std::string>(),
                        "KV policy, e.g. tiered:hbm=0.5,evict=0.1 (replaces the run's policy)")(
      "compare", po::value<std::string>(),
      "policies simulated beside it, e.g. full,tiered:hbm=0.5,evict=0.1,h2o:budget=1024")(
      "trace", po::value<std::vector<std::string>>()->composing(),
      "attention trace the policy is replayed over (repeatable; replaces the run's traces)")(
      "extend", po::value<std::string>(),
      "synthetic: requests longer than their trace continue on a synthetic trace; none: error")(
      "cache-dir", po::value<std::string>(), "store and reuse replay demands here");
  add_set_option(options);
  po::positional_options_description positional;
  positional.add("run", 1);
  po::variables_map values;
  if (!parse_arguments(
          args, options, positional, values,
          "usage: kvtier sim [RUN] [--policy P] [--compare P1,P2,...] [--trace T]... "
          "[--extend synthetic] [--cache-dir DIR] [--set PATH=VALUE]... "
          "[--format table|json|csv|html] [--out DIR]\n\nSimulates continuously batched "
          "serving of RUN's workload on "
          "its hardware and reports throughput, TTFT, TPOT, HBM and host memory use, "
          "PCIe traffic and utilisation. With a tier policy, each request follows "
          "the policy's replay over an attention trace (or a synthetic one) and its "
          "T1/T2 tokens are prefetched over PCIe layer by layer; --compare puts "
          "several policies side by side. With a cluster (run.cluster), several engines serve the "
          "workload behind a router and every engine is reported too. Same config "
          "and seed, same bytes out.",
          context.out)) {
    return 0;
  }
  const std::string format = values["format"].as<std::string>();
  if (format != "table" && format != "json" && format != "csv" && format != "html") {
    throw ConfigError("unknown --format '" + format + "': expected table, json, csv or html");
  }
  if (values.count("out") != 0U) {
    check_output_folder("--out", values["out"].as<std::string>(), kReportFiles);
  }
  if (values.count("cache-dir") != 0U) {
    check_output_folder("--cache-dir", values["cache-dir"].as<std::string>());
  }
  const std::string file =
      values.count("run") != 0U ? values["run"].as<std::string>() : default_run_file();
  config::RunSpec run;
  // Validated once --policy and the other tier options have edited it: a tier policy given there
  // counts as the file's would.
  const config::LocationMap locations =
      context.loader.resolve_file(file, run, overrides_from(values));
  apply_tier_options(values, run, file);
  if (const auto problems = config::validate(run, context.loader, locations); !problems.empty()) {
    throw config::InvalidConfig(problems, locations);
  }
  check_run_policies(run, locations, &values);
  // A request file and traces are found relative to the config that names them (traces given
  // with --trace relative to the working directory).
  config::resolve_run_paths(run, file, values.count("trace") == 0U);
  // --out, else the run's own output folder.
  const std::optional<std::filesystem::path> out_folder =
      values.count("out") != 0U
          ? std::optional<std::filesystem::path>(values["out"].as<std::string>())
      : run.outputs().has_directory()
          ? std::optional<std::filesystem::path>(run.outputs().directory())
          : std::nullopt;
  if (out_folder && values.count("out") == 0U) {
    check_output_folder("outputs.directory", *out_folder, kReportFiles);
  }
  const std::vector<serving::SimulationReport> reports = serving::simulate_all(run);
  const serving::SimulationReport& report = reports.front();
  std::uint64_t cache_hits = 0;
  for (const serving::SimulationReport& each : reports) {
    cache_hits += each.demand_cache_hits;
  }
  if (cache_hits > 0) {
    // On stderr: the report is the same whether the demands were cached or replayed.
    std::cerr << "kvtier sim: " << cache_hits << " trace demand(s) read from the demand cache "
              << run.tiering().demand_cache_directory() << "\n";
  }
  const auto& formats = run.outputs().formats();
  const auto wanted = [&](config::OutputFormat kind) {
    return out_folder &&
           (formats.empty() || std::find(formats.begin(), formats.end(), kind) != formats.end());
  };
  // Each text once, for the folder and standard output alike; OutputFile holds views of them.
  const std::string json = serving::report_json(reports, run, version_line());
  const std::string metrics =
      wanted(config::CSV) || format == "csv" ? serving::report_csv(reports) : "";
  const std::string page = wanted(config::HTML) || format == "html"
                               ? serving::report_html(reports, run, version_line(), file)
                               : "";
  if (out_folder) {
    const std::filesystem::path& folder = *out_folder;
    const std::string series = report.series.empty() ? "" : serving::series_csv(report);
    const std::string engines = serving::engines_csv(reports);
    std::vector<OutputFile> files;
    if (wanted(config::HTML)) {
      files.push_back({folder / "report.html", page});
    }
    if (wanted(config::JSON)) {
      files.push_back({folder / "report.json", json});
    }
    if (wanted(config::CSV)) {
      files.push_back({folder / "metrics.csv", metrics});
      if (!series.empty()) {
        files.push_back({folder / "timeseries.csv", series});
      }
      if (!engines.empty()) {
        files.push_back({folder / "engines.csv", engines});
      }
    }
    write_files_atomically(files);
    // An earlier run's time series or engines would pass for this run's.
    for (const auto& [name, text] :
         {std::pair{"timeseries.csv", &series}, std::pair{"engines.csv", &engines}}) {
      std::error_code error;
      if (text->empty() && wanted(config::CSV) &&
          std::filesystem::is_regular_file(folder / name, error)) {
        std::filesystem::remove(folder / name, error);
      }
    }
  }
  if (format == "json") {
    context.out << json;
  } else if (format == "html") {
    context.out << page;
  } else if (format == "csv") {
    context.out << metrics;
  } else {
    print_table(context.out, reports, run, file);
  }
  return 0;
}

}  // namespace kvtier::app
