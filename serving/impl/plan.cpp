#include "serving/plan.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <map>
#include <string>
#include <utility>

#include "common/errors.hpp"
#include "common/text_output.hpp"
#include "configs/schema/options.pb.h"
#include "configs/schema/workload.pb.h"
#include "serving/impl/plan_detail.hpp"
#include "serving/memory_plan.hpp"

namespace kvtier::serving {
namespace plan_detail {

// Waiting for copies (prefetch stalls and offloads beyond compute) above this share of GPU
// time makes PCIe, not compute, the bottleneck behind a latency SLO.
constexpr double kPcieBound = 0.25;

double metric(const std::vector<Metric>& metrics, const std::string& name) {
  const Metric* found = find_metric(metrics, name);
  if (found == nullptr) {
    throw std::logic_error("report has no metric " + name);
  }
  return found->value;
}

void record_probe(PlanResult& result, double load, const Evaluation& evaluation,
                  const std::vector<Slo>& slos) {
  ++result.evaluations;
  const auto value = [&evaluation](const std::string& name) {
    return evaluation.report.does_not_fit.empty() ? metric(evaluation.report.metrics, name)
                                                  : std::numeric_limits<double>::quiet_NaN();
  };
  // A cluster's run reports the cluster's throughput: the probe's is an engine's share, as its
  // load is.
  PlanProbe probe{load,
                  evaluation.feasible,
                  evaluation.binding,
                  {},
                  value("throughput_output_tokens_per_s") / result.cluster_engines};
  for (const Slo& slo : slos) {
    probe.slo_values_ms.push_back(value(slo.metric));
  }
  result.probes.push_back(std::move(probe));
}

std::string does_not_fit_binding(const SimulationReport& report) {
  return (report.does_not_fit_in == DoesNotFit::Memory::kHost ? "DDR: " : "HBM: ") +
         report.does_not_fit;
}

std::string missed_slos(const std::vector<Metric>& metrics, const std::vector<Slo>& slos) {
  std::string missed;
  for (const Slo& slo : slos) {
    const double value = metric(metrics, slo.metric);
    if (value > slo.limit_ms) {
      // A tenth of a millisecond, or up to a nanosecond as the limit needs to be shown as it is
      // and the value to differ from it (a rate search ends a hair past the limit).
      const auto shown_exactly = [&slo](int decimals) {
        const std::string text = format_fixed(slo.limit_ms, decimals);
        double read = 0.0;
        std::from_chars(text.data(), text.data() + text.size(), read);
        return read == slo.limit_ms;
      };
      int decimals = 1;
      while (decimals < 6 &&
             (!shown_exactly(decimals) ||
              format_fixed(value, decimals) == format_fixed(slo.limit_ms, decimals))) {
        ++decimals;
      }
      missed += (missed.empty() ? "" : ", ") + slo.metric + " " + format_fixed(value, decimals) +
                " > " + format_fixed(slo.limit_ms, decimals);
    }
  }
  return missed;
}

std::string work_binding(const std::vector<Metric>& metrics, const std::string& missed) {
  const double wait = metric(metrics, "copy_wait_fraction");
  // Iterations waiting for the host's recodes, a share of the run (NaN when not timed).
  const double recode_wait =
      metric(metrics, "host_recode_stall_s") / std::max(metric(metrics, "duration_s"), 1e-12);
  if (recode_wait > kPcieBound && !(wait > recode_wait)) {
    return "host recodes (" + format_fixed(100 * recode_wait, 0) +
           "% of the run waits for T1 <-> T2 recodes): " + missed;
  }
  return (wait > kPcieBound
              ? "PCIe (" + format_fixed(100 * wait, 0) + "% of GPU time waits for copies): "
              : std::string("compute: ")) +
         missed;
}

namespace {

// Engines of `per_engine` each that serve `target`; `option` names the target in errors.
std::uint64_t engines_for(double target, double per_engine, const char* option) {
  const double engines = std::ceil(target / per_engine);
  // 2^53: every count below is exact in a double, and no plan needs more.
  if (!(engines <= 0x1p53)) {
    throw ConfigError(std::string(option) + " " + std::to_string(target) + " needs " +
                      (std::isfinite(engines) ? "more than 2^53" : "infinitely many") +
                      " engines of " + std::to_string(per_engine));
  }
  return static_cast<std::uint64_t>(engines);
}

}  // namespace

void size_fleet(const config::RunSpec& run, const PlanOptions& options, PlanResult& result) {
  // A disaggregated cluster's pools may take GPUs of their own number an engine.
  const double gpus = serving::mean_gpus_per_engine(run);
  const double engines_per_node = serving::mean_engines_per_node(run);
  result.output_tokens_per_s_per_gpu = result.output_tokens_per_s_per_engine / gpus;
  result.output_tokens_per_s_per_node = result.output_tokens_per_s_per_engine * engines_per_node;
  if (!serves_any(result)) {
    return;  // no number of engines serves a target
  }
  if (options.target_output_tokens_per_s) {
    result.engines = engines_for(*options.target_output_tokens_per_s,
                                 result.output_tokens_per_s_per_engine, "--target-tokens-per-s");
  }
  if (options.target_requests_per_s) {
    result.engines = std::max(
        result.engines, engines_for(*options.target_requests_per_s,
                                    result.requests_per_s_per_engine, "--target-requests-per-s"));
  }
  // Whole clusters: ceil(ceil(target / per-engine) / N) = ceil(target / per-cluster).
  const std::uint64_t cluster = result.cluster_engines;
  result.engines = (result.engines + cluster - 1) / cluster * cluster;
  result.gpus = result.engines / cluster * serving::cluster_gpus(run);
  result.nodes = static_cast<std::uint64_t>(
      std::ceil(static_cast<double>(result.gpus) / run.hardware().node().gpus_per_node()));
}

}  // namespace plan_detail

namespace {

using plan_detail::Evaluation;
using plan_detail::metric;

// The schema's cap on workload.closed_loop.num_requests, which every evaluation sets.
std::uint64_t max_generated_requests() {
  const auto* field = config::ClosedLoop::descriptor()->FindFieldByName("num_requests");
  return static_cast<std::uint64_t>(field->options().GetExtension(config::max_value));
}

Evaluation evaluate(const config::RunSpec& base, std::uint32_t batch, const PlanOptions& options,
                    DemandMemo* memo) {
  config::RunSpec run = base;
  auto& loop = *run.mutable_workload()->mutable_closed_loop();
  loop.set_concurrency(batch);
  // plan_capacity bounds rounds, so batch x rounds stays far inside 64 bits.
  const std::uint64_t requests = std::uint64_t{batch} * options.rounds;
  if (requests > max_generated_requests()) {
    throw ConfigError("a batch of " + std::to_string(batch) + " over " +
                      std::to_string(options.rounds) + " rounds is " + std::to_string(requests) +
                      " requests, more than the " + std::to_string(max_generated_requests()) +
                      " a generated workload may hold: use fewer --rounds");
  }
  loop.set_num_requests(static_cast<std::uint32_t>(requests));
  Evaluation evaluation{false, {}, simulate_reporting_unfit(run, memo)};
  if (!evaluation.report.does_not_fit.empty()) {
    evaluation.binding = plan_detail::does_not_fit_binding(evaluation.report);
    return evaluation;
  }
  const auto& metrics = evaluation.report.metrics;
  const double most_at_once = metric(metrics, "max_running_requests");
  if (most_at_once < batch) {
    const bool hbm = metric(metrics, "admissions_held_by_hbm") > 0;
    const bool host = metric(metrics, "admissions_held_by_host") > 0;
    if (hbm || host) {
      const double host_limit = metric(metrics, "largest_batch_host_limit");
      evaluation.binding =
          host && (!hbm ||
                   (host_limit > 0 && host_limit < metric(metrics, "largest_batch_hbm_limit")))
              ? "DDR"
              : "HBM";
    } else {
      // Memory admitted every request it was asked to: the batch was never all in flight
      // because earlier requests finished before the prefill budget admitted the last ones.
      evaluation.binding = "scheduling: at most " + format_fixed(most_at_once, 0) + " of " +
                           std::to_string(batch) +
                           " requests in flight (the prefill budget admits them over several "
                           "iterations and the first finish before the last start)";
    }
    return evaluation;
  }
  const std::string missed = plan_detail::missed_slos(metrics, options.slos);
  if (!missed.empty()) {
    evaluation.binding = plan_detail::work_binding(metrics, missed);
    return evaluation;
  }
  evaluation.feasible = true;
  return evaluation;
}

PlanResult plan_batch(const config::RunSpec& run, const PlanOptions& options, DemandMemo* memo) {
  PlanResult result;
  result.search = PlanSearch::kBatch;
  const std::uint32_t cap = run.workload().max_batch_size();
  const auto probe_at = [&](std::uint32_t batch) {
    Evaluation evaluation = evaluate(run, batch, options, memo);
    plan_detail::record_probe(result, batch, evaluation, options.slos);
    return evaluation;
  };
  Evaluation one = probe_at(1);
  result.policy = one.report.policy;
  if (!one.feasible) {
    result.binding = one.binding;
    plan_detail::size_fleet(run, options, result);
    return result;
  }
  // The memory limit the single-request run reports bounds the search from above; it counts
  // whole-request reservations, which on-demand admission does not make, so that search starts
  // at the batch cap.
  const double fits = run.workload().has_on_demand_admission()
                          ? static_cast<double>(cap)
                          : metric(one.report.metrics, "largest_batch_that_fits");
  auto high = static_cast<std::uint32_t>(std::clamp(fits, 1.0, static_cast<double>(cap)));
  Evaluation best = std::move(one);
  std::uint32_t low = 1;  // feasible
  Evaluation top = probe_at(high);
  if (top.feasible) {
    low = high;
    result.binding = high == cap ? "max_batch_size " + std::to_string(cap)
                     : metric(top.report.metrics, "largest_batch_host_limit") == fits ? "DDR"
                                                                                      : "HBM";
    best = std::move(top);
  } else {
    result.binding = top.binding;
    while (high - low > 1) {
      const std::uint32_t middle = low + (high - low) / 2;
      Evaluation probe = probe_at(middle);
      if (probe.feasible) {
        low = middle;
        best = std::move(probe);
      } else {
        high = middle;
        result.binding = probe.binding;
      }
    }
  }
  result.max_batch = low;
  result.metrics = best.report.metrics;
  result.output_tokens_per_s_per_engine = metric(result.metrics, "throughput_output_tokens_per_s");
  result.requests_per_s_per_engine = metric(result.metrics, "throughput_requests_per_s");
  plan_detail::size_fleet(run, options, result);
  return result;
}

}  // namespace

std::vector<Slo> parse_slos(const std::string& text) {
  std::vector<Slo> slos;
  // Every comma separates two pieces: "a=1ms," has an empty second one, which is refused.
  for (std::size_t begin = 0; begin <= text.size() && !text.empty();) {
    const std::size_t comma = std::min(text.find(',', begin), text.size());
    const std::string piece = text.substr(begin, comma - begin);
    begin = comma + 1;
    const auto equals = piece.find('=');
    if (equals == std::string::npos || equals == 0) {
      throw ConfigError("--slo takes METRIC=LIMIT[,...] (e.g. tpot_p99=50ms), got '" + piece + "'");
    }
    const std::string name = piece.substr(0, equals);
    const std::string value = piece.substr(equals + 1);
    double number = 0.0;
    const auto parsed = std::from_chars(value.data(), value.data() + value.size(), number);
    const std::string unit(parsed.ptr, value.data() + value.size());
    static const std::map<std::string, double> kToMs = {{"ms", 1.0}, {"s", 1e3}, {"us", 1e-3}};
    const auto scale = kToMs.find(unit);
    if (parsed.ec != std::errc() || parsed.ptr == value.data() || scale == kToMs.end() ||
        !(number > 0) || !std::isfinite(number)) {
      std::string message = "--slo " + name;
      message += " needs a positive time with a unit (ms, s or us), got '" + value;
      throw ConfigError(message + "'");
    }
    static const char* const kLatencies[] = {"ttft", "tpot", "e2e_latency", "queue_wait",
                                             "iteration"};
    bool known = false;
    for (const char* latency : kLatencies) {
      for (const char* statistic : {"_p50", "_p90", "_p99", "_mean"}) {
        std::string candidate(latency);
        candidate += statistic;
        known = known || name == candidate;
      }
    }
    if (!known) {
      throw ConfigError("--slo: unknown metric '" + name +
                        "' (ttft, tpot, e2e_latency, queue_wait or iteration, with _p50, _p90, "
                        "_p99 or _mean)");
    }
    for (const Slo& earlier : slos) {
      if (earlier.metric == name + "_ms") {
        throw ConfigError("--slo names " + name + " twice");
      }
    }
    slos.push_back({name + "_ms", number * scale->second});
  }
  if (slos.empty()) {
    throw ConfigError("--slo needs at least one METRIC=LIMIT");
  }
  return slos;
}

bool serves_any(const PlanResult& result) {
  return result.search == PlanSearch::kBatch ? result.max_batch > 0
                                             : result.requests_per_s_per_engine > 0;
}

void check_plan_options(const config::RunSpec& run, const PlanOptions& options) {
  for (const auto& [target, option] :
       {std::pair{options.target_output_tokens_per_s, "--target-tokens-per-s"},
        std::pair{options.target_requests_per_s, "--target-requests-per-s"}}) {
    if (target && !(*target > 0 && std::isfinite(*target))) {
      throw ConfigError(std::string(option) + " must be a positive finite number");
    }
  }
  if (run.workload().has_closed_loop()) {
    if (run.has_cluster()) {
      throw ConfigError(
          "plan searches one engine's batch with a closed_loop workload; a cluster "
          "(run.cluster) is planned by the arrival rate it serves: give it a poisson or "
          "request_file workload");
    }
    if (options.rounds == 0 || options.rounds > kMaxRounds) {
      throw ConfigError("--rounds " + std::to_string(options.rounds) + ": from 1 to " +
                        std::to_string(kMaxRounds));
    }
  } else {
    plan_detail::check_rate_options(options);
  }
}

PlanResult plan_capacity(const config::RunSpec& run, const PlanOptions& options, DemandMemo* memo) {
  check_plan_options(run, options);
  return run.workload().has_closed_loop() ? plan_batch(run, options, memo)
                                          : plan_detail::plan_rate(run, options, memo);
}

}  // namespace kvtier::serving
