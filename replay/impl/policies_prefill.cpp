// Policies that compress the prompt once, at the end of prefill, from the attention of the
// prompt's last queries (the trace's prefill window): SnapKV, PyramidKV (SnapKV's selection
// with PyramidKV's per-layer budgets) and AdaKV (SnapKV's scores, selected per head with budgets
// shifted between heads). As in the papers, tokens generated afterwards are all kept: the budget
// applies to the prompt.

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <string>

#include "common/errors.hpp"
#include "replay/kernels.hpp"
#include "replay/policies.hpp"

namespace kvtier::replay {
namespace {

// NaN ranks below every score, so that sorting stays a strict weak order on bad data.
float rank_key(float score) {
  return std::isnan(score) ? -std::numeric_limits<float>::infinity() : score;
}

// What one layer keeps of the prompt: the positions selected from the prefix, and every
// position from `tail_start` on (the observation window, and later every generated token).
struct LayerSelection {
  bool compressed = false;  // false: the prompt fits in the budget and nothing is dropped
  std::uint64_t tail_start = 0;
  std::vector<std::uint64_t> kept;                // layer placement: union over heads, ascending
  std::vector<std::vector<std::uint64_t>> heads;  // per head (AdaKV), ascending
};

class PrefillSelectionPolicy final : public Policy {
 public:
  enum class Mode { kLayer, kHeads };
  enum class Mass { kHeadRows, kMeanRow };

  PrefillSelectionPolicy(const PolicyParameters& params, const ReplayShape& shape, Mode mode)
      : mode_(mode),
        budgets_(layer_budgets(params, shape.layers, shape.prompt_tokens)),
        window_(static_cast<std::uint32_t>(params.integer("window"))),
        kernel_(static_cast<std::uint32_t>(params.integer("kernel"))),
        pooling_(params.choice("pooling") == "max" ? Pooling::kMax : Pooling::kAverage) {
    if (mode == Mode::kHeads) {
      floor_share_ = params.number("floor");
      mass_ = params.choice("mass") == "heads" ? Mass::kHeadRows : Mass::kMeanRow;
    }
  }

  [[nodiscard]] std::vector<PolicyInput> inputs() const override {
    if (mode_ == Mode::kHeads && mass_ == Mass::kHeadRows) {
      return {PolicyInput::kPrefillWindow, PolicyInput::kHeadRows};
    }
    return {PolicyInput::kPrefillWindow};
  }

  // The whole selection happens here: only the pooled scores of one layer are held at a time,
  // not every layer's heads × window × prompt weights.
  void load_inputs(AttentionSource& source) override {
    const std::uint64_t prompt = source.prompt_tokens();
    const std::uint32_t trace_window = source.prefill_window();
    layers_.assign(source.layers(), {});
    for (std::uint32_t layer = 0; layer < source.layers(); ++layer) {
      LayerSelection& selection = layers_[layer];
      const std::uint64_t budget = budgets_.at(layer);
      if (prompt <= budget) {
        continue;  // SnapKV leaves a prompt that fits alone
      }
      selection.compressed = true;
      // The window is always kept; a budget below it keeps only its newest tokens.
      const std::uint64_t tail = std::min<std::uint64_t>(window_, budget);
      selection.tail_start = prompt - tail;
      const std::uint64_t per_head = budget - tail;
      if (per_head == 0) {
        continue;  // the window's newest tokens only
      }
      if (trace_window < window_) {
        throw DataError(source.name() + ": the policy observes the last " +
                        std::to_string(window_) + " prompt queries, the trace's prefill window " +
                        "holds " + std::to_string(trace_window) + " (set window=" +
                        std::to_string(trace_window) + " or capture a longer window)");
      }
      const std::vector<float> weights = source.read_prefill_window(layer);
      const std::uint64_t per_query = static_cast<std::uint64_t>(trace_window) * prompt;
      if (weights.empty() || weights.size() % per_query != 0) {
        throw DataError(source.name() + ": the prefill window of layer " + std::to_string(layer) +
                        " holds " + std::to_string(weights.size()) +
                        " weights, not heads x window x prompt");
      }
      const auto heads = static_cast<std::uint32_t>(weights.size() / per_query);
      heads_ = heads;
      const auto scores =
          snap_head_scores(weights, heads, trace_window, prompt, window_, kernel_, pooling_);
      if (mode_ == Mode::kLayer) {
        // Per-layer placement: SnapKV's per-head scores averaged over the heads.
        std::vector<float> mean(scores.front().size(), 0.0F);
        for (const auto& head : scores) {
          for (std::size_t i = 0; i < mean.size(); ++i) {
            mean[i] += head[i] / static_cast<float>(heads);
          }
        }
        selection.kept = top_positions(mean, per_head);
      } else {
        selection.heads = adaptive_head_selection(scores, per_head, floor_share_);
        for (const auto& head : selection.heads) {
          selection.kept.insert(selection.kept.end(), head.begin(), head.end());
        }
        std::sort(selection.kept.begin(), selection.kept.end());
        selection.kept.erase(std::unique(selection.kept.begin(), selection.kept.end()),
                             selection.kept.end());
      }
    }
  }

