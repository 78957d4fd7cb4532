#pragma once
// Heat maps for the HTML reports (attention by decode step and key position), as inline SVG like
// svg_chart.hpp's charts, on the same plot geometry.

#include <cstdint>
#include <string>
#include <vector>

namespace kvtier::report {

// A grid of values drawn as colours (attention by step and position), on a log scale over the
// decades below the largest value, with a colour bar; runs of a row that take one colour are
// drawn as one rectangle, so a map of ten thousand cells stays a small page.
struct HeatMap {
  std::string title;
  std::string x_label;
  std::string y_label;
  std::string value_label;  // the colour bar's title
  std::uint32_t rows = 0;
  std::uint32_t columns = 0;
  std::vector<double> values;  // rows × columns, row 0 at the top; NaN: left empty
  // What the columns span across and the rows down, for the axes' ticks.
  double x_low = 0.0;
  double x_high = 1.0;
  double y_low = 0.0;
  double y_high = 1.0;
  std::uint32_t decades = 4;  // values this many decades below the largest take the lowest colour
};

// std::invalid_argument when values are not rows × columns, or a span or decades is empty.
[[nodiscard]] std::string heat_map_svg(const HeatMap& map);
// The colour of a share t in [0, 1] of a heat map's scale (viridis: dark blue to yellow).
[[nodiscard]] std::string heat_colour(double t);

}  // namespace kvtier::report
