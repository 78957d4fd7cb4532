#pragma once
// Seeded synthetic attention traces (`kvtier trace synth`) for any model shape.
//
// Every decode row of layer l at step t (length n = prompt + t + 1) is a mixture whose masses
// are fixed fractions of the row (parameters in configs/schema/trace.proto, SyntheticAttention;
// docs/TRACE_FORMAT.md, "Synthetic traces"):
//   sinks       sink_mass over the first sink_tokens positions, equally;
//   recency     recency_mass over the newest recency_band_tokens positions, ∝ exp(-d / decay)
//               at distance d = n - 1 - position (per head: decay scaled by 2^(v·u_h));
//   heavy       heavy_hitter_mass over heavy_hitter_count prompt positions, ∝ rank^-s (Zipf);
//   re-reads    during a burst, reread_mass (taken from the recency band) over the tokens
//               of the note being re-read;
//   background  whatever is left, uniform over the whole row.
// Local layers move their heavy-hitter and re-read mass (scaled by local_long_range_scale)
// into the recency band. Components that do not exist yet (no sink inside a short row, no
// burst at this step) leave their mass to the background, so every row sums to 1.
//
// Rows are computed from the parameters alone (no state carried between steps), so any row is
// available at any time, top-k rows come without materialising the dense row, and a trace of
// 32k+ steps costs O(K) per top-k row.

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "configs/schema/model.pb.h"
#include "configs/schema/trace.pb.h"
#include "traces/format.hpp"
#include "traces/writer.hpp"

namespace kvtier::traces {

// The patterns `--pattern` names.
[[nodiscard]] std::span<const std::string_view> synthetic_patterns();
// The parameter set of a pattern (ConfigError for an unknown name).
[[nodiscard]] config::SyntheticAttention synthetic_preset(std::string_view pattern,
                                                          std::uint64_t seed);
// ConfigError when the parameters cannot make a distribution (masses above 1, delays
// inverted) or break the schema's ranges.
void check_synthetic(const config::SyntheticAttention& params);

// One re-read burst: steps [first_step, first_step + steps) re-read a note's positions.
struct RereadBurst {
  std::uint32_t first_step = 0;
  std::uint32_t note = 0;  // index into notes()
};

// A note: the tokens generated at steps [first_step, first_step + note_tokens).
struct Note {
  std::uint32_t first_step = 0;
  std::uint64_t first_position = 0;
};

// The masses of one mean row's components (they sum to 1).
struct RowMasses {
  double sink = 0, recency = 0, heavy = 0, reread = 0, background = 0;
};

class SyntheticAttentionModel {
 public:
  // `shape` gives prompt, steps, heads and layers; `model_layers` the model's layer count
  // (local layers are drawn over all of them, so a sliced trace keeps its layers' kinds).
  SyntheticAttentionModel(config::SyntheticAttention params, const TraceShape& shape,
                          std::uint32_t model_layers);

  [[nodiscard]] const config::SyntheticAttention& params() const noexcept { return params_; }
  [[nodiscard]] bool is_local(std::uint32_t layer) const { return local_[layer]; }
  [[nodiscard]] std::span<const std::uint64_t> heavy_hitters() const noexcept {
    return heavy_positions_;
  }
  [[nodiscard]] std::span<const Note> notes() const noexcept { return notes_; }
  [[nodiscard]] std::span<const RereadBurst> bursts() const noexcept { return bursts_; }
  // Notes re-read at `step` (one entry per active burst).
  [[nodiscard]] std::vector<std::uint32_t> active_notes(std::uint32_t step) const;
  [[nodiscard]] RowMasses masses(std::uint32_t layer, std::uint32_t step) const;

  // Decode rows of length shape.row_length(step).
  void mean_row(std::uint32_t layer, std::uint32_t step, std::span<float> out) const;
  void head_row(std::uint32_t layer, std::uint32_t step, std::uint32_t head,
                std::span<float> out) const;
  // The k largest entries of the mean row (weight descending, position ascending on ties),
  // padded with kTopKPadIndex / 0, and the mass outside them.
  void top_k_row(std::uint32_t layer, std::uint32_t step, std::uint32_t k,
                 std::span<std::int32_t> indices, std::span<float> weights, float& residual) const;
  // Row of prompt query `position` (< prompt) for one head: length position + 1, no re-reads.
  void prefill_row(std::uint32_t layer, std::uint32_t head, std::uint64_t position,
                   std::span<float> out) const;

 private:
  struct Row;  // the components of one row
  [[nodiscard]] Row row(std::uint32_t layer, std::uint64_t length, std::int64_t step,
                        std::int32_t head) const;
  void fill_dense(const Row& row, std::span<float> out) const;
  [[nodiscard]] double weight_at(const Row& row, std::uint64_t position) const;
  [[nodiscard]] double decay(std::uint32_t layer, std::uint32_t head) const;
  [[nodiscard]] std::vector<double> mean_band(std::uint32_t layer, std::uint64_t band) const;

  config::SyntheticAttention params_;
  TraceShape shape_;
  std::vector<bool> local_;                     // per model layer
  std::vector<double> head_scale_;              // per (model layer, head): decay multiplier
  std::vector<std::uint64_t> heavy_positions_;  // in rank order
  std::vector<double> heavy_weights_;           // Zipf weights, summing to 1
  std::vector<std::uint64_t> heavy_sorted_;     // positions sorted, for lookups
  std::vector<double> heavy_sorted_weights_;
  std::vector<Note> notes_;
  std::vector<RereadBurst> bursts_;  // sorted by first_step
  // Mean-over-heads recency profile of each trace layer over the whole band, for rows at least
  // as long as the band (all but the first rows of short-prompt traces).
  std::vector<std::vector<double>> mean_band_;
};

// What to write.
struct SynthOptions {
  config::ModelSpec model;
  std::uint32_t prompt_tokens = 0;
  std::uint32_t steps = 0;
  config::SyntheticAttention params;
  bool mean = true;
  bool heads = false;
  std::uint32_t top_k = 0;  // 0: no top-k rows
  std::uint32_t prefill_window = 0;
  bool key_norms = false;
  config::DType dtype = config::FP16;
  std::string tool = "kvtier trace synth";
  std::string description;
  WriterOptions writer;
};

[[nodiscard]] config::TraceMeta synthetic_meta(const SynthOptions& options);
void write_synthetic_trace(const std::filesystem::path& path, const SynthOptions& options);

}  // namespace kvtier::traces
