#include "apps/plan_report.hpp"

#include <google/protobuf/text_format.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <ostream>
#include <string>
#include <vector>

#include "common/text_output.hpp"
#include "report/html_page.hpp"
#include "report/svg_chart.hpp"
#include "serving/memory_plan.hpp"

namespace kvtier::app {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
// A load axis is drawn on a log scale when its probes span this factor or more.
constexpr double kLogScaleSpan = 16.0;

bool rate_search(const std::vector<serving::PlanResult>& results) {
  return !results.empty() && results.front().search == serving::PlanSearch::kRate;
}

// The planned load of each result, as the answer states it.
double planned_load(const serving::PlanResult& result) {
  return result.search == serving::PlanSearch::kRate ? result.requests_per_s_per_engine
                                                     : static_cast<double>(result.max_batch);
}

// A bar chart of one figure per policy.
std::string policy_bars(const std::string& title, const std::string& y_label,
                        const std::vector<std::string>& policies,
                        const std::vector<double>& values) {
  report::BarChart chart;
  chart.title = title;
  chart.y_label = y_label;
  chart.groups = policies;
  chart.series = {y_label};
  chart.values = {values};
  return report::bar_chart_svg(chart);
}

// Each probe of every policy: `value` against the load, sorted by load, with what the probe
// found in its tooltip.
std::vector<report::LineSeries> probe_lines(
    const std::vector<serving::PlanResult>& results, const std::vector<std::string>& policies,
    const std::function<double(const serving::PlanProbe&)>& value) {
  std::vector<report::LineSeries> lines;
  for (std::size_t r = 0; r < results.size(); ++r) {
    std::vector<const serving::PlanProbe*> probes;
    for (const serving::PlanProbe& probe : results[r].probes) {
      probes.push_back(&probe);
    }
    std::stable_sort(probes.begin(), probes.end(),
                     [](const auto* a, const auto* b) { return a->load < b->load; });
    report::LineSeries line{policies[r], {}, {}};
    for (const serving::PlanProbe* probe : probes) {
      line.x.push_back(probe->load);
      line.y.push_back(value(*probe));
      line.notes.push_back(probe->feasible ? "meets every SLO" : probe->binding);
    }
    lines.push_back(std::move(line));
  }
  return lines;
}

report::ChartAxis load_axis(const std::vector<serving::PlanResult>& results, bool cluster) {
  report::ChartAxis axis;
  axis.label = rate_search(results) ? (cluster ? "requests/s per engine (a share of the cluster's)"
                                               : "requests/s to one engine")
                                    : "batch (requests in flight)";
  double low = std::numeric_limits<double>::infinity();
  double high = 0.0;
  for (const serving::PlanResult& result : results) {
    for (const serving::PlanProbe& probe : result.probes) {
      low = std::min(low, probe.load);
      high = std::max(high, probe.load);
    }
  }
  if (low > 0.0 && high / low >= kLogScaleSpan) {
    axis.scale = report::AxisScale::kLog;
  }
  return axis;
}

}  // namespace

PlanTable plan_table(const std::vector<serving::PlanResult>& results, bool closed_loop,
                     bool with_target) {
  PlanTable table;
  table.header = closed_loop ? std::vector<std::string>{"policy",       "max batch", "req/s engine",
                                                        "tok/s engine", "tok/s GPU", "tok/s node"}
                             : std::vector<std::string>{"policy",       "max req/s", "in flight",
                                                        "tok/s engine", "tok/s GPU", "tok/s node"};
  if (with_target) {
    table.header.insert(table.header.end(), {"engines", "GPUs", "nodes"});
  }
  table.header.emplace_back("bound by");
  for (const auto& result : results) {
    std::vector<std::string> row{result.policy};
    if (closed_loop) {
      row.insert(row.end(), {std::to_string(result.max_batch),
                             format_fixed(result.requests_per_s_per_engine, 3)});
    } else {
      row.insert(row.end(), {format_fixed(result.requests_per_s_per_engine, 3),
                             serving::serves_any(result) ? std::to_string(result.max_batch) : "-"});
    }
    row.insert(row.end(), {format_fixed(result.output_tokens_per_s_per_engine, 1),
                           format_fixed(result.output_tokens_per_s_per_gpu, 1),
                           format_fixed(result.output_tokens_per_s_per_node, 1)});
    if (with_target && !serving::serves_any(result)) {
      row.insert(row.end(), {"-", "-", "-"});
    } else if (with_target) {
      row.insert(row.end(), {std::to_string(result.engines), std::to_string(result.gpus),
                             std::to_string(result.nodes)});
    }
    row.push_back(result.binding);
    table.rows.push_back(std::move(row));
  }
  return table;
}

