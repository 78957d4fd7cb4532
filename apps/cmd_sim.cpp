// `kvtier sim [RUN] [--set ...] [--format table|json|csv] [--out DIR]`: the serving simulation.

#include <filesystem>

#include "apps/cli.hpp"
#include "common/atomic_file.hpp"
#include "common/errors.hpp"
#include "common/text_output.hpp"
#include "configs/parse.hpp"
#include "configs/schema/run.pb.h"
#include "serving/simulation.hpp"

namespace kvtier::app {

namespace po = boost::program_options;

namespace {

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

void print_table(std::ostream& out, const serving::SimulationReport& report,
                 const config::RunSpec& run, const std::string& file) {
  out << "kvtier sim: " << file << "\n  " << run.model().name() << " on "
      << run.hardware().node().gpu().name() << " (" << run.hardware().node().name()
      << "), tensor parallel " << run.tensor_parallel_degree() << ", policy " << run.policy().name()
      << ", seed " << run.seed() << "\n  workload: " << report.workload << "\n\n";
  TextTable table({"metric", "value"}, {false, true});
  for (const auto& metric : report.metrics) {
    table.add_row({metric.name, format_fixed(metric.value, metric.decimals)});
  }
  table.render(out);
}

}  // namespace

int run_sim(const Arguments& args, Context& context) {
  po::options_description options("sim options");
  options.add_options()("run", po::value<std::string>(),
                        "RunSpec file (default: configs/examples/quickstart.textproto)")(
      "out", po::value<std::string>(),
      "also write report.json, metrics.csv and (with outputs.timeseries_interval_us) "
      "timeseries.csv into this folder");
  options.add_options()("format", po::value<std::string>()->default_value("table"),
                        "output: table, json or csv");
  add_set_option(options);
  po::positional_options_description positional;
  positional.add("run", 1);
  po::variables_map values;
  if (!parse_arguments(args, options, positional, values,
                       "usage: kvtier sim [RUN] [--set PATH=VALUE ...] [--format table|json|csv] "
                       "[--out DIR]\n\nSimulates continuously batched serving of RUN's workload on "
                       "its hardware with the whole KV cache in HBM, and reports throughput, TTFT, "
                       "TPOT, HBM use and utilisation. Same config and seed, same bytes out.",
                       context.out)) {
    return 0;
  }
  const std::string format = values["format"].as<std::string>();
  if (format != "table" && format != "json" && format != "csv") {
    throw ConfigError("unknown --format '" + format + "': expected table, json or csv");
  }
  const std::string file =
      values.count("run") != 0U ? values["run"].as<std::string>() : default_run_file();
  config::RunSpec run;
  (void)context.loader.load_file(file, run, overrides_from(values));
  // A request file is found relative to the config that names it.
  if (run.workload().has_request_file()) {
    const std::filesystem::path named = run.workload().request_file().path();
    if (named.is_relative()) {
      run.mutable_workload()->mutable_request_file()->set_path(
          (std::filesystem::path(file).parent_path() / named).lexically_normal().string());
    }
  }
  if (run.policy().name() != "full") {
    throw ConfigError("policy '" + run.policy().name() +
                          "' needs the tier-aware simulation, which this kvtier does not have yet; "
                          "use policy full",
                      file + ", field policy.name");
  }
  const serving::SimulationReport report = serving::simulate(run);
  const std::string json = serving::report_json(report, run, version_line());
  if (values.count("out") != 0U) {
    const std::filesystem::path folder = values["out"].as<std::string>();
    write_file_atomically(folder / "report.json", json);
    write_file_atomically(folder / "metrics.csv", serving::report_csv(report));
    if (!report.series.empty()) {
      write_file_atomically(folder / "timeseries.csv", serving::series_csv(report));
    }
  }
  if (format == "json") {
    context.out << json;
  } else if (format == "csv") {
    context.out << serving::report_csv(report);
  } else {
    print_table(context.out, report, run, file);
  }
  return 0;
}

}  // namespace kvtier::app
