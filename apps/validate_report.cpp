#include "apps/validate_report.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "common/text_output.hpp"
#include "report/html_page.hpp"
#include "report/svg_chart.hpp"

namespace kvtier::app {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

std::string unit_of(const std::string& metric) {
  if (metric.ends_with("_ms")) {
    return "ms";
  }
  if (metric.find("tokens_per_s") != std::string::npos) {
    return "tokens/s";
  }
  return "";
}

std::string with_unit(const std::string& what, const std::string& unit) {
  return unit.empty() ? what : what + " (" + unit + ")";
}

// Names in the order they first appear.
template <typename Item, typename Key>
std::vector<std::string> first_seen(const std::vector<Item>& items, Key key) {
  std::vector<std::string> names;
  for (const Item& item : items) {
    const std::string name = key(item);
    if (std::find(names.begin(), names.end(), name) == names.end()) {
      names.push_back(name);
    }
  }
  return names;
}

}  // namespace

double median_abs_error(const std::vector<validation::Projection>& projections) {
  std::vector<double> errors;
  for (const validation::Projection& projection : projections) {
    if (projection.projected) {
      errors.push_back(std::abs(projection.relative_error));
    }
  }
  if (errors.empty()) {
    return 0.0;
  }
  std::sort(errors.begin(), errors.end());
  const std::size_t middle = errors.size() / 2;
  return errors.size() % 2 == 1 ? errors[middle] : (errors[middle - 1] + errors[middle]) / 2.0;
}

std::string percent(double fraction) {
  return std::isfinite(fraction) ? format_fixed(100.0 * fraction, 1) + "%" : "inf";
}

ValidationTable published_table(const std::vector<validation::Projection>& projections) {
  ValidationTable table{
      {"id", "gpu", "tp", "model", "batch", "in/out", "metric", "published", "projected", "error"},
      {false, false, true, false, true, true, false, true, true, true},
      {}};
  for (const validation::Projection& p : projections) {
    table.rows.push_back(
        {p.point.id, p.point.gpu, std::to_string(p.point.tensor_parallel), p.point.model,
         std::to_string(p.point.batch_size),
         std::to_string(p.point.prompt_tokens) + "/" + std::to_string(p.point.output_tokens),
         p.point.metric, format_fixed(p.point.value, 2),
         p.projected ? format_fixed(p.simulated, 2) : "-",
         p.projected ? format_fixed(100.0 * p.relative_error, 1) + "%" : p.skipped_because});
  }
  return table;
}

ValidationTable figures_table(const std::vector<validation::ReferenceCheck>& checks) {
  ValidationTable table{
      {"id", "policy", "metric", "measured", "projected", "error", "tolerance", ""},
      {false, false, false, true, true, true, true, false},
      {}};
  for (const validation::ReferenceCheck& c : checks) {
    if (c.skipped()) {
      table.rows.push_back({c.id, c.policy, c.metric, format_fixed(c.measured, c.decimals), "-",
                            "-", "-", "skipped: " + c.skipped_because});
      continue;
    }
    table.rows.push_back(
        {c.id, c.policy, c.metric, format_fixed(c.measured, c.decimals),
         format_fixed(c.projected, c.decimals), percent(c.relative_error), percent(c.tolerance),
         std::string(c.within() ? "ok" : "OUTSIDE") + (c.calibrated ? " (calibrated)" : "") +
             (c.note.empty() ? "" : "; " + c.note)});
  }
  return table;
}

