#pragma once
// Measured references (validation/measurements/*.textproto, configs/schema/reference.proto):
// each file holds the configuration a measurement was taken on and the figures measured, with
// a tolerance each. check_reference simulates the configuration (its policy and every
// `compare` policy) and sets each figure's projection beside its measurement.

#include <string>
#include <vector>

#include "configs/loader.hpp"

namespace kvtier::validation {

struct ReferenceCheck {
  std::string id;      // the file's id
  std::string policy;  // canonical policy the figure was projected with
  std::string metric;
  double measured = 0.0;
  double projected = 0.0;
  double relative_error = 0.0;  // (projected − measured) / measured
  double tolerance = 0.0;
  bool calibrated = false;
  std::string note;
  [[nodiscard]] bool within() const;
};

// ConfigError for a malformed file (unknown metric, policy index out of range, neither or both
// of run and run_file); the simulation's own errors otherwise.
[[nodiscard]] std::vector<ReferenceCheck> check_reference(const std::string& path,
                                                          const config::ConfigLoader& loader);

}  // namespace kvtier::validation
