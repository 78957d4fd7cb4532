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
#include "configs/pools.hpp"
#include "hwmodels/link_math.hpp"
#include "hwmodels/model_shape.hpp"
#include "replay/parameters.hpp"
#include "serving/cluster.hpp"
#include "serving/engine.hpp"
#include "serving/impl/figures.hpp"
#include "serving/tier_demand.hpp"
#include "sim/simulator.hpp"

namespace kvtier::serving {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// The engines' busy time: of the busiest over the mean engine's, within each pool of a
// disaggregated cluster (the larger of the two), and each pool's mean busy fraction.
struct PoolBusy {
  double imbalance = 1.0;
  double prefill_fraction = 0.0;
  double decode_fraction = 0.0;
};

PoolBusy busy_of(const Cluster& cluster) {
  const double seconds =
      std::max(sim::to_seconds(figures_of(cluster).totals.last_completion), 1e-12);
  PoolBusy result;
  const std::size_t split = cluster.prefill_engines();
  const auto pool = [&](std::size_t begin, std::size_t end, double& fraction) {
    double busiest = 0.0;
    double mean = 0.0;
    for (std::size_t e = begin; e < end; ++e) {
      const double busy = sim::to_seconds(cluster.engine(e).totals().busy);
      busiest = std::max(busiest, busy);
      mean += busy / static_cast<double>(end - begin);
    }
    result.imbalance = std::max(result.imbalance, mean > 0.0 ? busiest / mean : 1.0);
    fraction = mean / seconds;
  };
  if (split == 0) {
    double unused = 0.0;
    pool(0, cluster.size(), unused);
  } else {
    pool(0, split, result.prefill_fraction);
    pool(split, cluster.size(), result.decode_fraction);
  }
  return result;
}

void add_distribution_or_none(std::vector<Metric>& metrics, const std::string& name,
                              const sim::LatencyDistribution& distribution) {
  // Null when no request was handed off, so that a sweep's rows keep their columns.
  const double none = std::numeric_limits<double>::quiet_NaN();
  const bool any = distribution.count() > 0;
  const auto ms = [&](double percentile) {
    return any ? sim::to_seconds(distribution.percentile(percentile)) * 1e3 : none;
  };
  metrics.push_back({name + "_p50_ms", ms(50), 3});
  metrics.push_back({name + "_p90_ms", ms(90), 3});
  metrics.push_back({name + "_p99_ms", ms(99), 3});
  metrics.push_back({name + "_mean_ms", any ? distribution.mean_ps() * 1e-9 : none, 3});
}

// A disaggregated cluster's pools and KV transfers, and a note naming them.
void add_disaggregation_figures(SimulationReport& report, const Cluster& cluster,
                                const config::RunSpec& run, const PoolBusy& busy) {
  const config::DisaggregationSpec& split = run.cluster().disaggregation();
  const KvTransfers& transfers = cluster.kv_transfers();
  const auto prefill = static_cast<double>(cluster.prefill_engines());
  const double decode = static_cast<double>(cluster.size()) - prefill;
  const double seconds =
      std::max(sim::to_seconds(figures_of(cluster).totals.last_completion), 1e-12);
  auto& m = report.metrics;
  m.push_back({"cluster_prefill_engines", prefill, 0});
  m.push_back({"cluster_decode_engines", decode, 0});
  m.push_back({"prefill_gpu_busy_fraction", busy.prefill_fraction, 4});
  m.push_back({"decode_gpu_busy_fraction", busy.decode_fraction, 4});
  m.push_back({"kv_transfers", static_cast<double>(transfers.count), 0});
  m.push_back({"kv_transfers_layer_wise", static_cast<double>(transfers.layer_wise), 0});
  m.push_back({"kv_transfer_gb", transfers.bytes / 1e9, 3});
  m.push_back({"kv_transfer_cached_gb", transfers.cached_bytes / 1e9, 3});
  // Each transfer holds one lane of a prefill engine's sending side and one of a decode
  // engine's receiving side for its copy.
  m.push_back({"kv_link_send_utilisation",
               sim::to_seconds(transfers.busy) / (prefill * transfers.sending_lanes * seconds), 4});
  m.push_back({"kv_link_receive_utilisation",
               sim::to_seconds(transfers.busy) / (decode * transfers.receiving_lanes * seconds),
               4});
  add_distribution_or_none(m, "kv_handoff", transfers.handoff);
  add_distribution_or_none(m, "kv_transfer", transfers.transfer);
  report.notes.push_back(
      "disaggregated: engines 0-" + std::to_string(cluster.prefill_engines() - 1) + " prefill, " +
      std::to_string(cluster.prefill_engines()) + "-" + std::to_string(cluster.size() - 1) +
      " decode (routed " + config::Routing_Name(split.decode_routing()) + "); " +
      std::to_string(transfers.count) + " prompts' KV (" + format_fixed(transfers.bytes / 1e9, 3) +
      (config::pools_differ(run) ? " GB for a decode GPU; " + describe_engines(run) + ")"
       : transfers.sending_lanes > 1
           ? (run.engine().data_parallel_dispatch() != config::ROUTING_UNSPECIFIED
                  ? " GB for the mean GPU, each prompt's between the GPUs its engines dispatched "
                    "it to)"
                  : " GB for the mean GPU, each prompt's from the GPU holding it)")
           : " GB per GPU)") +
      " over " + split.kv_link().name() + " at " +
      format_fixed(hw::asymptotic_gb_per_s(split.kv_link(), config::PEER), 1) + " GB/s per GPU, " +
      (config::pools_differ(run) ? std::string("each decode GPU's heads from the prefill GPUs "
                                               "holding them")
                                 : std::string("a copy each")) +
      (split.layer_wise_transfer()
           ? " layer by layer while the prefill's last iteration computes it (" +
                 std::to_string(transfers.layer_wise) + " of them; the others after it)"
           : std::string(" after the prefill")) +
      "; TTFT is the prefill engine's, TPOT counts the hand-off");
  if (split.receive_into_host_memory() || split.send_kept_only()) {
    const std::string what =
        std::string(split.send_kept_only()
                        ? "only the tokens of each prompt its policy keeps at the start"
                        : "each prompt's KV whole") +
        (split.receive_into_host_memory()
             ? ", into host memory, whence its first decode step loads what the policy keeps "
               "into HBM"
             : ", into HBM");
    report.notes.push_back(
        cluster.engine(cluster.size() - 1).tiers() != nullptr
            ? "each decode engine receives " + what + " (cluster.disaggregation)"
            : "the full cache keeps every token in HBM: its decode engines receive each prompt's "
              "KV whole into HBM, whatever cluster.disaggregation's receive_into_host_memory and "
              "send_kept_only say");
  }
}

// The cluster's own metrics (after simulated_events, whatever its size, so that a sweep over
// cluster.engines has the same columns), a note on how its figures merge, and every engine's
// own metrics.
void add_cluster_figures(SimulationReport& report, const Cluster& cluster,
                         const config::RunSpec& run) {
  const config::ClusterSpec& spec = run.cluster();
  const auto engines = static_cast<double>(cluster.size());
  // Disaggregated, every request passes a prefill engine: the spread is the decode pool's, and
  // the note gives each pool's.
  const auto routed = cluster.routed().begin();
  const auto pool = routed + static_cast<std::ptrdiff_t>(cluster.prefill_engines());
  const auto [fewest, most] = std::minmax_element(pool, cluster.routed().end());
  std::string spread = std::to_string(*fewest) + " to " + std::to_string(*most) + " requests each";
  if (cluster.prefill_engines() > 0) {
    const auto [fewest_prefill, most_prefill] = std::minmax_element(routed, pool);
    spread = "prefill engines " + std::to_string(*fewest_prefill) + " to " +
             std::to_string(*most_prefill) + " requests each, decode engines " + spread;
  }
  const PoolBusy pool_busy = busy_of(cluster);
  auto& m = report.metrics;
  m.push_back({"cluster_engines", engines, 0});
  m.push_back({"cluster_gpus", static_cast<double>(cluster_gpus(run)), 0});
  m.push_back({"cluster_nodes", cluster_nodes(run), 0});
  m.push_back({"engine_requests_min", static_cast<double>(*fewest), 0});
  m.push_back({"engine_requests_max", static_cast<double>(*most), 0});
  m.push_back({"engine_busy_imbalance", pool_busy.imbalance, 4});
  report.notes.push_back(
      "cluster of " + std::to_string(cluster.size()) + " engine(s) of " +
      (config::pools_differ(run)
           ? "their pool's split, " + std::to_string(cluster_gpus(run)) + " GPUs (" +
                 std::to_string(cluster.prefill_engines()) + " prefill of " +
                 std::to_string(gpus_per_engine(config::prefill_pool_run(run))) + ", " +
                 std::to_string(cluster.size() - cluster.prefill_engines()) + " decode of " +
                 std::to_string(gpus_per_engine(run)) + ")"
           : std::to_string(gpus_per_engine(run)) + " GPU(s)") +
      ", routed " + config::Routing_Name(spec.routing()) +
      (spec.has_kv_overlap_weight()
           ? " (kv_overlap_weight " + format_double(spec.kv_overlap_weight()) + ")"
           : std::string()) +
      ", " + spread +
      ": counts, GB and seconds summed over the engines, peaks the highest "
      "engine's, time averages, per-GPU rates and utilisations the mean engine's, latencies "
      "over every request");
  const bool split = cluster.prefill_engines() > 0;
  if (split) {
    add_disaggregation_figures(report, cluster, run, pool_busy);
  }
  for (std::size_t e = 0; e < cluster.size(); ++e) {
    const ServingEngine& engine = cluster.engine(e);
    std::vector<Metric> metrics = engine_metrics(figures_of(engine), engine, engine.run());
    std::vector<Metric> first{{"requests_routed", static_cast<double>(cluster.routed()[e]), 0}};
    if (split) {
      first.push_back({"prefill_engine", engine.role() == EngineRole::kPrefill ? 1.0 : 0.0, 0});
      first.push_back(
          {"requests_handed_off", static_cast<double>(engine.totals().requests_handed_off), 0});
    }
    metrics.insert(metrics.begin(), first.begin(), first.end());
    report.engines.push_back(std::move(metrics));
  }
}

// The sampled series: KV in HBM and in host memory per GPU (the mean engine's), and the
// requests running and waiting (the cluster's).
void add_series(SimulationReport& report, const Cluster& cluster) {
  const sim::TimeSeries* first = cluster.engine(0).kv_used_series();
  if (first == nullptr) {
    return;
  }
  struct Sampled {
    const char* name;
    const sim::TimeSeries* (ServingEngine::*series)() const noexcept;
    bool gib_per_gpu;  // bytes averaged over the engines in GiB; else a count summed
  };
  const auto engines = static_cast<double>(cluster.size());
  const Sampled sampled[] = {{"hbm_kv_used_gib", &ServingEngine::kv_used_series, true},
                             {"running_requests", &ServingEngine::running_series, false},
                             {"waiting_requests", &ServingEngine::waiting_series, false},
                             {"host_kv_used_gib", &ServingEngine::host_kv_used_series, true}};
  std::size_t samples = std::numeric_limits<std::size_t>::max();
  for (std::size_t e = 0; e < cluster.size(); ++e) {
    for (const Sampled& each : sampled) {
      samples = std::min(samples, (cluster.engine(e).*each.series)()->values().size());
    }
  }
  const double interval = sim::to_microseconds(first->interval());
  for (const Sampled& each : sampled) {
    std::vector<double> values(samples, 0.0);
    for (std::size_t e = 0; e < cluster.size(); ++e) {
      const std::vector<double>& engine_values = (cluster.engine(e).*each.series)()->values();
      for (std::size_t k = 0; k < samples; ++k) {
        values[k] += each.gib_per_gpu ? engine_values[k] / kGiB / engines : engine_values[k];
      }
    }
    report.series.push_back({each.name, interval, std::move(values)});
  }
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
    if (hw::has_hybrid_attention(run.model())) {
      const std::uint32_t layers = run.model().num_hidden_layers();
      const std::uint32_t global = hw::global_attention_layers(run.model(), layers);
      report.notes.push_back("hybrid attention: the policy places the " + std::to_string(global) +
                             " global layers' tokens (its attention mass kept is theirs); the " +
                             std::to_string(layers - global) + " windowed layers keep their " +
                             std::to_string(run.model().sliding_window()) + "-token window in HBM");
    }
    if (tiers->differential_prefetch()) {
      report.notes.emplace_back(
          "differential prefetch: only tokens newly placed in T1 cross PCIe "
          "each step (the paper's accounting; T1 is assumed to stay staged "
          "on the GPU between re-tierings without counting against HBM)");
    }
  }
  const std::string description = workload.description;
  std::unique_ptr<Cluster> built;
  try {
    built = std::make_unique<Cluster>(simulator, run, std::move(workload), tiers.get());
  } catch (const DoesNotFit& error) {
    if (!report_unfit) {
      throw;
    }
    report.workload = description;
    report.does_not_fit = error.what();
    report.does_not_fit_in = error.memory();
    return report;
  }
  Cluster& cluster = *built;
  cluster.start();
  simulator.run();
  const Figures figures = figures_of(cluster);
  const ServingTotals& totals = figures.totals;
  if (totals.requests_completed != cluster.workload().requests.size()) {
    // Every request fits alone (checked when the engines were built), so a run that ends with
    // requests left has stalled: a defect of the engine, never of the config.
    throw std::logic_error(
        "serving engine stalled with " +
        std::to_string(cluster.workload().requests.size() - totals.requests_completed) +
        " request(s) unfinished");
  }
  // What every engine shares: the memory plan, the cost model, the tier demand.
  const ServingEngine& engine = cluster.representative();

