#pragma once
// One serving simulation end to end: build the simulator and engine for a resolved RunSpec,
// run to completion, and summarise. Deterministic: the same config and seed give the same
// report, byte for byte.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "configs/schema/run.pb.h"
#include "serving/does_not_fit.hpp"

namespace kvtier::serving {

struct Metric {
  std::string name;  // carries the unit, like config fields (ttft_p99_ms)
  double value = 0.0;
  int decimals = 3;  // for tables; JSON and CSV print the shortest exact text
};

// The metric of that name among `metrics`; null when there is none.
[[nodiscard]] const Metric* find_metric(const std::vector<Metric>& metrics, std::string_view name);

struct Series {
  std::string name;
  double interval_us = 0.0;
  std::vector<double> values;
};

struct SimulationReport {
  std::string policy;  // canonical, with every parameter
  std::string workload;
  // Facts a reader must know to trust the figures ("demand from a synthetic reasoning trace").
  std::vector<std::string> notes;
  std::vector<Metric> metrics;
  std::vector<Series> series;
  // A cluster's (run.cluster): every engine's own metrics, requests_routed first, in the
  // cluster's order. Empty without a cluster, and for a policy that did not fit.
  std::vector<std::vector<Metric>> engines;
  std::uint64_t events = 0;
  // Among compared policies (simulate_all), why this one could not run: a request whose KV, as
  // the policy places it, fits neither HBM nor host memory (DoesNotFit). Its metrics then have
  // the other policies' names and NaN values (JSON null, an empty CSV cell, "-" in tables).
  std::string does_not_fit;
  DoesNotFit::Memory does_not_fit_in = DoesNotFit::Memory::kHbm;
  // Trace demands read from the demand cache rather than replayed. Not part of the report: the
  // same run gives the same report whether its demands were cached or not.
  std::uint64_t demand_cache_hits = 0;
};

class DemandMemo;

// Simulates run.policy(); a policy other than `full` is replayed first (serving/tier_demand.hpp),
// or its demand taken from `memo` (shared by the simulations of a sweep; may be null).
[[nodiscard]] SimulationReport simulate(const config::RunSpec& run, DemandMemo* memo = nullptr);

// As simulate(), but a workload the policy cannot fit gives a report whose does_not_fit says why
// (and no metrics) instead of throwing DoesNotFit.
[[nodiscard]] SimulationReport simulate_reporting_unfit(const config::RunSpec& run,
                                                        DemandMemo* memo = nullptr);

// run.policy() followed by every policy of run.compare(), each on the same workload and seed.
// A policy whose requests do not fit gets a report saying so while the others run; when none
// fits, DoesNotFit as simulate() throws it.
[[nodiscard]] std::vector<SimulationReport> simulate_all(const config::RunSpec& run,
                                                         DemandMemo* memo = nullptr);

// The run's policies as written ("tiered:hbm=0.5"): its policy, then each it compares, in the
// order simulate_all reports them.
[[nodiscard]] std::vector<std::string> policy_names(const config::RunSpec& run);
// The run once for each of its policies (`policy`, then each of `compare`), as a run of that
// policy alone (no `compare`): what a plan plans one at a time.
[[nodiscard]] std::vector<config::RunSpec> runs_per_policy(const config::RunSpec& run);

// {"schema": "kvtier.sim.v2", "kvtier_version": ..., "seed": ..., "workload": ...,
//  "policies": [{"policy": ..., "notes": [...], "metrics": {...}, "series": {...}
//                [, "engines": [{...metrics...}, ...] with a cluster]}, ...],
//  "config": {...}}
[[nodiscard]] std::string report_json(const std::vector<SimulationReport>& reports,
                                      const config::RunSpec& run, const std::string& version);
// A header row (policy, then metric names) and one row of values per report.
[[nodiscard]] std::string report_csv(const std::vector<SimulationReport>& reports);
// A cluster's engines: policy, engine (0-based), then the engines' metric names; a row per engine
// of each report that has them. Empty when none has (no cluster).
[[nodiscard]] std::string engines_csv(const std::vector<SimulationReport>& reports);
// A self-contained page for people (report.html): the run and each policy's notes; charts of
// throughput, latency percentiles, HBM by kind, HBM saved, host memory, PCIe, attention mass
// and utilisation with the policies side by side; the sampled series over time; a cluster's
// engines; every metric; and the resolved run. `source` names the config file it came from.
[[nodiscard]] std::string report_html(const std::vector<SimulationReport>& reports,
                                      const config::RunSpec& run, const std::string& version,
                                      const std::string& source);
// time_us then one column per series (of one report).
[[nodiscard]] std::string series_csv(const SimulationReport& report);

}  // namespace kvtier::serving
