// `kvtier replay search-budgets` driven as a user would: output, the front file, byte-identical
// results whatever --jobs, the page of --format html, one-line diagnostics and exit codes, no
// output file after a failure.

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "tests/support/cli_runner.hpp"
#include "tests/support/xml_reader.hpp"

namespace {

namespace fs = std::filesystem;
using Result = kvtier::test::CliResult;
using kvtier::test::expect_one_line_error;
using kvtier::test::scratch_dir;
using kvtier::test::slurp;

Result run(const std::string& args) {
  return kvtier::test::run_kvtier(args);
}

std::string path_of(const std::string& name) {
  return (scratch_dir() / name).string();
}

// Small stories260K traces (5 layers), made once: two calibration, one held-out.
const std::string& traces() {
  static const std::string made = [] {
    std::string names;
    for (const int seed : {1, 2, 3}) {
      const std::string file = path_of("search" + std::to_string(seed) + ".h5");
      const Result synth =
          run("trace synth --model stories260K --prompt-tokens 96 --steps 64 "
              "--pattern reasoning --seed " +
              std::to_string(seed) + " --out '" + file + "'");
      REQUIRE(synth.exit_code == 0);
    }
    return std::string("--traces '") + path_of("search1.h5") + "' '" + path_of("search2.h5") +
           "' --held-out '" + path_of("search3.h5") + "'";
  }();
  return made;
}

const std::string kSmall = " --base-policy h2o --floor 4 --cap 160 --evaluations 24 --seed 5";

using kvtier::testing::attribute;
using kvtier::testing::elements;
using kvtier::testing::joined_texts;
using kvtier::testing::XmlTree;

const XmlTree* chart_named(const XmlTree& page, const std::string& title) {
  for (const XmlTree* svg : elements(page, "svg")) {
    if (attribute(*svg, "aria-label") == title) {
      return svg;
    }
  }
  return nullptr;
}

// The series groups of a chart, in order.
std::vector<const XmlTree*> series_of(const XmlTree& svg) {
  std::vector<const XmlTree*> groups;
  for (const XmlTree* group : elements(svg, "g")) {
    if (attribute(*group, "class") == "series") {
      groups.push_back(group);
    }
  }
  return groups;
}

// The `key` list after the first `after` in a JSON text, as the reports join budgets: "4/8/16".
std::string json_budgets_after(const std::string& json, const std::string& after) {
  const auto from = json.find(after);
  REQUIRE(from != std::string::npos);
  const auto open = json.find("\"budgets\": [", from);
  REQUIRE(open != std::string::npos);
  const auto begin = open + 12;
  std::string list = json.substr(begin, json.find(']', begin) - begin);
  list.erase(std::remove(list.begin(), list.end(), ' '), list.end());
  std::replace(list.begin(), list.end(), ',', '/');
  return list;
}

}  // namespace

TEST_CASE("replay search-budgets help", "[cli][search]") {
  const Result help = run("replay search-budgets --help");
  CHECK(help.exit_code == 0);
  CHECK_THAT(help.out, Catch::Contains("usage: kvtier replay search-budgets") &&
                           Catch::Contains("--target-mean"));
}