namespace {

// A live run's steps as four charts, the step number along x.
void add_live_steps(report::HtmlPage& page, const validation::LiveSteps& run) {
  page.heading(3, run.id + " (" + run.policy + ", " + run.device + ")");
  const auto chart = [&](const std::string& what, const std::string& unit) {
    report::LineChart c;
    c.title = run.id + ": " + what;
    c.x.label = "decode step";
    c.y.label = unit;
    c.markers = run.steps.size() < 2;  // a lone step has no line to show it
    return c;
  };
  const auto series = [&](const std::string& label, auto value) {
    report::LineSeries line{label, {}, {}};
    for (std::size_t step = 0; step < run.steps.size(); ++step) {
      line.x.push_back(static_cast<double>(step + 1));
      line.y.push_back(value(run.steps[static_cast<int>(step)]));
    }
    return line;
  };
  report::LineChart time = chart("time per step", "ms");
  time.series.push_back(
      series("step", [](const config::StepFigures& s) { return s.latency_ms(); }));
  page.add_raw(report::line_chart_svg(time));

  report::LineChart tiers = chart("the context by tier", "token-layers");
  for (int tier = 0; tier < 4; ++tier) {
    tiers.series.push_back(series("T" + std::to_string(tier), [tier](const config::StepFigures& s) {
      return tier < s.tier_token_layers_size() ? static_cast<double>(s.tier_token_layers(tier))
                                               : kNaN;
    }));
  }
  page.add_raw(report::line_chart_svg(tiers));

  report::LineChart copies = chart("bytes copied per step", "KiB");
  copies.series.push_back(series("host to device", [](const config::StepFigures& s) {
    return static_cast<double>(s.h2d_bytes()) / 1024.0;
  }));
  copies.series.push_back(series("device to host", [](const config::StepFigures& s) {
    return static_cast<double>(s.d2h_bytes()) / 1024.0;
  }));
  page.add_raw(report::line_chart_svg(copies));

  report::LineChart kept = chart("attention mass kept", "share of the attention");
  kept.series.push_back(
      series("held tokens", [](const config::StepFigures& s) { return s.kept_mass(); }));
  page.add_raw(report::line_chart_svg(kept));
}

}  // namespace

std::string published_html(const std::vector<validation::Projection>& projections,
                           const std::string& file, const std::string& version) {
  report::HtmlPage page("kvtier validate: " + file);
  std::size_t projected = 0;
  std::size_t within_10 = 0;
  std::size_t within_20 = 0;
  for (const validation::Projection& p : projections) {
    projected += p.projected ? 1 : 0;
    within_10 += p.projected && std::abs(p.relative_error) <= 0.1 ? 1 : 0;
    within_20 += p.projected && std::abs(p.relative_error) <= 0.2 ? 1 : 0;
  }
  page.labelled("Points:", std::to_string(projected) + " of " + std::to_string(projections.size()) +
                               " projected; median |error| " +
                               percent(median_abs_error(projections)) + "; " +
                               std::to_string(within_10) + " within 10%, " +
                               std::to_string(within_20) + " within 20%");
  page.labelled("Version:", version);

  page.heading(2, "Simulated against published", "parity");
  page.paragraph(
      "One chart per metric, a point per measurement (a colour per GPU): on the solid diagonal "
      "the simulator equals the publication, between the dashed ones it is within 10%. Hover "
      "over a point for its id and values.");
  const std::vector<std::string> metrics =
      first_seen(projections, [](const validation::Projection& p) { return p.point.metric; });
  for (const std::string& metric : metrics) {
    report::LineChart chart;
    chart.title = metric;
    chart.x.label = with_unit("published", unit_of(metric));
    chart.y.label = with_unit("simulated", unit_of(metric));
    chart.x.scale = report::AxisScale::kLog;
    chart.y.scale = report::AxisScale::kLog;
    chart.lines = false;
    chart.same_ranges = true;
    chart.guides = {{"y = x", 1.0, 0.0, false}, {"+10%", 1.1, 0.0}, {"-10%", 0.9, 0.0}};
    const std::vector<std::string> gpus =
        first_seen(projections, [](const validation::Projection& p) { return p.point.gpu; });
    for (const std::string& gpu : gpus) {
      report::LineSeries series{gpu, {}, {}};
      for (const validation::Projection& p : projections) {
        if (p.point.metric == metric && p.point.gpu == gpu && p.projected) {
          series.x.push_back(p.point.value);
          series.y.push_back(p.simulated);
          series.notes.push_back(p.point.id + ", " + p.point.model + " TP " +
                                 std::to_string(p.point.tensor_parallel) + " batch " +
                                 std::to_string(p.point.batch_size) + ", error " +
                                 percent(p.relative_error));
        }
      }
      if (!series.x.empty()) {
        chart.series.push_back(std::move(series));
      }
    }
    page.add_raw(report::line_chart_svg(chart));
  }

  page.heading(2, "Every point", "points");
  ValidationTable table = published_table(projections);
  table.header.emplace_back("source");
  table.numeric.push_back(false);
  for (std::size_t i = 0; i < projections.size(); ++i) {
    table.rows[i].push_back(projections[i].point.source_title + " (" +
                            projections[i].point.source_url + ")");
  }
  page.table(table.header, table.rows, table.numeric);
  return page.str();
}

