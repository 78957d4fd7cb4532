#pragma once
// A synthetic trace generated as it is read (no file): the rows `kvtier trace synth` would
// write for a model shape, served straight to replay. The tier-aware simulator uses it when a
// run names no traces, and for the tail of requests longer than their trace.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "configs/schema/model.pb.h"
#include "configs/schema/trace.pb.h"
#include "replay/attention.hpp"

namespace kvtier::traces {
class SyntheticAttentionModel;
}

namespace kvtier::replay {

class SyntheticAttention final : public AttentionSource {
 public:
  // ConfigError when the parameters cannot make a distribution (traces::check_synthetic).
  SyntheticAttention(const config::ModelSpec& model, std::uint32_t prompt_tokens,
                     std::uint32_t steps, const config::SyntheticAttention& params);
  SyntheticAttention(const SyntheticAttention&) = delete;
  SyntheticAttention& operator=(const SyntheticAttention&) = delete;
  ~SyntheticAttention() override;

  [[nodiscard]] std::uint32_t layers() const override { return layers_; }
  [[nodiscard]] std::uint64_t prompt_tokens() const override { return prompt_tokens_; }
  [[nodiscard]] std::uint64_t steps() const override { return steps_; }
  void read_step(std::uint64_t step, std::vector<std::vector<float>>& rows) override;
  [[nodiscard]] std::string name() const override { return name_; }

 private:
  std::uint32_t layers_;
  std::uint32_t prompt_tokens_;
  std::uint32_t steps_;
  std::string name_;
  std::unique_ptr<traces::SyntheticAttentionModel> model_;
};

}  // namespace kvtier::replay
