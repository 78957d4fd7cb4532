#pragma once
// `kvtier trace info` output: what a trace holds (model, dimensions, granularities, sizes and
// compression) and its per-layer statistics, as aligned text or as JSON.

#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "traces/reader.hpp"
#include "traces/stats.hpp"

namespace kvtier::traces {

struct TraceSummary {
  std::uint64_t file_bytes = 0;
  TraceReader::StorageSizes attention;
};

[[nodiscard]] TraceSummary summarize(const TraceReader& reader);

// What the trace holds, field by field (format, model, dimensions, source, sizes), as text and
// html print them.
[[nodiscard]] std::vector<std::pair<std::string, std::string>> describe_facts(
    const TraceReader& reader, const TraceSummary& summary);
// A row per layer: kLayerColumns' figures, as text and html print them.
inline const std::vector<std::string> kLayerColumns = {"layer",     "sink",         "recent",
                                                       "far",       "entropy bits", "decay tokens",
                                                       "reach p50", "reach p90",    "reach p99"};
[[nodiscard]] std::vector<std::vector<std::string>> layer_rows(const TraceStats& stats);
// The reach histogram averaged over the layers.
[[nodiscard]] std::array<double, kReachBins> mean_reach(const TraceStats& stats);

[[nodiscard]] std::string describe_text(const TraceReader& reader, const TraceSummary& summary,
                                        const TraceStats& stats, const StatsOptions& options);
[[nodiscard]] std::string describe_json(const TraceReader& reader, const TraceSummary& summary,
                                        const TraceStats& stats, const StatsOptions& options);

// The smallest distance bin below which `share` of a layer's reach mass lies ("256-511").
[[nodiscard]] std::string reach_quantile(const LayerStats& layer, double share);

}  // namespace kvtier::traces
