// `kvtier validate [FILE... | --published FILE]`: the simulator against measured references,
// live measurement files and published measurements.

#include <algorithm>
#include <cmath>

#include "apps/cli.hpp"
#include "apps/validate_report.hpp"
#include "common/errors.hpp"
#include "common/text_output.hpp"
#include "validation/live.hpp"
#include "validation/published.hpp"
#include "validation/reference.hpp"

namespace kvtier::app {

namespace po = boost::program_options;

namespace {

// A number for JSON: null for a non-finite one (the relative error of a figure measured as 0).
std::string json_number(double value) {
  return std::isfinite(value) ? format_double(value) : "null";
}

// Measured references and live measurement files: projected vs measured per figure, skipped
// figures with the reason; exit 1 when one is out of tolerance.
int validate_files(const std::vector<std::string>& files, Format format, Context& context) {
  std::vector<validation::LiveSteps> steps;
  const std::vector<validation::ReferenceCheck> checks = validation::check_measurement_files(
      files, context.loader, format == Format::kHtml ? &steps : nullptr);
  std::size_t outside = 0;
  std::size_t skipped = 0;
  for (const auto& check : checks) {
    outside += check.within() ? 0 : 1;
    skipped += check.skipped() ? 1 : 0;
  }
  const std::size_t compared = checks.size() - skipped;
  if (format == Format::kHtml) {
    context.out << measurements_html(checks, steps, version_line());
  } else if (format == Format::kJson) {
    context.out << "{\"references\": [";
    for (std::size_t i = 0; i < checks.size(); ++i) {
      const auto& c = checks[i];
      context.out << (i == 0 ? "\n  " : ",\n  ") << "{\"id\": " << json_escape(c.id)
                  << ", \"policy\": " << json_escape(c.policy)
                  << ", \"metric\": " << json_escape(c.metric)
                  << ", \"measured\": " << format_double(c.measured);
      if (c.skipped()) {
        context.out << ", \"skipped\": " << json_escape(c.skipped_because) << "}";
        continue;
      }
      context.out << ", \"projected\": " << format_double(c.projected)
                  << ", \"relative_error\": " << json_number(c.relative_error)
                  << ", \"tolerance\": " << format_double(c.tolerance)
                  << ", \"calibrated\": " << (c.calibrated ? "true" : "false")
                  << ", \"within\": " << (c.within() ? "true" : "false");
      if (!c.note.empty()) {
        context.out << ", \"note\": " << json_escape(c.note);
      }
      context.out << "}";
    }
    context.out << "],\n \"outside_tolerance\": " << outside << ", \"skipped\": " << skipped
                << "}\n";
  } else {
    const ValidationTable figures = figures_table(checks);
    TextTable table(figures.header, figures.numeric);
    for (const auto& row : figures.rows) {
      table.add_row(row);
    }
    table.render(context.out);
    context.out << "\n"
                << compared << " figures, " << outside << " outside tolerance"
                << (skipped > 0 ? ", " + std::to_string(skipped) + " skipped" : "") << "\n";
  }
  if (outside > 0) {
    throw Error(std::to_string(outside) + " of " + std::to_string(compared) +
                    " figures outside their tolerance",
                {}, ExitCode::kRuntimeFailure);
  }
  return 0;
}

}  // namespace

int run_validate(const Arguments& args, Context& context) {
  po::options_description options("validate options");
  options.add_options()(
      "file", po::value<std::vector<std::string>>(),
      "measured references (*.textproto) and live measurement files (*.json), e.g. "
      "validation/measurements/*.textproto validation/measurements/*.json")(
      "published", po::value<std::string>(),
      "CSV of published measurements (validation/published/*.csv)");
  add_format_option(options, true);
  po::positional_options_description positional;
  positional.add("file", -1);
  po::variables_map values;
  if (!parse_arguments(
          args, options, positional, values,
          "usage: kvtier validate [FILE... | --published FILE] [--format text|json|html]\n\n"
          "Simulates the configuration of every measurement file and prints projected next to "
          "measured with the relative error, exiting 1 when a figure is outside its tolerance. "
          "A FILE is a measured reference (ReferenceMeasurement, protobuf text format: a run and "
          "its measured figures with tolerances) or a live measurement (JSON written by `kvtier "
          "live --measure`): a live run that followed a trace is simulated as one request of "
          "its model preset, KV dtype, policy, lengths and trace (a relative follow_trace is "
          "found from the file's folder), and its PCIe H2D and D2H bytes must equal the "
          "simulation's; a CUDA run also compares time per output token and copy busy times "
          "(10%), on the node preset of its GPU cut to that one GPU, its copies by SM kernels "
          "(by the copy engines when its device detail says `copy-engines copies`), and its "
          "engine calibrated on the first `full` run of the same GPU, engine settings, model, "
          "lengths and trace among the files when there is one. The file's `tolerances` replace "
          "these defaults. Free-running runs, models that are no preset and the CPU backend's "
          "timings are listed as skipped, with the reason. With --published, does the same "
          "for a CSV of published serving measurements (reporting the median error).",
          context.out)) {
    return 0;
  }
  const Format format = format_from(values, true);
  if (values.count("file") != 0U) {
    if (values.count("published") != 0U) {
      throw ConfigError("give measurement files or --published, not both");
    }
    return validate_files(values["file"].as<std::vector<std::string>>(), format, context);
  }
  if (values.count("published") == 0U) {
    throw ConfigError("validate needs measurement files or --published FILE (see --help)");
  }
  const auto points = validation::read_published(values["published"].as<std::string>());
  std::vector<validation::Projection> projections;
  projections.reserve(points.size());
  for (const auto& point : points) {
    projections.push_back(validation::project(point, context.loader));
  }
  const auto projected = static_cast<std::size_t>(
      std::count_if(projections.begin(), projections.end(),
                    [](const validation::Projection& p) { return p.projected; }));
  const double median = median_abs_error(projections);
  if (format == Format::kHtml) {
    context.out << published_html(projections, values["published"].as<std::string>(),
                                  version_line());
    return 0;
  }
  if (format == Format::kJson) {
    context.out << "{\"points\": [";
    for (size_t i = 0; i < projections.size(); ++i) {
      const auto& p = projections[i];
      context.out << (i == 0 ? "\n  " : ",\n  ") << "{\"id\": " << json_escape(p.point.id)
                  << ", \"metric\": " << json_escape(p.point.metric)
                  << ", \"published\": " << format_double(p.point.value);
      if (p.projected) {
        context.out << ", \"projected\": " << format_double(p.simulated)
                    << ", \"relative_error\": " << format_double(p.relative_error);
      } else {
        context.out << ", \"skipped\": " << json_escape(p.skipped_because);
      }
      context.out << "}";
    }
    context.out << "],\n \"projected\": " << projected
                << ", \"median_abs_relative_error\": " << format_double(median) << "}\n";
    return 0;
  }
  const ValidationTable published = published_table(projections);
  TextTable table(published.header, published.numeric);
  for (const auto& row : published.rows) {
    table.add_row(row);
  }
  table.render(context.out);
  context.out << "\n"
              << projected << " of " << projections.size() << " points projected; median |error| "
              << format_fixed(100.0 * median, 1) << "%\n";
  return 0;
}

}  // namespace kvtier::app
