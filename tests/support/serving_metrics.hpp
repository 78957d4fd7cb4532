#pragma once
// A simulated run's metrics by name, for tests of the serving simulation.

#include <map>
#include <string>

#include "configs/schema/run.pb.h"
#include "serving/simulation.hpp"

namespace kvtier::test {

inline std::map<std::string, double> serving_metrics(const config::RunSpec& run) {
  std::map<std::string, double> values;
  for (const auto& metric : serving::simulate(run).metrics) {
    values[metric.name] = metric.value;
  }
  return values;
}

}  // namespace kvtier::test
