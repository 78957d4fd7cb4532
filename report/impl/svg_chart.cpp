#include "report/svg_chart.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <limits>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/text_output.hpp"
#include "report/html_page.hpp"
#include "report/impl/svg_parts.hpp"

namespace kvtier::report {
namespace {

using detail::coordinate;
using detail::finite;
using detail::kCharWidth;
using detail::kPlotHeight;
using detail::kPlotWidth;
using detail::kYTitleChars;
using detail::open_svg;
using detail::shortened;
using detail::x_labels;

constexpr double kLegendRowHeight = 18.0;
constexpr double kLegendSwatch = 22.0;
// Thinned series keep two points per pixel column.
constexpr std::size_t kPointsBeforeThinning = 4 * static_cast<std::size_t>(kPlotWidth);

constexpr std::array<const char*, 7> kPalette = {"#0072B2", "#D55E00", "#009E73", "#CC79A7",
                                                 "#E69F00", "#56B4E9", "#000000"};
constexpr std::array<const char*, 4> kDashes = {"", "7 3", "2 2", "9 3 2 3"};
// A series that repeats an earlier one exactly would hide it, drawn on top of it. Its line
// takes gaps wide enough for the earlier line to show through, in patterns none of kDashes
// uses, and its markers are hollow shapes around the earlier one's dots.
constexpr std::array<const char*, 3> kRepeatDashes = {"6 6", "2 5", "12 5 2 5"};
enum class Marker { kDot, kSquare, kDiamond, kTriangle };
constexpr std::array<Marker, 3> kRepeatMarkers = {Marker::kSquare, Marker::kDiamond,
                                                  Marker::kTriangle};
constexpr double kRepeatMarkerSize = 5.0;  // half the width of a square, as r of a dot
// Guides (an SLO's limit, y = x) are grey and dashed, apart from every series.
constexpr const char* kGuideColour = "#888888";
constexpr const char* kGuideDashes = "5 4";

// Maps an axis's values onto pixels, and knows its ticks.
class AxisMap {
 public:
  AxisMap(const ChartAxis& axis, double data_low, double data_high, double pixel_low,
          double pixel_high)
      : axis_(axis), pixel_low_(pixel_low), pixel_high_(pixel_high) {
    if (!axis.categories.empty()) {
      for (std::size_t i = 0; i < axis.categories.size(); ++i) {
        ticks_.values.push_back(static_cast<double>(i));
      }
      ticks_.low = -0.5;
      ticks_.high = static_cast<double>(axis.categories.size()) - 0.5;
      ticks_.step = 1.0;
      return;
    }
    if (!axis.ticks.empty()) {
      given_ticks(data_low, data_high);
      return;
    }
    if (axis.scale == AxisScale::kLog) {
      ticks_ = log_ticks(data_low, data_high);
      return;
    }
    if (axis.include_zero) {
      data_low = std::min(data_low, 0.0);
      data_high = std::max(data_high, 0.0);
    }
    ticks_ = linear_ticks(data_low, data_high);
  }

  // Whether the axis can place the value at all (log axes take positive values only).
  [[nodiscard]] bool shows(double value) const {
    return finite(value) &&
           (axis_.scale != AxisScale::kLog || !axis_.categories.empty() || value > 0.0);
  }

  [[nodiscard]] double operator()(double value) const {
    double position = 0.0;
    if (axis_.scale == AxisScale::kLog && axis_.categories.empty()) {
      position = (std::log10(value) - std::log10(ticks_.low)) /
                 (std::log10(ticks_.high) - std::log10(ticks_.low));
    } else {
      position = (value - ticks_.low) / (ticks_.high - ticks_.low);
    }
    return pixel_low_ + position * (pixel_high_ - pixel_low_);
  }

  [[nodiscard]] const Ticks& ticks() const { return ticks_; }

