// report.html: the simulation's report as a page for people, its figures drawn as charts.

#include <google/protobuf/text_format.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <string>
#include <vector>

#include "common/text_output.hpp"
#include "report/html_page.hpp"
#include "report/svg_chart.hpp"
#include "serving/memory_plan.hpp"
#include "serving/simulation.hpp"

namespace kvtier::serving {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

class ReportPage {
 public:
  ReportPage(const std::vector<SimulationReport>& reports, std::vector<std::string> policies,
             report::HtmlPage& page)
      : reports_(reports), policies_(std::move(policies)), page_(page) {}

  // Whether any report has the metric (a policy that did not fit has its names, NaN values).
  [[nodiscard]] bool has(const std::string& name) const {
    return find_metric(reports_.front().metrics, name) != nullptr;
  }

  [[nodiscard]] double value(std::size_t report, const std::string& name) const {
    const Metric* metric = find_metric(reports_[report].metrics, name);
    return metric != nullptr ? metric->value : kNaN;
  }

  // Whether some policy's value of the metric is neither zero nor missing.
  [[nodiscard]] bool nonzero(const std::string& name) const {
    for (std::size_t r = 0; r < reports_.size(); ++r) {
      const double v = value(r, name);
      if (std::isfinite(v) && v != 0.0) {
        return true;
      }
    }
    return false;
  }

  // One bar per policy for each metric named, grouped by metric.
  void metric_bars(const std::string& title, const std::string& y_label,
                   const std::vector<std::pair<std::string, std::string>>& metrics) {
    report::BarChart chart;
    chart.title = title;
    chart.y_label = y_label;
    chart.series = policies_;
    chart.values.assign(reports_.size(), {});
    for (const auto& [name, group] : metrics) {
      if (!has(name)) {
        continue;
      }
      chart.groups.push_back(group);
      for (std::size_t r = 0; r < reports_.size(); ++r) {
        chart.values[r].push_back(value(r, name));
      }
    }
    if (!chart.groups.empty()) {
      page_.add_raw(report::bar_chart_svg(chart));
    }
  }

  void latency(const std::string& name, const std::string& title) {
    if (!has(name + "_p50_ms")) {
      return;
    }
    metric_bars(title, "milliseconds",
                {{name + "_p50_ms", "p50"},
                 {name + "_p90_ms", "p90"},
                 {name + "_p99_ms", "p99"},
                 {name + "_mean_ms", "mean"}});
  }

  // HBM per GPU by kind at the peak, stacked, one bar per policy.
  void hbm_by_kind() {
    const std::vector<std::pair<std::string, std::string>> kinds = {
        {"hbm_weights_gib", "weights"},
        {"hbm_workspace_gib", "activation workspace"},
        {"hbm_reserve_gib", "runtime reserve"},
        {"hbm_kv_reserved_peak_gib", "KV (peak reserved)"}};
    report::BarChart chart;
    chart.title = "HBM per GPU at the peak, by kind";
    chart.y_label = "GiB";
    chart.groups = policies_;
    chart.stacked = true;
    for (const auto& [name, label] : kinds) {
      if (!has(name)) {
        return;
      }
      chart.series.push_back(label);
      chart.values.emplace_back();
      for (std::size_t r = 0; r < reports_.size(); ++r) {
        chart.values.back().push_back(value(r, name));
      }
    }
    if (has("speculative_drafter_weights_gib")) {
      // A speculating run's drafter, which hbm_peak_gib holds beside the model's weights.
      chart.series.emplace_back("drafter weights");
      chart.values.emplace_back();
      for (std::size_t r = 0; r < reports_.size(); ++r) {
        chart.values.back().push_back(value(r, "speculative_drafter_weights_gib"));
      }
    }
    chart.series.emplace_back("free");
    chart.values.emplace_back();
    for (std::size_t r = 0; r < reports_.size(); ++r) {
      const double free = value(r, "hbm_capacity_gib") - value(r, "hbm_peak_gib");
      chart.values.back().push_back(std::isnan(free) ? kNaN : std::max(0.0, free));
    }
    page_.add_raw(report::bar_chart_svg(chart));
  }

