#pragma once
// The page `kvtier replay run --format html` prints.

#include <string>
#include <vector>

#include "replay/demand_cache.hpp"
#include "replay/trace_source.hpp"

namespace kvtier::app {

// One policy replayed over the trace: as given on the command line, and its demand.
struct PolicyRun {
  std::string given;
  replay::CachedReplay result;
};

// The trace; each policy's summary in a table; per decode step, the attention mass kept (mean
// over layers, and the lowest layer's), where the tokens are (a chart per policy: the context's
// share in each tier), and what crosses PCIe (T1 tokens, for full prefetch; tokens newly placed
// in T1, for differential); per layer, the mass kept and the HBM share over the steps.
[[nodiscard]] std::string replay_html(const replay::TraceAttention& trace,
                                      const std::vector<PolicyRun>& runs,
                                      const std::string& version);

}  // namespace kvtier::app