  [[nodiscard]] std::string label(double tick) const {
    if (!axis_.categories.empty()) {
      return axis_.categories[static_cast<std::size_t>(tick)];
    }
    return axis_.scale == AxisScale::kLog || !axis_.ticks.empty() ? format_double(tick)
                                                                  : tick_label(tick, ticks_.step);
  }

  // A value as a tooltip says it: the category's name, else the shortest exact text.
  [[nodiscard]] std::string value_text(double value) const {
    if (!axis_.categories.empty() && value >= 0.0 &&
        value < static_cast<double>(axis_.categories.size())) {
      return axis_.categories[static_cast<std::size_t>(value)];
    }
    return format_double(value);
  }

 private:
  // The axis's own ticks (those it can show), spanning them and the data with 4% to spare at
  // each end, in the scale's terms.
  void given_ticks(double data_low, double data_high) {
    const bool log = axis_.scale == AxisScale::kLog;
    for (const double tick : axis_.ticks) {
      if (finite(tick) && (!log || tick > 0.0)) {
        ticks_.values.push_back(tick);
      }
    }
    std::sort(ticks_.values.begin(), ticks_.values.end());
    ticks_.values.erase(std::unique(ticks_.values.begin(), ticks_.values.end()),
                        ticks_.values.end());
    double low = data_low;
    double high = data_high;
    if (!ticks_.values.empty()) {
      low = std::min(low, ticks_.values.front());
      high = std::max(high, ticks_.values.back());
    }
    const auto to_scale = [log](double value) { return log ? std::log10(value) : value; };
    const auto from_scale = [log](double value) { return log ? std::pow(10.0, value) : value; };
    double span = to_scale(high) - to_scale(low);
    if (span == 0.0) {
      span = log ? 1.0 : std::max(1.0, std::abs(low));
    }
    ticks_.low = from_scale(to_scale(low) - 0.04 * span);
    ticks_.high = from_scale(to_scale(high) + 0.04 * span);
    ticks_.step = 0.0;
  }

