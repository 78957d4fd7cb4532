#pragma once
// Opening a trace file and checking its structure against `/meta`: every declared dataset
// present with the right rank, dimensions and element type, and the row offsets consistent.
// Shared by the reader (which refuses the file on the first problem) and the validator (which
// reports them all). Internal to traces/.

#include <hdf5.h>

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "configs/schema/trace.pb.h"
#include "traces/format.hpp"
#include "traces/impl/h5.hpp"
#include "traces/validate.hpp"

namespace kvtier::traces {

struct LayerDatasets {
  h5::Handle mean, heads, topk_indices, topk_weights, topk_residual, prefill;
};

struct TraceDatasets {
  h5::Handle tokens;
  h5::Handle row_offsets;
  h5::Handle key_norms;
  std::vector<LayerDatasets> layers;  // index: layer - shape.layers.first
};

// An open trace file whose root attributes and `/meta` passed their checks.
struct OpenTrace {
  std::string file_name;
  h5::Handle file;
  h5::Handle half_type;
  config::TraceMeta meta;
  TraceShape shape;
  std::string producer;
  std::string created;
};

// Opens `path` read-only and checks the root attributes and `/meta`; DataError otherwise
// ("not an HDF5 file", "truncated", "unsupported trace format version", ...).
[[nodiscard]] OpenTrace open_trace(const std::string& path);

// Opens every dataset the shape declares and checks it; each problem found is appended to
// `problems` (the dataset is then left closed). `cache_bytes` sizes each dataset's chunk cache.
[[nodiscard]] TraceDatasets open_datasets(const OpenTrace& trace, std::size_t cache_bytes,
                                          std::vector<TraceProblem>& problems);

// Reads the block [start, start + count) of a weight dataset as float, converting FP16 through
// `scratch`.
void read_weight_block(const OpenTrace& trace, hid_t dataset, std::span<const hsize_t> start,
                       std::span<const hsize_t> count, std::vector<float>& out,
                       std::vector<std::uint16_t>& scratch, const std::string& where_text);

}  // namespace kvtier::traces