  // The sampled series of every policy that has them, one chart per series.
  void series_over_time() {
    std::vector<std::string> names;
    for (const SimulationReport& each : reports_) {
      for (const Series& series : each.series) {
        if (std::find(names.begin(), names.end(), series.name) == names.end()) {
          names.push_back(series.name);
        }
      }
    }
    if (names.empty()) {
      page_.paragraph(
          "No series was sampled: set outputs.timeseries_interval_us to chart KV in HBM and the "
          "requests over time.");
      return;
    }
    for (const std::string& name : names) {
      report::LineChart chart;
      chart.title = series_title(name);
      chart.x.label = "simulated time (s)";
      chart.y.label = series_unit(name);
      chart.markers = false;
      for (std::size_t r = 0; r < reports_.size(); ++r) {
        const auto found =
            std::find_if(reports_[r].series.begin(), reports_[r].series.end(),
                         [&name](const Series& series) { return series.name == name; });
        if (found == reports_[r].series.end()) {
          continue;
        }
        report::LineSeries line{policies_[r], {}, found->values};
        for (std::size_t k = 0; k < found->values.size(); ++k) {
          line.x.push_back(static_cast<double>(k) * found->interval_us * 1e-6);
        }
        chart.series.push_back(std::move(line));
      }
      page_.add_raw(report::line_chart_svg(chart));
    }
  }

  // A cluster's engines: their own figures for each policy that ran with them.
  void engines() {
    for (std::size_t r = 0; r < reports_.size(); ++r) {
      const std::vector<std::vector<Metric>>& engines = reports_[r].engines;
      if (engines.empty()) {
        continue;
      }
      page_.heading(3, "Engines of " + policies_[r]);
      report::BarChart routed;
      routed.title = "Requests routed to each engine (" + policies_[r] + ")";
      routed.y_label = "requests";
      routed.series = {"requests routed"};
      routed.values.emplace_back();
      std::vector<std::string> header{"engine"};
      for (const Metric& metric : engines.front()) {
        header.push_back(metric.name);
      }
      std::vector<std::vector<std::string>> rows;
      for (std::size_t e = 0; e < engines.size(); ++e) {
        routed.groups.push_back(std::to_string(e));
        const Metric* requests = find_metric(engines[e], "requests_routed");
        routed.values.back().push_back(requests != nullptr ? requests->value : kNaN);
        std::vector<std::string> row{std::to_string(e)};
        for (const Metric& metric : engines[e]) {
          row.push_back(cell(metric));
        }
        rows.push_back(std::move(row));
      }
      page_.add_raw(report::bar_chart_svg(routed));
      page_.table(header, rows, std::vector<bool>(header.size(), true));
    }
  }

  void all_metrics() {
    std::vector<std::string> header{"metric"};
    header.insert(header.end(), policies_.begin(), policies_.end());
    std::vector<bool> right(header.size(), true);
    right[0] = false;
    std::vector<std::vector<std::string>> rows;
    for (std::size_t m = 0; m < reports_.front().metrics.size(); ++m) {
      std::vector<std::string> row{reports_.front().metrics[m].name};
      for (const SimulationReport& each : reports_) {
        row.push_back(cell(each.metrics[m]));
      }
      rows.push_back(std::move(row));
    }
    page_.table(header, rows, right);
  }

 private:
  static std::string cell(const Metric& metric) {
    return std::isnan(metric.value) ? "-" : format_fixed(metric.value, metric.decimals);
  }

  static std::string series_title(const std::string& name) {
    if (name == "hbm_kv_used_gib") {
      return "KV in HBM per GPU";
    }
    if (name == "running_requests") {
      return "Requests running";
    }
    if (name == "waiting_requests") {
      return "Requests waiting for admission";
    }
    if (name == "host_kv_used_gib") {
      return "KV in host memory per GPU";
    }
    return name;
  }

  static std::string series_unit(const std::string& name) {
    if (name.ends_with("_gib")) {
      return "GiB";
    }
    if (name.ends_with("_requests")) {
      return "requests";
    }
    return name;
  }

  const std::vector<SimulationReport>& reports_;
  std::vector<std::string> policies_;
  report::HtmlPage& page_;
};

}  // namespace

