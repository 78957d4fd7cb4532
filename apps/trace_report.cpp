#include "apps/trace_report.hpp"

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/text_output.hpp"
#include "report/heat_map.hpp"
#include "report/html_page.hpp"
#include "report/svg_chart.hpp"

namespace kvtier::app {
namespace {

// A line per figure of the layers' statistics, against the layer.
report::LineChart by_layer(
    const std::string& title, const std::string& unit, const traces::TraceStats& stats,
    const std::vector<std::pair<std::string, std::function<double(const traces::LayerStats&)>>>&
        figures) {
  report::LineChart chart;
  chart.title = title;
  chart.x.label = "layer";
  chart.y.label = unit;
  for (const auto& [name, figure] : figures) {
    report::LineSeries line{name, {}, {}};
    for (const traces::LayerStats& layer : stats.layers) {
      line.x.push_back(layer.layer);
      line.y.push_back(figure(layer));
    }
    chart.series.push_back(std::move(line));
  }
  return chart;
}

}  // namespace

std::string trace_html(const traces::TraceReader& reader, const traces::TraceSummary& summary,
                       const traces::TraceStats& stats, const traces::StatsOptions& options,
                       const std::vector<traces::AttentionMap>& maps, const std::string& version) {
  report::HtmlPage page("kvtier trace: " + reader.file_name());
  page.labelled("Version:", version);
  std::vector<std::vector<std::string>> facts;
  for (const auto& [field, value] : traces::describe_facts(reader, summary)) {
    facts.push_back({field, value});
  }
  page.table({"field", "value"}, facts);

  page.heading(2, "By layer", "layers");
  page.paragraph("Over " + std::to_string(stats.steps.size()) + " of " +
                 std::to_string(reader.shape().steps) + " decode steps, from " +
                 (stats.from_topk ? "top-k rows (masses are lower bounds)" : "mean rows") +
                 ". Sink: positions below " + std::to_string(options.sink_tokens) +
                 "; recent: distance below " + std::to_string(options.recent_window) +
                 "; far: distance " + std::to_string(options.far_distance) +
                 " or more, sinks excluded; reach: distance quantiles of non-sink weights of " +
                 format_double(options.reach_threshold) + " or more.");
  page.add_raw(report::line_chart_svg(
      by_layer("Attention mass by where it falls", "share of a step's attention", stats,
               {{"sinks", [](const auto& layer) { return layer.sink_mass; }},
                {"recent", [](const auto& layer) { return layer.recent_mass; }},
                {"far", [](const auto& layer) { return layer.far_mass; }}})));
  page.add_raw(report::line_chart_svg(
      by_layer("Entropy of a step's attention", "bits", stats,
               {{"entropy", [](const auto& layer) { return layer.entropy_bits; }}})));
  page.add_raw(report::line_chart_svg(
      by_layer("Recency decay length", "tokens", stats,
               {{"decay", [](const auto& layer) { return layer.recency_decay_tokens; }}})));
  std::vector<bool> numbers(traces::kLayerColumns.size(), true);
  page.table(traces::kLayerColumns, traces::layer_rows(stats), numbers);

  page.heading(2, "How far back attention reaches", "reach");
  report::BarChart reach;
  reach.title = "Reach, mean over layers";
  reach.y_label = "share of non-sink weights of " + format_double(options.reach_threshold) + "+";
  reach.series = {"share"};
  reach.values.emplace_back();
  const std::array<double, traces::kReachBins> shares = traces::mean_reach(stats);
  for (std::size_t bin = 0; bin < traces::kReachBins; ++bin) {
    if (shares[bin] > 0.0) {
      reach.groups.push_back(traces::reach_bin_label(bin));
      reach.values.back().push_back(shares[bin]);
    }
  }
  page.add_raw(report::bar_chart_svg(reach));

  if (!maps.empty()) {
    page.heading(2, "Attention maps", "maps");
    page.paragraph(
        "Decode steps down, key positions across: each cell is the attention mass on its "
        "positions, averaged over a few of its row's steps (a row sums to 1" +
        std::string(maps.front().from_topk ? ", less here: top-k entries only" : "") +
        "), coloured on a log scale. Sinks show as a column on the left, recency as the "
        "diagonal, heavy hitters and re-read spans as columns and stripes.");
  }
  for (const traces::AttentionMap& map : maps) {
    report::HeatMap heat;
    heat.title = "Layer " + std::to_string(map.layer) + " (" + std::to_string(map.steps_per_bin) +
                 " steps by " + std::to_string(map.positions_per_bin) + " positions a cell)";
    heat.x_label = "key position";
    heat.y_label = "decode step";
    heat.value_label = "mass";
    heat.rows = map.step_bins;
    heat.columns = map.position_bins;
    heat.values = map.mass;
    heat.x_high = static_cast<double>(map.position_bins * map.positions_per_bin);
    heat.y_high = static_cast<double>(map.step_bins * map.steps_per_bin);
    page.add_raw(report::heat_map_svg(heat));
  }
  return page.str();
}

}  // namespace kvtier::app