  report.workload = cluster.workload().description;
  report.events = simulator.events_executed();
  if (recodes_untimed(figures, engine)) {
    report.notes.push_back(
        "T1 <-> T2 recodes read " + format_fixed(totals.host_recode_bytes / 1e9, 3) +
        " GB of host memory per GPU, not timed: " +
        (pipeline_stages(run) > 1 ? std::string("host recodes are not modelled with pipeline "
                                                "stages")
                                  : std::string("the run sets no tiering.host_recode")) +
        " (docs/SIMULATION.md)");
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
  if (run.engine().has_speculative()) {
    report.notes.push_back(speculative_note(run.engine().speculative(), totals));
  }
  report.metrics = engine_metrics(figures, engine, run);
  auto& m = report.metrics;
  m.push_back({"simulated_events", static_cast<double>(report.events), 0});

  if (run.has_cluster()) {
    add_cluster_figures(report, cluster, run);
  }
  add_series(report, cluster);
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
    json += "}";
    if (!report.engines.empty()) {
      json += ",\n   \"engines\": [";
      for (size_t e = 0; e < report.engines.size(); ++e) {
        json += std::string(e == 0 ? "" : ", ") + "{";
        for (size_t i = 0; i < report.engines[e].size(); ++i) {
          json += (i == 0 ? "" : ", ") + json_escape(report.engines[e][i].name) + ": " +
                  json_number(report.engines[e][i].value);
        }
        json += "}";
      }
      json += "]";
    }
    json += "}";
  }
  json += "],\n \"config\": " + config + "}\n";
  return json;
}

