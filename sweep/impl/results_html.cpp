// results.html: a sweep's results charted (sweep/impl/results_html.hpp).

#include "sweep/impl/results_html.hpp"

#include <google/protobuf/text_format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstddef>
#include <iterator>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/text_output.hpp"
#include "configs/schema/sweep.pb.h"
#include "replay/parameters.hpp"
#include "report/html_page.hpp"
#include "report/svg_chart.hpp"

namespace kvtier::sweep::detail {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
// A numeric x axis is drawn on a log scale when its values span this factor or more (batch
// sizes 1 to 256, contexts 1k to 128k).
constexpr double kLogScaleSpan = 16.0;
// A numeric x axis has its ticks at its own values, unless it has more than this many.
constexpr std::size_t kMostValueTicks = 12;

std::optional<double> number(const std::string& text) {
  double value = 0.0;
  const char* end = text.data() + text.size();
  const auto [stop, error] = std::from_chars(text.data(), end, value);
  if (error != std::errc() || stop != end || !std::isfinite(value)) {
    return std::nullopt;
  }
  return value;
}

struct Axis {
  std::string column;      // as results.csv names it
  std::string short_name;  // in line labels
  std::vector<std::string> values;
  bool numeric = true;
  bool policy = false;
};

std::string last_parts(const std::string& path, int parts) {
  std::size_t at = path.size();
  for (int i = 0; i < parts && at != std::string::npos && at > 0; ++i) {
    at = path.rfind('.', at - 1);
  }
  return at == std::string::npos ? path : path.substr(at + 1);
}

std::vector<Axis> axes_of(const Manifest& manifest) {
  std::vector<Axis> axes;
  for (std::size_t a = 0; a < manifest.axis_columns.size(); ++a) {
    Axis axis;
    axis.column = manifest.axis_columns[a];
    axis.values = manifest.axis_values[a];
    axis.policy = manifest.axis_paths[a] == kPolicyAxis;
    for (const std::string& value : axis.values) {
      axis.numeric = axis.numeric && number(value).has_value();
    }
    // A preset is named by what it is of (node.preset, host_link.preset).
    axis.short_name = last_parts(manifest.axis_paths[a], 1) == "preset"
                          ? last_parts(manifest.axis_paths[a], 2)
                          : last_parts(manifest.axis_paths[a], 1);
    axes.push_back(std::move(axis));
  }
  // Axes whose paths end alike keep two parts.
  for (std::size_t a = 0; a < axes.size(); ++a) {
    for (std::size_t b = 0; b < axes.size(); ++b) {
      if (a != b &&
          last_parts(manifest.axis_paths[a], 1) == last_parts(manifest.axis_paths[b], 1)) {
        axes[a].short_name = last_parts(manifest.axis_paths[a], 2);
      }
    }
  }
  return axes;
}

// The policies of each point's rows as the spec wrote them: its run's policy, then those it
// compares. Empty when the spec cannot be read back (the rows' own names serve then).
std::vector<std::string> policy_labels(const Manifest& manifest) {
  config::SweepSpec spec;
  if (!google::protobuf::TextFormat::ParseFromString(manifest.spec_text, &spec)) {
    return {};
  }
  std::vector<std::string> labels{replay::policy_string(spec.base().policy())};
  for (const config::PolicySpec& compared : spec.base().compare()) {
    labels.push_back(replay::policy_string(compared));
  }
  return labels;
}

// Which axis runs along x, which split the charts and which name the lines.
struct Layout {
  std::optional<std::size_t> x;  // absent: a ZIP sweep of several axes, charted by point
  std::vector<std::size_t> facets;
  std::vector<std::size_t> in_label;
};

// Each row's place among its point's rows (0 for the run's own policy, i for its i-th compared
// one): rows of a point are consecutive.
std::vector<std::size_t> places_in_point(const ResultTable& table) {
  std::vector<std::size_t> places;
  places.reserve(table.rows.size());
  for (std::size_t r = 0; r < table.rows.size(); ++r) {
    places.push_back(r > 0 && table.rows[r].point == table.rows[r - 1].point ? places.back() + 1
                                                                             : 0);
  }
  return places;
}

Layout layout_of(const std::vector<Axis>& axes, const Manifest& manifest, std::size_t policies) {
  Layout layout;
  if (manifest.mode == "ZIP" && axes.size() > 1) {
    return layout;
  }
  std::vector<std::size_t> varying;
  for (std::size_t a = 0; a < axes.size(); ++a) {
    if (axes[a].values.size() > 1) {
      varying.push_back(a);
    }
  }
  layout.x = 0;
  for (const std::size_t a : varying) {
    const Axis& best = axes[*layout.x];
    const bool better =
        axes[*layout.x].values.size() < 2 || axes[a].values.size() > best.values.size() ||
        (axes[a].values.size() == best.values.size() && axes[a].numeric && !best.numeric);
    if (better) {
      layout.x = a;
    }
  }
  std::vector<std::size_t> rest;
  std::size_t lines = policies;
  for (const std::size_t a : varying) {
    if (a != *layout.x) {
      rest.push_back(a);
      lines *= axes[a].values.size();
    }
  }
  while (lines > kMaxLinesPerChart && !rest.empty()) {
    const auto widest =
        std::max_element(rest.begin(), rest.end(), [&](std::size_t a, std::size_t b) {
          return axes[a].values.size() < axes[b].values.size();
        });
    lines /= axes[*widest].values.size();
    layout.facets.push_back(*widest);
    rest.erase(widest);
  }
  std::sort(layout.facets.begin(), layout.facets.end());
  layout.in_label = rest;
  return layout;
}

std::optional<double> metric_value(const Row& row, std::string_view name) {
  for (const auto& [metric, text] : row.metrics) {
    if (metric == name) {
      return number(text);
    }
  }
  return std::nullopt;
}

class SweepCharts {
 public:
  SweepCharts(const ResultTable& table, const Manifest& manifest)
      : table_(table),
        manifest_(manifest),
        axes_(axes_of(manifest)),
        policies_(policy_labels(manifest)),
        policy_index_(places_in_point(table)),
        layout_(layout_of(axes_, manifest, rows_per_point())) {
    for (std::size_t a = 0; a < axes_.size(); ++a) {
      if (axes_[a].policy) {
        policy_axis_ = a;
      }
      // An axis that edits a policy's fields makes its rows' policies differ from the spec's.
      const std::string& path = manifest.axis_paths[a];
      policy_edited_ = policy_edited_ || path.starts_with("policy.");
      compare_edited_ = compare_edited_ || path.starts_with("compare");
    }
  }

