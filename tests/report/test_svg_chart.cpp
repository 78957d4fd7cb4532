#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "report/heat_map.hpp"
#include "report/svg_chart.hpp"
#include "tests/support/xml_reader.hpp"

namespace kvtier::report {
namespace {

using testing::attribute;
using testing::elements;
using testing::number_attribute;
using testing::parse_xml;
using testing::text_of;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

std::vector<std::pair<double, double>> polyline_points(const testing::XmlTree& polyline) {
  std::vector<std::pair<double, double>> points;
  std::istringstream in(attribute(polyline, "points"));
  std::string pair;
  while (in >> pair) {
    const auto comma = pair.find(',');
    points.emplace_back(std::stod(pair.substr(0, comma)), std::stod(pair.substr(comma + 1)));
  }
  return points;
}

// The markers of the data (a scatter's legend draws dots too).
std::vector<const testing::XmlTree*> data_points(const testing::XmlTree& svg) {
  std::vector<const testing::XmlTree*> points;
  for (const auto* group : elements(svg, "g")) {
    if (attribute(*group, "class") == "series") {
      const auto circles = elements(*group, "circle");
      points.insert(points.end(), circles.begin(), circles.end());
    }
  }
  return points;
}

TEST_CASE("linear ticks are round values that cover the data", "[report]") {
  const Ticks ticks = linear_ticks(0.0, 9.3);
  CHECK(ticks.step == 2.0);
  CHECK(ticks.values == std::vector<double>{0, 2, 4, 6, 8, 10});
  const Ticks small = linear_ticks(0.013, 0.087);
  CHECK(small.step == Approx(0.01));
  CHECK(small.low == Approx(0.01));
  CHECK(small.high == Approx(0.09));
  REQUIRE(small.values.size() == 9);
  CHECK(tick_label(small.values[3], small.step) == "0.04");
  // The finest step of at most target + 3 ticks: 0 to 1023 by 200, not by 500 to 1500.
  const Ticks steps = linear_ticks(0.0, 1023.0);
  CHECK(steps.step == 200.0);
  CHECK(steps.high == 1200.0);
  // A tick a rounding error past the data does not add a step.
  const Ticks exact = linear_ticks(0.0, 0.1 + 0.2);
  CHECK(exact.high == Approx(0.3));
  CHECK(exact.values.size() == 7);
}

TEST_CASE("a degenerate range is widened around its value", "[report]") {
  const Ticks zero = linear_ticks(0.0, 0.0);
  CHECK(zero.low == 0.0);
  CHECK(zero.high >= 1.0);
  const Ticks flat = linear_ticks(50.0, 50.0);
  CHECK(flat.low < 50.0);
  CHECK(flat.high > 50.0);
  CHECK_THROWS_AS(linear_ticks(2.0, 1.0), std::invalid_argument);
  CHECK_THROWS_AS(linear_ticks(0.0, kNaN), std::invalid_argument);
  // A range of an ulp or two is widened like one of none, rather than ticked forever.
  for (const auto& [low, high] :
       {std::pair{1.0, std::nextafter(1.0, 2.0)}, std::pair{0.99999999999999989, 1.0}}) {
    const Ticks near = linear_ticks(low, high);
    CHECK(near.values.size() <= 9);
    CHECK(near.low <= low);
    CHECK(near.high >= high);
  }
  CHECK_THROWS_AS(linear_ticks(-1e308, 1e308), std::invalid_argument);
  CHECK_THROWS_AS(linear_ticks(0.0, 1e-323), std::invalid_argument);
}

TEST_CASE("log ticks are decades, with 2 and 5 over short ranges", "[report]") {
  CHECK(log_ticks(1.0, 256.0).values == std::vector<double>{1, 10, 100, 1000});
  CHECK(log_ticks(3.0, 40.0).values == std::vector<double>{2, 5, 10, 20, 50});
  CHECK(log_ticks(10.0, 10.0).values == std::vector<double>{10, 20});
  CHECK_THROWS_AS(log_ticks(0.0, 10.0), std::invalid_argument);
}

TEST_CASE("labels print the decimals their step needs and no negative zero", "[report]") {
  CHECK(tick_label(1500.0, 500.0) == "1500");
  CHECK(tick_label(0.25, 0.05) == "0.25");
  CHECK(tick_label(-1e-17, 0.5) == "0");
  CHECK(compact_number(3145.6247) == "3146");
  CHECK(compact_number(24.5349) == "24.53");
  CHECK(compact_number(0.0123) == "0.0123");
  CHECK(compact_number(0.5) == "0.5");
  CHECK(compact_number(0.0) == "0");
  CHECK(compact_number(kNaN) == "n/a");
  CHECK(compact_number(-2.0) == "-2");
}

TEST_CASE("a line chart maps its data onto the plot between its outer ticks", "[report]") {
  LineChart chart;
  chart.title = "tokens/s against batch";
  chart.x.label = "batch";
  chart.y.label = "tokens/s";
  chart.series.push_back({"full", {0.0, 5.0, 10.0}, {0.0, 5.0, 10.0}});
  const auto svg = parse_xml(line_chart_svg(chart));
  const auto circles = elements(svg, "circle");
  REQUIRE(circles.size() == 3);
  CHECK(number_attribute(*circles[0], "cx") == Approx(kPlotLeft));
  CHECK(number_attribute(*circles[0], "cy") == Approx(kPlotBottom));
  CHECK(number_attribute(*circles[1], "cx") == Approx((kPlotLeft + kPlotRight) / 2).margin(0.05));
  CHECK(number_attribute(*circles[2], "cx") == Approx(kPlotRight));
  CHECK(number_attribute(*circles[2], "cy") == Approx(kPlotTop));
  CHECK(text_of(*circles[1]) == "full: 5, 5");
  CHECK(elements(svg, "polyline").size() == 1);
}

TEST_CASE("a missing value breaks the line and has no marker", "[report]") {
  LineChart chart;
  chart.title = "t";
  chart.series.push_back({"a", {1, 2, 3, 4, 5}, {1, 2, kNaN, 4, 5}});
  chart.series.push_back({"b", {1, 2, 3}, {kNaN, 3, kNaN}});
  const auto svg = parse_xml(line_chart_svg(chart));
  // a: two stretches of two points; b: a lone point, drawn as its marker only.
  CHECK(elements(svg, "polyline").size() == 2);
  CHECK(elements(svg, "circle").size() == 5);
  const auto legend_lines = elements(svg, "line");
  CHECK(std::count_if(legend_lines.begin(), legend_lines.end(),
                      [](const auto* line) { return !attribute(*line, "stroke").empty(); }) == 2);
}

TEST_CASE("a log axis places decades evenly and leaves out what it cannot show", "[report]") {
  LineChart chart;
  chart.title = "log";
  chart.x.scale = AxisScale::kLog;
  chart.series.push_back({"s", {0.0, 1.0, 10.0, 100.0}, {1.0, 1.0, 2.0, 3.0}});
  const auto svg = parse_xml(line_chart_svg(chart));
  const auto circles = elements(svg, "circle");
  REQUIRE(circles.size() == 3);  // x = 0 cannot be placed on a log axis
  const double first = number_attribute(*circles[0], "cx");
  const double second = number_attribute(*circles[1], "cx");
  const double third = number_attribute(*circles[2], "cx");
  CHECK(first == Approx(kPlotLeft));
  CHECK(third == Approx(kPlotRight));
  CHECK(second - first == Approx(third - second).margin(0.1));
}

TEST_CASE("a categorical axis names its positions", "[report]") {
  LineChart chart;
  chart.title = "by model";
  chart.x.categories = {"Llama-3.1-8B", "Qwen2.5-7B", "Llama-3.1-70B"};
  chart.series.push_back({"full", {0, 1, 2}, {3, 2, 1}});
  const auto svg = parse_xml(line_chart_svg(chart));
  const auto circles = elements(svg, "circle");
  REQUIRE(circles.size() == 3);
  const double band = (kPlotRight - kPlotLeft) / 3.0;
  CHECK(number_attribute(*circles[0], "cx") == Approx(kPlotLeft + band / 2).margin(0.05));
  CHECK(text_of(*circles[2]) == "full: Llama-3.1-70B, 1");
  const std::string labels = kvtier::testing::joined_texts(svg, "text");
  CHECK(labels.find("|Qwen2.5-7B|") != std::string::npos);
}

TEST_CASE("a long sampled series keeps every pixel column's extremes", "[report]") {
  LineChart chart;
  chart.title = "KV over time";
  chart.markers = false;
  LineSeries series{"kv", {}, {}};
  for (int i = 0; i < 100'000; ++i) {
    series.x.push_back(i);
    series.y.push_back(i == 54'321 ? 10.0 : 1.0 + 0.001 * (i % 7));
  }
  chart.series.push_back(series);
  const auto svg = parse_xml(line_chart_svg(chart));
  const auto lines = elements(svg, "polyline");
  REQUIRE(lines.size() == 1);
  const auto points = polyline_points(*lines[0]);
  CHECK(points.size() < 2'000);
  double top = kPlotBottom;
  for (const auto& [x, y] : points) {
    top = std::min(top, y);
  }
  CHECK(top == Approx(kPlotTop));  // the spike, the y axis's highest tick at 10
  CHECK(points.front().first == Approx(kPlotLeft));
  CHECK(elements(svg, "circle").empty());
}

TEST_CASE("grouped bars stand side by side and stacked bars add up", "[report]") {
  BarChart chart;
  chart.title = "tokens/s";
  chart.y_label = "tokens/s";
  chart.groups = {"p50", "p99"};
  chart.series = {"full", "tiered"};
  chart.values = {{10.0, 20.0}, {kNaN, 40.0}};
  const auto grouped = parse_xml(bar_chart_svg(chart));
  const auto bars = elements(grouped, "rect");
  // Three bars with titles, the frame and two legend boxes.
  std::vector<const testing::XmlTree*> valued;
  for (const auto* rect : bars) {
    if (!text_of(*rect).empty()) {
      valued.push_back(rect);
    }
  }
  REQUIRE(valued.size() == 3);
  CHECK(text_of(*valued[2]) == "tiered, p99: 40");
  CHECK(number_attribute(*valued[2], "height") ==
        Approx(2 * number_attribute(*valued[1], "height")).margin(0.1));
  const std::string texts = kvtier::testing::joined_texts(grouped, "text");
  CHECK(texts.find("|n/a|") != std::string::npos);

  chart.stacked = true;
  chart.values = {{10.0, 20.0}, {30.0, 40.0}};
  const auto stacked = parse_xml(bar_chart_svg(chart));
  std::vector<double> heights;
  std::vector<double> tops;
  for (const auto* rect : elements(stacked, "rect")) {
    if (!text_of(*rect).empty()) {
      heights.push_back(number_attribute(*rect, "height"));
      tops.push_back(number_attribute(*rect, "y"));
    }
  }
  REQUIRE(heights.size() == 4);
  // Group p50: full (10) at the bottom, tiered (30) on top of it.
  CHECK(tops[1] + heights[1] == Approx(tops[0]).margin(0.1));
  CHECK(heights[1] == Approx(3 * heights[0]).margin(0.2));
}

TEST_CASE("a chart's text is escaped and the same chart gives the same bytes", "[report]") {
  LineChart chart;
  chart.title = "<policy> & \"quotes\"";
  chart.series.push_back({"tiered:hbm=0.5,evict=0.1 <x>", {1, 2}, {3, 4}});
  const std::string svg = line_chart_svg(chart);
  CHECK_NOTHROW(parse_xml(svg));
  CHECK(svg.find("<policy>") == std::string::npos);
  CHECK(svg == line_chart_svg(chart));
}

TEST_CASE("charts refuse data that does not match its shape", "[report]") {
  LineChart line;
  line.series.push_back({"s", {1, 2}, {1}});
  CHECK_THROWS_AS(line_chart_svg(line), std::invalid_argument);
  line.series = {{"s", {1, 2}, {1, 2}, {"one note"}}};
  CHECK_THROWS_AS(line_chart_svg(line), std::invalid_argument);
  BarChart bars;
  bars.groups = {"a"};
  bars.series = {"s", "t"};
  bars.values = {{1.0}};
  CHECK_THROWS_AS(bar_chart_svg(bars), std::invalid_argument);
  bars.values = {{1.0}, {1.0, 2.0}};
  CHECK_THROWS_AS(bar_chart_svg(bars), std::invalid_argument);
}

TEST_CASE("a level guide is drawn across the plot, and the y axis reaches it", "[report]") {
  LineChart chart;
  chart.title = "TTFT p99 against batch";
  chart.series.push_back({"full", {1, 2}, {10, 20}, {"meets the SLOs", "misses ttft_p99"}});
  chart.guides.push_back({"SLO 50 ms", 0.0, 50.0});
  const auto svg = parse_xml(line_chart_svg(chart));
  const auto guides = elements(svg, "g");
  const auto guide = std::find_if(guides.begin(), guides.end(), [](const auto* group) {
    return attribute(*group, "class") == "guide";
  });
  REQUIRE(guide != guides.end());
  const auto line = elements(**guide, "line");
  REQUIRE(line.size() == 1);
  // The y axis runs 0 to 50 (step 10): the level is its top.
  CHECK(number_attribute(*line[0], "y1") == Approx(kPlotTop));
  CHECK(number_attribute(*line[0], "y2") == Approx(kPlotTop));
  CHECK(number_attribute(*line[0], "x1") == Approx(kPlotLeft));
  CHECK(number_attribute(*line[0], "x2") == Approx(kPlotRight));
  CHECK(attribute(*line[0], "stroke-dasharray") == "5 4");
  CHECK(text_of(*elements(**guide, "title").front()) == "SLO 50 ms");
  const auto circles = elements(svg, "circle");
  REQUIRE(circles.size() == 2);
  CHECK(text_of(*circles[1]) == "full: 2, 20 (misses ttft_p99)");
  CHECK_THAT(kvtier::testing::joined_texts(svg, "text"), Catch::EndsWith("|full|SLO 50 ms|"));
}

TEST_CASE("a parity chart: points alone, both axes alike, y = x from corner to corner",
          "[report]") {
  LineChart chart;
  chart.title = "simulated against published";
  chart.x.scale = AxisScale::kLog;
  chart.y.scale = AxisScale::kLog;
  chart.lines = false;
  chart.same_ranges = true;
  chart.series.push_back({"tpot", {10, 20, 40}, {11, 19, 90}});
  chart.guides.push_back({"y = x", 1.0, 0.0, false});
  const auto svg = parse_xml(line_chart_svg(chart));
  CHECK(elements(svg, "polyline").empty());
  CHECK(data_points(svg).size() == 3);
  // The legend shows a dot for points that are not joined, and a solid line for y = x.
  CHECK(elements(svg, "circle").size() == 4);
  // 10 to 90 on both axes: ticks 10, 20, 50, 100, so a point on y = x sits on the diagonal.
  LineChart on_diagonal = chart;
  on_diagonal.series = {{"s", {20}, {20}}, {"t", {10, 100}, {10, 100}}};
  const auto diagonal = parse_xml(line_chart_svg(on_diagonal));
  const auto point = data_points(diagonal).front();
  const double across = (number_attribute(*point, "cx") - kPlotLeft) / (kPlotRight - kPlotLeft);
  const double up = (kPlotBottom - number_attribute(*point, "cy")) / (kPlotBottom - kPlotTop);
  CHECK(across == Approx(up).margin(0.002));
  for (const auto* group : elements(diagonal, "g")) {
    if (attribute(*group, "class") == "guide") {
      const auto* line = elements(*group, "line").front();
      CHECK(attribute(*line, "stroke-dasharray").empty());
      CHECK(number_attribute(*line, "x1") == Approx(kPlotLeft));
      CHECK(number_attribute(*line, "y1") == Approx(kPlotBottom));
      CHECK(number_attribute(*line, "x2") == Approx(kPlotRight));
      CHECK(number_attribute(*line, "y2") == Approx(kPlotTop));
    }
  }
  LineChart mixed = chart;
  mixed.y.scale = AxisScale::kLinear;
  mixed.same_ranges = false;
  CHECK_THROWS_AS(line_chart_svg(mixed), std::invalid_argument);  // y = x on mixed scales
  mixed.guides.clear();
  mixed.same_ranges = true;
  CHECK_THROWS_AS(line_chart_svg(mixed), std::invalid_argument);
}

TEST_CASE("a heat map merges each row's runs of one colour and leaves empty cells out",
          "[report]") {
  HeatMap map;
  map.title = "attention";
  map.rows = 2;
  map.columns = 4;
  map.decades = 2;
  // Row 0: the largest value, a hundredth of it, then nothing; row 1 one colour throughout.
  map.values = {1.0, 0.01, kNaN, kNaN, 0.1, 0.1, 0.1, 0.1};
  map.x_high = 400;
  map.y_high = 20;
  const auto svg = parse_xml(heat_map_svg(map));
  std::vector<const testing::XmlTree*> cells;
  for (const auto* group : elements(svg, "g")) {
    if (attribute(*group, "class") == "cells") {
      cells = elements(*group, "rect");
    }
  }
  REQUIRE(cells.size() == 3);
  // The largest value takes the scale's top colour, two decades below its bottom one.
  CHECK(attribute(*cells[0], "fill") == heat_colour((31 + 0.5) / 32));
  CHECK(attribute(*cells[1], "fill") == heat_colour(0.5 / 32));
  // Neighbours share their edge exactly, and a merged run spans the row.
  CHECK(number_attribute(*cells[0], "x") + number_attribute(*cells[0], "width") ==
        Approx(number_attribute(*cells[1], "x")).margin(1e-9));
  CHECK(number_attribute(*cells[2], "width") ==
        Approx(number_attribute(*cells[0], "width") * 4).margin(0.11));
  CHECK(number_attribute(*cells[2], "y") ==
        Approx(number_attribute(*cells[0], "y") + number_attribute(*cells[0], "height"))
            .margin(1e-9));
  // The colour bar's labels are the scale's decades.
  CHECK_THAT(kvtier::testing::joined_texts(svg, "text"),
             Catch::Contains("|1|") && Catch::Contains("|0.1|") && Catch::Contains("|≤ 0.01|"));
  map.values.pop_back();
  CHECK_THROWS_AS(heat_map_svg(map), std::invalid_argument);
}

TEST_CASE("heat colours run from viridis' dark blue to its yellow", "[report]") {
  CHECK(heat_colour(0.0) == "#440154");
  CHECK(heat_colour(1.0) == "#fde725");
  CHECK(heat_colour(kNaN) == "#440154");
  CHECK(heat_colour(2.0) == "#fde725");
}

// The series groups of a chart, in order.
std::vector<const testing::XmlTree*> series_groups(const testing::XmlTree& svg) {
  std::vector<const testing::XmlTree*> groups;
  for (const auto* group : elements(svg, "g")) {
    if (attribute(*group, "class") == "series") {
      groups.push_back(group);
    }
  }
  return groups;
}

TEST_CASE("a series identical to an earlier one is drawn apart and named so in the legend",
          "[report]") {
  LineChart chart;
  chart.title = "recall against the mean budget";
  chart.series.push_back({"searched", {16, 32, 64}, {0.5, 0.6, 0.8}});
  chart.series.push_back({"uniform", {16, 32, 64}, {0.5, 0.6, 0.8}});
  chart.series.push_back({"other", {16, 32, 64}, {0.4, 0.6, 0.8}});
  chart.series.push_back({"again", {16, 32, 64}, {0.5, 0.6, 0.8}});
  chart.series.push_back({"gapped", {16, 32, 64}, {0.4, kNaN, 0.8}});
  chart.series.push_back({"gapped too", {16, 32, 64}, {0.4, kNaN, 0.8}});
  const std::string text = line_chart_svg(chart);
  CHECK(text == line_chart_svg(chart));
  const auto svg = parse_xml(text);
  const auto groups = series_groups(svg);
  REQUIRE(groups.size() == 6);
  // The originals keep the palette's solid lines and dots; each repeat gets dashes of its own.
  const std::vector<std::string> dashes = {
      attribute(*groups[0], "stroke-dasharray"), attribute(*groups[1], "stroke-dasharray"),
      attribute(*groups[2], "stroke-dasharray"), attribute(*groups[3], "stroke-dasharray"),
      attribute(*groups[4], "stroke-dasharray"), attribute(*groups[5], "stroke-dasharray")};
  CHECK(dashes[0].empty());
  CHECK(dashes[2].empty());
  CHECK(dashes[4].empty());
  CHECK_FALSE(dashes[1].empty());
  CHECK_FALSE(dashes[3].empty());
  CHECK(dashes[1] != dashes[3]);
  CHECK_FALSE(dashes[5].empty());
  CHECK(elements(*groups[0], "circle").size() == 3);
  CHECK(elements(*groups[2], "circle").size() == 3);
  CHECK(elements(*groups[4], "circle").size() == 2);
  // A repeat's markers are hollow shapes around the dots it would hide, with the values in
  // their titles; two repeats of one series get different shapes.
  CHECK(elements(*groups[1], "circle").empty());
  const auto squares = elements(*groups[1], "rect");
  REQUIRE(squares.size() == 3);
  CHECK(attribute(*squares[0], "fill") == "none");
  CHECK(attribute(*squares[0], "stroke-dasharray") == "none");
  CHECK(number_attribute(*squares[0], "x") + number_attribute(*squares[0], "width") / 2 ==
        Approx(number_attribute(*elements(*groups[0], "circle")[0], "cx")).margin(0.1));
  CHECK(text_of(*squares[1]) == "uniform: 32, 0.6");
  CHECK(elements(*groups[3], "rect").empty());
  CHECK(elements(*groups[3], "polygon").size() == 3);
  CHECK(elements(*groups[5], "rect").size() == 2);  // NaN where its original has NaN
  // The legend names the series each repeat hides behind, and shows its dashes and shape.
  const std::string legend = kvtier::testing::joined_texts(svg, "text");
  CHECK_THAT(legend, Catch::Contains("|searched|uniform (same as searched)|other|"
                                     "again (same as searched)|gapped|"
                                     "gapped too (same as gapped)|"));
  std::vector<std::string> legend_dashes;
  for (const auto* line : elements(svg, "line")) {
    if (!attribute(*line, "stroke").empty()) {
      legend_dashes.push_back(attribute(*line, "stroke-dasharray"));
    }
  }
  CHECK(legend_dashes == dashes);

  // Without markers (sampled series) the dashes alone tell a repeat; a scatter shows only the
  // hollow shapes.
  chart.markers = false;
  const auto sampled = parse_xml(line_chart_svg(chart));
  CHECK(elements(sampled, "rect").size() == 1);  // the frame
  CHECK(attribute(*series_groups(sampled)[1], "stroke-dasharray") == dashes[1]);
  chart.markers = true;
  chart.lines = false;
  const auto scatter = parse_xml(line_chart_svg(chart));
  CHECK(elements(scatter, "polyline").empty());
  CHECK(elements(*series_groups(scatter)[1], "rect").size() == 3);
  CHECK_THAT(kvtier::testing::joined_texts(scatter, "text"),
             Catch::Contains("|uniform (same as searched)|"));

  // Points alike in part, or the same values at other x, are no repeat.
  LineChart apart;
  apart.title = "apart";
  apart.series.push_back({"a", {1, 2, 3}, {1, 2, 3}});
  apart.series.push_back({"b", {1, 2}, {1, 2}});
  apart.series.push_back({"c", {2, 3, 4}, {1, 2, 3}});
  apart.series.push_back({"d", {1, 2, 3}, {kNaN, kNaN, kNaN}});
  apart.series.push_back({"e", {1, 2, 3}, {kNaN, kNaN, kNaN}});
  const auto separate = parse_xml(line_chart_svg(apart));
  for (const auto* group : series_groups(separate)) {
    CHECK(attribute(*group, "stroke-dasharray").empty());
  }
  CHECK_THAT(kvtier::testing::joined_texts(separate, "text"), !Catch::Contains("same as"));
}

TEST_CASE("series past the palette repeat its colours with dashes", "[report]") {
  CHECK(series_colour(0) == series_colour(7));
  CHECK(series_dashes(0).empty());
  CHECK_FALSE(series_dashes(7).empty());
  CHECK(series_dashes(7) != series_dashes(14));
}

}  // namespace
}  // namespace kvtier::report
