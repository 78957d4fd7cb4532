// `--format html` of kvtier plan and kvtier validate: the pages, read back as XML, hold what the
// JSON of the same command says.

#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <string>
#include <vector>

#include "tests/support/cli_runner.hpp"
#include "tests/support/paths.hpp"
#include "tests/support/small_run.hpp"
#include "tests/support/xml_reader.hpp"

namespace {

namespace fs = std::filesystem;
using kvtier::test::CliResult;
using kvtier::testing::attribute;
using kvtier::testing::elements;
using kvtier::testing::parse_xml;
using kvtier::testing::text_of;
using kvtier::testing::XmlTree;

const std::string kPlanRun = kvtier::test::small_run_text();

fs::path write_file(const std::string& name, const std::string& content) {
  const fs::path path = kvtier::test::scratch_dir() / name;
  std::ofstream(path) << content;
  return path;
}

// A measured reference of kPlanRun's output tokens/s, measured as 1, within `tolerance`.
fs::path throughput_reference(const std::string& id, const std::string& tolerance) {
  const std::string run = "html-" + id + "-run.textproto";
  (void)write_file(run, kPlanRun);
  return write_file("html-" + id + ".textproto",
                    "id: \"" + id + "\" citation: \"test\" run_file: \"" + run +
                        "\"\nmetric { policy_index: 0 metric: \"throughput_output_tokens_per_s\" "
                        "measured: 1 tolerance: " +
                        tolerance + " }\n");
}

// The number after the last `"key": ` in a JSON text (a summary follows the items it sums).
double json_number(const std::string& json, const std::string& key) {
  const auto at = json.rfind("\"" + key + "\": ");
  REQUIRE(at != std::string::npos);
  return std::stod(json.substr(at + key.size() + 4));
}

const XmlTree& chart_named(const XmlTree& page, const std::string& title) {
  for (const XmlTree* svg : elements(page, "svg")) {
    if (attribute(*svg, "aria-label") == title) {
      return *svg;
    }
  }
  FAIL("no chart '" << title << "'");
  throw std::logic_error("unreachable");
}

// The markers of a chart's data (a scatter's legend draws dots too).
std::size_t data_points(const XmlTree& svg) {
  std::size_t points = 0;
  for (const XmlTree* group : elements(svg, "g")) {
    if (attribute(*group, "class") == "series") {
      points += elements(*group, "circle").size();
    }
  }
  return points;
}

}  // namespace

TEST_CASE("plan --format html charts each search against its SLOs", "[cli]") {
  const fs::path run = write_file("html-plan.textproto", kPlanRun);
  const std::string args =
      "plan " + run.string() + " --slo tpot_p99=40ms,ttft_p99=1s --target-tokens-per-s 5000";
  const CliResult json = kvtier::test::run_kvtier(args + " --format json");
  REQUIRE(json.exit_code == 0);
  // The JSON lists the same simulations: the search starts at a batch of 1.
  CHECK_THAT(json.out, Catch::Contains("\"probes\": [{\"load\": 1, \"feasible\": "));
  const CliResult html = kvtier::test::run_kvtier(args + " --format html");
  INFO(html.err);
  REQUIRE(html.exit_code == 0);
  CHECK(html.err.empty());
  const XmlTree page = parse_xml(html.out);
  // Each SLO's chart has a point for every simulation of the search, and the SLO's limit.
  const auto evaluations = static_cast<std::size_t>(json_number(json.out, "evaluations"));
  for (const auto& [title, limit] : {std::pair{"tpot_p99_ms against the load", "SLO: 40 ms"},
                                     std::pair{"ttft_p99_ms against the load", "SLO: 1000 ms"}}) {
    const XmlTree& chart = chart_named(page, title);
    CHECK(data_points(chart) == evaluations);
    CHECK_THAT(kvtier::testing::joined_texts(chart, "title"),
               Catch::Contains("|" + std::string(limit) + "|"));
  }
  // The answer's table and bars say what the JSON says.
  const std::string max_batch =
      std::to_string(static_cast<int>(json_number(json.out, "max_batch")));
  const std::string gpus = std::to_string(static_cast<int>(json_number(json.out, "gpus")));
  const auto cells = kvtier::testing::joined_texts(page, "td");
  CHECK_THAT(cells, Catch::Contains("|full|" + max_batch + "|"));
  CHECK_THAT(
      kvtier::testing::joined_texts(chart_named(page, "GPUs that serve the target"), "title"),
      Catch::Contains("|GPUs, full: " + gpus + "|"));
  // The same command gives the same page.
  CHECK(kvtier::test::run_kvtier(args + " --format html").out == html.out);
}

