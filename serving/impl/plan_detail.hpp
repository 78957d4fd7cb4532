#pragma once
// What the batch search (plan.cpp) and the rate search (plan_rate.cpp) share: reading a
// report, naming what binds a missed SLO, and sizing a fleet for the targets.

#include <string>
#include <vector>

#include "configs/schema/run.pb.h"
#include "serving/plan.hpp"
#include "serving/simulation.hpp"

namespace kvtier::serving::plan_detail {

// One simulation of a search: whether the load met the plan, and if not, what bound it.
struct Evaluation {
  bool feasible = false;
  std::string binding;
  SimulationReport report;
};

[[nodiscard]] double metric(const std::vector<Metric>& metrics, const std::string& name);

// Adds the evaluation of `load` to result.probes (and counts it).
void record_probe(PlanResult& result, double load, const Evaluation& evaluation,
                  const std::vector<Slo>& slos);

// "HBM: <why>" or "DDR: <why>": a single request of the workload fits neither memory, so no
// load of this policy runs.
[[nodiscard]] std::string does_not_fit_binding(const SimulationReport& report);

// The SLOs the run missed ("tpot_p99_ms 61.2 > 50.0, ..."); empty when every one held.
[[nodiscard]] std::string missed_slos(const std::vector<Metric>& metrics,
                                      const std::vector<Slo>& slos);

// What binds SLOs missed while the engine worked rather than waited for memory: the host's
// recodes, PCIe or compute, each followed by `missed`.
[[nodiscard]] std::string work_binding(const std::vector<Metric>& metrics,
                                       const std::string& missed);

// Fills result's throughput per GPU and node from its per-engine figures, and the engines,
// GPUs and nodes that serve every target of `options`. ConfigError past 2^53 engines.
void size_fleet(const config::RunSpec& run, const PlanOptions& options, PlanResult& result);

// The rate search's options (--rate-precision, a queue-revealing SLO): ConfigError otherwise.
void check_rate_options(const PlanOptions& options);
[[nodiscard]] PlanResult plan_rate(const config::RunSpec& run, const PlanOptions& options,
                                   DemandMemo* memo);

}  // namespace kvtier::serving::plan_detail
