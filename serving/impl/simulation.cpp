#include "serving/simulation.hpp"

#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <cmath>

#include "common/text_output.hpp"
#include "hwmodels/link_math.hpp"
#include "serving/engine.hpp"
#include "sim/simulator.hpp"

namespace kvtier::serving {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

double ms(sim::Tick time) {
  return sim::to_seconds(time) * 1e3;
}

void add_distribution(std::vector<Metric>& metrics, const std::string& name,
                      const sim::LatencyDistribution& distribution) {
  if (distribution.count() == 0) {
    return;
  }
  metrics.push_back({name + "_p50_ms", ms(distribution.percentile(50)), 3});
  metrics.push_back({name + "_p90_ms", ms(distribution.percentile(90)), 3});
  metrics.push_back({name + "_p99_ms", ms(distribution.percentile(99)), 3});
  metrics.push_back({name + "_mean_ms", distribution.mean_ps() * 1e-9, 3});
}

double mean_request_tokens(const Workload& workload) {
  double total = 0.0;
  for (const auto& request : workload.requests) {
    total += static_cast<double>(request.prompt_tokens + request.output_tokens);
  }
  return workload.requests.empty() ? 0.0 : total / static_cast<double>(workload.requests.size());
}

}  // namespace

SimulationReport simulate(const config::RunSpec& run) {
  sim::Simulator simulator;
  ServingEngine engine(simulator, run, make_workload(run.workload(), run.seed()));
  engine.start();
  simulator.run();

  SimulationReport report;
  report.workload = engine.workload().description;
  report.events = simulator.events_executed();
  const ServingTotals& totals = engine.totals();
  const MemoryPlan& plan = engine.memory();
  const double seconds = std::max(sim::to_seconds(totals.last_completion), 1e-12);
  const auto& node = run.hardware().node();
  const double tp = run.tensor_parallel_degree();
  auto& m = report.metrics;

  m.push_back({"requests_completed", static_cast<double>(totals.requests_completed), 0});
  m.push_back({"prompt_tokens", static_cast<double>(totals.prompt_tokens), 0});
  m.push_back({"output_tokens", static_cast<double>(totals.output_tokens), 0});
  m.push_back({"iterations", static_cast<double>(totals.iterations), 0});
  m.push_back({"duration_s", seconds, 3});
  m.push_back(
      {"throughput_output_tokens_per_s", static_cast<double>(totals.output_tokens) / seconds, 1});
  m.push_back({"throughput_total_tokens_per_s",
               static_cast<double>(totals.prompt_tokens + totals.output_tokens) / seconds, 1});
  m.push_back(
      {"throughput_requests_per_s", static_cast<double>(totals.requests_completed) / seconds, 3});
  add_distribution(m, "ttft", engine.ttft());
  add_distribution(m, "tpot", engine.tpot());
  add_distribution(m, "e2e_latency", engine.e2e());
  add_distribution(m, "queue_wait", engine.queue_wait());
  add_distribution(m, "iteration", engine.iteration_time());

  m.push_back({"hbm_capacity_gib", plan.capacity_bytes / kGiB, 2});
  m.push_back({"hbm_weights_gib", plan.weights_bytes / kGiB, 2});
  m.push_back({"hbm_workspace_gib", plan.workspace_bytes / kGiB, 2});
  m.push_back({"hbm_reserve_gib", plan.reserve_bytes / kGiB, 2});
  m.push_back({"hbm_kv_capacity_gib", plan.kv_capacity_bytes / kGiB, 2});
  m.push_back({"hbm_kv_used_peak_gib", engine.kv_used().max() / kGiB, 3});
  m.push_back({"hbm_kv_used_mean_gib", engine.kv_used().time_average() / kGiB, 3});
  m.push_back({"hbm_kv_reserved_peak_gib", engine.kv_reserved().max() / kGiB, 3});
  m.push_back({"hbm_peak_gib",
               (plan.weights_bytes + plan.workspace_bytes + plan.reserve_bytes +
                engine.kv_reserved().max()) /
                   kGiB,
               3});
  m.push_back({"kv_bytes_per_token_per_gpu", plan.kv_bytes_per_token, 1});
  const double per_request =
      plan.kv_bytes_for(static_cast<std::uint64_t>(mean_request_tokens(engine.workload())));
  m.push_back({"largest_batch_that_fits",
               per_request > 0 ? std::floor(plan.kv_capacity_bytes / per_request) : 0.0, 0});
  m.push_back({"max_running_requests", static_cast<double>(totals.max_running), 0});
  m.push_back({"mean_running_requests", engine.running().time_average(), 2});
  m.push_back({"max_waiting_requests", static_cast<double>(totals.max_waiting), 0});
  m.push_back({"engines_per_node", std::floor(node.gpus_per_node() / tp), 0});

  const hw::GpuModel& gpu = engine.cost_model().gpu();
  m.push_back({"gpu_busy_fraction", sim::to_seconds(totals.busy) / seconds, 4});
  m.push_back({"compute_utilisation",
               totals.flops / (gpu.peak_flops(run.model().activation_dtype()) * seconds), 4});
  m.push_back({"hbm_bandwidth_utilisation",
               totals.hbm_bytes / (gpu.memory_bytes_per_second() * seconds), 4});
  if (run.tensor_parallel_degree() > 1 && node.has_gpu_link()) {
    const double link = hw::asymptotic_gb_per_s(node.gpu_link(), config::PEER) * 1e9;
    m.push_back({"nvlink_utilisation", totals.interconnect_bytes / (link * seconds), 4});
  }
  m.push_back({"simulated_events", static_cast<double>(report.events), 0});

  if (const auto* kv = engine.kv_used_series()) {
    const double interval = sim::to_microseconds(kv->interval());
    std::vector<double> gib;
    for (const double bytes : kv->values()) {
      gib.push_back(bytes / kGiB);
    }
    report.series.push_back({"hbm_kv_used_gib", interval, gib});
    report.series.push_back({"running_requests", interval, engine.running_series()->values()});
  }
  return report;
}