  void start(const ReplayShape& shape, std::vector<LayerPlacement>& placement) override {
    for (std::uint32_t layer = 0; layer < shape.layers; ++layer) {
      const LayerSelection& selection = layers_.at(layer);
      if (!selection.compressed) {
        continue;
      }
      auto next = selection.kept.begin();
      for (std::uint64_t token = 0; token < selection.tail_start; ++token) {
        if (next != selection.kept.end() && *next == token) {
          ++next;
        } else {
          placement[layer].move(token, Tier::kEvicted);
        }
      }
    }
  }

  // Compression happens once; every generated token is kept.
  void observe(const StepView& /*view*/, std::vector<LayerPlacement>& /*placement*/) override {}

  // AdaKV's heads keep different tokens, so the layer placement (their union) overstates what
  // each head attends to: the kept share is each head's own, averaged over the heads.
  [[nodiscard]] double own_kept_mass(const StepView& view, std::uint32_t layer) const override {
    const LayerSelection& selection = layers_.at(layer);
    // Without a per-head prefix (nothing dropped, or a budget within the window) every head
    // keeps what the placement holds.
    if (mode_ != Mode::kHeads || !selection.compressed || selection.heads.empty()) {
      return -1.0;
    }
    const std::vector<float>& mean_row = view.rows[layer];
    const std::size_t length = mean_row.size();
    if (mass_ == Mass::kHeadRows && view.heads != heads_) {
      throw DataError("the trace's decode rows have " + std::to_string(view.heads) +
                      " heads, its prefill window " + std::to_string(heads_));
    }
    double kept = 0.0;
    for (std::uint32_t head = 0; head < heads_; ++head) {
      const float* row = mass_ == Mass::kHeadRows ? view.head_rows[layer].data() +
                                                        static_cast<std::size_t>(head) * length
                                                  : mean_row.data();
      for (const std::uint64_t token : selection.heads[head]) {
        kept += row[token];
      }
      kept += kernels::sum({row + selection.tail_start, length - selection.tail_start});
    }
    return kept / heads_;
  }

