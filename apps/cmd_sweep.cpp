// kvtier sweep: what-if grids over a base run (docs/SWEEPS.md), and merging of shard folders.

#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <exception>
#include <iostream>
#include <optional>

#include "apps/cli.hpp"
#include "common/errors.hpp"
#include "common/text_output.hpp"
#include "sweep/mpi.hpp"
#include "sweep/sweep.hpp"

namespace kvtier::app {
namespace {

namespace po = boost::program_options;

std::string shown_value(const sweep::Row& row, const sweep::HeadlineMetric& metric) {
  for (const auto& [name, text] : row.metrics) {
    if (name == metric.name) {
      double value = 0.0;
      const auto parsed = std::from_chars(text.data(), text.data() + text.size(), value);
      return parsed.ec == std::errc() ? format_fixed(value, metric.decimals) : text;
    }
  }
  return "";
}

void print_table(std::ostream& out, const sweep::ResultTable& table) {
  std::vector<std::string> header{"point"};
  header.insert(header.end(), table.axis_columns.begin(), table.axis_columns.end());
  header.emplace_back("policy");
  std::vector<bool> right(header.size(), false);
  right.front() = true;
  std::vector<const sweep::HeadlineMetric*> shown;
  for (const sweep::HeadlineMetric& metric : sweep::kHeadlineMetrics) {
    for (const std::string& column : table.metric_columns) {
      if (column == metric.name) {
        shown.push_back(&metric);
        header.emplace_back(std::string(metric.name));
        right.push_back(true);
      }
    }
  }
  bool errors = false;
  for (const sweep::Row& row : table.rows) {
    errors = errors || !row.error.empty();
  }
  if (errors) {
    header.emplace_back("error");
    right.push_back(false);
  }
  TextTable text(header, right);
  for (const sweep::Row& row : table.rows) {
    std::vector<std::string> cells{std::to_string(row.point)};
    cells.insert(cells.end(), row.axis_values.begin(), row.axis_values.end());
    cells.push_back(row.policy);
    for (const sweep::HeadlineMetric* metric : shown) {
      cells.push_back(shown_value(row, *metric));
    }
    if (errors) {
      cells.push_back(row.error);
    }
    text.add_row(cells);
  }
  out << "kvtier sweep: " << table.name << " (spec hash " << table.spec_hash << ")\n\n";
  text.render(out);
}

void print_results(std::ostream& out, const std::string& format, const sweep::ResultTable& table) {
  if (format == "csv") {
    out << sweep::results_csv(table);
  } else if (format == "json") {
    out << sweep::results_json(table);
  } else {
    print_table(out, table);
  }
}

std::string checked_format(const po::variables_map& values) {
  std::string format = values["format"].as<std::string>();
  if (format != "table" && format != "csv" && format != "json") {
    throw ConfigError("unknown --format '" + format + "': expected table, csv or json");
  }
  return format;
}

// One line rewritten in place; only on a terminal, so logs and pipes stay clean.
void print_progress(const sweep::Progress& progress) {
  std::string line = "\r\033[Kkvtier sweep: " + std::to_string(progress.done) + "/" +
                     std::to_string(progress.total) + " points";
  if (progress.resumed > 0) {
    line += " (" + std::to_string(progress.resumed) + " resumed)";
  }
  line += ", " + format_fixed(progress.elapsed_s, 1) + " s elapsed";
  if (progress.eta_s >= 0.0 && progress.done < progress.total) {
    line += ", ETA " + format_fixed(progress.eta_s, 0) + " s";
  }
  std::cerr << line << std::flush;
}

int run_merge(const Arguments& args, Context& context) {
  po::options_description options("sweep merge options");
  options.add_options()("folders", po::value<std::vector<std::string>>()->composing(),
                        "sweep folders (--out of each shard)")(
      "out", po::value<std::string>()->required(), "folder for the merged results")(
      "format", po::value<std::string>()->default_value("table"), "output: table, csv or json");
  po::positional_options_description positional;
  positional.add("folders", -1);
  po::variables_map values;
  if (!parse_arguments(
          args, options, positional, values,
          "usage: kvtier sweep merge OUT1 OUT2 ... --out DIR [--format "
          "table|csv|json]\n\nCombines the point files of shard folders (kvtier sweep "
          "--shard K/N) into DIR/results.csv, DIR/results.h5 and DIR/results.html. Refuses "
          "folders of "
          "different specs, and names the points no folder holds.",
          context.out)) {
    return 0;
  }
  const std::string format = checked_format(values);
  if (values.count("folders") == 0U) {
    throw ConfigError("kvtier sweep merge needs the shard folders (see --help)");
  }
  std::vector<std::filesystem::path> folders;
  for (const std::string& folder : values["folders"].as<std::vector<std::string>>()) {
    folders.emplace_back(folder);
  }
  const std::filesystem::path out = values["out"].as<std::string>();
  check_output_folder("--out", out, {"sweep.json", "results.csv", "results.h5", "results.html"});
  const sweep::ResultTable table = sweep::merge_sweeps(folders, out);
  std::cerr << "kvtier sweep merge: " << folders.size() << " folder(s), " << table.rows.size()
            << " rows -> " << (out / "results.csv").string() << "\n";
  print_results(context.out, format, table);
  return 0;
}

// A sweep ready to run: its spec loaded, its folder and options checked.
struct SweepCommand {
  sweep::Sweep spec;
  sweep::RunOptions run;
  std::string format;
};

// Parses and checks the arguments and loads the spec; nullopt when --help was printed.
std::optional<SweepCommand> prepare_sweep(const Arguments& args, Context& context) {
  po::options_description options("sweep options");
  options.add_options()("spec", po::value<std::string>(), "SweepSpec file")(
      "jobs,j", po::value<int>()->default_value(1), "points simulated at once (threads)")(
      "out", po::value<std::string>(),
      "sweep folder: point files, results.csv, results.h5, results.html (default: sweep-NAME)")(
      "shard", po::value<std::string>(), "run only points whose index % N == K (K/N)")(
      "mpi", po::bool_switch(),
      "share the points among the processes of an MPI job (mpiexec -n R kvtier sweep ... --mpi); "
      "rank 0 writes the folder")("format", po::value<std::string>()->default_value("table"),
                                  "output: table, csv or json");
  add_set_option(options);
  po::positional_options_description positional;
  positional.add("spec", 1);
  po::variables_map values;
  if (!parse_arguments(
          args, options, positional, values,
          "usage: kvtier sweep SPEC [--jobs N] [--out DIR] [--shard K/N] [--mpi] [--format "
          "table|csv|json] [--set PATH=VALUE]...\n       kvtier sweep merge OUT1 OUT2 ... --out "
          "DIR [--format table|csv|json]\n\nSimulates every point of a SweepSpec (a base run and "
          "axes of values, GRID or "
          "ZIP; an axis on `policy` takes policy strings) with every policy of its run (with a "
          "`plan` block, plans it as kvtier plan does: the largest load within the SLOs), and "
          "writes one row per point and policy to DIR/results.csv and DIR/results.h5, and "
          "DIR/results.html, a page charting the headline metrics against the axes. Each "
          "finished point is kept in DIR/points, so a rerun with the same DIR resumes; the "
          "results do not depend on --jobs, --shard or the MPI processes. Points that are not "
          "valid runs or do not fit get rows with an error instead of metrics.",
          context.out)) {
    return std::nullopt;
  }
  SweepCommand command;
  command.format = checked_format(values);
  if (values.count("spec") == 0U) {
    throw ConfigError("kvtier sweep needs a SweepSpec file (see --help)");
  }
  const int jobs = values["jobs"].as<int>();
  if (jobs < 1) {
    throw ConfigError("--jobs " + std::to_string(jobs) + ": at least 1");
  }
  const std::string file = values["spec"].as<std::string>();
  command.spec = sweep::load_sweep(file, context.loader, overrides_from(values));

  if (values.count("out") == 0U) {
    // The default folder is made of the name: one folder in the working directory, no more.
    const std::string& name = command.spec.spec.name();
    const bool plain =
        !name.empty() && name != "." && name != ".." &&
        std::none_of(name.begin(), name.end(), [](char c) {
          return c == '/' || c == '\\' || static_cast<unsigned char>(c) < 0x20 || c == 0x7F;
        });
    if (!plain) {
      throw ConfigError("the spec's name '" + name +
                        "' cannot name the default folder sweep-NAME (a path separator, a control "
                        "character or no name): give --out");
    }
  }
  command.run.out = values.count("out") != 0U ? values["out"].as<std::string>()
                                              : "sweep-" + command.spec.spec.name();
  check_output_folder("--out", command.run.out,
                      {"sweep.json", "results.csv", "results.h5", "results.html"});
  command.run.jobs = static_cast<unsigned>(jobs);
  if (values.count("shard") != 0U) {
    command.run.shard = sweep::parse_shard(values["shard"].as<std::string>());
  }
  return command;
}

// Runs the sweep with its progress line on stderr when that is a terminal.
template <typename Run>
sweep::RunSummary with_progress(SweepCommand& command, const Run& run) {
  const bool terminal = ::isatty(STDERR_FILENO) == 1;
  if (terminal) {
    command.run.progress = print_progress;
  }
  sweep::RunSummary summary = run();
  if (terminal) {
    std::cerr << "\n";
  }
  return summary;
}

void report_summary(const SweepCommand& command, const sweep::RunSummary& summary,
                    const std::string& where, Context& context) {
  std::string line = "kvtier sweep: " + std::to_string(summary.selected) + " of " +
                     std::to_string(summary.total_points) + " points (" +
                     std::to_string(summary.resumed) + " resumed, " +
                     std::to_string(summary.computed) + " run" + where;
  if (summary.replaced > 0) {
    line += ", " + std::to_string(summary.replaced) + " damaged point files redone";
  }
  line += ")";
  if (summary.failed_points > 0) {
    line += ", " + std::to_string(summary.failed_points) +
            " with policies that could not run (see the error column)";
  }
  std::cerr << line << " -> " << (command.run.out / "results.csv").string() << "\n";
  print_results(context.out, command.format, summary.table);
}

// Under an MPI job every rank gets here with the same arguments. Whatever fails, on any rank, is
// reported once, by rank 0, and every rank ends with its exit code (sweep/mpi.hpp).
int sweep_on_ranks(const sweep::MpiJob& job, const Arguments& args, Context& context) {
  std::ostream discard(nullptr);  // --help is printed by rank 0 alone
  Context quiet{discard, context.presets, context.loader};
  std::optional<SweepCommand> command;
  std::exception_ptr failure;
  try {
    command = prepare_sweep(args, job.rank() == 0 ? context : quiet);
  } catch (const po::error& error) {
    failure = std::make_exception_ptr(ConfigError(error.what(), "see --help"));
  } catch (...) {
    failure = std::current_exception();
  }
  if (!failure && !command) {
    return 0;
  }
  if (const int code = job.agree(command ? command->spec.hash : "", failure); code != 0) {
    return code;
  }
  if (job.rank() != 0) {
    return job.work(command->spec, context.loader, command->run);
  }
  const sweep::RunSummary summary = with_progress(
      *command, [&] { return job.coordinate(command->spec, context.loader, command->run); });
  report_summary(
      *command, summary,
      " on " + std::to_string(job.size()) + " MPI process" + (job.size() > 1 ? "es" : ""), context);
  return 0;
}

int run_sweep_mpi(const Arguments& args, Context& context) {
  sweep::MpiJob job;
  int code = 0;
  try {
    code = sweep_on_ranks(job, args, context);
  } catch (...) {
    if (job.rank() != 0) {
      throw;  // a worker's own failure: the launcher stops the job
    }
    code = report_failure(std::current_exception());
  }
  // No rank ends before rank 0's report is out: once one has, the launcher may stop the others.
  job.barrier();
  return code;
}

}  // namespace

int run_sweep(const Arguments& args, Context& context) {
  if (!args.empty() && args.front() == "merge") {
    return run_merge(Arguments(args.begin() + 1, args.end()), context);
  }
  if (std::find(args.begin(), args.end(), "--mpi") != args.end()) {
    return run_sweep_mpi(args, context);
  }
  std::optional<SweepCommand> command = prepare_sweep(args, context);
  if (!command) {
    return 0;
  }
  const sweep::RunSummary summary = with_progress(
      *command, [&] { return sweep::run_sweep(command->spec, context.loader, command->run); });
  report_summary(*command, summary, "", context);
  return 0;
}

}  // namespace kvtier::app