std::string measurements_html(const std::vector<validation::ReferenceCheck>& checks,
                              const std::vector<validation::LiveSteps>& live,
                              const std::string& version) {
  report::HtmlPage page("kvtier validate: measurement files");
  std::size_t outside = 0;
  std::size_t skipped = 0;
  for (const validation::ReferenceCheck& check : checks) {
    outside += check.within() ? 0 : 1;
    skipped += check.skipped() ? 1 : 0;
  }
  page.labelled("Figures:", std::to_string(checks.size() - skipped) + " compared, " +
                                std::to_string(outside) + " outside their tolerance, " +
                                std::to_string(skipped) + " skipped");
  page.labelled("Version:", version);

  page.heading(2, "Errors against tolerances", "errors");
  page.paragraph(
      "For each measurement file, each compared figure's |error| as a share of its tolerance: "
      "at most 1 (the dashed line) is within it. A figure whose tolerance is 0 (bytes, which "
      "must be equal) shows 0 when exact and is left out otherwise; the table below has every "
      "figure.");
  const std::vector<std::string> files =
      first_seen(checks, [](const validation::ReferenceCheck& c) { return c.id; });
  for (const std::string& file : files) {
    std::vector<const validation::ReferenceCheck*> compared;
    for (const validation::ReferenceCheck& check : checks) {
      if (check.id == file && !check.skipped()) {
        compared.push_back(&check);
      }
    }
    if (compared.empty()) {
      continue;
    }
    report::LineChart chart;
    chart.title = file;
    chart.lines = false;
    chart.y.label = "share of the tolerance";
    chart.x.label = "figure";
    std::vector<std::string> policies;
    for (const auto* check : compared) {
      if (std::find(chart.x.categories.begin(), chart.x.categories.end(), check->metric) ==
          chart.x.categories.end()) {
        chart.x.categories.push_back(check->metric);
      }
      if (std::find(policies.begin(), policies.end(), check->policy) == policies.end()) {
        policies.push_back(check->policy);
      }
    }
    for (const std::string& policy : policies) {
      report::LineSeries series{policy, {}, {}};
      for (const auto* check : compared) {
        if (check->policy != policy) {
          continue;
        }
        const auto at =
            std::find(chart.x.categories.begin(), chart.x.categories.end(), check->metric) -
            chart.x.categories.begin();
        const double share = check->tolerance > 0.0
                                 ? std::abs(check->relative_error) / check->tolerance
                                 : (check->relative_error == 0.0 ? 0.0 : kNaN);
        series.x.push_back(static_cast<double>(at));
        series.y.push_back(share);
        series.notes.push_back("measured " + format_double(check->measured) + ", projected " +
                               format_double(check->projected) + ", error " +
                               percent(check->relative_error) + " of " + percent(check->tolerance) +
                               (check->calibrated ? ", calibrated" : ""));
      }
      chart.series.push_back(std::move(series));
    }
    chart.guides.push_back({"tolerance", 0.0, 1.0});
    page.add_raw(report::line_chart_svg(chart));
  }

  page.heading(2, "Every figure", "figures");
  const ValidationTable table = figures_table(checks);
  page.table(table.header, table.rows, table.numeric);

  if (!live.empty()) {
    page.heading(2, "Live runs step by step", "steps");
    page.paragraph(
        "What each live run measured at every decode step (the steps of its measurement file): "
        "the step's time (decode, the policy's step and the cache's moves), the context by "
        "tier summed over layers, the bytes its copies moved each way, and the attention mass "
        "on held tokens (the mean over layers).");
    for (const validation::LiveSteps& run : live) {
      add_live_steps(page, run);
    }
  }
  return page.str();
}

}  // namespace kvtier::app
