#pragma once
// Live measurement files (`kvtier live --measure`, configs/schema/measurement.proto) against the
// simulator. A live run that followed a trace made exactly the replay's moves over it
// (docs/LIVE.md), so it is simulated as one request of the same model, KV dtype, policy, trace
// and lengths, and its copy volumes — on a GPU also its time per token and copy times — are set
// beside the simulation's (docs/VALIDATION.md, "Live measurement files").

#include <string>
#include <string_view>
#include <vector>

#include "configs/loader.hpp"
#include "configs/schema/measurement.pb.h"
#include "validation/reference.hpp"

namespace kvtier::validation {

// One live file's run step by step, for pages: its id (as its checks'), policy and device as
// the file names them, and every decode step's figures.
struct LiveSteps {
  std::string id;
  std::string policy;
  std::string device;
  std::vector<config::StepFigures> steps;
};

// A live file is JSON (what `kvtier live --measure` writes); a reference is protobuf text format.
[[nodiscard]] bool is_live_measurement(std::string_view text);

// The figures of measurement files, references and live files told apart by content (a live
// file is JSON). A live file's figures: pcie_h2d_bytes, pcie_d2h_bytes, host_recode_bytes,
// tpot_mean_ms, pcie_h2d_busy_s, pcie_d2h_busy_s and host_recode_busy_s, each compared or
// skipped with the reason (a free-running run, a model that is no preset, timings of the CPU
// backend or of a GPU no node preset holds, recodes on a host without kv_recode rates). The
// host's recodes are simulated on the file's recode_threads, on the step's path.
// A CUDA run's time per token is projected with its engine calibrated on the first full-cache
// run among `paths` of the same GPU, engine settings, model, lengths and trace, unless that run
// was faster than the simulator's model (the full run's own figure is then marked calibrated;
// docs/VALIDATION.md). Errors are the first bad file's, in the order of `paths`: ConfigError
// when a file cannot be read;
// DataError, naming the file and field, when it is binary, not a LiveMeasurement, lacks what the
// comparison reads, names a follow_trace that does not exist (a relative one is found from the
// file's folder) or cannot be simulated as it says. With `steps`, also every live file's steps
// in the order of `paths` (measured references have none), from the same reading.
[[nodiscard]] std::vector<ReferenceCheck> check_measurement_files(
    const std::vector<std::string>& paths, const config::ConfigLoader& loader,
    std::vector<LiveSteps>* steps = nullptr);

}  // namespace kvtier::validation
