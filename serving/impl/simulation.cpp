#include "serving/simulation.hpp"

#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>

#include "common/errors.hpp"
#include "common/text_output.hpp"
#include "hwmodels/link_math.hpp"
#include "serving/engine.hpp"
#include "serving/tier_demand.hpp"
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

// The run's policy recodes tokens between T1 and T2 but the run does not time them (no
// tiering.host_recode): its recode times have no value, and a note says why.
bool recodes_untimed(const ServingEngine& engine) {
  return engine.totals().host_recode_bytes > 0.0 && !engine.host_recode_costed();
}

void add_tier_metrics(std::vector<Metric>& m, const ServingEngine& engine, double seconds) {
  const ServingTotals& totals = engine.totals();
  const double full_peak = engine.full_kv().max();
  m.push_back({"hbm_kv_full_cache_peak_gib", full_peak / kGiB, 3});
  m.push_back({"hbm_saved_peak_gib", (full_peak - engine.kv_used().max()) / kGiB, 3});
  m.push_back({"hbm_saved_mean_gib",
               (engine.full_kv().time_average() - engine.kv_used().time_average()) / kGiB, 3});
  m.push_back({"host_kv_capacity_gib", engine.memory().host_kv_capacity_bytes / kGiB, 2});
  m.push_back({"host_kv_used_peak_gib", engine.host_kv_used().max() / kGiB, 3});
  m.push_back({"host_kv_reserved_peak_gib", engine.host_kv_reserved().max() / kGiB, 3});
  m.push_back({"pcie_h2d_gb", totals.h2d_bytes / 1e9, 3});
  m.push_back({"pcie_d2h_gb", totals.d2h_bytes / 1e9, 3});
  m.push_back({"pcie_h2d_gb_per_s", totals.h2d_bytes / 1e9 / seconds, 3});
  m.push_back({"pcie_h2d_utilisation", sim::to_seconds(totals.h2d_busy) / seconds, 4});
  m.push_back({"pcie_d2h_utilisation", sim::to_seconds(totals.d2h_busy) / seconds, 4});
  m.push_back({"prefetch_stall_s", sim::to_seconds(totals.prefetch_stall), 4});
  m.push_back(
      {"prefetch_stall_fraction",
       sim::to_seconds(totals.prefetch_stall) / std::max(sim::to_seconds(totals.busy), 1e-12), 4});
  m.push_back({"copy_wait_s", sim::to_seconds(totals.copy_wait), 4});
  m.push_back({"copy_wait_fraction",
               sim::to_seconds(totals.copy_wait) / std::max(sim::to_seconds(totals.busy), 1e-12),
               4});
  m.push_back({"host_recode_gb", totals.host_recode_bytes / 1e9, 3});
  // Recodes a run does not time have no time (null, "-"); none take none.
  const double untimed = recodes_untimed(engine) ? std::numeric_limits<double>::quiet_NaN() : 0.0;
  m.push_back({"host_recode_s", untimed + sim::to_seconds(totals.host_recode_busy), 4});
  m.push_back({"host_recode_stall_s", untimed + sim::to_seconds(totals.host_recode_stall), 4});
  const TierDemand* tiers = engine.tiers();
  const double kept = tiers != nullptr ? tiers->mean_kept_mass() : 1.0;
  m.push_back({"attention_mass_kept_mean", kept, 4});
  m.push_back({"attention_mass_kept_min", tiers != nullptr ? tiers->min_kept_mass() : 1.0, 4});
  m.push_back({"attention_mass_lost_mean", 1.0 - kept, 4});
}

// The most requests of the workload's mean shape that fit at once by HBM (their KV: T0 and
// staging with a tier policy) and by host memory (their T1/T2; 0 when they use none).
struct BatchLimits {
  double hbm = 0.0;
  double host = 0.0;
};

BatchLimits largest_batch(const ServingEngine& engine) {
  const MemoryPlan& plan = engine.memory();
  const auto count = static_cast<std::uint32_t>(engine.workload().requests.size());
  BatchLimits limits;
  if (count == 0) {
    return limits;
  }
  double hbm = 0.0;
  double host = 0.0;
  for (std::uint32_t id = 0; id < count; ++id) {
    hbm += engine.hbm_reservation(id);
    host += engine.host_reservation(id);
  }
  hbm /= count;
  host /= count;
  limits.hbm = hbm > 0 ? std::floor(plan.kv_capacity_bytes / hbm) : 0.0;
  limits.host = host > 0 ? std::floor(plan.host_kv_capacity_bytes / host) : 0.0;
  return limits;
}

