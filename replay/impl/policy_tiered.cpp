// The four-tier hierarchy of "Not All Thoughts Need HBM" (REFERENCE.md §1.1): cumulative
// attention scores; a protected set (the prompt, the first generated tokens as sinks, the most
// recent tokens) always in HBM; every Δ steps the unprotected tokens are re-tiered — the bottom
// ⌊r·|U|⌋ by score evicted, the top ⌊β·(|U| − n_evict)⌋ in HBM, the rest in host memory
// (optionally the lowest share of it compressed, T2). Placement is shared by all layers, as
// the score is averaged over layers.

#include <algorithm>
#include <cmath>
#include <numeric>

#include "replay/kernels.hpp"
#include "replay/policies.hpp"

namespace kvtier::replay {
namespace {

class TieredPolicy final : public Policy {
 public:
  explicit TieredPolicy(const PolicyParameters& params)
      : hbm_ratio_(params.number("hbm")),
        evict_ratio_(params.number("evict")),
        compress_ratio_(params.number("compress")),
        delta_(static_cast<std::uint64_t>(params.integer("delta"))),
        recent_(static_cast<std::uint64_t>(params.integer("recent"))),
        sinks_(static_cast<std::uint64_t>(params.integer("sinks"))) {}

  void start(const ReplayShape& shape, std::vector<LayerPlacement>& /*placement*/) override {
    prompt_ = shape.prompt_tokens;
    scores_.assign(prompt_, 0.0F);
  }

  void observe(const StepView& view, std::vector<LayerPlacement>& placement) override {
    const std::uint64_t tokens = prompt_ + view.step + 1;
    scores_.resize(tokens, 0.0F);
    // s_i += mean over layers of the (renormalised) attention; layers with NaN or infinite
    // weights are skipped, as the paper's implementation does.
    std::uint32_t valid = 0;
    for (std::uint32_t layer = 0; layer < view.rows.size(); ++layer) {
      valid += std::isfinite(view.total_mass[layer]) ? 1 : 0;
    }
    const std::span<const float> held = placement.front().resident_mask();
    for (std::uint32_t layer = 0; layer < view.rows.size() && valid > 0; ++layer) {
      if (!std::isfinite(view.total_mass[layer]) || view.kept_mass[layer] <= 0) {
        continue;
      }
      kernels::accumulate(scores_, view.rows[layer], held,
                          static_cast<float>(1.0 / (view.kept_mass[layer] * valid)));
    }
    if ((view.step + 1) % delta_ == 0) {
      retier(tokens, placement);
    }
  }

 private:
  void retier(std::uint64_t tokens, std::vector<LayerPlacement>& placement) {
    const std::uint64_t generated = tokens - prompt_;
    if (generated <= sinks_ + recent_) {
      return;
    }
    // Unprotected: generated tokens after the sinks and before the recent window.
    std::vector<std::uint64_t> unprotected(generated - sinks_ - recent_);
    std::iota(unprotected.begin(), unprotected.end(), prompt_ + sinks_);
    std::stable_sort(unprotected.begin(), unprotected.end(),
                     [this](auto a, auto b) { return scores_[a] < scores_[b]; });
    const LayerPlacement& shared = placement.front();
    const auto evict_target =
        static_cast<std::uint64_t>(std::floor(evict_ratio_ * unprotected.size()));
    std::uint64_t evicted = 0;
    for (const auto token : unprotected) {
      evicted += shared.tier(token) == Tier::kEvicted ? 1 : 0;
    }
    std::vector<std::uint64_t> survivors;
    survivors.reserve(unprotected.size());
    for (const auto token : unprotected) {  // lowest scores first
      if (shared.tier(token) == Tier::kEvicted) {
        continue;
      }
      if (evicted < evict_target) {
        move_all(placement, token, Tier::kEvicted);
        ++evicted;
      } else {
        survivors.push_back(token);
      }
    }
    const auto in_hbm = static_cast<std::uint64_t>(std::floor(hbm_ratio_ * survivors.size()));
    const std::uint64_t off_hbm = survivors.size() - in_hbm;
    const auto compressed = static_cast<std::uint64_t>(std::floor(compress_ratio_ * off_hbm));
    for (std::uint64_t rank = 0; rank < survivors.size(); ++rank) {
      const Tier tier = rank >= off_hbm     ? Tier::kHbm
                        : rank < compressed ? Tier::kCompressed
                                            : Tier::kHost;
      move_all(placement, survivors[rank], tier);
    }
  }

  static void move_all(std::vector<LayerPlacement>& placement, std::uint64_t token, Tier tier) {
    for (auto& layer : placement) {
      layer.move(token, tier);
    }
  }

  double hbm_ratio_;
  double evict_ratio_;
  double compress_ratio_;
  std::uint64_t delta_;
  std::uint64_t recent_;
  std::uint64_t sinks_;
  std::uint64_t prompt_ = 0;
  std::vector<float> scores_;
};

}  // namespace

PolicyInfo tiered_policy_info() {
  return PolicyInfo{
      "tiered",
      "four-tier hierarchy: protected set + cumulative-attention re-tiering every delta steps "
      "into HBM (T0), host DDR (T1), compressed host (T2), evicted (T3)",
      "Not All Thoughts Need HBM (arXiv 2605.09490), REFERENCE.md §1.1",
      {{"hbm",
        ParamType::kNumber,
        "0.5",
        "beta: share of surviving unprotected tokens kept in HBM",
        0,
        1,
        {}},
       {"evict",
        ParamType::kNumber,
        "0.1",
        "r: share of unprotected tokens evicted (T3)",
        0,
        1,
        {}},
       {"delta", ParamType::kInteger, "64", "re-tiering period in decode steps", 1, 1e9, {}},
       {"compress",
        ParamType::kNumber,
        "0",
        "share of the off-HBM survivors held 8-bit in T2 (0: T2 off)",
        0,
        1,
        {}},
       {"recent", ParamType::kInteger, "128", "most recent tokens always in HBM", 0, 1e9, {}},
       {"sinks", ParamType::kInteger, "4", "first generated tokens always in HBM", 0, 1e9, {}},
       {"prefetch",
        ParamType::kChoice,
        "full",
        "host tokens moved to the GPU each step: all of T1 (full, as the public code) or only "
        "newly placed ones (differential)",
        0,
        0,
        {"full", "differential"}}},
      [](const PolicyParameters& params, const ReplayShape&) -> std::unique_ptr<Policy> {
        return std::make_unique<TieredPolicy>(params);
      }};
}

}  // namespace kvtier::replay
