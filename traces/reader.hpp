#pragma once
// Streaming reader of attention traces (format v1, docs/TRACE_FORMAT.md).
//
// Opening checks the root attributes, parses `/meta` and checks every dataset the meta
// declares (presence, rank, dimensions, element type) and the row offsets; a file that fails
// any check is refused with a DataError naming the file and the dataset. Reads then fetch step
// ranges of one layer at a time, so memory is bounded by the range asked for, never by the
// file; any step is a cheap random access (one or two chunks per layer).

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "configs/schema/trace.pb.h"
#include "traces/format.hpp"

namespace kvtier::traces {

struct ReaderOptions {
  // HDF5's chunk cache for each open dataset. Two chunks' worth keeps a forward stream from
  // decompressing the chunk a block boundary falls into twice.
  std::size_t chunk_cache_bytes = 1U << 20;
};

// Decode rows of a step range, packed: row (first + i) is values[offsets[i] .. offsets[i+1]).
struct DenseRows {
  StepRange steps;
  std::vector<std::uint64_t> offsets;  // steps.count + 1 entries, offsets[0] == 0
  std::vector<float> values;
  [[nodiscard]] std::span<const float> row(std::uint32_t i) const {
    return {values.data() + offsets[i], values.data() + offsets[i + 1]};
  }
};

// Per-head decode rows of a step range: head h's rows packed like DenseRows, heads one after
// another (values has heads × offsets.back() entries).
struct HeadRows {
  StepRange steps;
  std::uint32_t heads = 0;
  std::vector<std::uint64_t> offsets;
  std::vector<float> values;
  [[nodiscard]] std::span<const float> row(std::uint32_t head, std::uint32_t i) const {
    const std::uint64_t base = static_cast<std::uint64_t>(head) * offsets.back();
    return {values.data() + base + offsets[i], values.data() + base + offsets[i + 1]};
  }
};

// Top-k rows of a step range: row i has k entries at [i * k, (i + 1) * k).
struct TopKRows {
  StepRange steps;
  std::uint32_t k = 0;
  std::vector<std::int32_t> indices;  // kTopKPadIndex pads rows shorter than k
  std::vector<float> weights;
  std::vector<float> residual;  // one per row: attention mass outside the k entries
};

class TraceReader {
 public:
  explicit TraceReader(const std::filesystem::path& path, ReaderOptions options = {});
  TraceReader(const TraceReader&) = delete;
  TraceReader& operator=(const TraceReader&) = delete;
  TraceReader(TraceReader&&) noexcept;
  TraceReader& operator=(TraceReader&&) noexcept;
  ~TraceReader();

  [[nodiscard]] const std::string& file_name() const noexcept;
  [[nodiscard]] const config::TraceMeta& meta() const noexcept;
  [[nodiscard]] const TraceShape& shape() const noexcept;
  // Root attributes.
  [[nodiscard]] const std::string& producer() const noexcept;
  [[nodiscard]] const std::string& created() const noexcept;

  [[nodiscard]] std::vector<std::int32_t> read_tokens() const;

  // The rows of `layer` (a model layer index) for `steps`; `out` is reused (no reallocation
  // once it has grown to the largest range). DataError when the range or layer is outside the
  // trace or the data cannot be read.
  void read_mean(std::uint32_t layer, StepRange steps, DenseRows& out) const;
  void read_heads(std::uint32_t layer, StepRange steps, HeadRows& out) const;
  void read_topk(std::uint32_t layer, StepRange steps, TopKRows& out) const;
  // heads × prefill_window × prompt_tokens weights.
  [[nodiscard]] std::vector<float> read_prefill_window(std::uint32_t layer) const;
  // kv_heads × tokens() norms.
  [[nodiscard]] std::vector<float> read_key_norms(std::uint32_t layer) const;

  // Splits `steps` into consecutive blocks whose dense rows hold at most `max_elements`
  // weights each (a block has at least one step), for streaming with bounded memory.
  [[nodiscard]] std::vector<StepRange> plan_blocks(StepRange steps,
                                                   std::uint64_t max_elements) const;

  // Streams mean rows: for each block of steps (plan_blocks), for each layer in `layers`,
  // calls `visit(layer, rows)`. One block of one layer is in memory at a time.
  void stream_mean(LayerRange layers, StepRange steps, std::uint64_t max_elements,
                   const std::function<void(std::uint32_t, const DenseRows&)>& visit) const;

  // Stored (compressed) and logical bytes of the attention datasets, for compression ratios.
  struct StorageSizes {
    std::uint64_t stored_bytes = 0;
    std::uint64_t logical_bytes = 0;
  };
  [[nodiscard]] StorageSizes attention_storage() const;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvtier::traces
