// report.html: the simulation's report as a page of charts. Reports are made by hand, so every
// figure a chart shows is known.

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "configs/schema/run.pb.h"
#include "serving/simulation.hpp"
#include "tests/support/xml_reader.hpp"

namespace {

using kvtier::serving::Metric;
using kvtier::serving::SimulationReport;
using kvtier::testing::attribute;
using kvtier::testing::elements;
using kvtier::testing::parse_xml;
using kvtier::testing::text_of;
using kvtier::testing::XmlTree;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

kvtier::config::RunSpec run_spec() {
  kvtier::config::RunSpec run;
  run.set_name("report-test");
  run.mutable_model()->set_name("Llama-3.1-8B");
  run.mutable_hardware()->mutable_node()->set_name("hgx-h100-8");
  run.mutable_hardware()->mutable_node()->mutable_gpu()->set_name("H100-SXM");
  run.set_tensor_parallel_degree(1);
  run.set_seed(3);
  run.mutable_policy()->set_name("full");
  auto* tiered = run.add_compare();
  tiered->set_name("tiered");
  auto* hbm = tiered->add_param();
  hbm->set_name("hbm");
  hbm->set_number(0.5);
  return run;
}

SimulationReport report(const std::string& policy, double throughput, double pcie_gb) {
  SimulationReport r;
  r.policy = policy;
  r.workload = "closed loop, 2 in flight, 4 requests";
  r.metrics = {{"throughput_output_tokens_per_s", throughput, 1},
               {"throughput_total_tokens_per_s", 2 * throughput, 1},
               {"ttft_p50_ms", 10, 3},
               {"ttft_p90_ms", 20, 3},
               {"ttft_p99_ms", 30, 3},
               {"ttft_mean_ms", 12, 3},
               {"hbm_capacity_gib", 80, 2},
               {"hbm_weights_gib", 15, 2},
               {"hbm_workspace_gib", 1, 2},
               {"hbm_reserve_gib", 2, 2},
               {"hbm_kv_reserved_peak_gib", 42, 3},
               {"hbm_peak_gib", 60, 3},
               {"pcie_h2d_gb", pcie_gb, 3},
               {"pcie_d2h_gb", 0, 3}};
  return r;
}

std::vector<SimulationReport> two_policies() {
  std::vector<SimulationReport> reports{report("full", 2030.5, 0),
                                        report("tiered:hbm=0.5,evict=0", 1500, 12.5)};
  reports[1].notes.push_back("demand from a synthetic trace <reasoning> & more");
  return reports;
}

// Every element's <title> (the values charts carry) and text, by chart title.
struct Page {
  XmlTree tree;
  std::vector<std::string> chart_titles;
  std::vector<std::string> values;  // <title>s of bars and points
};

Page read(const std::string& html) {
  Page page{parse_xml(html), {}, {}};
  for (const XmlTree* svg : elements(page.tree, "svg")) {
    for (const XmlTree* text : elements(*svg, "text")) {
      if (attribute(*text, "class") == "title") {
        page.chart_titles.push_back(text_of(*text));
      }
    }
    for (const XmlTree* title : elements(*svg, "title")) {
      page.values.push_back(text_of(*title));
    }
  }
  return page;
}

bool contains(const std::vector<std::string>& texts, const std::string& text) {
  return std::find(texts.begin(), texts.end(), text) != texts.end();
}

TEST_CASE("report.html charts each policy's figures side by side", "[serving][report]") {
  const std::string html = kvtier::serving::report_html(two_policies(), run_spec(),
                                                        "kvtier 0.1.0 (test)", "run.textproto");
  const Page page = read(html);
  CHECK(text_of(page.tree.get_child("html.head.title")) == "kvtier sim: report-test");
  CHECK(contains(page.chart_titles, "Throughput"));
  CHECK(contains(page.chart_titles, "Time to first token"));
  CHECK(contains(page.chart_titles, "HBM per GPU at the peak, by kind"));
  // Bars carry their exact values, named by the policies as the run wrote them.
  CHECK(contains(page.values, "full, output tokens/s: 2030.5"));
  CHECK(contains(page.values, "tiered:hbm=0.5, output tokens/s: 1500"));
  CHECK(contains(page.values, "tiered:hbm=0.5, p99: 30"));
  // HBM by kind: the parts of the peak, and what is left of the capacity.
  CHECK(contains(page.values, "weights, full: 15"));
  CHECK(contains(page.values, "KV (peak reserved), tiered:hbm=0.5: 42"));
  CHECK(contains(page.values, "free, full: 20"));
  // PCIe moves for one policy: its section is there.
  CHECK(contains(page.chart_titles, "PCIe traffic per GPU"));
  CHECK(contains(page.values, "tiered:hbm=0.5, host to device: 12.5"));
  // A policy's notes, escaped as text.
  const std::string items = kvtier::testing::joined_texts(page.tree, "li");
  CHECK_THAT(items, Catch::Contains("|demand from a synthetic trace <reasoning> & more|"));
  // Every metric in the table, a row each, with the metric's decimals.
  std::size_t metric_rows = 0;
  for (const XmlTree* row : elements(page.tree, "tr")) {
    const auto cells = elements(*row, "td");
    if (!cells.empty() && text_of(*cells[0]) == "hbm_kv_reserved_peak_gib") {
      CHECK(text_of(*cells[1]) == "42.000");
    }
    metric_rows += cells.size() == 3 ? 1 : 0;
  }
  CHECK(metric_rows == two_policies().front().metrics.size());
  CHECK(html == kvtier::serving::report_html(two_policies(), run_spec(), "kvtier 0.1.0 (test)",
                                             "run.textproto"));
}

TEST_CASE("report.html leaves out what no policy has, and marks a policy that did not fit",
          "[serving][report]") {
  std::vector<SimulationReport> reports = two_policies();
  for (Metric& metric : reports[1].metrics) {
    metric.value = kNaN;
  }
  reports[1].does_not_fit = "a request needs 90 GiB";
  reports[1].notes.push_back("does not fit: a request needs 90 GiB");
  const std::string html =
      kvtier::serving::report_html(reports, run_spec(), "kvtier 0.1.0 (test)", "run.textproto");
  const Page page = read(html);
  CHECK_FALSE(contains(page.chart_titles, "PCIe traffic per GPU"));
  CHECK_FALSE(contains(page.chart_titles, "Time per output token"));
  CHECK_FALSE(contains(page.values, "tiered:hbm=0.5, output tokens/s: nan"));
  const std::string texts = kvtier::testing::joined_texts(page.tree, "text");
  CHECK_THAT(texts, Catch::Contains("|n/a|"));
  CHECK_THAT(html, Catch::Contains("does not fit: a request needs 90 GiB"));
  CHECK_THAT(html, Catch::Contains("No series was sampled"));
}

TEST_CASE("report.html draws the sampled series over time, a line per policy",
          "[serving][report]") {
  std::vector<SimulationReport> reports = two_policies();
  reports[0].series.push_back({"hbm_kv_used_gib", 500'000, {0, 1, 2, 3}});
  reports[0].series.push_back({"waiting_requests", 500'000, {3, 2, 1, 0}});
  reports[1].series.push_back({"hbm_kv_used_gib", 500'000, {0, 0.5, 1, 1.5, 2}});
  const Page page = read(
      kvtier::serving::report_html(reports, run_spec(), "kvtier 0.1.0 (test)", "run.textproto"));
  const XmlTree* kv = nullptr;
  const XmlTree* waiting = nullptr;
  for (const XmlTree* svg : elements(page.tree, "svg")) {
    const std::string title = attribute(*svg, "aria-label");
    kv = title == "KV in HBM per GPU" ? svg : kv;
    waiting = title == "Requests waiting for admission" ? svg : waiting;
  }
  REQUIRE(kv != nullptr);
  REQUIRE(waiting != nullptr);
  CHECK(elements(*kv, "polyline").size() == 2);
  CHECK(elements(*waiting, "polyline").size() == 1);
  const std::string ticks = kvtier::testing::joined_texts(*kv, "text");
  // 2 s of samples (the tiered run's five, 0.5 s apart) on ticks of 0.5 s.
  CHECK_THAT(ticks,
             Catch::Contains("|0|0.5|1.0|1.5|2.0|") && Catch::Contains("simulated time (s)"));
}

TEST_CASE("report.html shows a cluster's engines", "[serving][report]") {
  std::vector<SimulationReport> reports = two_policies();
  for (const double routed : {3.0, 1.0, 2.0}) {
    reports[0].engines.push_back({{"requests_routed", routed, 0}, {"ttft_p99_ms", 5, 3}});
  }
  const std::string html =
      kvtier::serving::report_html(reports, run_spec(), "kvtier 0.1.0 (test)", "run.textproto");
  const Page page = read(html);
  CHECK(contains(page.chart_titles, "Requests routed to each engine (full)"));
  CHECK(contains(page.values, "requests routed, 2: 2"));
  CHECK_THAT(html, Catch::Contains("<h3>Engines of full</h3>"));
  std::size_t engine_rows = 0;
  for (const XmlTree* row : elements(page.tree, "tr")) {
    const auto cells = elements(*row, "td");
    engine_rows += cells.size() == 3 && text_of(*cells[2]) == "5.000" ? 1 : 0;
  }
  CHECK(engine_rows == 3);
}

}  // namespace
