#pragma once
// What replay reads: for each decode step, every layer's head-averaged attention row over the
// tokens visible at that step. Row t of a layer covers positions 0 .. prompt + t (the prompt,
// the tokens generated before step t, and the step's own token), as in the trace format.
// Implemented by the HDF5 trace reader and by in-memory sources in tests.

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace kvtier::replay {

// Layer projection (DESIGN.md §2) of a source with `source` layers onto a model with `target`
// layers: target layer l reads source layer round(l·(source−1)/(target−1)); a one-layer target
// reads source layer 0.
[[nodiscard]] std::vector<std::uint32_t> project_layers(std::uint32_t source, std::uint32_t target);

class AttentionSource {
 public:
  virtual ~AttentionSource() = default;

  [[nodiscard]] virtual std::uint32_t layers() const = 0;
  [[nodiscard]] virtual std::uint64_t prompt_tokens() const = 0;
  [[nodiscard]] virtual std::uint64_t steps() const = 0;
  // Fills rows[l] (resized to prompt + step + 1) with layer l's attention at `step`.
  virtual void read_step(std::uint64_t step, std::vector<std::vector<float>>& rows) = 0;

  // Optional data some policies need (Policy::inputs); a source without it keeps the defaults.
  // Per-head decode rows: heads() > 0 when present; rows[l] gets heads × (prompt + step + 1)
  // weights, head-major.
  [[nodiscard]] virtual std::uint32_t heads() const { return 0; }
  virtual void read_head_step(std::uint64_t step, std::vector<std::vector<float>>& rows);
  // Prefill window: the last prefill_window() prompt queries of every head, heads ×
  // prefill_window() × prompt weights (zeros after each query's own position); 0 when absent.
  [[nodiscard]] virtual std::uint32_t prefill_window() const { return 0; }
  [[nodiscard]] virtual std::vector<float> read_prefill_window(std::uint32_t layer);
  // Key norms: kv_heads() × (prompt + steps) L2 norms of the cached keys; kv_heads() is 0 when
  // absent.
  [[nodiscard]] virtual std::uint32_t kv_heads() const { return 0; }
  [[nodiscard]] virtual std::vector<float> read_key_norms(std::uint32_t layer);
  // Where the data comes from, for errors ("trace.h5").
  [[nodiscard]] virtual std::string name() const { return "attention source"; }
};

// A source held in memory: rows_[step][layer][position]; optional data added by the setters.
class InMemoryAttention final : public AttentionSource {
 public:
  InMemoryAttention(std::uint32_t layers, std::uint64_t prompt_tokens,
                    std::vector<std::vector<std::vector<float>>> rows);

  // head_rows[step][layer]: heads × row length, head-major.
  void set_head_rows(std::uint32_t heads, std::vector<std::vector<std::vector<float>>> head_rows);
  // window[layer]: heads × window × prompt.
  void set_prefill_window(std::uint32_t window, std::vector<std::vector<float>> window_weights);
  // norms[layer]: kv_heads × (prompt + steps).
  void set_key_norms(std::uint32_t kv_heads, std::vector<std::vector<float>> norms);

  [[nodiscard]] std::uint32_t layers() const override { return layers_; }
  [[nodiscard]] std::uint64_t prompt_tokens() const override { return prompt_tokens_; }
  [[nodiscard]] std::uint64_t steps() const override { return rows_.size(); }
  void read_step(std::uint64_t step, std::vector<std::vector<float>>& rows) override;
  [[nodiscard]] std::uint32_t heads() const override { return heads_; }
  void read_head_step(std::uint64_t step, std::vector<std::vector<float>>& rows) override;
  [[nodiscard]] std::uint32_t prefill_window() const override { return window_; }
  [[nodiscard]] std::vector<float> read_prefill_window(std::uint32_t layer) override;
  [[nodiscard]] std::uint32_t kv_heads() const override { return kv_heads_; }
  [[nodiscard]] std::vector<float> read_key_norms(std::uint32_t layer) override;

 private:
  std::uint32_t layers_;
  std::uint64_t prompt_tokens_;
  std::vector<std::vector<std::vector<float>>> rows_;
  std::uint32_t heads_ = 0;
  std::vector<std::vector<std::vector<float>>> head_rows_;
  std::uint32_t window_ = 0;
  std::vector<std::vector<float>> window_weights_;
  std::uint32_t kv_heads_ = 0;
  std::vector<std::vector<float>> key_norms_;
};

}  // namespace kvtier::replay
