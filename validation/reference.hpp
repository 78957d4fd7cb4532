#pragma once
// Measured references (validation/measurements/*.textproto, configs/schema/reference.proto):
// each file holds the configuration a measurement was taken on and the figures measured, with
// a tolerance each. check_reference simulates the configuration (its policy and every
// `compare` policy) and sets each figure's projection beside its measurement.

#include <string>
#include <vector>

#include "configs/loader.hpp"

namespace kvtier::validation {

// One figure of a measurement file (a reference's or a live run's, validation/live.hpp).
struct ReferenceCheck {
  std::string id;      // the file's id (a live file: its name without the extension)
  std::string policy;  // canonical policy the figure was projected with
  std::string metric;
  double measured = 0.0;
  double projected = 0.0;
  // (projected − measured) / measured; a live figure measured as 0: 0 when the projection is 0
  // too, else infinite (outside any tolerance).
  double relative_error = 0.0;
  double tolerance = 0.0;
  bool calibrated = false;
  std::string note;
  // Not compared, and why ("not comparable (cpu backend)"); empty for a compared figure.
  std::string skipped_because;
  int decimals = 3;  // for tables (byte counts: 0)
  // Compared and within its tolerance, or skipped (a skipped figure fails nothing).
  [[nodiscard]] bool within() const;
  [[nodiscard]] bool skipped() const { return !skipped_because.empty(); }
};

// ConfigError for a malformed file (unknown metric, policy index out of range, neither or both
// of run and run_file); the simulation's own errors otherwise.
[[nodiscard]] std::vector<ReferenceCheck> check_reference(const std::string& path,
                                                          const config::ConfigLoader& loader);

}  // namespace kvtier::validation
