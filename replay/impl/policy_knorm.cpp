// KNorm / L2Norm (REFERENCE.md §2): keys with a low L2 norm draw high attention, so a layer keeps
// the keys with the lowest norm (mean over the KV heads) within its budget, and the most recent
// `recent` tokens whatever their norm. Norms are known as soon as a key is cached, so the prompt
// is cut when the policy starts, and each step's new key competes at once.

#include "replay/impl/budgeted.hpp"
#include "replay/policies.hpp"

namespace kvtier::replay {
namespace {

using detail::BudgetedPolicy;
using detail::ResidentTokens;

class KnormPolicy final : public BudgetedPolicy {
 public:
  KnormPolicy(const PolicyParameters& params, const ReplayShape& shape)
      : BudgetedPolicy(params, shape),
        recent_(static_cast<std::uint64_t>(params.integer("recent"))) {}

  [[nodiscard]] std::vector<PolicyInput> inputs() const override {
    return {PolicyInput::kKeyNorms};
  }

  void load_inputs(AttentionSource& source) override { norms_ = detail::mean_key_norms(source); }

  void start(const ReplayShape& shape, std::vector<LayerPlacement>& placement) override {
    BudgetedPolicy::start(shape, placement);
    for (std::uint32_t layer = 0; layer < shape.layers; ++layer) {
      ResidentTokens& resident = layers_[layer];
      for (std::size_t j = 0; j < resident.ids.size(); ++j) {
        resident.scores[j] = -norms_[layer][resident.ids[j]];
      }
      trim(layer, placement[layer]);
    }
  }

  void observe(const StepView& /*view*/, std::vector<LayerPlacement>& placement) override {
    for (std::uint32_t layer = 0; layer < placement.size(); ++layer) {
      const std::uint64_t token = placement[layer].size() - 1;
      layers_[layer].add(token, -norms_[layer][token]);
      trim(layer, placement[layer]);
    }
  }

 private:
  // Over budget, the highest-norm token outside the recent window goes (ties: the earlier).
  void trim(std::uint32_t layer, LayerPlacement& tiers) {
    ResidentTokens& resident = layers_[layer];
    const std::uint64_t first_recent = tiers.size() > recent_ ? tiers.size() - recent_ : 0;
    while (resident.ids.size() > budgets_[layer]) {
      const auto candidates = resident.index_of(first_recent);
      if (candidates == 0) {
        break;  // only recent tokens left: the budget is smaller than the recent window
      }
      resident.evict(resident.lowest(candidates), tiers);
    }
  }

  std::uint64_t recent_;
  std::vector<std::vector<float>> norms_;
};

}  // namespace

PolicyInfo knorm_policy_info() {
  auto params = budget_params("1024");
  params.push_back({"recent",
                    ParamType::kInteger,
                    "0",
                    "most recent tokens kept whatever their norm (the paper's rule has none [U])",
                    0,
                    1e9,
                    {}});
  return PolicyInfo{
      "knorm",
      "KNorm (L2Norm): keep the keys with the lowest L2 norm within a per-layer budget, plus a "
      "recent window; needs the trace's key norms",
      "A Simple and Effective L2 Norm-Based Strategy for KV Cache Compression (arXiv "
      "2406.11430), REFERENCE.md §2",
      params, [](const PolicyParameters& p, const ReplayShape& shape) -> std::unique_ptr<Policy> {
        return std::make_unique<KnormPolicy>(p, shape);
      }};
}

}  // namespace kvtier::replay
