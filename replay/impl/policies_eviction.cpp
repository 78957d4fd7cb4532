// Eviction baselines (REFERENCE.md §2) with a per-layer token budget: StreamingLLM (sinks +
// window), H2O (accumulated attention, heavy hitters + recent), TOVA (lowest current attention),
// and the full cache.

#include <algorithm>

#include "replay/impl/budgeted.hpp"
#include "replay/policies.hpp"

namespace kvtier::replay {
namespace {

using detail::BudgetedPolicy;
using detail::finite_row;
using detail::ResidentTokens;

class FullPolicy final : public Policy {
 public:
  void observe(const StepView& /*view*/, std::vector<LayerPlacement>& /*placement*/) override {}
};

// Keeps `sinks` first tokens and the last `window` tokens; a token is evicted when it leaves
// the window.
class StreamingPolicy final : public Policy {
 public:
  explicit StreamingPolicy(const PolicyParameters& params)
      : sinks_(static_cast<std::uint64_t>(params.integer("sinks"))),
        window_(static_cast<std::uint64_t>(params.integer("window"))) {}

  void start(const ReplayShape& /*shape*/, std::vector<LayerPlacement>& placement) override {
    for (auto& layer : placement) {
      trim(layer);
    }
  }
  void observe(const StepView& /*view*/, std::vector<LayerPlacement>& placement) override {
    for (auto& layer : placement) {
      trim(layer);
    }
  }

 private:
  void trim(LayerPlacement& layer) const {
    const std::uint64_t size = layer.size();
    if (size <= sinks_ + window_) {
      return;
    }
    // Tokens [sinks, size - window) are outside; only the newest of them can still be resident
    // after the first call, but the prompt may need many at once.
    for (std::uint64_t token = size - window_; token-- > sinks_;) {
      if (layer.tier(token) == Tier::kEvicted) {
        break;
      }
      layer.move(token, Tier::kEvicted);
    }
  }

  std::uint64_t sinks_;
  std::uint64_t window_;
};

// Accumulated attention per token (column sums of the head-mean rows, renormalised to what the
// layer still holds); over budget, the lowest-scoring token outside the recent window goes.
class H2OPolicy final : public BudgetedPolicy {
 public:
  H2OPolicy(const PolicyParameters& params, const ReplayShape& shape)
      : BudgetedPolicy(params, shape), recent_share_(params.number("recent")) {}

  void observe(const StepView& view, std::vector<LayerPlacement>& placement) override {
    for (std::uint32_t layer = 0; layer < placement.size(); ++layer) {
      LayerPlacement& tiers = placement[layer];
      ResidentTokens& resident = layers_[layer];
      resident.add(tiers.size() - 1);
      if (finite_row(view, layer)) {
        resident.accumulate(view.rows[layer], view.kept_mass[layer]);
      }
      const std::uint64_t budget = budgets_[layer];
      const auto recent = static_cast<std::uint64_t>(recent_share_ * static_cast<double>(budget));
      const std::uint64_t first_recent = tiers.size() > recent ? tiers.size() - recent : 0;
      while (resident.ids.size() > budget) {
        const auto candidates = static_cast<std::size_t>(
            std::lower_bound(resident.ids.begin(), resident.ids.end(), first_recent) -
            resident.ids.begin());
        if (candidates == 0) {
          break;  // only recent tokens left: the budget is smaller than the recent window
        }
        resident.evict(resident.lowest(candidates), tiers);
      }
    }
  }

 private:
  double recent_share_;
};

// Over budget, drops the token the current query attends to least (never the query's own).
class TovaPolicy final : public BudgetedPolicy {
 public:
  TovaPolicy(const PolicyParameters& params, const ReplayShape& shape)
      : BudgetedPolicy(params, shape) {}

  void observe(const StepView& view, std::vector<LayerPlacement>& placement) override {
    for (std::uint32_t layer = 0; layer < placement.size(); ++layer) {
      LayerPlacement& tiers = placement[layer];
      ResidentTokens& resident = layers_[layer];
      resident.add(tiers.size() - 1);
      // This step's attention only; a row that is not finite leaves the last step's scores.
      if (finite_row(view, layer)) {
        const std::vector<float>& row = view.rows[layer];
        for (std::size_t j = 0; j < resident.ids.size(); ++j) {
          resident.scores[j] = row[resident.ids[j]];
        }
      }
      while (resident.ids.size() > budgets_[layer] && resident.ids.size() > 1) {
        resident.evict(resident.lowest(resident.ids.size() - 1), tiers);
      }
    }
  }
};

}  // namespace

PolicyInfo full_policy_info() {
  return PolicyInfo{"full",
                    "every token in HBM (the baseline; keeps all attention mass)",
                    "—",
                    {},
                    [](const PolicyParameters&, const ReplayShape&) -> std::unique_ptr<Policy> {
                      return std::make_unique<FullPolicy>();
                    }};
}

PolicyInfo streaming_policy_info() {
  return PolicyInfo{
      "streaming",
      "StreamingLLM: attention sinks plus a rolling window of recent tokens; the rest evicted",
      "StreamingLLM (arXiv 2309.17453), REFERENCE.md §2",
      {{"sinks", ParamType::kInteger, "4", "first tokens always kept", 0, 1e9, {}},
       {"window", ParamType::kInteger, "1020", "most recent tokens kept", 1, 1e9, {}}},
      [](const PolicyParameters& params, const ReplayShape&) -> std::unique_ptr<Policy> {
        return std::make_unique<StreamingPolicy>(params);
      }};
}

PolicyInfo h2o_policy_info() {
  auto params = budget_params("1024");
  params.push_back({"recent",
                    ParamType::kNumber,
                    "0.5",
                    "share of the budget reserved for the most recent tokens (10% heavy + 10% "
                    "recent in the paper: half each)",
                    0,
                    1,
                    {}});
  return PolicyInfo{
      "h2o",
      "Heavy-Hitter Oracle: accumulated attention; keep heavy hitters and recent tokens within "
      "a per-layer budget",
      "H2O (arXiv 2306.14048), REFERENCE.md §2", params,
      [](const PolicyParameters& p, const ReplayShape& shape) -> std::unique_ptr<Policy> {
        return std::make_unique<H2OPolicy>(p, shape);
      }};
}

PolicyInfo tova_policy_info() {
  return PolicyInfo{
      "tova",
      "Token Omission Via Attention: over budget, drop the token with the lowest current attention",
      "TOVA (arXiv 2401.06104), REFERENCE.md §2", budget_params("1024"),
      [](const PolicyParameters& p, const ReplayShape& shape) -> std::unique_ptr<Policy> {
        return std::make_unique<TovaPolicy>(p, shape);
      }};
}

}  // namespace kvtier::replay
