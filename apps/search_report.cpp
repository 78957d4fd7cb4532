#include "apps/search_report.hpp"

#include <cstdint>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "common/text_output.hpp"
#include "report/html_page.hpp"
#include "report/svg_chart.hpp"

namespace kvtier::app {
namespace {

// A budget axis is drawn on a log scale when the bounds span this factor or more: the search
// draws its genes on a log scale, so its points crowd the low end of a linear one.
constexpr double kLogScaleSpan = 16.0;

constexpr const char* kRecallLabel = "recall (attention mass kept)";

report::ChartAxis budget_axis(const replay::SearchOptions& options) {
  report::ChartAxis axis;
  axis.label = "mean budget (tokens per layer)";
  if (static_cast<double>(options.bounds.cap) >=
      kLogScaleSpan * static_cast<double>(options.bounds.floor)) {
    axis.scale = report::AxisScale::kLog;
  }
  return axis;
}

// Layers are whole: up to this many, each is a tick of its own; beyond, round ticks.
constexpr std::size_t kLayerTicks = 16;

report::ChartAxis layer_axis(std::size_t layers) {
  report::ChartAxis axis;
  axis.label = "layer";
  if (layers <= kLayerTicks) {
    for (std::size_t l = 0; l < layers; ++l) {
      axis.ticks.push_back(static_cast<double>(l));
    }
  }
  return axis;
}

std::string point_note(const replay::BudgetPoint& point) {
  return "evaluation " + std::to_string(point.evaluation) + ", " +
         (point.generation == 0 ? std::string("initial design")
                                : "generation " + std::to_string(point.generation)) +
         ", budgets " + joined_budgets(point.budgets);
}

report::LineSeries points_series(const std::string& label,
                                 const std::vector<const replay::BudgetPoint*>& points) {
  report::LineSeries series{label, {}, {}};
  for (const replay::BudgetPoint* point : points) {
    series.x.push_back(point->mean_budget);
    series.y.push_back(point->recall);
    series.notes.push_back(point_note(*point));
  }
  return series;
}

std::string winner_label(const replay::BudgetPoint& winner) {
  return "winner (mean " + format_fixed(winner.mean_budget, 1) + ")";
}

// The winner's recall as a level: one dot among many is easily missed, and the level shows
// what every other budget gives up or adds against it.
report::Guide winner_level(const replay::BudgetPoint& winner) {
  return {"winner's recall " + format_fixed(winner.recall, 5), 0.0, winner.recall};
}

// `chart` on the budget and recall axes with the Pareto front and the winner drawn over its
// series, and the winner's recall as a level.
std::string front_and_winner_svg(const SearchReport& report, report::LineChart chart) {
  const replay::SearchResult& result = report.result;
  std::vector<const replay::BudgetPoint*> front;
  for (const replay::BudgetPoint& point : result.front) {
    front.push_back(&point);
  }
  const replay::BudgetPoint& winner = result.front[result.winner];
  chart.x = budget_axis(report.options);
  chart.y.label = kRecallLabel;
  chart.y.include_zero = false;
  chart.series.push_back(points_series("Pareto front", front));
  chart.series.push_back(points_series(winner_label(winner), {&winner}));
  chart.guides.push_back(winner_level(winner));
  return report::line_chart_svg(chart);
}

// Every evaluated point by where it came from, the front over them and the winner on top.
std::string explored_chart(const SearchReport& report) {
  const replay::SearchResult& result = report.result;
  std::vector<const replay::BudgetPoint*> design;
  std::vector<const replay::BudgetPoint*> generations;
  for (const replay::BudgetPoint& point : result.evaluated) {
    (point.generation == 0 ? design : generations).push_back(&point);
  }
  report::LineChart chart;
  chart.title = "Every budget vector evaluated: recall against the mean budget";
  chart.lines = false;
  chart.series.push_back(points_series("initial design", design));
  chart.series.push_back(points_series("DE generations", generations));
  return front_and_winner_svg(report, std::move(chart));
}

std::string front_chart(const SearchReport& report) {
  report::LineChart chart;
  chart.title = "The Pareto front and the winner";
  return front_and_winner_svg(report, std::move(chart));
}

std::string comparison_chart(const SearchReport& report) {
  report::LineChart chart;
  chart.title = std::string("Winner rescaled against uniform, on the ") +
                (report.inputs.has_held_out ? "held-out" : "calibration") + " traces";
  chart.x.label = "target mean budget (tokens per layer)";
  chart.y.label = kRecallLabel;
  chart.y.include_zero = false;
  report::LineSeries searched{"the winner rescaled", {}, {}};
  report::LineSeries uniform{"uniform", {}, {}};
  for (const replay::UniformComparison& c : report.comparisons) {
    chart.x.ticks.push_back(static_cast<double>(c.target_mean));
    searched.x.push_back(static_cast<double>(c.target_mean));
    searched.y.push_back(c.searched_recall);
    searched.notes.push_back("budgets " + joined_budgets(c.budgets));
    uniform.x.push_back(static_cast<double>(c.target_mean));
    uniform.y.push_back(c.uniform_recall);
  }
  chart.series = {searched, uniform};
  return report::line_chart_svg(chart);
}

std::string budgets_chart(const SearchReport& report) {
  const replay::BudgetPoint& winner = report.result.front[report.result.winner];
  report::LineChart chart;
  chart.title = "Budgets by layer: the winner and its rescalings";
  chart.x = layer_axis(winner.budgets.size());
  chart.y.label = "budget (tokens)";
  const auto by_layer = [](const std::string& label, const std::vector<std::uint64_t>& budgets) {
    report::LineSeries series{label, {}, {}};
    for (std::size_t l = 0; l < budgets.size(); ++l) {
      series.x.push_back(static_cast<double>(l));
      series.y.push_back(static_cast<double>(budgets[l]));
    }
    return series;
  };
  chart.series.push_back(by_layer(winner_label(winner), winner.budgets));
  for (const replay::UniformComparison& c : report.comparisons) {
    chart.series.push_back(
        by_layer("rescaled to mean " + std::to_string(c.target_mean), c.budgets));
  }
  return report::line_chart_svg(chart);
}

std::string layer_recall_chart(const replay::BudgetPoint& winner) {
  report::LineChart chart;
  chart.title = "The winner's recall by layer, on the calibration traces";
  chart.x = layer_axis(winner.layer_recall.size());
  chart.y.label = kRecallLabel;
  chart.y.include_zero = false;
  report::LineSeries series{winner_label(winner), {}, {}};
  for (std::size_t l = 0; l < winner.layer_recall.size(); ++l) {
    series.x.push_back(static_cast<double>(l));
    series.y.push_back(winner.layer_recall[l]);
    series.notes.push_back("budget " + std::to_string(winner.budgets[l]));
  }
  chart.series.push_back(std::move(series));
  return report::line_chart_svg(chart);
}

std::string files_text(const std::vector<std::string>& files) {
  std::string text;
  for (const std::string& file : files) {
    text += (text.empty() ? "" : ", ") + file;
  }
  return text;
}

}  // namespace

std::string joined_budgets(const std::vector<std::uint64_t>& budgets) {
  std::string text;
  for (const std::uint64_t b : budgets) {
    text += (text.empty() ? "" : "/") + std::to_string(b);
  }
  return text;
}

std::string search_html(const SearchReport& report, const std::string& version) {
  const replay::SearchResult& result = report.result;
  const SearchInputs& inputs = report.inputs;
  const replay::BudgetPoint& winner = result.front[result.winner];
  report::HtmlPage page("kvtier replay search-budgets: " + report.base);
  page.labelled("Search:", report.base + ", " + std::to_string(inputs.layers) +
                               " layers, budgets in [" +
                               std::to_string(report.options.bounds.floor) + ", " +
                               std::to_string(report.options.bounds.cap) + "], seed " +
                               std::to_string(report.options.seed) + "; " +
                               std::to_string(result.evaluated.size()) +
                               " budget vectors evaluated: the initial design, then " +
                               std::to_string(result.generations) + " DE generations screening " +
                               std::to_string(result.proposals) + " proposals");
  page.labelled("Calibration traces:",
                files_text(inputs.calibration) + " (" +
                    (inputs.in_memory ? "replayed from memory, " : "replayed from the files, ") +
                    format_fixed(static_cast<double>(inputs.memory_bytes) / (1 << 20), 1) +
                    " MiB of rows)");
  page.labelled("Held-out traces:", inputs.has_held_out
                                        ? files_text(inputs.held_out)
                                        : std::string("none (the comparison with uniform runs on "
                                                      "the calibration traces)"));
  page.labelled("Winner:", result.winner_rule + ": mean " + format_fixed(winner.mean_budget, 1) +
                               ", recall " + format_fixed(winner.recall, 5) + ", budgets " +
                               joined_budgets(winner.budgets) + "; as a policy " +
                               replay::explicit_budget_policy(report.base, winner.budgets));
  if (!report.out_file.empty()) {
    page.labelled("Front:", "written to " + report.out_file + " (CSV)");
  }
  page.labelled("Version:", version);

  page.heading(2, "What the search explored", "explored");
  page.add_raw(explored_chart(report));
  page.add_raw(front_chart(report));

  page.heading(2, "Pareto front", "front");
  std::vector<std::vector<std::string>> rows;
  for (std::size_t k = 0; k < result.front.size(); ++k) {
    const replay::BudgetPoint& point = result.front[k];
    rows.push_back({format_fixed(point.mean_budget, 1), format_fixed(point.recall, 5),
                    std::to_string(point.evaluation), std::to_string(point.generation),
                    k == result.winner ? "winner" : "", joined_budgets(point.budgets)});
  }
  page.table({"mean budget", "recall", "evaluation", "generation", "", "budgets"}, rows,
             {true, true, true, true, false, false});

  page.heading(2, "Winner against uniform", "comparison");
  page.add_raw(comparison_chart(report));
  rows.clear();
  for (const replay::UniformComparison& c : report.comparisons) {
    const double gain = c.searched_recall - c.uniform_recall;
    rows.push_back({std::to_string(c.target_mean), format_fixed(c.searched_recall, 5),
                    format_fixed(c.uniform_recall, 5),
                    (gain >= 0 ? "+" : "") + format_fixed(gain, 5), joined_budgets(c.budgets),
                    replay::explicit_budget_policy(report.base, c.budgets)});
  }
  page.table({"target mean", "searched", "uniform", "gain", "budgets", "policy"}, rows,
             {true, true, true, true, false, false});

  page.heading(2, "By layer", "layers");
  page.add_raw(budgets_chart(report));
  page.add_raw(layer_recall_chart(winner));

  TextTable evaluated({"eval", "generation", "mean budget", "recall", "budgets"},
                      {true, true, true, true, false});
  for (const replay::BudgetPoint& point : result.evaluated) {
    evaluated.add_row({std::to_string(point.evaluation), std::to_string(point.generation),
                       format_fixed(point.mean_budget, 1), format_fixed(point.recall, 5),
                       joined_budgets(point.budgets)});
  }
  std::ostringstream text;
  evaluated.render(text);
  page.details("Every budget vector evaluated (" + std::to_string(result.evaluated.size()) + ")",
               text.str());
  return page.str();
}

}  // namespace kvtier::app
