// The rate search of `kvtier plan` (serving/plan.hpp): the run's own requests, their arrival
// times scaled, bisected on the rate between a probe that meets every SLO and one that misses.

#include <algorithm>
#include <cmath>
#include <string>

#include "common/errors.hpp"
#include "common/text_output.hpp"
#include "serving/impl/plan_detail.hpp"
#include "serving/workload.hpp"

namespace kvtier::serving::plan_detail {
namespace {

// Rates up to 2^40 times the run's own: past that its requests arrive all but at once.
constexpr int kMaxDoublings = 40;
// Rates down to 2^-20 times the run's own, and only while the last request arrives within
// kLatestArrivalS: the simulated clock (picoseconds in 63 bits) ends after 106 days.
constexpr int kMaxHalvings = 20;
constexpr double kLatestArrivalS = 1e6;
// A plan whose overload could hide by more than this share of the rate says so.
constexpr double kHiddenOverloadNote = 0.05;

struct Arrivals {
  double rate_per_s = 0.0;  // the run's own
  double last_s = 0.0;      // the last request's arrival at that rate
  double span_s = 0.0;      // from the first arrival to the last
  double output_tokens_per_request = 0.0;
  std::size_t requests = 0;
};

Arrivals arrivals_of(const config::RunSpec& run) {
  const Workload workload = make_workload(run.workload(), run.seed());
  Arrivals arrivals;
  arrivals.requests = workload.requests.size();
  double output_tokens = 0.0;
  for (const RequestSpec& request : workload.requests) {
    output_tokens += static_cast<double>(request.output_tokens);
  }
  arrivals.output_tokens_per_request = output_tokens / static_cast<double>(arrivals.requests);
  const double first =
      sim::to_seconds(workload.requests.front().arrival.value_or(sim::Tick::zero()));
  arrivals.last_s = sim::to_seconds(workload.requests.back().arrival.value_or(sim::Tick::zero()));
  arrivals.span_s = arrivals.last_s - first;
  if (run.workload().has_poisson()) {
    arrivals.rate_per_s = run.workload().poisson().rate_per_s();
  } else {
    if (!(arrivals.span_s > 0)) {
      throw ConfigError("request file " + run.workload().request_file().path() +
                        ": its requests all arrive at one instant, so it has no arrival rate to "
                        "search (plan the batch with a closed_loop workload instead)");
    }
    // Requests per second between the first arrival and the last.
    arrivals.rate_per_s = static_cast<double>(arrivals.requests - 1) / arrivals.span_s;
  }
  return arrivals;
}

// Latencies that grow with the queue of an engine past its capacity.
bool reveals_queueing(const Slo& slo) {
  return slo.metric.starts_with("ttft_") || slo.metric.starts_with("queue_wait_") ||
         slo.metric.starts_with("e2e_latency_");
}

// What binds SLOs missed at a rate: memory that held admissions back (or preempted), the batch
// cap the running requests reached, or else the work itself.
std::string rate_binding(const std::vector<Metric>& metrics, std::uint32_t cap,
                         const std::string& missed) {
  const double held_by_hbm = metric(metrics, "admissions_held_by_hbm");
  const double held_by_host = metric(metrics, "admissions_held_by_host");
  const double preemptions = metric(metrics, "preemptions");
  if (held_by_hbm > 0 || held_by_host > 0 || preemptions > 0) {
    const bool host = held_by_host > held_by_hbm + preemptions;
    return std::string(host ? "DDR" : "HBM") + " (admissions waited for " + (host ? "host" : "KV") +
           " memory in " + format_fixed(host ? held_by_host : held_by_hbm, 0) + " iterations, " +
           format_fixed(preemptions, 0) + " preemptions): " + missed;
  }
  if (metric(metrics, "max_running_requests") >= cap) {
    return "max_batch_size " + std::to_string(cap) +
           " (requests queued behind a full batch): " + missed;
  }
  return work_binding(metrics, missed);
}

// The run with its arrivals `speed` times as frequent.
Evaluation probe(const config::RunSpec& base, double speed, const PlanOptions& options,
                 DemandMemo* memo) {
  config::RunSpec run = base;
  auto& workload = *run.mutable_workload();
  if (workload.has_poisson()) {
    workload.mutable_poisson()->set_rate_per_s(base.workload().poisson().rate_per_s() * speed);
  } else {
    workload.mutable_request_file()->set_time_scale(base.workload().request_file().time_scale() /
                                                    speed);
  }
  Evaluation result{false, {}, simulate_reporting_unfit(run, memo)};
  if (!result.report.does_not_fit.empty()) {
    result.binding = does_not_fit_binding(result.report);
    return result;
  }
  const std::string missed = missed_slos(result.report.metrics, options.slos);
  if (missed.empty()) {
    result.feasible = true;
  } else {
    result.binding = rate_binding(result.report.metrics, base.workload().max_batch_size(), missed);
  }
  return result;
}

}  // namespace

void check_rate_options(const PlanOptions& options) {
  if (!(options.rate_precision >= kMinRatePrecision &&
        options.rate_precision <= kMaxRatePrecision)) {
    throw ConfigError("--rate-precision " + format_double(options.rate_precision) + ": from " +
                      format_double(kMinRatePrecision) + " to " + format_double(kMaxRatePrecision));
  }
  if (std::none_of(options.slos.begin(), options.slos.end(), reveals_queueing)) {
    throw ConfigError(
        "plan searches the arrival rate of this open-loop workload, so it needs an SLO on ttft, "
        "queue_wait or e2e_latency: an engine past its capacity queues requests without bound "
        "while tpot and iteration times hold");
  }
}

PlanResult plan_rate(const config::RunSpec& run, const PlanOptions& options, DemandMemo* memo) {
  const Arrivals arrivals = arrivals_of(run);
  PlanResult result;
  result.search = PlanSearch::kRate;
  // A cluster's rate is searched whole; its engines each take a share.
  result.cluster_engines = run.has_cluster() ? run.cluster().engines() : 1;
  const double engines = result.cluster_engines;
  const std::string server = run.has_cluster() ? "the cluster" : "one engine";
  const auto probe_at = [&](double speed) {
    Evaluation evaluation = probe(run, speed, options, memo);
    record_probe(result, arrivals.rate_per_s * speed / engines, evaluation, options.slos);
    return evaluation;
  };
  Evaluation first = probe_at(1.0);
  result.policy = first.report.policy;
  if (!first.report.does_not_fit.empty()) {
    result.binding = first.binding;
    result.infeasible_requests_per_s = arrivals.rate_per_s / engines;
    size_fleet(run, options, result);
    return result;
  }
  // Speeds (multiples of the run's rate) that met every SLO and that missed one; 0: none yet.
  double feasible = 0.0;
  double infeasible = 0.0;
  Evaluation best;
  if (first.feasible) {
    feasible = 1.0;
    best = std::move(first);
    for (int doublings = 1; infeasible == 0.0; ++doublings) {
      if (doublings > kMaxDoublings) {
        throw ConfigError("policy " + result.policy + " meets every SLO with the workload's " +
                          std::to_string(arrivals.requests) + " requests arriving within " +
                          format_double(arrivals.span_s / feasible) +
                          " s: the workload is too short to load " + server +
                          "; give it more requests");
      }
      Evaluation next = probe_at(2 * feasible);
      if (next.feasible) {
        feasible *= 2;
        best = std::move(next);
      } else {
        infeasible = 2 * feasible;
        result.binding = std::move(next.binding);
      }
    }
  } else {
    infeasible = 1.0;
    result.binding = std::move(first.binding);
    for (int halvings = 1; feasible == 0.0; ++halvings) {
      if (halvings > kMaxHalvings || arrivals.last_s * 2 / infeasible > kLatestArrivalS) {
        // Not even requests this far apart meet the SLOs: no rate does.
        result.infeasible_requests_per_s = arrivals.rate_per_s * infeasible / engines;
        result.binding = "even at " + format_fixed(arrivals.rate_per_s * infeasible, 6) +
                         " requests/s" + (run.has_cluster() ? " to the cluster" : "") + ": " +
                         result.binding;
        size_fleet(run, options, result);
        return result;
      }
      Evaluation next = probe_at(infeasible / 2);
      if (next.feasible) {
        feasible = infeasible / 2;
        best = std::move(next);
      } else {
        infeasible /= 2;
        result.binding = std::move(next.binding);
      }
    }
  }
  // Bisected on a log scale: the bracket's ratio halves its logarithm each probe.
  while (infeasible > feasible * (1 + options.rate_precision)) {
    const double middle = std::sqrt(feasible * infeasible);
    Evaluation next = probe_at(middle);
    if (next.feasible) {
      feasible = middle;
      best = std::move(next);
    } else {
      infeasible = middle;
      result.binding = std::move(next.binding);
    }
  }
  result.cluster_requests_per_s = arrivals.rate_per_s * feasible;
  result.requests_per_s_per_engine = result.cluster_requests_per_s / engines;
  result.infeasible_requests_per_s = arrivals.rate_per_s * infeasible / engines;
  result.metrics = std::move(best.report.metrics);
  result.max_batch = static_cast<std::uint32_t>(metric(result.metrics, "max_running_requests"));
  // Served at the rate it arrives: in the long run an engine that keeps up puts out each
  // request's tokens as fast as requests come.
  result.output_tokens_per_s_per_engine =
      result.requests_per_s_per_engine * arrivals.output_tokens_per_request;
  // Past its capacity μ, an engine offered λ over a span S ends it with (λ − μ)·S requests
  // queued, which wait (λ/μ − 1)·S more: an overload below limit / S of the rate stays inside
  // the queue-revealing SLO with the most room over a run this short.
  double room_s = 0.0;
  for (const Slo& slo : options.slos) {
    if (reveals_queueing(slo)) {
      room_s = std::max(room_s, slo.limit_ms / 1e3);
    }
  }
  const double span_s = arrivals.span_s / feasible;
  if (const double hidden = room_s / span_s; !(hidden <= kHiddenOverloadNote)) {
    result.notes.push_back(
        "the workload's " + std::to_string(arrivals.requests) + " requests arrive within " +
        format_fixed(span_s, 3) + " s at the planned rate, so a queue growing by up to " +
        format_fixed(100 * hidden, 0) + "% of the rate (" + format_fixed(1e3 * room_s, 0) +
        " ms of SLO over that span) still meets the SLOs: the rate found may be that much above "
        "what " +
        server + " sustains; give the workload more requests");
  }
  if (run.has_cluster()) {
    result.notes.push_back(
        "the cluster of " + std::to_string(result.cluster_engines) +
        (result.cluster_engines == 1 ? " engine, routed " : " engines, routed ") +
        config::Routing_Name(run.cluster().routing()) + ", serves " +
        format_fixed(result.cluster_requests_per_s, 3) +
        " requests/s within the SLOs; per-engine figures are its share, and fleets are sized "
        "in whole clusters");
  }
  size_fleet(run, options, result);
  return result;
}

}  // namespace kvtier::serving::plan_detail