 private:
  Mode mode_;
  std::vector<std::uint64_t> budgets_;
  std::uint32_t window_;
  std::uint32_t kernel_;
  Pooling pooling_;
  double floor_share_ = 0.0;
  Mass mass_ = Mass::kMeanRow;
  std::uint32_t heads_ = 1;
  std::vector<LayerSelection> layers_;
};

std::vector<ParamSpec> prefill_params(const std::string& default_allocation,
                                      const std::string& default_window) {
  auto params = budget_params("1024", default_allocation);
  params.push_back({"window",
                    ParamType::kInteger,
                    default_window,
                    "observation window: the last prompt queries whose attention scores the "
                    "prompt; these prompt tokens are always kept (needs a trace prefill window at "
                    "least this long)",
                    1,
                    1e6,
                    {}});
  params.push_back(
      {"kernel", ParamType::kInteger, "7", "1-D pooling kernel over positions", 1, 1001, {}});
  params.push_back({"pooling",
                    ParamType::kChoice,
                    "max",
                    "pooling of the scores over neighbouring positions",
                    0,
                    0,
                    {"max", "avg"}});
  return params;
}

}  // namespace

std::vector<float> pool_scores(std::span<const float> scores, std::uint32_t kernel,
                               Pooling pooling) {
  const std::int64_t half = kernel / 2;
  const auto n = static_cast<std::int64_t>(scores.size());
  std::vector<float> pooled(scores.size());
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int64_t first = std::max<std::int64_t>(0, i - half);
    const std::int64_t last = std::min<std::int64_t>(n - 1, i + half);
    if (pooling == Pooling::kMax) {
      float best = -std::numeric_limits<float>::infinity();
      for (std::int64_t j = first; j <= last; ++j) {
        best = std::max(best, scores[static_cast<std::size_t>(j)]);
      }
      pooled[static_cast<std::size_t>(i)] = best;
    } else {
      float total = 0.0F;
      for (std::int64_t j = first; j <= last; ++j) {
        total += scores[static_cast<std::size_t>(j)];
      }
      pooled[static_cast<std::size_t>(i)] = total / static_cast<float>(2 * half + 1);
    }
  }
  return pooled;
}

std::vector<std::vector<float>> snap_head_scores(std::span<const float> weights,
                                                 std::uint32_t heads, std::uint32_t trace_window,
                                                 std::uint64_t prompt, std::uint32_t window,
                                                 std::uint32_t kernel, Pooling pooling) {
  const std::uint64_t prefix = prompt - window;
  std::vector<std::vector<float>> scores(heads);
  std::vector<float> mean(prefix);
  for (std::uint32_t head = 0; head < heads; ++head) {
    std::fill(mean.begin(), mean.end(), 0.0F);
    for (std::uint32_t query = trace_window - window; query < trace_window; ++query) {
      const float* row =
          weights.data() + (static_cast<std::uint64_t>(head) * trace_window + query) * prompt;
      for (std::uint64_t i = 0; i < prefix; ++i) {
        mean[i] += row[i];
      }
    }
    for (float& value : mean) {
      value /= static_cast<float>(window);
    }
    scores[head] = pool_scores(mean, kernel, pooling);
  }
  return scores;
}

std::vector<std::uint64_t> top_positions(std::span<const float> scores, std::uint64_t k) {
  std::vector<std::uint64_t> order(scores.size());
  std::iota(order.begin(), order.end(), 0);
  if (k >= order.size()) {
    return order;
  }
  const auto better = [&](std::uint64_t a, std::uint64_t b) {
    const float sa = rank_key(scores[a]);
    const float sb = rank_key(scores[b]);
    return sa != sb ? sa > sb : a < b;
  };
  std::nth_element(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(k), order.end(),
                   better);
  order.resize(k);
  std::sort(order.begin(), order.end());
  return order;
}