TEST_CASE("replay search-budgets prints the front, the winner and the comparison",
          "[cli][search]") {
  const std::string csv = path_of("front.csv");
  const Result text = run("replay search-budgets " + traces() + kSmall +
                          " --target-mean 16 32 --jobs 1 --out '" + csv + "'");
  INFO("stderr: " << text.err);
  REQUIRE(text.exit_code == 0);
  CHECK(text.err.empty());
  CHECK_THAT(text.out, Catch::Contains("Pareto front") && Catch::Contains("winner (*)") &&
                           Catch::Contains("held-out traces") && Catch::Contains("wrote"));
  const std::string front = slurp(csv);
  CHECK_THAT(front, Catch::StartsWith("mean_budget,recall,evaluation,generation,winner,budgets\n"));
  CHECK(std::count(front.begin(), front.end(), '\n') >= 3);

  // Byte-identical output and front file whatever the thread count.
  const std::string csv2 = path_of("front2.csv");
  const Result threads = run("replay search-budgets " + traces() + kSmall +
                             " --target-mean 16 32 --jobs 3 --out '" + csv2 + "'");
  REQUIRE(threads.exit_code == 0);
  CHECK(slurp(csv2) == front);
  std::string expected = text.out;
  expected.replace(expected.find(csv), csv.size(), csv2);
  CHECK(threads.out == expected);

  // Streaming the calibration traces from their files instead of memory changes nothing but
  // the line that says so.
  const std::string csv3 = path_of("front3.csv");
  const Result streamed = run("replay search-budgets " + traces() + kSmall +
                              " --target-mean 16 32 --memory 0 --out '" + csv3 + "'");
  REQUIRE(streamed.exit_code == 0);
  CHECK(slurp(csv3) == front);
  CHECK_THAT(streamed.out, Catch::Contains("replayed from the files"));
  CHECK_THAT(text.out, Catch::Contains("replayed from memory"));

  const Result json = run("replay search-budgets " + traces() + kSmall + " --format json --jobs 2");
  REQUIRE(json.exit_code == 0);
  CHECK_THAT(json.out,
             Catch::StartsWith("{\"base_policy\": \"h2o\"") && Catch::Contains("\"front\": [") &&
                 Catch::Contains("\"winner\": {") && Catch::Contains("\"uniform_recall\": ") &&
                 Catch::Contains("\"layer_recall\": [") && Catch::Contains("\"front_csv\": null"));
  // Without --held-out, the comparison runs on the calibration traces and says so.
  const Result calibration = run("replay search-budgets --traces '" + path_of("search1.h5") +
                                 "' --base-policy h2o --floor 4 --cap 160 --evaluations 10");
  REQUIRE(calibration.exit_code == 0);
  CHECK_THAT(calibration.out, Catch::Contains("the calibration traces"));
}

TEST_CASE("replay search-budgets --format html charts the search and marks the winner",
          "[cli][search]") {
  const std::string csv = path_of("html-front.csv");
  const std::string args = "replay search-budgets " + traces() + kSmall + " --target-mean 16 32";
  const Result json = run(args + " --format json");
  REQUIRE(json.exit_code == 0);
  const Result html = run(args + " --format html --out '" + csv + "'");
  INFO("stderr: " << html.err);
  REQUIRE(html.exit_code == 0);
  CHECK(html.err.empty());
  CHECK(fs::exists(csv));
  CHECK_THAT(html.out, Catch::StartsWith("<!DOCTYPE html>"));
  const XmlTree page = kvtier::testing::parse_xml(html.out);

  // Every evaluated vector is a point of the first chart (the initial design and the DE
  // generations), with the front and the winner drawn over them and its recall as a level.
  const XmlTree* explored =
      chart_named(page, "Every budget vector evaluated: recall against the mean budget");
  REQUIRE(explored != nullptr);
  const auto groups = series_of(*explored);
  REQUIRE(groups.size() == 4);
  const auto evaluations_at = json.out.find("\"evaluations\": ");
  REQUIRE(evaluations_at != std::string::npos);
  const std::size_t evaluations = std::stoul(json.out.substr(evaluations_at + 15));
  CHECK(elements(*groups[0], "circle").size() + elements(*groups[1], "circle").size() ==
        evaluations);
  const auto mean_at = json.out.find("\"mean_budget\": ", json.out.find("\"winner\": {"));
  const double winner_mean = std::stod(json.out.substr(mean_at + 15));
  char winner_label[64];
  std::snprintf(winner_label, sizeof(winner_label), "winner (mean %.1f)", winner_mean);
  CHECK_THAT(joined_texts(*explored, "text"),
             Catch::Contains(std::string("|") + winner_label + "|") &&
                 Catch::Contains("|winner's recall "));
  REQUIRE(chart_named(page, "The Pareto front and the winner") != nullptr);
  REQUIRE(chart_named(page, "Winner rescaled against uniform, on the held-out traces") != nullptr);

  // The tables: the winner's row of the front with its budgets, each target against uniform.
  const std::string cells = joined_texts(page, "td");
  const std::string winner_budgets = json_budgets_after(json.out, "\"winner\": {");
  CHECK_THAT(cells, Catch::Contains("|winner|" + winner_budgets + "|"));
  CHECK_THAT(cells, Catch::Contains("|16|") && Catch::Contains("|32|"));
  CHECK_THAT(html.out, Catch::Contains(winner_budgets + "; as a policy h2o:"));

  // The same search gives the same page, and the thread count does not show in it.
  CHECK(run(args + " --format html --out '" + csv + "'").out == html.out);
  CHECK(run(args + " --format html --jobs 3 --out '" + csv + "'").out == html.out);

  const Result help = run("replay search-budgets --help");
  CHECK_THAT(help.out, Catch::Contains("[--format text|json|html]"));
  expect_one_line_error(run(args + " --format svg"), 2, "expected text, json or html");
}

