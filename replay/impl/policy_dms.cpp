// Dynamic Memory Sparsification emulated on traces (REFERENCE.md §1.4): DMS learns a keep/evict
// decision per token and executes it late — a token marked for eviction stays usable until it
// leaves a sliding window of the last `delay` tokens. Without the trained evictor, a scorer
// decides (as kvpress's DMSPress does): H2O's accumulated attention or the key norm. Per layer,
// while more than the budget of tokens are unmarked, the lowest-scoring unmarked token is marked
// (a mark is final, like DMS's decision); a marked token is evicted once it is older than the
// window. Memory therefore peaks at the budget plus the marked tokens still in the window (at
// most `delay`), and the replay records count them. delay=0 is immediate eviction: with the
// attention scorer exactly H2O with no recent window, with the key norm exactly KNorm.

#include <algorithm>
#include <limits>

#include "replay/impl/budgeted.hpp"
#include "replay/policies.hpp"

namespace kvtier::replay {
namespace {

using detail::BudgetedPolicy;
using detail::finite_row;
using detail::ResidentTokens;

// A marked token's score: never the lowest again, so it is never marked twice.
constexpr float kMarked = std::numeric_limits<float>::infinity();

class DmsPolicy final : public BudgetedPolicy {
 public:
  DmsPolicy(const PolicyParameters& params, const ReplayShape& shape)
      : BudgetedPolicy(params, shape),
        delay_(static_cast<std::uint64_t>(params.integer("delay"))),
        key_norm_(params.choice("scorer") == "knorm") {}

  [[nodiscard]] std::vector<PolicyInput> inputs() const override {
    if (key_norm_) {
      return {PolicyInput::kKeyNorms};
    }
    return {};
  }

  void load_inputs(AttentionSource& source) override { norms_ = detail::mean_key_norms(source); }

  void start(const ReplayShape& shape, std::vector<LayerPlacement>& placement) override {
    BudgetedPolicy::start(shape, placement);
    marked_.assign(shape.layers, {});
    // Key norms are known when the prompt is cached, so the prompt is cut at once; attention
    // scores start with the first decode step.
    if (key_norm_) {
      for (std::uint32_t layer = 0; layer < shape.layers; ++layer) {
        ResidentTokens& resident = layers_[layer];
        for (std::size_t j = 0; j < resident.ids.size(); ++j) {
          resident.scores[j] = -norms_[layer][resident.ids[j]];
        }
        mark_and_evict(layer, placement[layer]);
      }
    }
  }

  void observe(const StepView& view, std::vector<LayerPlacement>& placement) override {
    for (std::uint32_t layer = 0; layer < placement.size(); ++layer) {
      LayerPlacement& tiers = placement[layer];
      ResidentTokens& resident = layers_[layer];
      const std::uint64_t token = tiers.size() - 1;
      if (key_norm_) {
        resident.add(token, -norms_[layer][token]);  // low norm, high score: kept
      } else {
        resident.add(token);
        if (finite_row(view, layer)) {
          resident.accumulate(view.rows[layer], view.kept_mass[layer]);
        }
      }
      mark_and_evict(layer, tiers);
    }
  }

 private:
  void mark_and_evict(std::uint32_t layer, LayerPlacement& tiers) {
    ResidentTokens& resident = layers_[layer];
    std::vector<std::uint64_t>& marked = marked_[layer];
    while (resident.ids.size() - marked.size() > budgets_[layer]) {
      const std::size_t j = resident.lowest(resident.ids.size());
      if (resident.scores[j] == kMarked) {
        break;  // only marked tokens left
      }
      resident.scores[j] = kMarked;
      marked.insert(std::upper_bound(marked.begin(), marked.end(), resident.ids[j]),
                    resident.ids[j]);
    }
    // Marked tokens that have left the window (all of them when delay is 0) go now.
    const std::uint64_t window_start = tiers.size() > delay_ ? tiers.size() - delay_ : 0;
    std::size_t leaving = 0;
    while (leaving < marked.size() && marked[leaving] < window_start) {
      resident.evict(resident.index_of(marked[leaving]), tiers);
      ++leaving;
    }
    marked.erase(marked.begin(), marked.begin() + static_cast<std::ptrdiff_t>(leaving));
  }

  std::uint64_t delay_;
  bool key_norm_;
  std::vector<std::vector<float>> norms_;
  std::vector<std::vector<std::uint64_t>> marked_;  // per layer, ascending, still in the window
};

}  // namespace

PolicyInfo dms_policy_info() {
  auto params = budget_params("1024");
  params.push_back({"delay",
                    ParamType::kInteger,
                    "256",
                    "sliding window w: a token marked for eviction stays until it is older than "
                    "the last w tokens (256 in the paper [U]; NVIDIA's Qwen3 config 512, kvpress "
                    "DMSPress 128); 0 evicts at once",
                    0,
                    1e9,
                    {}});
  params.push_back({"scorer",
                    ParamType::kChoice,
                    "attention",
                    "what stands in for the trained evictor: accumulated attention (as H2O) or "
                    "the key norm (high norm evicted first, as KNorm; needs the trace's key "
                    "norms)",
                    0,
                    0,
                    {"attention", "knorm"}});
  return PolicyInfo{
      "dms",
      "Dynamic Memory Sparsification, emulated: a scorer marks the tokens over a per-layer "
      "budget; a marked token stays in HBM until it leaves a sliding window (delayed eviction)",
      "DMS (arXiv 2506.05345), kvpress DMSPress, REFERENCE.md §1.4", params,
      [](const PolicyParameters& p, const ReplayShape& shape) -> std::unique_ptr<Policy> {
        return std::make_unique<DmsPolicy>(p, shape);
      }};
}

}  // namespace kvtier::replay
