#include "report/heat_map.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "common/text_output.hpp"
#include "report/html_page.hpp"
#include "report/impl/svg_parts.hpp"

namespace kvtier::report {
namespace {

using detail::coordinate;
using detail::finite;
using detail::kYTitleChars;
using detail::on_grid;
using detail::open_svg;
using detail::shortened;
using detail::x_labels;

// Viridis (matplotlib's default colour map, perceptually uniform and readable in grey), ten
// stops; between them colours are interpolated.
constexpr std::array<std::array<int, 3>, 10> kViridis = {{{68, 1, 84},
                                                          {72, 40, 120},
                                                          {62, 73, 137},
                                                          {49, 104, 142},
                                                          {38, 130, 142},
                                                          {31, 158, 137},
                                                          {53, 183, 121},
                                                          {110, 206, 88},
                                                          {181, 222, 43},
                                                          {253, 231, 37}}};
// Colours a heat map is drawn in: few enough that a row's runs merge.
constexpr int kHeatLevels = 32;
// The plot of a heat map leaves room on the right for its colour bar.
constexpr double kHeatRight = kPlotRight - 84.0;

std::string hex_colour(const std::array<int, 3>& rgb) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string text = "#";
  for (const int channel : rgb) {
    text += kDigits[channel / 16];
    text += kDigits[channel % 16];
  }
  return text;
}

}  // namespace

std::string heat_colour(double t) {
  t = std::clamp(std::isnan(t) ? 0.0 : t, 0.0, 1.0);
  const double at = t * static_cast<double>(kViridis.size() - 1);
  const auto stop = std::min(static_cast<std::size_t>(at), kViridis.size() - 2);
  const double share = at - static_cast<double>(stop);
  std::array<int, 3> rgb{};
  for (std::size_t c = 0; c < 3; ++c) {
    rgb[c] = static_cast<int>(
        std::lround(kViridis[stop][c] + share * (kViridis[stop + 1][c] - kViridis[stop][c])));
  }
  return hex_colour(rgb);
}