  const ChartAxis& axis_;
  double pixel_low_;
  double pixel_high_;
  Ticks ticks_;
};

struct Range {
  double low = std::numeric_limits<double>::infinity();
  double high = -std::numeric_limits<double>::infinity();
  void add(double value) {
    low = std::min(low, value);
    high = std::max(high, value);
  }
  [[nodiscard]] bool empty() const { return low > high; }
};

// A <line> from (x1, y1) to (x2, y2), with further attributes (` class="grid"`).
std::string line_element(double x1, double x2, double y1, double y2, std::string_view attributes) {
  std::string svg = "<line";
  svg += attributes;
  for (const auto& [name, value] : {std::pair{" x1=\"", x1}, std::pair{"\" x2=\"", x2},
                                    std::pair{"\" y1=\"", y1}, std::pair{"\" y2=\"", y2}}) {
    svg += name;
    svg += coordinate(value);
  }
  svg += "\"/>\n";
  return svg;
}

// Horizontal grid lines and labels of the y axis, the frame, and the axis's title.
std::string y_axis(const AxisMap& y, const std::string& label) {
  std::string svg;
  for (const double tick : y.ticks().values) {
    svg += line_element(kPlotLeft, kPlotRight, y(tick), y(tick), " class=\"grid\"");
    svg += "<text class=\"tick\" x=\"" + coordinate(kPlotLeft - 6.0) + "\" y=\"" +
           coordinate(y(tick) + 4.0) + "\" text-anchor=\"end\">" + html_escape(y.label(tick)) +
           "</text>\n";
  }
  svg += "<rect class=\"frame\" x=\"" + coordinate(kPlotLeft) + "\" y=\"" + coordinate(kPlotTop) +
         "\" width=\"" + coordinate(kPlotWidth) + "\" height=\"" + coordinate(kPlotHeight) +
         "\"/>\n";
  svg += "<text class=\"axis-title\" text-anchor=\"middle\" transform=\"translate(16," +
         coordinate((kPlotTop + kPlotBottom) / 2.0) + ") rotate(-90)\">" +
         html_escape(shortened(label, kYTitleChars)) + "</text>\n";
  return svg;
}

// How the legend shows one entry: a box (bars), a line in the entry's colour and dashes, or a
// dot (points not joined); a repeated series' hollow marker over its line or instead of the dot.
struct LegendEntry {
  enum Swatch { kLine, kBox, kDot };
  std::string label;
  std::string colour;
  std::string dashes;
  Swatch swatch = kLine;
  Marker marker = Marker::kDot;
};

std::string stroke_attributes(const std::string& colour, const std::string& dashes,
                              const char* width) {
  return " stroke=\"" + colour + "\" stroke-width=\"" + width + "\"" +
         (dashes.empty() ? std::string() : " stroke-dasharray=\"" + dashes + "\"");
}

// A repeated series' marker centred on (x, y): an outline only, solid whatever the series'
// dashes, around the dot of the series it repeats. `inside` is the element's content (a
// <title>), or empty.
std::string hollow_marker(Marker shape, double x, double y, const std::string& colour,
                          const std::string& inside) {
  constexpr double h = kRepeatMarkerSize;
  std::string svg;
  if (shape == Marker::kSquare) {
    svg = "<rect x=\"" + coordinate(x - h) + "\" y=\"" + coordinate(y - h) + "\" width=\"" +
          coordinate(2.0 * h) + "\" height=\"" + coordinate(2.0 * h) + "\"";
  } else {
    // Both centred on (x, y): the triangle's centroid, a third of its height above its base.
    const std::vector<std::pair<double, double>> corners =
        shape == Marker::kDiamond
            ? std::vector<std::pair<double, double>>{{x, y - 1.3 * h},
                                                     {x + 1.3 * h, y},
                                                     {x, y + 1.3 * h},
                                                     {x - 1.3 * h, y}}
            : std::vector<std::pair<double, double>>{
                  {x, y - 1.4 * h}, {x + 1.2 * h, y + 0.7 * h}, {x - 1.2 * h, y + 0.7 * h}};
    svg = "<polygon points=\"";
    for (std::size_t i = 0; i < corners.size(); ++i) {
      svg +=
          (i == 0 ? "" : " ") + coordinate(corners[i].first) + "," + coordinate(corners[i].second);
    }
    svg += "\"";
  }
  svg += " fill=\"none\" stroke=\"" + colour + "\" stroke-width=\"1.5\" stroke-dasharray=\"none\"";
  const std::string tag = shape == Marker::kSquare ? "rect" : "polygon";
  return svg + (inside.empty() ? "/>\n" : ">" + inside + "</" + tag + ">\n");
}

// The legend's rows below `top`. Returns its height.
double legend(std::string& svg, const std::vector<LegendEntry>& entries, double top) {
  if (entries.empty()) {
    return 0.0;
  }
  double x = kPlotLeft;
  double y = top;
  for (const LegendEntry& entry : entries) {
    const double width =
        kLegendSwatch + 6.0 + static_cast<double>(entry.label.size()) * kCharWidth + 16.0;
    if (x > kPlotLeft && x + width > kPlotRight) {
      x = kPlotLeft;
      y += kLegendRowHeight;
    }
    if (entry.swatch == LegendEntry::kBox) {
      svg += "<rect x=\"" + coordinate(x) + "\" y=\"" + coordinate(y - 10.0) +
             "\" width=\"12\" height=\"12\" fill=\"" + entry.colour + "\"/>\n";
    } else if (entry.swatch == LegendEntry::kDot && entry.marker == Marker::kDot) {
      svg += "<circle cx=\"" + coordinate(x + kLegendSwatch / 2.0) + "\" cy=\"" +
             coordinate(y - 4.0) + "\" r=\"3.5\" fill=\"" + entry.colour + "\"/>\n";
    } else if (entry.swatch == LegendEntry::kLine) {
      svg += line_element(x, x + kLegendSwatch, y - 4.0, y - 4.0,
                          stroke_attributes(entry.colour, entry.dashes, "2"));
    }
    if (entry.swatch != LegendEntry::kBox && entry.marker != Marker::kDot) {
      svg += hollow_marker(entry.marker, x + kLegendSwatch / 2.0, y - 4.0, entry.colour, "");
    }
    svg += "<text class=\"legend\" x=\"" + coordinate(x + kLegendSwatch + 6.0) + "\" y=\"" +
           coordinate(y) + "\">" + html_escape(entry.label) + "</text>\n";
    x += width;
  }
  return y - top + kLegendRowHeight;
}

// Legend entries for series in the palette's order.
std::vector<LegendEntry> series_entries(const std::vector<std::string>& labels,
                                        LegendEntry::Swatch swatch) {
  std::vector<LegendEntry> entries;
  for (std::size_t i = 0; i < labels.size(); ++i) {
    entries.push_back({labels[i], series_colour(i),
                       swatch == LegendEntry::kLine ? series_dashes(i) : "", swatch});
  }
  return entries;
}

// The points of one unbroken stretch of a line, thinned to each pixel column's extremes when
// there are more than the plot can show.
std::vector<std::pair<double, double>> thin(std::vector<std::pair<double, double>> points) {
  if (points.size() <= kPointsBeforeThinning) {
    return points;
  }
  std::vector<std::pair<double, double>> kept;
  std::size_t begin = 0;
  while (begin < points.size()) {
    const double column = std::floor(points[begin].first);
    std::size_t end = begin;
    std::size_t lowest = begin;
    std::size_t highest = begin;
    while (end < points.size() && std::floor(points[end].first) == column) {
      // Pixel y grows downwards: the highest value has the smallest y.
      if (points[end].second > points[lowest].second) {
        lowest = end;
      }
      if (points[end].second < points[highest].second) {
        highest = end;
      }
      ++end;
    }
    kept.push_back(points[std::min(lowest, highest)]);
    if (lowest != highest) {
      kept.push_back(points[std::max(lowest, highest)]);
    }
    begin = end;
  }
  return kept;
}

// For each series, the first earlier series with the same points (x and y alike, NaN where it
// has NaN), or the series' own index. A series with no point to draw repeats none.
std::vector<std::size_t> repeated_series(const std::vector<LineSeries>& series) {
  const auto same = [](double a, double b) { return a == b || (std::isnan(a) && std::isnan(b)); };
  const auto equal = [&same](const std::vector<double>& a, const std::vector<double>& b) {
    return std::equal(a.begin(), a.end(), b.begin(), b.end(), same);
  };
  std::vector<std::size_t> repeats(series.size());
  for (std::size_t s = 0; s < series.size(); ++s) {
    repeats[s] = s;
    bool drawn = false;
    for (std::size_t i = 0; i < series[s].x.size() && !drawn; ++i) {
      drawn = finite(series[s].x[i]) && finite(series[s].y[i]);
    }
    for (std::size_t t = 0; t < s && drawn; ++t) {
      if (repeats[t] == t && equal(series[t].x, series[s].x) && equal(series[t].y, series[s].y)) {
        repeats[s] = t;
        break;
      }
    }
  }
  return repeats;
}

std::string polyline(const std::vector<std::pair<double, double>>& points) {
  std::string svg = "<polyline points=\"";
  for (std::size_t i = 0; i < points.size(); ++i) {
    svg += (i == 0 ? "" : " ") + coordinate(points[i].first) + "," + coordinate(points[i].second);
  }
  return svg + "\"/>\n";
}

}  // namespace

Ticks linear_ticks(double low, double high, int target) {
  if (!finite(low) || !finite(high) || low > high) {
    throw std::invalid_argument("linear_ticks: not a range");
  }
  // A range of a few ulps is as degenerate as none: no round step ticks it in doubles.
  if (high - low <=
      8.0 * std::numeric_limits<double>::epsilon() * std::max(std::abs(low), std::abs(high))) {
    const double pad =
        low == 0.0 && high == 0.0 ? 1.0 : std::max(std::abs(low), std::abs(high)) * 0.1;
    low -= low == 0.0 && high == 0.0 ? 0.0 : pad;
    high += pad;
  }
  // The finest round step (1, 2 or 5 times a power of ten) whose ticks number at most three
  // more than asked: it wastes the least of the plot beyond the data.
  const double rough = (high - low) / std::max(1, target - 1);
  if (!std::isfinite(rough) || !(std::pow(10.0, std::floor(std::log10(rough)) - 1.0) > 0.0)) {
    throw std::invalid_argument("linear_ticks: a range too wide or too narrow for doubles");
  }
  Ticks ticks;
  double first = 0.0;
  double last = 0.0;
  for (double decade = std::pow(10.0, std::floor(std::log10(rough)) - 1.0);; decade *= 10.0) {
    for (const double multiple : {1.0, 2.0, 5.0}) {
      ticks.step = multiple * decade;
      // A tolerance of a millionth of a step keeps 0.30000000000000004 from starting a new one.
      const double slack = ticks.step * 1e-6;
      first = std::floor((low + slack) / ticks.step);
      last = std::ceil((high - slack) / ticks.step);
      if (last - first + 1.0 <= static_cast<double>(target + 3)) {
        ticks.low = first * ticks.step;
        ticks.high = last * ticks.step;
        const auto count = static_cast<int>(last - first) + 1;
        for (int k = 0; k < count; ++k) {
          ticks.values.push_back((first + k) * ticks.step);
        }
        return ticks;
      }
    }
  }
}

Ticks log_ticks(double low, double high) {
  if (!finite(low) || !finite(high) || low <= 0.0 || low > high) {
    throw std::invalid_argument("log_ticks: not a positive range");
  }
  int first = static_cast<int>(std::floor(std::log10(low) + 1e-9));
  int last = static_cast<int>(std::ceil(std::log10(high) - 1e-9));
  if (last == first) {
    ++last;
  }
  Ticks ticks;
  ticks.step = 0.0;
  const bool fine = last - first <= 2;
  for (int decade = first; decade <= last; ++decade) {
    const double power = std::pow(10.0, decade);
    for (const double multiple : {1.0, 2.0, 5.0}) {
      if ((multiple == 1.0 || (fine && decade < last))) {
        ticks.values.push_back(multiple * power);
      }
    }
  }
  // Trim the fine ticks beyond the data to the nearest one that still covers it.
  while (ticks.values.size() > 2 && ticks.values[1] <= low) {
    ticks.values.erase(ticks.values.begin());
  }
  while (ticks.values.size() > 2 && ticks.values[ticks.values.size() - 2] >= high) {
    ticks.values.pop_back();
  }
  ticks.low = ticks.values.front();
  ticks.high = ticks.values.back();
  return ticks;
}

std::string tick_label(double value, double step) {
  int decimals = 0;
  while (decimals < 12) {
    const double scaled = step * std::pow(10.0, decimals);
    if (std::abs(scaled - std::round(scaled)) <= 1e-6 * std::max(1.0, scaled)) {
      break;
    }
    ++decimals;
  }
  std::string text = format_fixed(value, decimals);
  if (text.find_first_not_of("-0.") == std::string::npos) {
    return "0";
  }
  return text;
}

std::string compact_number(double value) {
  if (!finite(value)) {
    return "n/a";
  }
  const double magnitude = std::abs(value);
  if (magnitude >= 1000.0 || magnitude == 0.0) {
    return tick_label(value, 1.0);
  }
  const int decimals = 3 - static_cast<int>(std::floor(std::log10(magnitude)));
  std::string text = format_fixed(value, decimals);
  while (text.back() == '0') {
    text.pop_back();
  }
  if (text.back() == '.') {
    text.pop_back();
  }
  return text == "-0" ? "0" : text;
}

std::string series_colour(std::size_t index) {
  return kPalette[index % kPalette.size()];
}

std::string series_dashes(std::size_t index) {
  return kDashes[(index / kPalette.size()) % kDashes.size()];
}

std::string line_chart_svg(const LineChart& chart) {
  const auto refuse = [&chart](const std::string& why) {
    throw std::invalid_argument("line chart '" + chart.title + "': " + why);
  };
  if (!chart.y.categories.empty()) {
    refuse("a categorical y axis");
  }
  const bool log_x = chart.x.scale == AxisScale::kLog && chart.x.categories.empty();
  const bool log_y = chart.y.scale == AxisScale::kLog;
  const bool one_scale = chart.x.categories.empty() && log_x == log_y;
  if (chart.same_ranges && !one_scale) {
    refuse("same_ranges needs both axes on one scale");
  }
  Range xs;
  Range ys;
  for (const LineSeries& series : chart.series) {
    if (series.x.size() != series.y.size() ||
        (!series.notes.empty() && series.notes.size() != series.x.size())) {
      refuse("series '" + series.label + "': x, y and notes differ in length");
    }
    for (std::size_t i = 0; i < series.x.size(); ++i) {
      const bool x_shown = finite(series.x[i]) && (!log_x || series.x[i] > 0.0);
      const bool y_shown = finite(series.y[i]) && (!log_y || series.y[i] > 0.0);
      if (x_shown && y_shown) {
        xs.add(series.x[i]);
        ys.add(series.y[i]);
      }
    }
  }
  for (const Guide& guide : chart.guides) {
    if (guide.factor != 0.0 && !one_scale) {
      refuse("guide '" + guide.label + "': y = factor·x needs both axes on one scale");
    }
    if (guide.factor == 0.0 && finite(guide.level) && (!log_y || guide.level > 0.0)) {
      ys.add(guide.level);
    }
  }
  if (xs.empty()) {
    xs.add(log_x ? 1.0 : 0.0);
    xs.add(log_x ? 10.0 : 1.0);
  }
  if (ys.empty()) {
    ys.add(log_y ? 1.0 : 0.0);
    ys.add(log_y ? 10.0 : 1.0);
  }
  if (chart.same_ranges) {
    xs.add(ys.low);
    xs.add(ys.high);
    ys = xs;
  }
  const AxisMap x(chart.x, xs.low, xs.high, kPlotLeft, kPlotRight);
  const AxisMap y(chart.y, ys.low, ys.high, kPlotBottom, kPlotTop);

  std::string body = y_axis(y, chart.y.label);
  std::vector<std::pair<double, std::string>> labels;
  for (const double tick : x.ticks().values) {
    labels.emplace_back(x(tick), x.label(tick));
    if (chart.x.categories.empty()) {
      body += line_element(x(tick), x(tick), kPlotTop, kPlotBottom, " class=\"grid\"");
    }
  }
  const double band = x_labels(body, labels);
  body += "<text class=\"axis-title\" x=\"" + coordinate((kPlotLeft + kPlotRight) / 2.0) +
          "\" y=\"" + coordinate(kPlotBottom + band + 16.0) + "\" text-anchor=\"middle\">" +
          html_escape(chart.x.label) + "</text>\n";

  std::vector<LegendEntry> entries;
  for (const Guide& guide : chart.guides) {
    // The part of the guide inside the plot.
    const double x_low = x.ticks().low;
    const double x_high = x.ticks().high;
    double from = x_low;
    double to = x_high;
    if (guide.factor != 0.0) {
      const double ends[] = {y.ticks().low / guide.factor, y.ticks().high / guide.factor};
      from = std::max(x_low, std::min(ends[0], ends[1]));
      to = std::min(x_high, std::max(ends[0], ends[1]));
    } else if (!y.shows(guide.level)) {
      continue;
    }
    if (!(from < to)) {
      continue;
    }
    const auto at = [&guide](double value) {
      return guide.factor != 0.0 ? guide.factor * value : guide.level;
    };
    const std::string dashes = guide.dashed ? kGuideDashes : "";
    body += "<g class=\"guide\">" +
            line_element(x(from), x(to), y(at(from)), y(at(to)),
                         stroke_attributes(kGuideColour, dashes, "1.25")) +
            "<title>" + html_escape(guide.label) + "</title></g>\n";
    entries.push_back({guide.label, kGuideColour, dashes, LegendEntry::kLine});
  }

  std::vector<LegendEntry> all;
  const std::vector<std::size_t> repeats = repeated_series(chart.series);
  std::vector<std::size_t> repeat_count(chart.series.size(), 0);
  for (std::size_t s = 0; s < chart.series.size(); ++s) {
    const LineSeries& series = chart.series[s];
    LegendEntry look{series.label, series_colour(s), series_dashes(s),
                     chart.lines ? LegendEntry::kLine : LegendEntry::kDot};
    if (repeats[s] != s) {
      // The legend says so: without it a reader would take the hidden series for missing.
      const std::size_t k = repeat_count[repeats[s]]++;
      look.label += " (same as " + chart.series[repeats[s]].label + ")";
      look.dashes = chart.lines ? kRepeatDashes[k % kRepeatDashes.size()] : "";
      look.marker = chart.markers ? kRepeatMarkers[k % kRepeatMarkers.size()] : Marker::kDot;
    }
    all.push_back(look);
    const std::string& dashes = look.dashes;
    body += "<g class=\"series\" stroke=\"" + look.colour + "\" fill=\"" + look.colour + "\"" +
            (dashes.empty() ? std::string() : " stroke-dasharray=\"" + dashes + "\"") + ">\n";
    std::vector<std::pair<double, double>> stretch;
    std::string markers;
    const auto flush = [&] {
      if (chart.lines && stretch.size() > 1) {
        body += polyline(chart.markers ? stretch : thin(std::move(stretch)));
      }
      stretch.clear();
    };
    for (std::size_t i = 0; i < series.x.size(); ++i) {
      if (!x.shows(series.x[i]) || !y.shows(series.y[i])) {
        flush();
        continue;
      }
      const double px = x(series.x[i]);
      const double py = y(series.y[i]);
      stretch.emplace_back(px, py);
      if (chart.markers) {
        const std::string title = "<title>" + html_escape(series.label) + ": " +
                                  html_escape(x.value_text(series.x[i])) + ", " +
                                  html_escape(format_double(series.y[i])) +
                                  (series.notes.empty() || series.notes[i].empty()
                                       ? std::string()
                                       : " (" + html_escape(series.notes[i]) + ")") +
                                  "</title>";
        markers += look.marker == Marker::kDot
                       ? "<circle cx=\"" + coordinate(px) + "\" cy=\"" + coordinate(py) +
                             "\" r=\"3\">" + title + "</circle>\n"
                       : hollow_marker(look.marker, px, py, look.colour, title);
      }
    }
    flush();
    body += markers + "</g>\n";
  }
  all.insert(all.end(), entries.begin(), entries.end());
  const double legend_top = kPlotBottom + band + 44.0;
  const double legend_height = legend(body, all, legend_top);
  return open_svg(chart.title, legend_top + legend_height) + body + "</svg>\n";
}

std::string bar_chart_svg(const BarChart& chart) {
  if (chart.values.size() != chart.series.size()) {
    throw std::invalid_argument("bar chart '" + chart.title + "': values for " +
                                std::to_string(chart.values.size()) + " series, named " +
                                std::to_string(chart.series.size()));
  }
  Range ys;
  ys.add(0.0);
  for (std::size_t g = 0; g < chart.groups.size(); ++g) {
    double up = 0.0;
    double down = 0.0;
    for (const std::vector<double>& values : chart.values) {
      if (values.size() != chart.groups.size()) {
        throw std::invalid_argument("bar chart '" + chart.title + "': a series' values differ " +
                                    "in number from its groups");
      }
      const double value = values[g];
      if (!finite(value)) {
        continue;
      }
      if (chart.stacked) {
        (value >= 0.0 ? up : down) += value;
      } else {
        ys.add(value);
      }
    }
    ys.add(up);
    ys.add(down);
  }
  ChartAxis y_axis_spec;
  y_axis_spec.label = chart.y_label;
  const AxisMap y(y_axis_spec, ys.low, ys.high, kPlotBottom, kPlotTop);
  std::string body = y_axis(y, chart.y_label);

  const double groups = static_cast<double>(std::max<std::size_t>(1, chart.groups.size()));
  const double band = kPlotWidth / groups;
  const double bars = chart.stacked ? 1.0 : static_cast<double>(chart.series.size());
  const double bar_width = std::min(band * 0.8 / std::max(1.0, bars), 80.0);
  const bool value_labels = bars * groups <= 24.0 && bar_width >= 16.0;
  std::vector<std::pair<double, std::string>> labels;
  for (std::size_t g = 0; g < chart.groups.size(); ++g) {
    const double centre = kPlotLeft + (static_cast<double>(g) + 0.5) * band;
    labels.emplace_back(centre, chart.groups[g]);
    double up = 0.0;
    double down = 0.0;
    bool any = false;
    for (std::size_t s = 0; s < chart.series.size(); ++s) {
      const double value = chart.values[s][g];
      const double left =
          chart.stacked ? centre - bar_width / 2.0
                        : centre - bar_width * bars / 2.0 + bar_width * static_cast<double>(s);
      if (!finite(value)) {
        if (!chart.stacked) {
          body += "<text class=\"note\" x=\"" + coordinate(left + bar_width / 2.0) + "\" y=\"" +
                  coordinate(y(0.0) - 3.0) + "\" text-anchor=\"middle\">n/a</text>\n";
        }
        continue;
      }
      any = true;
      double from = 0.0;
      double to = value;
      if (chart.stacked) {
        double& base = value >= 0.0 ? up : down;
        from = base;
        to = base + value;
        base = to;
      }
      const double top = std::min(y(from), y(to));
      const double height = std::abs(y(from) - y(to));
      body += "<rect x=\"" + coordinate(left) + "\" y=\"" + coordinate(top) + "\" width=\"" +
              coordinate(bar_width) + "\" height=\"" + coordinate(height) + "\" fill=\"" +
              series_colour(s) + "\"><title>" + html_escape(chart.series[s]) + ", " +
              html_escape(chart.groups[g]) + ": " + html_escape(format_double(value)) +
              "</title></rect>\n";
      if (value_labels && !chart.stacked) {
        body += "<text class=\"value\" x=\"" + coordinate(left + bar_width / 2.0) + "\" y=\"" +
                coordinate(value >= 0.0 ? top - 3.0 : top + height + 11.0) +
                "\" text-anchor=\"middle\">" + compact_number(value) + "</text>\n";
      }
    }
    if (chart.stacked && value_labels) {
      body += "<text class=\"value\" x=\"" + coordinate(centre) + "\" y=\"" +
              coordinate(y(up) - 3.0) + "\" text-anchor=\"middle\">" +
              (any ? compact_number(up + down) : std::string("n/a")) + "</text>\n";
    }
  }
  const double label_band = x_labels(body, labels);
  const double legend_top = kPlotBottom + label_band + 22.0;
  const double legend_height =
      legend(body, series_entries(chart.series, LegendEntry::kBox), legend_top);
  return open_svg(chart.title, legend_top + legend_height) + body + "</svg>\n";
}

}  // namespace kvtier::report
