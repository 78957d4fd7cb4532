#include "validation/reference.hpp"

#include <cmath>
#include <filesystem>

#include "common/errors.hpp"
#include "configs/schema/reference.pb.h"
#include "configs/schema/run.pb.h"
#include "serving/simulation.hpp"

namespace kvtier::validation {

bool ReferenceCheck::within() const {
  return skipped() || std::abs(relative_error) <= tolerance;
}

std::vector<ReferenceCheck> check_reference(const std::string& path,
                                            const config::ConfigLoader& loader) {
  config::ReferenceMeasurement reference;
  (void)loader.load_file(path, reference, {});
  if (reference.has_run() == reference.has_run_file()) {
    throw ConfigError(
        "a reference names its configuration either inline (run) or by file "
        "(run_file), exactly one of them",
        path);
  }
  config::RunSpec run = reference.run();
  std::string run_path = path;
  if (reference.has_run_file()) {
    run_path =
        (std::filesystem::path(path).parent_path() / reference.run_file()).lexically_normal();
    (void)loader.load_file(run_path, run, {});
  }
  config::resolve_run_paths(run, run_path);
  const std::vector<serving::SimulationReport> reports = serving::simulate_all(run);
  std::vector<ReferenceCheck> checks;
  for (int i = 0; i < reference.metric_size(); ++i) {
    const config::ReferenceMetric& figure = reference.metric(i);
    const std::string where = path + ", metric[" + std::to_string(i) + "]";
    if (figure.policy_index() >= reports.size()) {
      throw ConfigError("policy_index " + std::to_string(figure.policy_index()) +
                            " but the run simulates " + std::to_string(reports.size()) +
                            " policies",
                        where);
    }
    const serving::SimulationReport& report = reports[figure.policy_index()];
    const serving::Metric* found = nullptr;
    for (const serving::Metric& metric : report.metrics) {
      found = metric.name == figure.metric() ? &metric : found;
    }
    if (found == nullptr) {
      throw ConfigError("the simulation reports no metric '" + figure.metric() + "'", where);
    }
    if (figure.measured() == 0.0) {
      throw ConfigError("measured value 0 has no relative error", where);
    }
    ReferenceCheck& check = checks.emplace_back();
    check.id = reference.id();
    check.policy = report.policy;
    check.metric = figure.metric();
    check.measured = figure.measured();
    check.projected = found->value;
    check.relative_error = (found->value - figure.measured()) / figure.measured();
    check.tolerance = figure.tolerance();
    check.calibrated = figure.calibrated();
    check.note = figure.note();
  }
  return checks;
}

}  // namespace kvtier::validation
