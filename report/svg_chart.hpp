#pragma once
// Charts for the HTML reports, drawn as inline SVG: line charts (a sweep's metric against an
// axis, a run's sampled series over time) and bar charts (policies side by side, stacked or
// grouped). The SVG needs no script, font or stylesheet from elsewhere, so a report opens from
// a folder copied off a machine with no network. Every value is also in the element's
// <title> (shown on hover), at full precision. Same chart, same bytes: coordinates are printed
// with a fixed number of decimals.

#include <cstdint>
#include <string>
#include <vector>

namespace kvtier::report {

enum class AxisScale { kLinear, kLog };

struct ChartAxis {
  std::string label;  // the quantity and its unit: "KV in HBM per GPU (GiB)"
  AxisScale scale = AxisScale::kLinear;
  // A categorical axis: values are the indices 0..n-1 of these names, spaced evenly. Only for x.
  std::vector<std::string> categories;
  // A linear axis starts at zero (or below, for negative data) unless this is false.
  bool include_zero = true;
  // Ticks at these values (a sweep axis's own) instead of round ones; the axis then spans
  // them and the data, with a little room at both ends, and does not include zero.
  std::vector<double> ticks;
};

struct LineSeries {
  std::string label;
  std::vector<double> x;
  std::vector<double> y;  // NaN (or a value a log axis cannot show) breaks the line there
  // Empty, or a few words per point that its marker's <title> adds ("misses ttft_p99").
  std::vector<std::string> notes = {};
};

// A reference drawn grey under the data and named in the legend: the level y = `level` (an
// SLO's limit) when `factor` is 0, else the line y = factor·x (a parity chart's y = x and its
// ±10%), which needs both axes on the same scale. The axes cover a level.
struct Guide {
  std::string label;
  double factor = 0.0;
  double level = 0.0;
  bool dashed = true;  // solid for the one a chart is read against (y = x)
};

struct LineChart {
  std::string title;
  ChartAxis x;
  ChartAxis y;
  // A series with exactly the points of an earlier one (x and y alike) would hide it: it is
  // drawn with gaps the earlier one shows through, its markers hollow squares, diamonds or
  // triangles around the earlier one's dots, and its legend entry ends "(same as LABEL)".
  std::vector<LineSeries> series;
  std::vector<Guide> guides;
  // A dot, with its values in a <title>, at every point. Off for sampled series, whose points
  // are thinned to the plot's width (keeping each pixel column's lowest and highest value).
  bool markers = true;
  // Points joined by lines; off for a scatter of points that are no sequence.
  bool lines = true;
  // Both axes span the x and the y data together (a parity chart); they must share a scale.
  bool same_ranges = false;
};

struct BarChart {
  std::string title;
  std::string y_label;
  std::vector<std::string> groups;          // along x
  std::vector<std::string> series;          // one colour each, in the legend
  std::vector<std::vector<double>> values;  // [series][group]; NaN: no bar, marked "n/a"
  // Series stacked into one bar per group (parts of a whole, such as HBM by kind) instead of
  // side by side.
  bool stacked = false;
};

// The plot's size in SVG user units; the legend adds rows below it.
inline constexpr double kChartWidth = 760.0;
inline constexpr double kPlotLeft = 76.0;
inline constexpr double kPlotRight = kChartWidth - 24.0;
inline constexpr double kPlotTop = 36.0;
inline constexpr double kPlotBottom = 300.0;

// std::invalid_argument when the series' x and y (or notes) lengths differ, a bar chart's
// values do not match its series and groups, a categorical axis is given where none can be, or
// a proportional guide or same_ranges is given axes of different scales.
[[nodiscard]] std::string line_chart_svg(const LineChart& chart);
[[nodiscard]] std::string bar_chart_svg(const BarChart& chart);

// Axis ticks on round values (1, 2 or 5 times a power of ten) that cover [low, high].
struct Ticks {
  double low = 0.0;   // first tick, <= the data's low
  double high = 1.0;  // last tick, >= the data's high
  double step = 1.0;  // linear: between ticks; log: unused (0)
  std::vector<double> values;
};
// `target` to `target` + 3 ticks, at the finest round step that gives no more; a degenerate
// range is widened around its value.
[[nodiscard]] Ticks linear_ticks(double low, double high, int target = 6);
// Powers of ten covering [low, high] (both > 0), with 2 and 5 times them when the range spans
// two decades or less.
[[nodiscard]] Ticks log_ticks(double low, double high);
// A tick's text: as many decimals as the step needs ("0.25", "1500").
[[nodiscard]] std::string tick_label(double value, double step);
// A value for a label beside a bar: four significant figures at most, no exponent below 1e15
// ("3146", "24.53", "0.0123").
[[nodiscard]] std::string compact_number(double value);

// The colour of the i-th series (Okabe and Ito's palette, distinguishable with colour-blind
// vision) and, past the palette's length, the dash pattern that tells repeats apart ("" for
// solid).
[[nodiscard]] std::string series_colour(std::size_t index);
[[nodiscard]] std::string series_dashes(std::size_t index);

}  // namespace kvtier::report
