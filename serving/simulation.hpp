#pragma once
// One serving simulation end to end: build the simulator and engine for a resolved RunSpec,
// run to completion, and summarise. Deterministic: the same config and seed give the same
// report, byte for byte.

#include <cstdint>
#include <string>
#include <vector>

#include "configs/schema/run.pb.h"

namespace kvtier::serving {

struct Metric {
  std::string name;  // carries the unit, like config fields (ttft_p99_ms)
  double value = 0.0;
  int decimals = 3;  // for tables; JSON and CSV print the shortest exact text
};

struct Series {
  std::string name;
  double interval_us = 0.0;
  std::vector<double> values;
};

struct SimulationReport {
  std::string workload;
  std::vector<Metric> metrics;
  std::vector<Series> series;
  std::uint64_t events = 0;
};

[[nodiscard]] SimulationReport simulate(const config::RunSpec& run);

// {"schema": "kvtier.sim.v1", "kvtier_version": ..., "seed": ..., "config": {...}, ...}
[[nodiscard]] std::string report_json(const SimulationReport& report, const config::RunSpec& run,
                                      const std::string& version);
// A header row of metric names and one row of values.
[[nodiscard]] std::string report_csv(const SimulationReport& report);
// time_us then one column per series.
[[nodiscard]] std::string series_csv(const SimulationReport& report);

}  // namespace kvtier::serving
