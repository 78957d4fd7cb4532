#pragma once
// The page `kvtier trace info --format html` prints.

#include <string>
#include <vector>

#include "traces/attention_map.hpp"
#include "traces/describe.hpp"

namespace kvtier::app {

// What the trace holds; its per-layer statistics charted against the layer (sink, recent and
// far mass, entropy, recency decay) and tabled; the reach histogram; and an attention map of
// each layer in `maps` (decode steps down, key positions across).
[[nodiscard]] std::string trace_html(const traces::TraceReader& reader,
                                     const traces::TraceSummary& summary,
                                     const traces::TraceStats& stats,
                                     const traces::StatsOptions& options,
                                     const std::vector<traces::AttentionMap>& maps,
                                     const std::string& version);

}  // namespace kvtier::app
