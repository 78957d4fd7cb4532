#include "tests/kernels/support/wide_recodes.hpp"

#include <algorithm>
#include <vector>

#include "kernels/random_model.hpp"
#include "replay/parameters.hpp"
#include "replay/synthetic_attention.hpp"
#include "traces/synth.hpp"

namespace kvtier::kernels::testing {

namespace {

constexpr std::uint32_t kPrompt = 64;
constexpr int kSteps = 160;

config::ModelSpec wide_kv_spec() {
  config::ModelSpec spec;
  spec.set_name("wide-kv");
  spec.set_architecture(config::LLAMA);
  spec.set_num_hidden_layers(4);
  spec.set_hidden_size(256);
  spec.set_num_attention_heads(32);
  spec.set_num_key_value_heads(32);
  spec.set_head_dim(128);
  spec.set_intermediate_size(256);
  spec.set_vocab_size(64);
  spec.set_max_position_embeddings(512);
  spec.set_rope_theta(10000.0);
  spec.set_rms_norm_eps(1e-5);
  return spec;
}

}  // namespace

std::shared_ptr<const ModelWeights> wide_kv_model() {
  static const std::shared_ptr<const ModelWeights> model =
      std::make_shared<const ModelWeights>(random_model(wide_kv_spec(), {.seed = 3}));
  return model;
}

LiveResult follow_with_recodes(Engine& engine, int recode_threads) {
  replay::SyntheticAttention source(engine.spec(), kPrompt, kSteps,
                                    traces::synthetic_preset("reasoning", 5));
  LiveOptions options;
  options.policy =
      replay::parse_policy_string("tiered:hbm=0.2,evict=0,compress=0.5,delta=8,recent=16,sinks=4");
  options.max_new_tokens = kSteps;
  options.follow = &source;
  for (int t = 0; t < kSteps; ++t) {
    options.forced_tokens.push_back((7 + 13 * t) % 64);
  }
  options.keep_logits = true;
  options.recode_threads = recode_threads;
  std::vector<std::int32_t> prompt;
  for (std::uint32_t i = 0; i < kPrompt; ++i) {
    prompt.push_back(static_cast<std::int32_t>((1 + 37 * i) % 64));
  }
  return run_live(engine, nullptr, prompt, options);
}

std::uint64_t most_recodes_in_a_step(const LiveResult& result) {
  std::uint64_t most = 0;
  for (std::uint64_t step = 0; step < result.demand.steps(); ++step) {
    std::uint64_t recodes = 0;
    for (std::uint32_t layer = 0; layer < result.demand.layers(); ++layer) {
      const replay::StepLayerRecord& record = result.demand.at(step, layer);
      // Into T2 from T1, and into T1 from T2 (the rest of each count comes from HBM).
      recodes +=
          (record.compressed - record.compressed_from_hbm) + (record.newly_host - record.demoted);
    }
    most = std::max(most, recodes);
  }
  return most;
}

}  // namespace kvtier::kernels::testing
