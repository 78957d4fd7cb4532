#pragma once
// What `kvtier plan` prints: the answer table (text and html share it) and the page of
// `--format html`.

#include <ostream>
#include <string>
#include <vector>

#include "configs/schema/run.pb.h"
#include "serving/plan.hpp"

namespace kvtier::app {

struct PlanTable {
  std::vector<std::string> header;
  std::vector<std::vector<std::string>> rows;  // a row per result
};

// policy, the load (max batch and req/s, or max req/s and requests in flight), tokens/s per
// engine, GPU and node, with targets the engines, GPUs and nodes, and what binds it.
[[nodiscard]] PlanTable plan_table(const std::vector<serving::PlanResult>& results,
                                   bool closed_loop, bool with_target);

// The text answer's first lines: the run, how its engines split (`parallelism`), the SLOs
// (`slo_text` as given), the load searched and, with a cluster, what per-engine figures mean;
// `engines`: whose engines the cluster has.
enum class ClusterEngines {
  kRun,         // the run's
  kEachLayout,  // each layout's (plan --layouts of layouts that set them)
  kSomeLayouts  // some layouts' and the run's for the others
};
void write_plan_header(std::ostream& out, const std::string& file, const config::RunSpec& run,
                       const std::string& parallelism, const std::string& slo_text,
                       const serving::PlanOptions& options,
                       ClusterEngines engines = ClusterEngines::kRun);

// One policy's answer as JSON (`kvtier plan --format json`): its load, what binds it, tokens/s
// per engine, GPU and node, with a target the fleet, its notes, the metrics at the planned load
// and every probe with the SLOs' values.
[[nodiscard]] std::string plan_json(const serving::PlanResult& result,
                                    const std::vector<serving::Slo>& slos, bool with_target,
                                    bool cluster);

// The page: the answer for each policy charted side by side (its load, tokens/s per GPU, with
// targets the GPUs), what binds it and its notes; every simulation of each search, each SLO's
// metric against the load with the SLO's limit; the figures at the planned load. `policies`
// names the results as the run wrote them; `parallelism` says how the engines split
// (describe_engines, or the layouts compared); `notes` follow the answer's table;
// `engines` as for write_plan_header.
[[nodiscard]] std::string plan_html(const std::vector<serving::PlanResult>& results,
                                    const std::vector<std::string>& policies,
                                    const config::RunSpec& run, const serving::PlanOptions& options,
                                    const std::string& file, const std::string& version,
                                    const std::string& parallelism,
                                    const std::vector<std::string>& notes = {},
                                    ClusterEngines engines = ClusterEngines::kRun);

}  // namespace kvtier::app