  // Points the table holds, and the most rows one has (the policies of a point that ran).
  [[nodiscard]] std::size_t points() const {
    return static_cast<std::size_t>(
        std::count(policy_index_.begin(), policy_index_.end(), std::size_t{0}));
  }
  [[nodiscard]] std::size_t rows_per_point() const {
    return policy_index_.empty()
               ? 1
               : *std::max_element(policy_index_.begin(), policy_index_.end()) + 1;
  }

  // What the charts show, in words.
  [[nodiscard]] std::string description() const {
    std::string text = "Each chart shows a metric against " + x_label() + ", one line per policy";
    for (const std::size_t a : layout_.in_label) {
      if (!axes_[a].policy) {
        text += " and " + axes_[a].short_name;
      }
    }
    if (!layout_.facets.empty()) {
      text += "; one chart for each value of";
      for (const std::size_t a : layout_.facets) {
        text += " " + axes_[a].short_name;
      }
    }
    return text + ". A gap is a point that could not run.";
  }

  void chart(report::HtmlPage& page, const HeadlineMetric& metric) const {
    // Facet key -> lines (label -> points), both in the order rows first show them.
    std::vector<std::pair<std::string, std::vector<report::LineSeries>>> facets;
    for (std::size_t r = 0; r < table_.rows.size(); ++r) {
      const Row& row = table_.rows[r];
      if (duplicate_compared(r)) {
        continue;
      }
      const std::string facet = facet_of(row);
      auto chart = std::find_if(facets.begin(), facets.end(),
                                [&facet](const auto& each) { return each.first == facet; });
      if (chart == facets.end()) {
        facets.emplace_back(facet, std::vector<report::LineSeries>{});
        chart = std::prev(facets.end());
      }
      const std::string label = line_label(r);
      auto line = std::find_if(chart->second.begin(), chart->second.end(),
                               [&label](const auto& each) { return each.label == label; });
      if (line == chart->second.end()) {
        chart->second.push_back({label, {}, {}});
        line = std::prev(chart->second.end());
      }
      line->x.push_back(x_of(row));
      line->y.push_back(row.error.empty() ? metric_value(row, metric.name).value_or(kNaN) : kNaN);
    }
    for (auto& [facet, lines] : facets) {
      report::LineChart chart;
      chart.title = std::string(metric.title) + (facet.empty() ? "" : " (" + facet + ")");
      chart.x = x_axis();
      chart.y.label = std::string(metric.unit);
      for (report::LineSeries& line : lines) {
        sort_by_x(line);
      }
      chart.series = std::move(lines);
      page.add_raw(report::line_chart_svg(chart));
    }
  }