// With `report_unfit`, a workload the policy cannot fit (DoesNotFit) gives a report saying so
// instead of the exception.
SimulationReport simulate_policy(const config::RunSpec& run, DemandMemo* memo, bool report_unfit) {
  sim::Simulator simulator;
  Workload workload = make_workload(run.workload(), run.seed());
  std::unique_ptr<TierDemand> tiers;
  SimulationReport report;
  report.policy = "full";
  if (run.policy().name() != "full") {
    tiers = std::make_unique<TierDemand>(run, run.policy(), workload, memo);
    report.policy = tiers->policy();
    if (tiers->synthetic()) {
      const ReplayedTrace& trace = tiers->traces().front();
      report.notes.push_back(
          "demand from a " + trace.source + " of " + std::to_string(trace.prompt_tokens) +
          " prompt tokens + " + std::to_string(trace.steps) + " steps, " +
          std::to_string(trace.demand().layers()) + " layers: the run names no traces");
    }
    if (!tiers->synthetic()) {
      report.notes.push_back("demand replayed over " + std::to_string(run.tiering().traces_size()) +
                             " trace(s); mean kept mass " +
                             format_fixed(tiers->mean_kept_mass(), 4));
      report.demand_cache_hits = tiers->cache_hits();
    }
    if (tiers->synthetic_tail_fraction() > 0.0) {
      report.notes.push_back(format_fixed(100.0 * tiers->synthetic_tail_fraction(), 1) +
                             "% of decode steps ran past their trace and follow a synthetic "
                             "extension");
    }
    if (tiers->differential_prefetch()) {
      report.notes.emplace_back(
          "differential prefetch: only tokens newly placed in T1 cross PCIe "
          "each step (the paper's accounting; T1 is assumed to stay staged "
          "on the GPU between re-tierings without counting against HBM)");
    }
  }
  const std::string description = workload.description;
  std::unique_ptr<ServingEngine> built;
  try {
    built = std::make_unique<ServingEngine>(simulator, run, std::move(workload), tiers.get());
  } catch (const DoesNotFit& error) {
    if (!report_unfit) {
      throw;
    }
    report.workload = description;
    report.does_not_fit = error.what();
    report.does_not_fit_in = error.memory();
    return report;
  }
  ServingEngine& engine = *built;
  engine.start();
  simulator.run();
  if (engine.totals().requests_completed != engine.workload().requests.size()) {
    // Every request fits alone (checked when the engine was built), so a run that ends with
    // requests left has stalled: a defect of the engine, never of the config.
    throw std::logic_error(
        "serving engine stalled with " +
        std::to_string(engine.workload().requests.size() - engine.totals().requests_completed) +
        " request(s) unfinished");
  }

  report.workload = engine.workload().description;
  report.events = simulator.events_executed();
  const ServingTotals& totals = engine.totals();
  if (recodes_untimed(engine)) {
    report.notes.push_back("T1 <-> T2 recodes read " +
                           format_fixed(totals.host_recode_bytes / 1e9, 3) +
                           " GB of host memory per GPU, not timed: the run sets no "
                           "tiering.host_recode (docs/SIMULATION.md)");
  }
  if (run.workload().has_on_demand_admission()) {
    const config::OnDemandAdmission& admission = run.workload().on_demand_admission();
    const std::string preemption = admission.has_swap()
                                       ? "swapped to host memory (" +
                                             format_double(admission.swap().space_gib()) +
                                             " GiB of swap space per GPU, a copy per "
                                             "block) or, without room there, recomputed"
                                       : "recomputed";
    report.notes.push_back("requests admitted on demand (workload.on_demand_admission, watermark " +
                           format_double(admission.watermark()) +
                           "): preempted when KV runs short and " + preemption +
                           "; largest_batch_* still count whole-request reservations");
    if (totals.swapped_preemptions < totals.preemptions && admission.has_swap()) {
      report.notes.push_back(
          std::to_string(totals.preemptions - totals.swapped_preemptions) + " of " +
          std::to_string(totals.preemptions) +
          " preempted requests did not fit the free swap space and were recomputed (vLLM V0 "
          "aborts the run there: raise swap.space_gib to model it swapping them)");
    }
  }
  const MemoryPlan& plan = engine.memory();
  if (plan.block_tokens > 0) {
    report.notes.push_back(
        "KV memory in blocks of " + std::to_string(plan.block_tokens) +
        " tokens (memory.kv_block_tokens): " +
        std::to_string(
            static_cast<std::uint64_t>(std::llround(plan.kv_capacity_bytes / plan.block_bytes()))) +
        " blocks of KV capacity per GPU; full-precision KV in HBM takes whole blocks" +
        (engine.tiers() != nullptr ? std::string(" (the policy's T0 in blocks of each layer's own)")
                                   : std::string()));
  }
  const double prefix_hit_rate = totals.prefix_queried_tokens > 0
                                     ? static_cast<double>(totals.prefix_hit_tokens) /
                                           static_cast<double>(totals.prefix_queried_tokens)
                                     : 0.0;
  if (run.memory().prefix_caching()) {
    const std::string host_tier =
        engine.memory().prefix_host_bytes > 0.0
            ? " (" +
                  format_fixed(100.0 * static_cast<double>(totals.prefix_host_hit_tokens) /
                                   std::max<double>(1.0, totals.prefix_queried_tokens),
                               1) +
                  "% from the host tier of " +
                  format_fixed(engine.memory().prefix_host_bytes / kGiB, 2) +
                  " GiB per GPU, memory.prefix_cache_host_gib: " +
                  format_fixed(totals.prefix_store_bytes / 1e9, 3) + " GB stored, " +
                  format_fixed(totals.prefix_load_bytes / 1e9, 3) + " GB loaded back in " +
                  std::to_string(totals.prefix_copies) + " copies" +
                  (run.memory().has_prefix_cache_host_chunk_tokens()
                       ? " of chunks of " +
                             std::to_string(run.memory().prefix_cache_host_chunk_tokens()) +
                             " tokens"
                       : std::string(" of a block's layer's keys or values")) +
                  ")"
            : std::string();
    report.notes.push_back(
        "prefix caching (memory.prefix_caching): " + format_fixed(100.0 * prefix_hit_rate, 1) +
        "% of the tokens prefills looked up came from cached blocks" + host_tier + ", " +
        std::to_string(totals.prefix_evicted_blocks) +
        " cached blocks evicted from HBM; largest_batch_* count whole-request reservations "
        "without sharing");
  }
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
  const BatchLimits limits = largest_batch(engine);
  m.push_back({"largest_batch_that_fits",
               limits.host > 0 ? std::min(limits.hbm, limits.host) : limits.hbm, 0});
  m.push_back({"largest_batch_hbm_limit", limits.hbm, 0});
  m.push_back({"largest_batch_host_limit", limits.host, 0});
  add_tier_metrics(m, engine, seconds);
  m.push_back({"max_running_requests", static_cast<double>(totals.max_running), 0});
  m.push_back({"mean_running_requests", engine.running().time_average(), 2});
  m.push_back({"max_waiting_requests", static_cast<double>(totals.max_waiting), 0});
  m.push_back({"admissions_held_by_hbm", static_cast<double>(totals.admissions_held_by_hbm), 0});
  m.push_back({"admissions_held_by_host", static_cast<double>(totals.admissions_held_by_host), 0});
  m.push_back({"preemptions", static_cast<double>(totals.preemptions), 0});
  m.push_back({"preempted_kv_tokens", static_cast<double>(totals.preempted_kv_tokens), 0});
  m.push_back({"swapped_preemptions", static_cast<double>(totals.swapped_preemptions), 0});
  m.push_back({"swap_space_gib", plan.swap_space_bytes / kGiB, 2});
  m.push_back({"swap_space_used_peak_gib", engine.swap_used().max() / kGiB, 3});
  m.push_back({"swap_out_gb", totals.swap_out_bytes / 1e9, 3});
  m.push_back({"swap_in_gb", totals.swap_in_bytes / 1e9, 3});
  m.push_back({"swap_s", sim::to_seconds(totals.swap_busy), 4});
  m.push_back({"prefix_cache_hit_tokens", static_cast<double>(totals.prefix_hit_tokens), 0});
  m.push_back({"prefix_cache_hit_rate", prefix_hit_rate, 4});
  m.push_back(
      {"prefix_cache_evicted_blocks", static_cast<double>(totals.prefix_evicted_blocks), 0});
  m.push_back({"prefix_cache_host_gib", plan.prefix_host_bytes / kGiB, 2});
  m.push_back(
      {"prefix_cache_host_hit_tokens", static_cast<double>(totals.prefix_host_hit_tokens), 0});
  m.push_back({"prefix_cache_store_gb", totals.prefix_store_bytes / 1e9, 3});
  m.push_back({"prefix_cache_load_gb", totals.prefix_load_bytes / 1e9, 3});
  m.push_back({"prefix_cache_store_s", sim::to_seconds(totals.prefix_store_busy), 4});
  m.push_back({"prefix_cache_load_s", sim::to_seconds(totals.prefix_load_busy), 4});
  m.push_back({"prefix_cache_copies", static_cast<double>(totals.prefix_copies), 0});
  m.push_back({"prefix_cache_gather_s", sim::to_seconds(totals.prefix_gather_busy), 4});
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

SimulationReport simulate_checked(const config::RunSpec& run, DemandMemo* memo, bool report_unfit) {
  try {
    return simulate_policy(run, memo, report_unfit);
  } catch (const std::overflow_error& error) {
    // Picosecond ticks end at about 106 days: a run whose rates, bandwidths or overheads are so
    // far out of scale that its times pass that is a config problem, not an internal error.
    throw ConfigError(std::string(error.what()) +
                          ": the run's rates, bandwidths, sizes or overheads put its simulated "
                          "time out of range",
                      "simulating policy " + run.policy().name());
  }
}

// A number of a JSON report: null for a figure a policy that did not fit has not.
std::string json_number(double value) {
  return std::isnan(value) ? "null" : format_double(value);
}

}  // namespace