namespace {

// "4 engines", "each layout's engines" or "each layout's engines (the run's 4 where one names
// none)": the cluster a plan searched.
std::string cluster_engines(const config::RunSpec& run, ClusterEngines engines) {
  const std::string of_run = std::to_string(run.cluster().engines());
  switch (engines) {
    case ClusterEngines::kEachLayout: return "each layout's engines";
    case ClusterEngines::kSomeLayouts:
      return "each layout's engines (the run's " + of_run + " where one names none)";
    case ClusterEngines::kRun: break;
  }
  return of_run + " engines";
}

}  // namespace

void write_plan_header(std::ostream& out, const std::string& file, const config::RunSpec& run,
                       const std::string& parallelism, const std::string& slo_text,
                       const serving::PlanOptions& options, ClusterEngines engines) {
  out << "kvtier plan: " << file << "\n  " << run.model().name() << " on "
      << run.hardware().node().gpu().name() << ", " << parallelism << ", SLO " << slo_text << "\n  "
      << (run.workload().has_closed_loop()
              ? "largest batch (closed loop of the run's request shape)"
              : "largest arrival rate (the run's requests, arriving faster or slower; precision " +
                    format_double(options.rate_precision) + ")")
      << "\n";
  if (run.has_cluster()) {
    out << "  of a cluster of " << cluster_engines(run, engines) << " routed "
        << config::Routing_Name(run.cluster().routing())
        << ": per-engine figures are a share of the cluster's, engines come in whole clusters\n";
  }
  out << "\n";
}

std::string plan_json(const serving::PlanResult& result, const std::vector<serving::Slo>& slos,
                      bool with_target, bool cluster) {
  const bool rate = result.search == serving::PlanSearch::kRate;
  std::string json = "{\"policy\": " + json_escape(result.policy);
  if (rate) {
    json += ", \"max_requests_per_s\": " + format_double(result.requests_per_s_per_engine) +
            ", \"infeasible_requests_per_s\": " + format_double(result.infeasible_requests_per_s) +
            ", \"max_running_requests\": " + std::to_string(result.max_batch);
    if (cluster) {
      json += ", \"cluster_engines\": " + std::to_string(result.cluster_engines) +
              ", \"cluster_max_requests_per_s\": " + format_double(result.cluster_requests_per_s);
    }
  } else {
    json += ", \"max_batch\": " + std::to_string(result.max_batch) +
            ", \"requests_per_s_per_engine\": " + format_double(result.requests_per_s_per_engine);
  }
  json +=
      ", \"binding\": " + json_escape(result.binding) + ", \"output_tokens_per_s_per_engine\": " +
      format_double(result.output_tokens_per_s_per_engine) +
      ", \"output_tokens_per_s_per_gpu\": " + format_double(result.output_tokens_per_s_per_gpu) +
      ", \"output_tokens_per_s_per_node\": " + format_double(result.output_tokens_per_s_per_node) +
      ", \"evaluations\": " + std::to_string(result.evaluations);
  if (with_target && !serving::serves_any(result)) {  // no engine meets the SLOs: none serves it
    json += R"(, "engines": null, "gpus": null, "nodes": null)";
  } else if (with_target) {
    json += ", \"engines\": " + std::to_string(result.engines) +
            ", \"gpus\": " + std::to_string(result.gpus) +
            ", \"nodes\": " + std::to_string(result.nodes);
  }
  json += ", \"notes\": [";
  for (std::size_t i = 0; i < result.notes.size(); ++i) {
    json += (i == 0 ? "" : ", ") + json_escape(result.notes[i]);
  }
  json += "], \"metrics\": {";
  for (std::size_t i = 0; i < result.metrics.size(); ++i) {
    json += (i == 0 ? "" : ", ") + json_escape(result.metrics[i].name) + ": " +
            format_double(result.metrics[i].value);
  }
  json += "}, \"probes\": [";
  for (std::size_t p = 0; p < result.probes.size(); ++p) {
    const serving::PlanProbe& probe = result.probes[p];
    json += std::string(p == 0 ? "" : ", ") + "{\"load\": " + format_double(probe.load) +
            ", \"feasible\": " + (probe.feasible ? "true" : "false") +
            ", \"binding\": " + json_escape(probe.binding) + ", \"slos_ms\": {";
    for (std::size_t s = 0; s < slos.size(); ++s) {
      json += (s == 0 ? "" : ", ") + json_escape(slos[s].metric) + ": " +
              json_number_or_null(probe.slo_values_ms[s]);
    }
    json += "}, \"output_tokens_per_s\": " + json_number_or_null(probe.output_tokens_per_s) + "}";
  }
  return json + "]}";
}

