#include "replay/synthetic_attention.hpp"

#include "traces/synth.hpp"

namespace kvtier::replay {

SyntheticAttention::SyntheticAttention(const config::ModelSpec& model, std::uint32_t prompt_tokens,
                                       std::uint32_t steps,
                                       const config::SyntheticAttention& params)
    : layers_(model.num_hidden_layers()),
      prompt_tokens_(prompt_tokens),
      steps_(steps),
      name_("synthetic " + params.pattern() + " trace (seed " + std::to_string(params.seed()) +
            ")") {
  traces::check_synthetic(params);
  traces::SynthOptions options;
  options.model = model;
  options.prompt_tokens = prompt_tokens;
  options.steps = steps;
  options.params = params;
  const traces::TraceShape shape = traces::shape_from_meta(traces::synthetic_meta(options), name_);
  model_ = std::make_unique<traces::SyntheticAttentionModel>(params, shape, layers_);
}

SyntheticAttention::~SyntheticAttention() = default;

void SyntheticAttention::read_step(std::uint64_t step, std::vector<std::vector<float>>& rows) {
  rows.resize(layers_);
  const std::uint64_t length = prompt_tokens_ + step + 1;
  for (std::uint32_t layer = 0; layer < layers_; ++layer) {
    rows[layer].resize(length);
    model_->mean_row(layer, static_cast<std::uint32_t>(step), rows[layer]);
  }
}

}  // namespace kvtier::replay
