// results.html: which axis runs along x, how lines are named and split over charts, gaps for
// points that could not run, ZIP sweeps, the policy axis, the table's cap. Tables are made by
// hand, so every figure a chart shows is known.

#include <catch2/catch.hpp>

#include <algorithm>
#include <string>
#include <vector>

#include "common/text_output.hpp"
#include "sweep/impl/results_html.hpp"
#include "sweep/sweep.hpp"
#include "tests/support/xml_reader.hpp"

namespace {

using kvtier::sweep::ResultTable;
using kvtier::sweep::Row;
using kvtier::sweep::detail::Manifest;
using kvtier::testing::attribute;
using kvtier::testing::elements;
using kvtier::testing::parse_xml;
using kvtier::testing::text_of;
using kvtier::testing::XmlTree;

struct Axis {
  std::string path;
  std::vector<std::string> values;
};

struct Sweep {
  Manifest manifest;
  ResultTable table;
};

// Every point runs `policies` (the run's own first; the policy axis's value when there is one),
// with throughput 100·(point + 1) + the policy's place and TTFT ten times that. Points in
// `failing` have an error instead.
Sweep make_sweep(const std::vector<Axis>& axes, const std::string& mode,
                 const std::vector<std::string>& compare, std::vector<std::uint64_t> failing = {}) {
  Sweep sweep;
  Manifest& m = sweep.manifest;
  m.name = "report";
  m.spec_hash = "0123456789abcdef";
  m.kvtier_version = "0.1.0";
  m.mode = mode;
  m.points = mode == "ZIP" ? axes.front().values.size() : 1;
  std::vector<std::string> columns;
  for (const Axis& axis : axes) {
    m.axis_paths.push_back(axis.path);
    columns.push_back(axis.path == "policy" ? "policy_axis" : axis.path);
    m.axis_values.push_back(axis.values);
    if (mode != "ZIP") {
      m.points *= axis.values.size();
    }
  }
  m.axis_columns = columns;
  m.spec_text = "name: \"report\"\nbase {\n  policy { name: \"full\" }\n";
  for (const std::string& name : compare) {
    m.spec_text += "  compare { name: \"" + name + "\" param { name: \"budget\" number: 64 } }\n";
  }
  m.spec_text += "}\nmode: " + mode + "\n";
  std::vector<Row> rows;
  for (std::uint64_t point = 0; point < m.points; ++point) {
    std::vector<std::string> values(axes.size());
    std::uint64_t rest = point;
    for (std::size_t a = axes.size(); a-- > 0;) {
      const std::uint64_t size = axes[a].values.size();
      values[a] = axes[a].values[mode == "ZIP" ? point : rest % size];
      rest /= mode == "ZIP" ? 1 : size;
    }
    const auto policy_axis = std::find_if(axes.begin(), axes.end(),
                                          [](const Axis& axis) { return axis.path == "policy"; });
    std::vector<std::string> policies{
        policy_axis == axes.end() ? "full" : values[policy_axis - axes.begin()]};
    for (const std::string& name : compare) {
      policies.push_back(name + ":budget=64,canonical=1");
    }
    for (std::size_t k = 0; k < policies.size(); ++k) {
      Row row{point, values, policies[k], {}, {}};
      if (std::find(failing.begin(), failing.end(), point) != failing.end()) {
        row.error = "nothing can run: <weights> & more";
      } else {
        const double throughput = 100.0 * static_cast<double>(point + 1) + static_cast<double>(k);
        row.metrics = {{"throughput_output_tokens_per_s", kvtier::format_double(throughput)},
                       {"ttft_p99_ms", kvtier::format_double(10 * throughput)}};
      }
      rows.push_back(std::move(row));
    }
  }
  sweep.table = kvtier::sweep::make_table(m.name, m.spec_hash, columns, std::move(rows));
  return sweep;
}

struct Chart {
  std::string title;
  std::vector<std::string> lines;   // the legend's labels
  std::vector<std::string> points;  // the markers' titles
  std::vector<std::string> ticks;   // the tick labels
  std::vector<double> xs;           // the markers' x
  std::size_t polylines = 0;
};

std::vector<Chart> charts(const std::string& html) {
  std::vector<Chart> found;
  const XmlTree page = parse_xml(html);
  for (const XmlTree* svg : elements(page, "svg")) {
    Chart chart;
    for (const XmlTree* text : elements(*svg, "text")) {
      const std::string kind = attribute(*text, "class");
      if (kind == "title") {
        chart.title = text_of(*text);
      } else if (kind == "legend") {
        chart.lines.push_back(text_of(*text));
      } else if (kind == "tick") {
        chart.ticks.push_back(text_of(*text));
      }
    }
    for (const XmlTree* circle : elements(*svg, "circle")) {
      chart.points.push_back(text_of(*circle));
      chart.xs.push_back(std::stod(attribute(*circle, "cx")));
    }
    chart.polylines = elements(*svg, "polyline").size();
    found.push_back(std::move(chart));
  }
  return found;
}

bool contains(const std::vector<std::string>& texts, const std::string& text) {
  return std::find(texts.begin(), texts.end(), text) != texts.end();
}

TEST_CASE("sweep report: each headline metric is charted against the axis with most values",
          "[sweep]") {
  const Sweep sweep = make_sweep(
      {{"workload.closed_loop.concurrency", {"1", "8", "32", "64"}}, {"model.preset", {"A", "B"}}},
      "GRID", {"h2o"});
  const std::string html = kvtier::sweep::detail::results_html(sweep.table, sweep.manifest);
  const std::vector<Chart> found = charts(html);
  // The two metrics the table has, in kHeadlineMetrics' order.
  REQUIRE(found.size() == 2);
  CHECK(found[0].title == "Output tokens per second");
  CHECK(found[1].title == "Time to first token, p99");
  const Chart& throughput = found[0];
  // A preset axis is named by what it is a preset of.
  CHECK(throughput.lines ==
        std::vector<std::string>{"full; model.preset=A", "h2o:budget=64; model.preset=A",
                                 "full; model.preset=B", "h2o:budget=64; model.preset=B"});
  CHECK(throughput.polylines == 4);
  REQUIRE(throughput.points.size() == 16);
  // Point 2 is concurrency 8 with model A; its compared policy is second.
  CHECK(contains(throughput.points, "full; model.preset=A: 8, 300"));
  CHECK(contains(throughput.points, "h2o:budget=64; model.preset=A: 8, 301"));
  // Ticks at the axis's own values, spaced by their logarithms (1 to 64 spans 16 or more).
  CHECK(contains(throughput.ticks, "1"));
  CHECK(contains(throughput.ticks, "32"));
  const double x1 = throughput.xs[0];
  const double x8 = throughput.xs[1];
  const double x64 = throughput.xs[3];
  CHECK(x8 - x1 == Approx(x64 - x8).margin(0.2));
  CHECK(html == kvtier::sweep::detail::results_html(sweep.table, sweep.manifest));
}

TEST_CASE("sweep report: lines beyond a chart's share are split over charts by another axis",
          "[sweep]") {
  const Sweep sweep = make_sweep({{"workload.closed_loop.concurrency", {"1", "2", "3", "4", "5"}},
                                  {"model.preset", {"A", "B", "C", "D"}},
                                  {"tensor_parallel_degree", {"1", "2"}}},
                                 "GRID", {"h2o"});
  // 2 policies × 4 models × 2 TP degrees = 16 lines: more than 14, so a chart per model.
  const std::vector<Chart> found =
      charts(kvtier::sweep::detail::results_html(sweep.table, sweep.manifest));
  REQUIRE(found.size() == 8);
  CHECK(found[0].title == "Output tokens per second (model.preset=A)");
  CHECK(found[3].title == "Output tokens per second (model.preset=D)");
  CHECK(found[4].title == "Time to first token, p99 (model.preset=A)");
  CHECK(found[0].lines.size() == 4);
  CHECK(contains(found[0].lines, "h2o:budget=64; tensor_parallel_degree=2"));
  CHECK(found[0].points.size() == 20);
}

TEST_CASE("sweep report: a point that could not run is a gap, and is listed with its error",
          "[sweep]") {
  const Sweep sweep =
      make_sweep({{"workload.closed_loop.concurrency", {"1", "2", "3", "4"}}}, "GRID", {}, {3});
  const std::string html = kvtier::sweep::detail::results_html(sweep.table, sweep.manifest);
  const std::vector<Chart> found = charts(html);
  REQUIRE(found.size() == 2);
  CHECK(found[0].points.size() == 3);
  CHECK(found[0].polylines == 1);
  const XmlTree page = parse_xml(html);
  const std::string cells = kvtier::testing::joined_texts(page, "td");
  CHECK_THAT(cells, Catch::Contains("3|4|full|nothing can run: <weights> & more|"));
  CHECK_THAT(html, Catch::Contains("1 with a policy that could not run"));
}

TEST_CASE("sweep report: a ZIP sweep of several axes is charted against its points", "[sweep]") {
  const Sweep sweep =
      make_sweep({{"model.preset", {"Llama-3.1-8B", "Qwen2.5-32B", "Llama-3.1-70B"}},
                  {"tensor_parallel_degree", {"1", "2", "4"}}},
                 "ZIP", {"h2o"});
  const std::vector<Chart> found =
      charts(kvtier::sweep::detail::results_html(sweep.table, sweep.manifest));
  REQUIRE(found.size() == 2);
  CHECK(found[0].lines == std::vector<std::string>{"full", "h2o:budget=64"});
  CHECK(contains(found[0].ticks, "Qwen2.5-32B, 2"));
  CHECK(contains(found[0].points, "full: Llama-3.1-70B, 4, 300"));
}

TEST_CASE("sweep report: the policy axis names lines, and a compared policy is charted once",
          "[sweep]") {
  const Sweep sweep = make_sweep(
      {{"workload.closed_loop.concurrency", {"1", "2"}}, {"policy", {"full", "tiered:hbm=0.5"}}},
      "GRID", {"h2o"});
  // Both axes have two values: the numeric one runs along x.
  const std::vector<Chart> found =
      charts(kvtier::sweep::detail::results_html(sweep.table, sweep.manifest));
  REQUIRE(found.size() == 2);
  CHECK(found[0].lines == std::vector<std::string>{"full", "h2o:budget=64", "tiered:hbm=0.5"});
  // h2o ran beside both policies of each concurrency, alike: one point per concurrency.
  CHECK(found[0].points.size() == 6);

  const Sweep on_x = make_sweep({{"policy", {"full", "tiered:hbm=0.5", "streaming"}},
                                 {"workload.closed_loop.concurrency", {"1", "2"}}},
                                "GRID", {});
  const std::vector<Chart> by_policy =
      charts(kvtier::sweep::detail::results_html(on_x.table, on_x.manifest));
  REQUIRE(by_policy.size() == 2);
  CHECK(by_policy[0].lines == std::vector<std::string>{"the policy on x; concurrency=1",
                                                       "the policy on x; concurrency=2"});
  CHECK(contains(by_policy[0].ticks, "tiered:hbm=0.5"));
}

TEST_CASE("sweep report: a policy an axis edits is named as it ran", "[sweep]") {
  // An axis on the run's policy's parameter: the spec's own string would name every row alike.
  Sweep sweep = make_sweep({{"policy.param[0].number", {"0.25", "0.75"}},
                            {"workload.closed_loop.concurrency", {"1", "2", "4"}}},
                           "GRID", {"h2o"});
  for (Row& row : sweep.table.rows) {
    if (row.policy == "full") {
      row.policy = "tiered:hbm=" + row.axis_values[0] + ",evict=0";
    }
  }
  const std::string html = kvtier::sweep::detail::results_html(sweep.table, sweep.manifest);
  const std::vector<Chart> found = charts(html);
  REQUIRE(found.size() == 2);
  CHECK(contains(found[0].lines, "tiered:hbm=0.25,evict=0; number=0.25"));
  CHECK(contains(found[0].lines, "h2o:budget=64; number=0.75"));
  CHECK_THAT(kvtier::testing::joined_texts(parse_xml(html), "td"),
             Catch::Contains("|tiered:hbm=0.75,evict=0|"));
}

TEST_CASE("sweep report: the table shows its first rows and says where the rest are", "[sweep]") {
  std::vector<std::string> seeds;
  for (std::size_t i = 0; i <= kvtier::sweep::detail::kMaxTableRows; ++i) {
    seeds.push_back(std::to_string(i + 1));
  }
  const Sweep sweep = make_sweep({{"seed", seeds}}, "ZIP", {});
  const std::string html = kvtier::sweep::detail::results_html(sweep.table, sweep.manifest);
  CHECK_THAT(html, Catch::Contains("The first 2000 of 2001 rows; results.csv has them all."));
  const XmlTree page = parse_xml(html);
  // The axes table (a header and a row) and the results table (a header and 2000 rows).
  CHECK(elements(page, "tr").size() == 2 + 2001);
}

}  // namespace