SimulationReport simulate(const config::RunSpec& run, DemandMemo* memo) {
  return simulate_checked(run, memo, false);
}

SimulationReport simulate_reporting_unfit(const config::RunSpec& run, DemandMemo* memo) {
  return simulate_checked(run, memo, true);
}

std::string report_json(const std::vector<SimulationReport>& reports, const config::RunSpec& run,
                        const std::string& version) {
  std::string config;
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(run, &config, options);
  std::string json = "{\"schema\": \"kvtier.sim.v2\", \"kvtier_version\": " + json_escape(version) +
                     ", \"seed\": " + std::to_string(run.seed()) +
                     ", \"workload\": " + json_escape(reports.front().workload) +
                     ",\n \"policies\": [";
  for (size_t r = 0; r < reports.size(); ++r) {
    const SimulationReport& report = reports[r];
    json += std::string(r == 0 ? "" : ",") + "\n  {\"policy\": " + json_escape(report.policy);
    if (!report.does_not_fit.empty()) {
      json += ", \"does_not_fit\": " + json_escape(report.does_not_fit);
    }
    json += ", \"notes\": [";
    for (size_t i = 0; i < report.notes.size(); ++i) {
      json += (i == 0 ? "" : ", ") + json_escape(report.notes[i]);
    }
    json += "],\n   \"metrics\": {";
    for (size_t i = 0; i < report.metrics.size(); ++i) {
      json += (i == 0 ? "" : ", ") + json_escape(report.metrics[i].name) + ": " +
              json_number(report.metrics[i].value);
    }
    json += "},\n   \"series\": {";
    for (size_t i = 0; i < report.series.size(); ++i) {
      const Series& series = report.series[i];
      json += (i == 0 ? "" : ", ") + json_escape(series.name) +
              ": {\"interval_us\": " + format_double(series.interval_us) + ", \"values\": [";
      for (size_t k = 0; k < series.values.size(); ++k) {
        json += (k == 0 ? "" : ", ") + format_double(series.values[k]);
      }
      json += "]}";
    }
    json += "}}";
  }
  json += "],\n \"config\": " + config + "}\n";
  return json;
}

