#pragma once
// Replay over an HDF5 attention trace (docs/TRACE_FORMAT.md): an AttentionSource backed by a
// traces::TraceReader.
//
// The engine asks for one step at a time, in order. Reading a step's rows one by one would
// decompress the same chunks again and again, so rows are read in blocks of consecutive steps
// per layer (all layers share the block's step range) and served from memory; the blocks of all
// layers together hold at most `block_elements` weights, so memory stays bounded whatever the
// trace's length. Per-head rows are blocked the same way. Random access works too (a step
// outside the current block starts a new block there), it is just slower.
//
// Layers: a sliced trace (first_layer > 0) holds model layers first .. first + count − 1;
// layer l of this source is model layer first + l.
//
// A trace with top-k rows but no dense mean rows is replayed from reconstructed rows: the K
// stored weights at their positions, and the row's residual mass spread uniformly over the
// other positions (from_topk() is true, and demand files record it). Attention outside the top
// k is therefore approximated as flat; kept-mass figures are exact for the top-k entries only.

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "replay/attention.hpp"
#include "traces/reader.hpp"

namespace kvtier::replay {

struct TraceAttentionOptions {
  // Weights held in memory at once by the step blocks of all layers (16 MiB of float by
  // default), for mean (or top-k) rows and again for per-head rows; a block holds at least one
  // step. Larger blocks read no faster: 4M was 1.3-1.9x faster than 16M on the development VM
  // (bench/RESULTS.md, "Replay from trace files"), the blocks staying closer to the caches.
  std::uint64_t block_elements = std::uint64_t{1} << 22;
};

class TraceAttention final : public AttentionSource {
 public:
  // Opens and checks the trace (TraceReader); DataError naming the file when it holds neither
  // mean nor top-k rows.
  explicit TraceAttention(const std::filesystem::path& path, TraceAttentionOptions options = {});

  [[nodiscard]] std::uint32_t layers() const override { return shape().layers.count; }
  [[nodiscard]] std::uint64_t prompt_tokens() const override { return shape().prompt_tokens; }
  [[nodiscard]] std::uint64_t steps() const override { return shape().steps; }
  void read_step(std::uint64_t step, std::vector<std::vector<float>>& rows) override;

  [[nodiscard]] std::uint32_t heads() const override;
  void read_head_step(std::uint64_t step, std::vector<std::vector<float>>& rows) override;
  [[nodiscard]] std::uint32_t prefill_window() const override;
  [[nodiscard]] std::vector<float> read_prefill_window(std::uint32_t layer) override;
  [[nodiscard]] std::uint32_t kv_heads() const override;
  [[nodiscard]] std::vector<float> read_key_norms(std::uint32_t layer) override;
  // The trace's file name as given ("runs/trace.h5").
  [[nodiscard]] std::string name() const override { return reader_.file_name(); }

  // True when rows are reconstructed from top-k entries (the trace has no mean rows).
  [[nodiscard]] bool from_topk() const noexcept { return from_topk_; }
  // Model layer of source layer 0.
  [[nodiscard]] std::uint32_t first_layer() const noexcept { return shape().layers.first; }
  [[nodiscard]] const traces::TraceReader& reader() const noexcept { return reader_; }
  [[nodiscard]] const traces::TraceShape& shape() const noexcept { return reader_.shape(); }

 private:
  // Consecutive steps from `step` whose rows hold at most `budget` weights (at least one step).
  [[nodiscard]] traces::StepRange block_from(std::uint64_t step, std::uint64_t budget) const;
  void check_step(std::uint64_t step) const;
  void load_mean_block(std::uint64_t step);
  void load_head_block(std::uint64_t step);
  void reconstruct(std::uint32_t layer, std::uint64_t step, std::vector<float>& row) const;

  traces::TraceReader reader_;
  TraceAttentionOptions options_;
  bool from_topk_ = false;
  // One block per source layer, all covering the same steps: mean rows (or top-k rows when
  // reconstructing) in mean_block_, per-head rows in head_block_.
  std::vector<traces::DenseRows> mean_;
  std::vector<traces::TopKRows> topk_;
  std::vector<traces::HeadRows> heads_;
  traces::StepRange mean_block_;
  traces::StepRange head_block_;
};

}  // namespace kvtier::replay
