#pragma once
// The attention-trace file format, version 1 (docs/TRACE_FORMAT.md): names, dimensions and the
// shape of a trace as its `/meta` declares it. Reader, writer, validator and tools all take
// their layout from here, so the format is written down once.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "configs/schema/trace.pb.h"

namespace kvtier::traces {

inline constexpr std::string_view kFormatName = "kvtier-attention-trace";
inline constexpr std::uint32_t kFormatVersion = 1;
inline constexpr std::string_view kMetaMessageType = "kvtier.config.TraceMeta";

// Dataset and group paths.
inline constexpr std::string_view kMetaPath = "/meta";
inline constexpr std::string_view kTokensPath = "/tokens";
inline constexpr std::string_view kRowOffsetsPath = "/attention/row_offsets";
inline constexpr std::string_view kMeanGroup = "/attention/mean";
inline constexpr std::string_view kHeadsGroup = "/attention/heads";
inline constexpr std::string_view kTopKGroup = "/attention/topk";
inline constexpr std::string_view kPrefillGroup = "/prefill/window";
inline constexpr std::string_view kKeyNormsPath = "/keys/norm";

// Index that pads a top-k row whose decode row has fewer than K positions.
inline constexpr std::int32_t kTopKPadIndex = -1;

// "layer_007": three digits at least, more for models with over 999 layers.
[[nodiscard]] std::string layer_name(std::uint32_t layer);
[[nodiscard]] std::string mean_path(std::uint32_t layer);
[[nodiscard]] std::string heads_path(std::uint32_t layer);
[[nodiscard]] std::string topk_indices_path(std::uint32_t layer);
[[nodiscard]] std::string topk_weights_path(std::uint32_t layer);
[[nodiscard]] std::string topk_residual_path(std::uint32_t layer);
[[nodiscard]] std::string prefill_path(std::uint32_t layer);

// Storage format of attention weights.
enum class WeightType { kFloat16, kFloat32 };

[[nodiscard]] constexpr std::size_t weight_bytes(WeightType type) noexcept {
  return type == WeightType::kFloat16 ? 2 : 4;
}

// A half-open range [first, first + count).
struct StepRange {
  std::uint32_t first = 0;
  std::uint32_t count = 0;
  [[nodiscard]] std::uint32_t end() const noexcept { return first + count; }
};

struct LayerRange {
  std::uint32_t first = 0;
  std::uint32_t count = 0;
  [[nodiscard]] std::uint32_t end() const noexcept { return first + count; }
};

// Every dimension of a trace, derived from its `/meta`.
// The largest top-k row: beyond the longest context of any model (Llama 3.1's 128k, Qwen's 1M),
// where a dense row is the smaller choice anyway. It keeps a row's HDF5 chunk at a few MB.
inline constexpr std::uint32_t kMaxTopK = std::uint32_t{1} << 20;

struct TraceShape {
  std::uint32_t prompt_tokens = 0;
  std::uint32_t steps = 0;
  LayerRange layers;
  std::uint32_t heads = 0;     // attention (query) heads
  std::uint32_t kv_heads = 0;  // key/value heads
  std::uint32_t vocab_size = 0;
  std::uint32_t top_k = 0;           // 0 without the top-k granularity
  std::uint32_t prefill_window = 0;  // 0 without the prefill window
  WeightType weight_type = WeightType::kFloat16;
  bool has_mean = false;
  bool has_heads = false;
  bool has_topk = false;
  bool has_prefill = false;
  bool has_key_norms = false;

  // Positions a trace covers: the prompt plus one token per step.
  [[nodiscard]] std::uint64_t tokens() const noexcept {
    return static_cast<std::uint64_t>(prompt_tokens) + steps;
  }
  // Decode step t attends to positions 0 .. prompt_tokens + t (its own token included).
  [[nodiscard]] std::uint64_t row_length(std::uint64_t step) const noexcept {
    return prompt_tokens + step + 1;
  }
  // Where step t's row starts in a packed dataset: the lengths of rows 0 .. t-1 added up.
  [[nodiscard]] std::uint64_t row_offset(std::uint64_t step) const noexcept {
    return step * prompt_tokens + step * (step + 1) / 2;
  }
  [[nodiscard]] std::uint64_t packed_elements() const noexcept { return row_offset(steps); }
  [[nodiscard]] bool has_dense() const noexcept { return has_mean || has_heads; }
  [[nodiscard]] bool has_layer(std::uint32_t layer) const noexcept {
    return layer >= layers.first && layer < layers.end();
  }
};

// The shape `meta` declares, or DataError naming `where` when it is not a usable trace
// description (unknown dtype, top_k without GRANULARITY_TOP_K, no MEAN and no TOP_K, ...).
[[nodiscard]] TraceShape shape_from_meta(const config::TraceMeta& meta, const std::string& where);

// How far a stored row's sum may be from 1 and still be a probability distribution. Rounding
// each weight to the storage type errs by at most half an ulp: relative 2^-11 for normal FP16
// values (at most 2^-11 of the row's mass in all), plus up to 2^-25 absolute for each subnormal
// one (weights below 6.1e-5), so long FP16 rows need more room; the producer's own float
// normalisation is allowed as much again.
[[nodiscard]] double row_sum_tolerance(WeightType type, std::uint64_t row_length) noexcept;

// Splits `steps` into consecutive blocks whose packed rows hold at most `max_elements` weights
// each (a block has at least one step): the unit of streaming with bounded memory.
[[nodiscard]] std::vector<StepRange> plan_step_blocks(const TraceShape& shape, StepRange steps,
                                                      std::uint64_t max_elements);

[[nodiscard]] std::string_view granularity_name(config::TraceGranularity granularity);

}  // namespace kvtier::traces