  // The rows' policies as the spec wrote them.
  [[nodiscard]] std::string policy_of(std::size_t row) const {
    const std::size_t k = policy_index_[row];
    if (k == 0 && policy_axis_) {
      return table_.rows[row].axis_values[*policy_axis_];
    }
    // As the row ran when an axis edits it (the canonical string), else as the spec wrote it.
    const bool edited = k == 0 ? policy_edited_ : compare_edited_;
    return !edited && k < policies_.size() ? policies_[k] : table_.rows[row].policy;
  }

 private:
  [[nodiscard]] std::string x_label() const {
    if (layout_.x) {
      return axes_[*layout_.x].column;
    }
    std::string label = "the points (";
    for (std::size_t a = 0; a < axes_.size(); ++a) {
      label += (a == 0 ? "" : ", ") + axes_[a].column;
    }
    return label + ")";
  }

  [[nodiscard]] report::ChartAxis x_axis() const {
    report::ChartAxis axis;
    axis.label = x_label();
    if (!layout_.x) {
      for (std::uint64_t point = 0; point < manifest_.points; ++point) {
        std::string name;
        for (std::size_t a = 0; a < axes_.size(); ++a) {
          name += (a == 0 ? "" : ", ") + axes_[a].values.at(point);
        }
        axis.categories.push_back(name);
      }
      return axis;
    }
    const Axis& x = axes_[*layout_.x];
    if (!x.numeric) {
      axis.categories = x.values;
      return axis;
    }
    double low = std::numeric_limits<double>::infinity();
    double high = 0.0;
    for (const std::string& value : x.values) {
      low = std::min(low, *number(value));
      high = std::max(high, *number(value));
      if (x.values.size() <= kMostValueTicks) {
        axis.ticks.push_back(*number(value));
      }
    }
    if (low > 0.0 && high / low >= kLogScaleSpan) {
      axis.scale = report::AxisScale::kLog;
    }
    return axis;
  }

  [[nodiscard]] double x_of(const Row& row) const {
    if (!layout_.x) {
      return static_cast<double>(row.point);
    }
    const Axis& x = axes_[*layout_.x];
    const std::string& value = row.axis_values[*layout_.x];
    if (x.numeric) {
      return *number(value);
    }
    const auto found = std::find(x.values.begin(), x.values.end(), value);
    return static_cast<double>(found - x.values.begin());
  }

  [[nodiscard]] std::string facet_of(const Row& row) const {
    std::string facet;
    for (const std::size_t a : layout_.facets) {
      facet += (facet.empty() ? "" : ", ") + axes_[a].short_name + "=" + row.axis_values[a];
    }
    return facet;
  }

  [[nodiscard]] std::string line_label(std::size_t r) const {
    const Row& row = table_.rows[r];
    std::string label = policy_of(r);
    if (policy_index_[r] == 0 && policy_axis_ && layout_.x == policy_axis_) {
      label = "the policy on x";
    }
    for (const std::size_t a : layout_.in_label) {
      if (!axes_[a].policy) {
        label += "; " + axes_[a].short_name + "=" + row.axis_values[a];
      }
    }
    return label;
  }

  // A compared policy runs alike whatever the policy axis gives the point's own policy: its
  // rows at the axis's other values repeat those at the first, and are charted once.
  [[nodiscard]] bool duplicate_compared(std::size_t r) const {
    if (policy_index_[r] == 0 || !policy_axis_) {
      return false;
    }
    const bool labelled = std::find(layout_.in_label.begin(), layout_.in_label.end(),
                                    *policy_axis_) != layout_.in_label.end();
    return labelled &&
           table_.rows[r].axis_values[*policy_axis_] != axes_[*policy_axis_].values.front();
  }

  static void sort_by_x(report::LineSeries& line) {
    std::vector<std::size_t> order(line.x.size());
    for (std::size_t i = 0; i < order.size(); ++i) {
      order[i] = i;
    }
    std::stable_sort(order.begin(), order.end(),
                     [&line](std::size_t a, std::size_t b) { return line.x[a] < line.x[b]; });
    report::LineSeries sorted{line.label, {}, {}};
    for (const std::size_t i : order) {
      sorted.x.push_back(line.x[i]);
      sorted.y.push_back(line.y[i]);
    }
    line = std::move(sorted);
  }