std::string plan_html(const std::vector<serving::PlanResult>& results,
                      const std::vector<std::string>& policies, const config::RunSpec& run,
                      const serving::PlanOptions& options, const std::string& file,
                      const std::string& version, const std::string& parallelism,
                      const std::vector<std::string>& notes, ClusterEngines engines) {
  const bool rate = rate_search(results);
  const bool with_target = options.has_target();
  report::HtmlPage page("kvtier plan: " + (run.name().empty() ? file : run.name()));
  page.labelled("Run:", file);
  page.labelled("Hardware:", run.model().name() + " on " + run.hardware().node().gpu().name() +
                                 " (" + run.hardware().node().name() + "), " + parallelism);
  std::string slos;
  for (const serving::Slo& slo : options.slos) {
    slos += (slos.empty() ? "" : ", ") + slo.metric + " ≤ " + format_double(slo.limit_ms) + " ms";
  }
  page.labelled("SLOs:", slos);
  page.labelled("Search:", rate ? "the largest arrival rate: the run's own requests arriving "
                                  "faster or slower, to a precision of " +
                                      format_double(options.rate_precision)
                                : "the largest batch: closed loops of the run's request shape, " +
                                      std::to_string(options.rounds) + " requests per slot");
  if (run.has_cluster()) {
    page.labelled("Cluster:", cluster_engines(run, engines) + " routed " +
                                  config::Routing_Name(run.cluster().routing()) +
                                  ", searched whole; per-engine figures are its share, and "
                                  "fleets come in whole clusters");
  }
  page.labelled("Version:", version);

  page.heading(2, "The answer", "answer");
  // The policies as the run wrote them; what binds each follows the charts, in full.
  PlanTable table = plan_table(results, !rate, with_target);
  table.header.pop_back();
  for (std::size_t r = 0; r < results.size(); ++r) {
    table.rows[r].front() = policies[r];
    table.rows[r].pop_back();
  }
  std::vector<bool> numbers(table.header.size(), true);
  numbers.front() = false;
  page.table(table.header, table.rows, numbers);
  page.list(notes);
  std::vector<double> loads;
  std::vector<double> per_gpu;
  std::vector<double> gpus;
  for (const serving::PlanResult& result : results) {
    const bool serves = serving::serves_any(result);
    loads.push_back(planned_load(result));
    per_gpu.push_back(serves ? result.output_tokens_per_s_per_gpu : 0.0);
    gpus.push_back(serves ? static_cast<double>(result.gpus) : kNaN);
  }
  page.add_raw(
      policy_bars(rate ? "Largest arrival rate within the SLOs" : "Largest batch within the SLOs",
                  rate ? "requests/s per engine" : "requests in flight", policies, loads));
  page.add_raw(
      policy_bars("Output tokens per second per GPU at that load", "tokens/s", policies, per_gpu));
  if (with_target) {
    page.add_raw(policy_bars("GPUs that serve the target", "GPUs", policies, gpus));
  }
  for (std::size_t r = 0; r < results.size(); ++r) {
    page.labelled(policies[r] + ":", results[r].policy + "; bound by " + results[r].binding);
    page.list(results[r].notes);
  }

  page.heading(2, "The search", "search");
  page.paragraph(
      "Every simulation each search ran: for each SLO its metric against the load, the limit "
      "dashed. Hover over a point to see whether that load met every SLO and, if not, what "
      "stopped it. A gap is a load whose requests did not fit.");
  const report::ChartAxis x = load_axis(results, run.has_cluster());
  for (std::size_t s = 0; s < options.slos.size(); ++s) {
    const serving::Slo& slo = options.slos[s];
    report::LineChart chart;
    chart.title = slo.metric + " against the load";
    chart.x = x;
    chart.y.label = "ms";
    chart.series = probe_lines(results, policies, [s](const serving::PlanProbe& probe) {
      return probe.slo_values_ms.at(s);
    });
    chart.guides.push_back({"SLO: " + format_double(slo.limit_ms) + " ms", 0.0, slo.limit_ms});
    page.add_raw(report::line_chart_svg(chart));
  }
  report::LineChart tokens;
  tokens.title = "Output tokens per second against the load";
  tokens.x = x;
  tokens.y.label = "tokens/s per engine";
  tokens.series = probe_lines(
      results, policies, [](const serving::PlanProbe& probe) { return probe.output_tokens_per_s; });
  page.add_raw(report::line_chart_svg(tokens));

  page.heading(2, "At the planned load", "metrics");
  const auto ran = std::find_if(results.begin(), results.end(),
                                [](const auto& result) { return !result.metrics.empty(); });
  if (ran == results.end()) {
    page.paragraph("No policy serves any load within the SLOs.");
  } else {
    std::vector<std::string> header{"metric"};
    header.insert(header.end(), policies.begin(), policies.end());
    std::vector<std::vector<std::string>> rows;
    for (std::size_t m = 0; m < ran->metrics.size(); ++m) {
      std::vector<std::string> row{ran->metrics[m].name};
      for (const serving::PlanResult& result : results) {
        const serving::Metric* found = serving::find_metric(result.metrics, ran->metrics[m].name);
        row.push_back(found == nullptr ? "-" : format_fixed(found->value, found->decimals));
      }
      rows.push_back(std::move(row));
    }
    std::vector<bool> right(header.size(), true);
    right.front() = false;
    page.table(header, rows, right);
  }
  std::string config;
  google::protobuf::TextFormat::PrintToString(run, &config);
  page.details("The resolved run (presets expanded)", config);
  return page.str();
}

}  // namespace kvtier::app