std::string heat_map_svg(const HeatMap& map) {
  if (map.values.size() != static_cast<std::size_t>(map.rows) * map.columns || map.rows == 0 ||
      map.columns == 0 || !(map.x_high > map.x_low) || !(map.y_high > map.y_low) ||
      map.decades == 0) {
    throw std::invalid_argument("heat map '" + map.title +
                                "': values must be rows × columns over non-empty spans");
  }
  double largest = 0.0;
  for (const double value : map.values) {
    if (finite(value)) {
      largest = std::max(largest, value);
    }
  }
  // The scale ends at the decade above the largest value, so its labels are powers of ten.
  const double top = largest > 0.0 ? std::ceil(std::log10(largest) - 1e-9) : 0.0;
  const double bottom = top - static_cast<double>(map.decades);
  // The colour level of a value: -1 for none (NaN).
  const auto level = [&](double value) {
    if (!finite(value)) {
      return -1;
    }
    if (!(value > 0.0) || largest <= 0.0) {
      return 0;
    }
    const double t = (std::max(std::log10(value), bottom) - bottom) / (top - bottom);
    return std::min(kHeatLevels - 1, static_cast<int>(t * kHeatLevels));
  };
  const double width = (kHeatRight - kPlotLeft) / map.columns;
  const double height = (kPlotBottom - kPlotTop) / map.rows;

  std::string body = "<g class=\"cells\" shape-rendering=\"crispEdges\">\n";
  for (std::uint32_t row = 0; row < map.rows; ++row) {
    std::uint32_t column = 0;
    while (column < map.columns) {
      const int colour = level(map.values[static_cast<std::size_t>(row) * map.columns + column]);
      std::uint32_t end = column + 1;
      while (end < map.columns &&
             level(map.values[static_cast<std::size_t>(row) * map.columns + end]) == colour) {
        ++end;
      }
      if (colour >= 0) {
        // Edges from rounded ends, so that neighbouring cells share them exactly (no seams).
        const double left = on_grid(kPlotLeft + column * width);
        const double top_edge = on_grid(kPlotTop + row * height);
        body += "<rect x=\"" + coordinate(left) + "\" y=\"" + coordinate(top_edge) + "\" width=\"" +
                coordinate(on_grid(kPlotLeft + end * width) - left) + "\" height=\"" +
                coordinate(on_grid(kPlotTop + (row + 1) * height) - top_edge) + "\" fill=\"" +
                heat_colour((colour + 0.5) / kHeatLevels) + "\"/>\n";
      }
      column = end;
    }
  }
  body += "</g>\n";
  body += "<rect class=\"frame\" x=\"" + coordinate(kPlotLeft) + "\" y=\"" + coordinate(kPlotTop) +
          "\" width=\"" + coordinate(kHeatRight - kPlotLeft) + "\" height=\"" +
          coordinate(kPlotBottom - kPlotTop) + "\"/>\n";

  // Axes: x across, y downwards from the top.
  const Ticks x_ticks = linear_ticks(map.x_low, map.x_high);
  const Ticks y_ticks = linear_ticks(map.y_low, map.y_high);
  std::vector<std::pair<double, std::string>> labels;
  for (const double tick : x_ticks.values) {
    if (tick >= map.x_low && tick <= map.x_high) {
      labels.emplace_back(
          kPlotLeft + (tick - map.x_low) / (map.x_high - map.x_low) * (kHeatRight - kPlotLeft),
          tick_label(tick, x_ticks.step));
    }
  }
  const double band = x_labels(body, labels);
  body += "<text class=\"axis-title\" x=\"" + coordinate((kPlotLeft + kHeatRight) / 2.0) +
          "\" y=\"" + coordinate(kPlotBottom + band + 16.0) + "\" text-anchor=\"middle\">" +
          html_escape(map.x_label) + "</text>\n";
  for (const double tick : y_ticks.values) {
    if (tick >= map.y_low && tick <= map.y_high) {
      const double at =
          kPlotTop + (tick - map.y_low) / (map.y_high - map.y_low) * (kPlotBottom - kPlotTop);
      body += "<text class=\"tick\" x=\"" + coordinate(kPlotLeft - 6.0) + "\" y=\"" +
              coordinate(at + 4.0) + "\" text-anchor=\"end\">" +
              html_escape(tick_label(tick, y_ticks.step)) + "</text>\n";
    }
  }
  body += "<text class=\"axis-title\" text-anchor=\"middle\" transform=\"translate(16," +
          coordinate((kPlotTop + kPlotBottom) / 2.0) + ") rotate(-90)\">" +
          html_escape(shortened(map.y_label, kYTitleChars)) + "</text>\n";

  // The colour bar: the levels bottom to top, a label at each decade.
  const double bar_left = kHeatRight + 18.0;
  const double bar_height = (kPlotBottom - kPlotTop) / kHeatLevels;
  body += "<g class=\"colour-bar\" shape-rendering=\"crispEdges\">\n";
  for (int colour = 0; colour < kHeatLevels; ++colour) {
    body += "<rect x=\"" + coordinate(bar_left) + "\" y=\"" +
            coordinate(kPlotBottom - (colour + 1) * bar_height) + "\" width=\"12\" height=\"" +
            coordinate(bar_height) + "\" fill=\"" + heat_colour((colour + 0.5) / kHeatLevels) +
            "\"/>\n";
  }
  body += "</g>\n";
  for (std::uint32_t decade = 0; decade <= map.decades; ++decade) {
    const double at = kPlotTop + decade * (kPlotBottom - kPlotTop) / map.decades;
    body += "<text class=\"tick\" x=\"" + coordinate(bar_left + 16.0) + "\" y=\"" +
            coordinate(at + 4.0) + "\">" + (decade == map.decades ? "≤ " : "") +
            html_escape(compact_number(std::pow(10.0, top - decade))) + "</text>\n";
  }
  body += "<text class=\"axis-title\" x=\"" + coordinate(bar_left) + "\" y=\"" +
          coordinate(kPlotTop - 8.0) + "\">" + html_escape(map.value_label) + "</text>\n";
  return open_svg(map.title, kPlotBottom + band + 28.0) + body + "</svg>\n";
}

}  // namespace kvtier::report