std::vector<SimulationReport> simulate_all(const config::RunSpec& run, DemandMemo* memo) {
  std::vector<SimulationReport> reports{simulate_reporting_unfit(run, memo)};
  for (const config::PolicySpec& policy : run.compare()) {
    config::RunSpec variant = run;
    *variant.mutable_policy() = policy;
    variant.clear_compare();
    reports.push_back(simulate_reporting_unfit(variant, memo));
  }
  const auto ran = std::find_if(reports.begin(), reports.end(),
                                [](const SimulationReport& r) { return r.does_not_fit.empty(); });
  if (ran == reports.end()) {  // as a single run says it
    throw DoesNotFit(reports.front().does_not_fit_in, reports.front().does_not_fit);
  }
  // A policy that did not fit has the others' figures, each without a value, and says why.
  for (SimulationReport& report : reports) {
    if (!report.does_not_fit.empty()) {
      report.metrics = ran->metrics;
      for (Metric& metric : report.metrics) {
        metric.value = std::numeric_limits<double>::quiet_NaN();
      }
      report.notes.push_back("does not fit: " + report.does_not_fit);
    }
  }
  return reports;
}

std::string report_csv(const std::vector<SimulationReport>& reports) {
  std::string csv = "policy";
  for (const Metric& metric : reports.front().metrics) {
    csv += "," + metric.name;
  }
  csv += "\n";
  for (const SimulationReport& report : reports) {
    // Policy strings hold commas: quoted as RFC 4180 asks.
    csv += "\"" + report.policy + "\"";
    for (const Metric& metric : report.metrics) {
      csv += "," + (std::isnan(metric.value) ? std::string() : format_double(metric.value));
    }
    csv += "\n";
  }
  return csv;
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
