#pragma once
// `kvtier trace info` output: what a trace holds (model, dimensions, granularities, sizes and
// compression) and its per-layer statistics, as aligned text or as JSON.

#include <cstdint>
#include <string>

#include "traces/reader.hpp"
#include "traces/stats.hpp"

namespace kvtier::traces {

struct TraceSummary {
  std::uint64_t file_bytes = 0;
  TraceReader::StorageSizes attention;
};

[[nodiscard]] TraceSummary summarize(const TraceReader& reader);

[[nodiscard]] std::string describe_text(const TraceReader& reader, const TraceSummary& summary,
                                        const TraceStats& stats, const StatsOptions& options);
[[nodiscard]] std::string describe_json(const TraceReader& reader, const TraceSummary& summary,
                                        const TraceStats& stats, const StatsOptions& options);

// The smallest distance bin below which `share` of a layer's reach mass lies ("256-511").
[[nodiscard]] std::string reach_quantile(const LayerStats& layer, double share);

}  // namespace kvtier::traces
