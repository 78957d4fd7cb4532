#pragma once
// What the charts of svg_chart.cpp and heat_map.cpp share: coordinates as printed, the SVG's
// opening, labels along x and cut titles. Not part of the module's interface.

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "report/svg_chart.hpp"

namespace kvtier::report::detail {

inline constexpr double kPlotWidth = kPlotRight - kPlotLeft;
inline constexpr double kPlotHeight = kPlotBottom - kPlotTop;
// An estimate of a 12-pixel sans-serif character's width, for laying out labels and the legend.
inline constexpr double kCharWidth = 6.6;
// Tick labels turn when they would overlap even broken into lines; turned, they are cut to this
// length.
inline constexpr std::size_t kTurnedLabelChars = 24;
// The y axis's title runs along the plot's height, and is cut to it.
inline constexpr std::size_t kYTitleChars = static_cast<std::size_t>(kPlotHeight / kCharWidth);

// A coordinate at a tenth of a unit, never "-0.0".
[[nodiscard]] std::string coordinate(double value);
// A value rounded as coordinate() prints it.
[[nodiscard]] double on_grid(double value);
[[nodiscard]] bool finite(double value);
// `text` cut to `length` bytes with an ellipsis, never inside a UTF-8 sequence.
[[nodiscard]] std::string shortened(const std::string& text, std::size_t length);
// The SVG element's opening tag and title; `height` includes the legend.
[[nodiscard]] std::string open_svg(const std::string& title, double height);
// Labels along x at their positions: on one line when they fit beside each other, else broken
// into lines, else turned and shortened (the whole text in a <title>). Returns the band's
// height.
double x_labels(std::string& svg, const std::vector<std::pair<double, std::string>>& labels);

}  // namespace kvtier::report::detail