TEST_CASE("validate --published --format html charts each metric against its publication",
          "[cli]") {
  const std::string published =
      "'" + std::string(kvtier::test::source_dir()) + "/validation/published/decode_latency.csv'";
  const CliResult json =
      kvtier::test::run_kvtier("validate --published " + published + " --format json");
  REQUIRE(json.exit_code == 0);
  const CliResult html =
      kvtier::test::run_kvtier("validate --published " + published + " --format html");
  REQUIRE(html.exit_code == 0);
  const XmlTree page = parse_xml(html.out);
  // A parity chart per metric the file has, holding every projected point once.
  std::set<std::string> metrics;
  for (std::size_t at = json.out.find("\"metric\": \""); at != std::string::npos;
       at = json.out.find("\"metric\": \"", at + 1)) {
    const std::size_t begin = at + 11;
    metrics.insert(json.out.substr(begin, json.out.find('"', begin) - begin));
  }
  std::size_t points = 0;
  for (const std::string& metric : metrics) {
    const XmlTree& chart = chart_named(page, metric);
    points += data_points(chart);
    CHECK_THAT(kvtier::testing::joined_texts(chart, "title"),
               Catch::Contains("|y = x|") && Catch::Contains("|+10%|"));
  }
  CHECK(points == static_cast<std::size_t>(json_number(json.out, "projected")));
  CHECK(elements(page, "svg").size() == metrics.size());
  // The summary's median is the JSON's, in percent.
  const double median = json_number(json.out, "median_abs_relative_error");
  char expected[32];
  std::snprintf(expected, sizeof(expected), "median |error| %.1f%%", 100.0 * median);
  CHECK_THAT(html.out, Catch::Contains(expected));
}

TEST_CASE("validate --format html prints the page, then fails a figure outside tolerance",
          "[cli]") {
  const fs::path strict = throughput_reference("strict", "0.01");
  const CliResult html = kvtier::test::run_kvtier("validate " + strict.string() + " --format html");
  CHECK(html.exit_code == 1);
  CHECK_THAT(html.err, Catch::StartsWith("kvtier: error: 1 of 1 figures outside"));
  const XmlTree page = parse_xml(html.out);
  CHECK_THAT(kvtier::testing::joined_texts(page, "td"), Catch::Contains("|OUTSIDE|"));
  CHECK(data_points(chart_named(page, "strict")) == 1);
}

TEST_CASE("validate --format html charts each live run step by step", "[cli]") {
  const std::string live = std::string(kvtier::test::source_dir()) +
                           "/validation/measurements/stories260K-tiered-cpu.json";
  std::ifstream in(live);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::size_t steps = 0;
  for (auto at = text.find("\"latency_ms\""); at != std::string::npos;
       at = text.find("\"latency_ms\"", at + 1)) {
    ++steps;
  }
  REQUIRE(steps > 1);
  const CliResult html = kvtier::test::run_kvtier("validate " + live + " --format html");
  REQUIRE(html.exit_code == 0);
  const XmlTree page = parse_xml(html.out);
  CHECK_THAT(kvtier::testing::joined_texts(page, "h2"), Catch::Contains("Live runs step by step"));
  for (const char* what : {"time per step", "bytes copied per step", "attention mass kept"}) {
    (void)chart_named(page, std::string("stories260K-tiered-cpu: ") + what);
  }
  // The context by tier: T0 to T3, a point per step.
  std::size_t lines = 0;
  for (const XmlTree* group :
       elements(chart_named(page, "stories260K-tiered-cpu: the context by tier"), "g")) {
    if (attribute(*group, "class") != "series") {
      continue;
    }
    ++lines;
    const std::vector<const XmlTree*> polylines = elements(*group, "polyline");
    REQUIRE(polylines.size() == 1);
    const std::string points = attribute(*polylines.front(), "points");
    CHECK(static_cast<std::size_t>(std::count(points.begin(), points.end(), ',')) == steps);
  }
  CHECK(lines == 4);
  // A measured reference has no steps: no such section.
  const fs::path reference = throughput_reference("loose", "1e9");
  const CliResult plain =
      kvtier::test::run_kvtier("validate " + reference.string() + " --format html");
  CHECK(plain.exit_code == 0);
  CHECK_THAT(kvtier::testing::joined_texts(parse_xml(plain.out), "h2"),
             !Catch::Contains("Live runs step by step"));
}

TEST_CASE("a command without a page refuses --format html", "[cli]") {
  kvtier::test::expect_one_line_error(kvtier::test::run_kvtier("presets list --format html"), 2,
                                      "expected text or json");
  kvtier::test::expect_one_line_error(
      kvtier::test::run_kvtier("validate --published x.csv --format svg"), 2,
      "expected text, json or html");
}
