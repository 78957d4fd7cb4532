// `kvtier validate --published FILE`: the simulator against published measurements.

#include <algorithm>
#include <cmath>

#include "apps/cli.hpp"
#include "common/errors.hpp"
#include "common/text_output.hpp"
#include "validation/published.hpp"

namespace kvtier::app {

namespace po = boost::program_options;

namespace {

double median(std::vector<double> values) {
  if (values.empty()) {
    return 0.0;
  }
  std::sort(values.begin(), values.end());
  const size_t middle = values.size() / 2;
  return values.size() % 2 == 1 ? values[middle] : (values[middle - 1] + values[middle]) / 2.0;
}

}  // namespace

int run_validate(const Arguments& args, Context& context) {
  po::options_description options("validate options");
  options.add_options()("published", po::value<std::string>()->required(),
                        "CSV of published measurements (validation/published/*.csv)");
  add_format_option(options);
  po::variables_map values;
  if (!parse_arguments(args, options, {}, values,
                       "usage: kvtier validate --published FILE [--format text|json]\n\n"
                       "Simulates every published measurement's configuration and prints the "
                       "projected value next to the measured one with the relative error.",
                       context.out)) {
    return 0;
  }
  const Format format = format_from(values);
  const auto points = validation::read_published(values["published"].as<std::string>());
  std::vector<validation::Projection> projections;
  projections.reserve(points.size());
  for (const auto& point : points) {
    projections.push_back(validation::project(point, context.loader));
  }
  std::vector<double> errors;
  for (const auto& projection : projections) {
    if (projection.projected) {
      errors.push_back(std::abs(projection.relative_error));
    }
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
    context.out << "],\n \"projected\": " << errors.size()
                << ", \"median_abs_relative_error\": " << format_double(median(errors)) << "}\n";
    return 0;
  }
  TextTable table(
      {"id", "gpu", "tp", "model", "batch", "in/out", "metric", "published", "projected", "error"},
      {false, false, true, false, true, true, false, true, true, true});
  for (const auto& p : projections) {
    table.add_row(
        {p.point.id, p.point.gpu, std::to_string(p.point.tensor_parallel), p.point.model,
         std::to_string(p.point.batch_size),
         std::to_string(p.point.prompt_tokens) + "/" + std::to_string(p.point.output_tokens),
         p.point.metric, format_fixed(p.point.value, 2),
         p.projected ? format_fixed(p.simulated, 2) : "-",
         p.projected ? format_fixed(100.0 * p.relative_error, 1) + "%" : p.skipped_because});
  }
  table.render(context.out);
  context.out << "\n"
              << errors.size() << " of " << projections.size()
              << " points projected; median |error| " << format_fixed(100.0 * median(errors), 1)
              << "%\n";
  return 0;
}

}  // namespace kvtier::app
