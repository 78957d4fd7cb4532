#pragma once
// What replay reads: for each decode step, every layer's head-averaged attention row over the
// tokens visible at that step. Row t of a layer covers positions 0 .. prompt + t (the prompt,
// the tokens generated before step t, and the step's own token), as in the trace format.
// Implemented by the HDF5 trace reader and by in-memory sources in tests.

#include <cstdint>
#include <span>
#include <vector>

namespace kvtier::replay {

class AttentionSource {
 public:
  virtual ~AttentionSource() = default;

  [[nodiscard]] virtual std::uint32_t layers() const = 0;
  [[nodiscard]] virtual std::uint64_t prompt_tokens() const = 0;
  [[nodiscard]] virtual std::uint64_t steps() const = 0;
  // Fills rows[l] (resized to prompt + step + 1) with layer l's attention at `step`.
  virtual void read_step(std::uint64_t step, std::vector<std::vector<float>>& rows) = 0;
};

// A source held in memory: rows_[step][layer][position].
class InMemoryAttention final : public AttentionSource {
 public:
  InMemoryAttention(std::uint32_t layers, std::uint64_t prompt_tokens,
                    std::vector<std::vector<std::vector<float>>> rows);

  [[nodiscard]] std::uint32_t layers() const override { return layers_; }
  [[nodiscard]] std::uint64_t prompt_tokens() const override { return prompt_tokens_; }
  [[nodiscard]] std::uint64_t steps() const override { return rows_.size(); }
  void read_step(std::uint64_t step, std::vector<std::vector<float>>& rows) override;

 private:
  std::uint32_t layers_;
  std::uint64_t prompt_tokens_;
  std::vector<std::vector<std::vector<float>>> rows_;
};

}  // namespace kvtier::replay