TEST_CASE("replay search-budgets errors", "[cli][search]") {
  const std::string csv = path_of("never.csv");
  const std::string out = " --out '" + csv + "'";
  // Usage and configuration: exit 2.
  expect_one_line_error(run("replay search-budgets --base-policy h2o"), 2, "traces");
  expect_one_line_error(run("replay search-budgets " + traces()), 2, "base-policy");
  expect_one_line_error(run("replay search-budgets " + traces() + " --base-policy nonesuch" + out),
                        2, "nonesuch");
  expect_one_line_error(run("replay search-budgets " + traces() + " --base-policy tiered" + out), 2,
                        "per-layer budgets");
  expect_one_line_error(
      run("replay search-budgets " + traces() + " --base-policy h2o:budget=64" + out), 2, "budget");
  expect_one_line_error(
      run("replay search-budgets " + traces() + " --base-policy h2o:recent=7" + out), 2, "recent");
  expect_one_line_error(
      run("replay search-budgets " + traces() + kSmall + " --target-mean 2" + out), 2,
      "--target-mean 2");
  expect_one_line_error(
      run("replay search-budgets " + traces() + " --base-policy h2o --floor 100 --cap 50" + out), 2,
      "floor");
  expect_one_line_error(run("replay search-budgets " + traces() + kSmall + " --jobs 0" + out), 2,
                        "--jobs");
  expect_one_line_error(
      run("replay search-budgets " + traces() + kSmall + " --evaluations 0" + out), 2,
      "--evaluations");
  expect_one_line_error(run("replay search-budgets " + traces() + kSmall + " --format yaml" + out),
                        2, "yaml");
  // Traces of different layer counts cannot share a budget vector: exit 2.
  const std::string sliced = path_of("sliced.h5");
  REQUIRE(run("trace convert '" + path_of("search1.h5") + "' --layers 0:3 --out '" + sliced + "'")
              .exit_code == 0);
  expect_one_line_error(
      run("replay search-budgets " + traces() + " --held-out '" + sliced + "'" + kSmall + out), 2,
      "layers");
  // Bad data: exit 3.
  expect_one_line_error(
      run("replay search-budgets --traces '" + path_of("missing.h5") + "'" + kSmall + out), 3,
      "missing.h5");
  const std::string garbage = path_of("garbage.h5");
  std::ofstream(garbage) << "not a trace\n";
  expect_one_line_error(run("replay search-budgets --traces '" + garbage + "'" + kSmall + out), 3,
                        "garbage.h5");
  // A policy that needs data the traces lack (snapkv: the prefill window).
  expect_one_line_error(run("replay search-budgets " + traces() +
                            " --base-policy snapkv --floor 4 --cap 160 --evaluations 8" + out),
                        3, "prefill");
  CHECK_FALSE(fs::exists(csv));
}