std::string report_json(const SimulationReport& report, const config::RunSpec& run,
                        const std::string& version) {
  std::string config;
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(run, &config, options);
  std::string json = "{\"schema\": \"kvtier.sim.v1\", \"kvtier_version\": " + json_escape(version) +
                     ", \"seed\": " + std::to_string(run.seed()) +
                     ", \"workload\": " + json_escape(report.workload) + ",\n \"metrics\": {";
  for (size_t i = 0; i < report.metrics.size(); ++i) {
    json += (i == 0 ? "" : ", ") + json_escape(report.metrics[i].name) + ": " +
            format_double(report.metrics[i].value);
  }
  json += "},\n \"series\": {";
  for (size_t i = 0; i < report.series.size(); ++i) {
    const Series& series = report.series[i];
    json += (i == 0 ? "" : ", ") + json_escape(series.name) +
            ": {\"interval_us\": " + format_double(series.interval_us) + ", \"values\": [";
    for (size_t k = 0; k < series.values.size(); ++k) {
      json += (k == 0 ? "" : ", ") + format_double(series.values[k]);
    }
    json += "]}";
  }
  json += "},\n \"config\": " + config + "}\n";
  return json;
}

std::string report_csv(const SimulationReport& report) {
  std::string header;
  std::string values;
  for (size_t i = 0; i < report.metrics.size(); ++i) {
    header += (i == 0 ? "" : ",") + report.metrics[i].name;
    values += (i == 0 ? "" : ",") + format_double(report.metrics[i].value);
  }
  return header + "\n" + values + "\n";
}

std::string series_csv(const SimulationReport& report) {
  if (report.series.empty()) {
    return {};
  }
  std::string csv = "time_us";
  size_t rows = 0;
  for (const Series& series : report.series) {
    csv += "," + series.name;
    rows = std::max(rows, series.values.size());
  }
  csv += "\n";
  for (size_t row = 0; row < rows; ++row) {
    csv += format_double(static_cast<double>(row) * report.series.front().interval_us);
    for (const Series& series : report.series) {
      csv += "," + (row < series.values.size() ? format_double(series.values[row]) : std::string());
    }
    csv += "\n";
  }
  return csv;
}

}  // namespace kvtier::serving