std::vector<std::vector<std::uint64_t>> adaptive_head_selection(
    const std::vector<std::vector<float>>& scores, std::uint64_t per_head, double floor_share) {
  const std::size_t heads = scores.size();
  std::vector<std::vector<std::uint64_t>> kept(heads);
  if (heads == 0) {
    return kept;
  }
  const std::uint64_t length = scores.front().size();
  if (per_head >= length) {
    for (auto& head : kept) {
      head.resize(length);
      std::iota(head.begin(), head.end(), 0);
    }
    return kept;
  }
  // The safeguard: every head keeps its own best ⌊α·n⌋ whatever the others score.
  const auto floor = static_cast<std::uint64_t>(std::floor(floor_share * per_head));
  std::vector<std::vector<char>> taken(heads, std::vector<char>(length, 0));
  for (std::size_t head = 0; head < heads; ++head) {
    kept[head] = top_positions(scores[head], floor);
    for (const std::uint64_t position : kept[head]) {
      taken[head][position] = 1;
    }
  }
  // The rest of the layer's n·H, jointly: the best remaining (head, position) pairs.
  struct Candidate {
    float score;
    std::uint64_t position;
    std::size_t head;
  };
  std::vector<Candidate> rest;
  rest.reserve(heads * (length - floor));
  for (std::size_t head = 0; head < heads; ++head) {
    for (std::uint64_t position = 0; position < length; ++position) {
      if (taken[head][position] == 0) {
        rest.push_back({rank_key(scores[head][position]), position, head});
      }
    }
  }
  const std::uint64_t joint = heads * (per_head - floor);
  const auto better = [](const Candidate& a, const Candidate& b) {
    if (a.score != b.score) {
      return a.score > b.score;
    }
    return a.position != b.position ? a.position < b.position : a.head < b.head;
  };
  std::nth_element(rest.begin(), rest.begin() + static_cast<std::ptrdiff_t>(joint), rest.end(),
                   better);
  for (std::uint64_t i = 0; i < joint; ++i) {
    kept[rest[i].head].push_back(rest[i].position);
  }
  for (auto& head : kept) {
    std::sort(head.begin(), head.end());
  }
  return kept;
}

PolicyInfo snapkv_policy_info() {
  return PolicyInfo{
      "snapkv",
      "SnapKV: at prefill end, keep the observation window and the prompt tokens the window's "
      "queries attend to most (pooled); generated tokens are all kept",
      "SnapKV (arXiv 2404.14469), REFERENCE.md §2 (window 32-64, kernel 5-7; max pooling [U])",
      prefill_params("uniform", "32"),
      [](const PolicyParameters& p, const ReplayShape& shape) -> std::unique_ptr<Policy> {
        return std::make_unique<PrefillSelectionPolicy>(p, shape,
                                                        PrefillSelectionPolicy::Mode::kLayer);
      }};
}

PolicyInfo pyramidkv_policy_info() {
  return PolicyInfo{
      "pyramidkv",
      "PyramidKV: SnapKV's prompt selection with budgets falling linearly from the lowest layer "
      "to the highest (allocation=pyramid)",
      "PyramidKV (arXiv 2406.02069; beta 20, window 64), REFERENCE.md §2",
      prefill_params("pyramid", "64"),
      [](const PolicyParameters& p, const ReplayShape& shape) -> std::unique_ptr<Policy> {
        return std::make_unique<PrefillSelectionPolicy>(p, shape,
                                                        PrefillSelectionPolicy::Mode::kLayer);
      }};
}

PolicyInfo adakv_policy_info() {
  auto params = prefill_params("uniform", "32");
  params.push_back({"floor",
                    ParamType::kNumber,
                    "0.2",
                    "alpha: share of the mean per-head budget every head keeps whatever the "
                    "others score",
                    0,
                    1,
                    {}});
  params.push_back({"mass",
                    ParamType::kChoice,
                    "heads",
                    "attention kept per head from the trace's per-head decode rows (heads), or "
                    "approximated from the head-mean row (mean) for traces without them",
                    0,
                    0,
                    {"heads", "mean"}});
  return PolicyInfo{
      "adakv",
      "AdaKV: SnapKV scores per head; per layer the best n*H (head, token) pairs jointly, each "
      "head at least alpha*n; the layer holds the union of the heads' tokens",
      "Ada-KV (arXiv 2407.11550), REFERENCE.md §2", params,
      [](const PolicyParameters& p, const ReplayShape& shape) -> std::unique_ptr<Policy> {
        return std::make_unique<PrefillSelectionPolicy>(p, shape,
                                                        PrefillSelectionPolicy::Mode::kHeads);
      }};
}

}  // namespace kvtier::replay