const Metric* find_metric(const std::vector<Metric>& metrics, std::string_view name) {
  const auto found = std::find_if(metrics.begin(), metrics.end(),
                                  [name](const Metric& metric) { return metric.name == name; });
  return found == metrics.end() ? nullptr : &*found;
}

std::vector<std::string> policy_names(const config::RunSpec& run) {
  std::vector<std::string> names{replay::policy_string(run.policy())};
  for (const config::PolicySpec& compared : run.compare()) {
    names.push_back(replay::policy_string(compared));
  }
  return names;
}

std::vector<config::RunSpec> runs_per_policy(const config::RunSpec& run) {
  std::vector<config::RunSpec> runs;
  const auto add = [&](const config::PolicySpec& policy) {
    config::RunSpec& alone = runs.emplace_back(run);
    *alone.mutable_policy() = policy;
    alone.clear_compare();
  };
  add(run.policy());
  for (const config::PolicySpec& compared : run.compare()) {
    add(compared);
  }
  return runs;
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

std::string engines_csv(const std::vector<SimulationReport>& reports) {
  const auto with_engines = std::find_if(
      reports.begin(), reports.end(), [](const auto& report) { return !report.engines.empty(); });
  if (with_engines == reports.end()) {
    return {};
  }
  std::string csv = "policy,engine";
  for (const Metric& metric : with_engines->engines.front()) {
    csv += "," + metric.name;
  }
  csv += "\n";
  for (const SimulationReport& report : reports) {
    for (size_t e = 0; e < report.engines.size(); ++e) {
      csv += "\"" + report.policy + "\"," + std::to_string(e);
      for (const Metric& metric : report.engines[e]) {
        csv += "," + (std::isnan(metric.value) ? std::string() : format_double(metric.value));
      }
      csv += "\n";
    }
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