  const ResultTable& table_;
  const Manifest& manifest_;
  std::vector<Axis> axes_;
  std::vector<std::string> policies_;
  std::vector<std::size_t> policy_index_;  // each row's place among its point's policies
  Layout layout_;
  std::optional<std::size_t> policy_axis_;
  bool policy_edited_ = false;   // an axis on policy.<field>
  bool compare_edited_ = false;  // an axis on compare[...]
};

}  // namespace

std::string results_html(const ResultTable& table, const Manifest& manifest) {
  report::HtmlPage page("kvtier sweep: " + table.name);
  const std::uint64_t failed = failed_points(table);
  const SweepCharts charts(table, manifest);
  page.labelled("Spec:", "spec hash " + table.spec_hash + ", kvtier " + table.kvtier_version +
                             ", " + manifest.mode);
  page.labelled("Points:", std::to_string(charts.points()) + " of the sweep's " +
                               std::to_string(manifest.points) + " here, " +
                               std::to_string(table.rows.size()) + " rows (a row per policy), " +
                               std::to_string(failed) + " with a policy that could not run");

  page.heading(2, "Axes", "axes");
  std::vector<std::vector<std::string>> axis_rows;
  for (std::size_t a = 0; a < manifest.axis_columns.size(); ++a) {
    std::string values;
    for (const std::string& value : manifest.axis_values[a]) {
      values += (values.empty() ? "" : ", ") + value;
    }
    axis_rows.push_back({manifest.axis_columns[a], values});
  }
  page.table({"column", "values"}, axis_rows);

  page.heading(2, "Charts", "charts");
  page.paragraph(charts.description());
  for (const HeadlineMetric& metric : kHeadlineMetrics) {
    if (std::find(table.metric_columns.begin(), table.metric_columns.end(), metric.name) !=
        table.metric_columns.end()) {
      charts.chart(page, metric);
    }
  }

  std::vector<std::string> header{"point"};
  header.insert(header.end(), table.axis_columns.begin(), table.axis_columns.end());
  header.emplace_back("policy");
  std::vector<bool> right{true};
  right.resize(header.size(), false);
  if (failed > 0) {
    page.heading(2, "Points that could not run", "failed");
    std::vector<std::vector<std::string>> rows;
    for (std::size_t r = 0; r < table.rows.size(); ++r) {
      const Row& row = table.rows[r];
      if (row.error.empty()) {
        continue;
      }
      std::vector<std::string> cells{std::to_string(row.point)};
      cells.insert(cells.end(), row.axis_values.begin(), row.axis_values.end());
      cells.push_back(charts.policy_of(r));
      cells.push_back(row.error);
      rows.push_back(std::move(cells));
    }
    std::vector<std::string> with_error = header;
    with_error.emplace_back("error");
    page.table(with_error, rows, right);
  }

  page.heading(2, "Results", "results");
  std::vector<const HeadlineMetric*> shown;
  for (const HeadlineMetric& metric : kHeadlineMetrics) {
    if (std::find(table.metric_columns.begin(), table.metric_columns.end(), metric.name) !=
        table.metric_columns.end()) {
      shown.push_back(&metric);
      header.emplace_back(std::string(metric.name));
      right.push_back(true);
    }
  }
  if (table.rows.size() > kMaxTableRows) {
    page.paragraph("The first " + std::to_string(kMaxTableRows) + " of " +
                   std::to_string(table.rows.size()) + " rows; results.csv has them all.");
  }
  std::vector<std::vector<std::string>> rows;
  for (std::size_t r = 0; r < std::min(table.rows.size(), kMaxTableRows); ++r) {
    const Row& row = table.rows[r];
    std::vector<std::string> cells{std::to_string(row.point)};
    cells.insert(cells.end(), row.axis_values.begin(), row.axis_values.end());
    cells.push_back(charts.policy_of(r));
    for (const HeadlineMetric* metric : shown) {
      const std::optional<double> value = metric_value(row, metric->name);
      cells.push_back(value ? format_fixed(*value, metric->decimals) : "-");
    }
    rows.push_back(std::move(cells));
  }
  page.table(header, rows, right);
  page.details("The resolved sweep spec", manifest.spec_text);
  return page.str();
}

}  // namespace kvtier::sweep::detail
