#pragma once
// Internal to the policy library: the compact list of tokens a budgeted policy holds per layer,
// shared by H2O, TOVA, DMS and KNorm so that each step costs O(budget), not O(context), and so
// that DMS with no delay reproduces H2O's choices exactly (same scores, same tie-breaking).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "common/errors.hpp"
#include "replay/policies.hpp"

namespace kvtier::replay::detail {

// The tokens a layer still holds, in position order, each with a score.
struct ResidentTokens {
  std::vector<std::uint64_t> ids;
  std::vector<float> scores;

  void add(std::uint64_t id, float score = 0.0F) {
    ids.push_back(id);
    scores.push_back(score);
  }
  // Removes entry j and evicts its token.
  void evict(std::size_t j, LayerPlacement& tiers) {
    tiers.move(ids[j], Tier::kEvicted);
    ids.erase(ids.begin() + static_cast<std::ptrdiff_t>(j));
    scores.erase(scores.begin() + static_cast<std::ptrdiff_t>(j));
  }
  // The entry with the lowest score among the first `limit`; ties go to the earlier token.
  [[nodiscard]] std::size_t lowest(std::size_t limit) const {
    return static_cast<std::size_t>(
        std::min_element(scores.begin(), scores.begin() + static_cast<std::ptrdiff_t>(limit)) -
        scores.begin());
  }
  // The entry of token `id` when it is held; in any case the number of held tokens before it.
  [[nodiscard]] std::size_t index_of(std::uint64_t id) const {
    return static_cast<std::size_t>(std::lower_bound(ids.begin(), ids.end(), id) - ids.begin());
  }
  // H2O's accumulated attention: each held token's weight in `row`, renormalised to the share
  // of the row the layer still holds (what softmax over the held keys gives).
  void accumulate(const std::vector<float>& row, double kept_mass) {
    const float scale = kept_mass > 0 ? static_cast<float>(1.0 / kept_mass) : 0.0F;
    for (std::size_t j = 0; j < ids.size(); ++j) {
      scores[j] += row[ids[j]] * scale;
    }
  }
};

// Whether layer `layer`'s row of this step can score tokens. A row holding NaN or infinity (a
// broken step of a live run; trace files refuse such rows on read) is skipped, as `tiered` and
// `monarch` skip it: accumulated into a score it would pin one token, or leave every later
// comparison of the layer false, for the rest of the run.
[[nodiscard]] inline bool finite_row(const StepView& view, std::uint32_t layer) {
  return std::isfinite(view.total_mass[layer]);
}

// A policy holding at most a budget of tokens per layer (uniform, pyramid or explicit
// allocation), every prompt token listed at start.
class BudgetedPolicy : public Policy {
 public:
  BudgetedPolicy(const PolicyParameters& params, const ReplayShape& shape)
      : budgets_(layer_budgets(params, shape.layers)) {}

  void start(const ReplayShape& shape, std::vector<LayerPlacement>& /*placement*/) override {
    layers_.assign(shape.layers, {});
    for (auto& layer : layers_) {
      for (std::uint64_t token = 0; token < shape.prompt_tokens; ++token) {
        layer.add(token);
      }
    }
  }

 protected:
  std::vector<std::uint64_t> budgets_;
  std::vector<ResidentTokens> layers_;
};

// Key norms averaged over the KV heads: norms[l][position] for every layer, from the source's
// kv_heads × (prompt + steps) values per layer (PolicyInput::kKeyNorms).
[[nodiscard]] inline std::vector<std::vector<float>> mean_key_norms(AttentionSource& source) {
  const std::uint32_t kv_heads = source.kv_heads();
  std::vector<std::vector<float>> norms(source.layers());
  for (std::uint32_t layer = 0; layer < source.layers(); ++layer) {
    const std::vector<float> values = source.read_key_norms(layer);
    const std::uint64_t positions = source.prompt_tokens() + source.steps();
    if (values.size() != kv_heads * positions) {
      throw DataError(source.name() + ": key norms of layer " + std::to_string(layer) + " hold " +
                      std::to_string(values.size()) + " values, expected " +
                      std::to_string(kv_heads * positions) + " (KV heads x positions)");
    }
    norms[layer].assign(positions, 0.0F);
    for (std::uint32_t head = 0; head < kv_heads; ++head) {
      for (std::size_t i = 0; i < positions; ++i) {
        norms[layer][i] += values[head * positions + i] / static_cast<float>(kv_heads);
      }
    }
  }
  return norms;
}

}  // namespace kvtier::replay::detail