std::string report_html(const std::vector<SimulationReport>& reports, const config::RunSpec& run,
                        const std::string& version, const std::string& source) {
  const std::vector<std::string> policies = policy_names(run);
  report::HtmlPage page("kvtier sim: " + (run.name().empty() ? source : run.name()));
  page.labelled("Run:", source);
  page.labelled("Hardware:", run.model().name() + " on " + run.hardware().node().gpu().name() +
                                 " (" + run.hardware().node().name() + "), " +
                                 describe_engines(run));
  page.labelled("Workload:", reports.front().workload);
  page.labelled("Seed:", std::to_string(run.seed()) + "; " + version);

  page.heading(2, "Policies", "policies");
  for (std::size_t r = 0; r < reports.size(); ++r) {
    page.labelled(policies[r] + ":", reports[r].policy);
    page.list(reports[r].notes);
  }

  ReportPage charts(reports, policies, page);
  page.heading(2, "Throughput and latency", "throughput");
  charts.metric_bars("Throughput", "tokens per second",
                     {{"throughput_output_tokens_per_s", "output tokens/s"},
                      {"throughput_total_tokens_per_s", "prompt and output tokens/s"}});
  charts.latency("ttft", "Time to first token");
  charts.latency("tpot", "Time per output token");
  if (charts.nonzero("queue_wait_p99_ms")) {
    charts.latency("queue_wait", "Time waiting for admission");
  }
  charts.latency("e2e_latency", "Request latency");

  page.heading(2, "Memory", "memory");
  charts.hbm_by_kind();
  charts.metric_bars("KV in HBM per GPU and HBM saved against the full cache", "GiB",
                     {{"hbm_kv_used_peak_gib", "KV used, peak"},
                      {"hbm_kv_used_mean_gib", "KV used, mean"},
                      {"hbm_saved_peak_gib", "saved, peak"},
                      {"hbm_saved_mean_gib", "saved, mean"}});
  if (charts.nonzero("host_kv_used_peak_gib")) {
    charts.metric_bars("Host memory per GPU", "GiB",
                       {{"host_kv_capacity_gib", "KV capacity"},
                        {"host_kv_used_peak_gib", "KV used, peak"},
                        {"host_kv_reserved_peak_gib", "KV reserved, peak"}});
  }
  charts.metric_bars("Largest batch that fits", "requests",
                     {{"largest_batch_hbm_limit", "by HBM"},
                      {"largest_batch_host_limit", "by host memory"},
                      {"largest_batch_that_fits", "both"}});

  if (charts.nonzero("pcie_h2d_gb") || charts.nonzero("pcie_d2h_gb")) {
    page.heading(2, "PCIe and host work", "pcie");
    charts.metric_bars("PCIe traffic per GPU", "GB",
                       {{"pcie_h2d_gb", "host to device"}, {"pcie_d2h_gb", "device to host"}});
    charts.metric_bars(
        "PCIe utilisation", "fraction of the link",
        {{"pcie_h2d_utilisation", "host to device"}, {"pcie_d2h_utilisation", "device to host"}});
    charts.metric_bars(
        "Time waiting for copies", "fraction of the run",
        {{"prefetch_stall_fraction", "prefetch stalls"}, {"copy_wait_fraction", "all copies"}});
  }
  if (charts.nonzero("attention_mass_lost_mean")) {
    charts.metric_bars("Attention mass", "fraction of each step's attention",
                       {{"attention_mass_kept_mean", "kept, mean"},
                        {"attention_mass_kept_min", "kept, lowest"},
                        {"attention_mass_lost_mean", "lost, mean"}});
  }

  page.heading(2, "Utilisation", "utilisation");
  charts.metric_bars("Utilisation of the GPU", "fraction",
                     {{"gpu_busy_fraction", "busy"},
                      {"compute_utilisation", "compute"},
                      {"hbm_bandwidth_utilisation", "HBM bandwidth"},
                      {"nvlink_utilisation", "NVLink"},
                      {"network_utilisation", "network"}});

  page.heading(2, "Over time", "time");
  charts.series_over_time();

  if (std::any_of(reports.begin(), reports.end(),
                  [](const SimulationReport& each) { return !each.engines.empty(); })) {
    page.heading(2, "Engines", "engines");
    charts.engines();
  }

  page.heading(2, "Every metric", "metrics");
  charts.all_metrics();

  std::string config;
  google::protobuf::TextFormat::PrintToString(run, &config);
  page.details("The resolved run (presets expanded)", config);
  return page.str();
}

}  // namespace kvtier::serving
