// Monarch (REFERENCE.md §1.2; JohannaWeb/Monarch, src/monarch_paging.py): hot/cold paging of
// the KV cache in pages of 16 tokens, residency per page shared by every layer. Hot pages stay
// in HBM (T0); cold pages are compressed to host memory (T2); nothing is evicted. Importance is
// an EMA of attention: every step all EMAs decay, hot tokens take max(EMA, attention); the hot
// set is the recent window, the sticky tokens, and the best non-hot tokens whose EMA reaches
// the promotion threshold; a token promoted `sticky_after` times stays sticky.

#include <algorithm>
#include <cmath>
#include <span>
#include <stdexcept>
#include <string>

#include "common/errors.hpp"
#include "replay/kernels.hpp"
#include "replay/policies.hpp"

namespace kvtier::replay {
namespace {

struct MonarchPreset {
  const char* name;
  std::int64_t window;
  std::int64_t max_hot;
  std::int64_t sticky_tokens;
};

// MonarchPagingConfig's defaults and its fast / accurate presets.
constexpr MonarchPreset kPresets[] = {
    {"fast", 256, 384, 16}, {"default", 512, 768, 16}, {"accurate", 768, 1024, 32}};

const MonarchPreset& preset_of(const PolicyParameters& params) {
  const std::string& name = params.choice("preset");
  for (const MonarchPreset& preset : kPresets) {
    if (name == preset.name) {
      return preset;
    }
  }
  return kPresets[1];
}

// A preset's value unless the policy string gave the parameter itself.
std::int64_t preset_value(const PolicyParameters& params, const std::string& name,
                          std::int64_t preset) {
  return params.given(name) ? params.integer(name) : preset;
}

void resolve_preset(PolicyParameters& params, const ReplayShape& /*shape*/) {
  const MonarchPreset& preset = preset_of(params);
  params.set("window", std::to_string(preset_value(params, "window", preset.window)));
  params.set("max_hot", std::to_string(preset_value(params, "max_hot", preset.max_hot)));
  params.set("sticky_tokens",
             std::to_string(preset_value(params, "sticky_tokens", preset.sticky_tokens)));
}

// A cold page's format. turboquant stores no scales; polar-int4's fp32 scale per 64 values is
// folded into its average bits (exact where head_dim is a multiple of 64); int8 is not
// Monarch's but the live cache's format, so that a live run of monarch can be compared with
// its simulation byte for byte.
CompressedFormat format_of(const std::string& compression) {
  if (compression == "turboquant") {
    return {16.0, 0};
  }
  if (compression == "polar-int4") {
    return {6.25, 0};
  }
  if (compression == "int8") {
    return kInt8HeadScaled;
  }
  throw std::logic_error("monarch: compression '" + compression + "' is not a declared choice");
}

class MonarchPolicy final : public Policy {
 public:
  explicit MonarchPolicy(const PolicyParameters& params)
      : page_(static_cast<std::uint64_t>(params.integer("page"))),
        decay_(static_cast<float>(params.number("decay"))),
        threshold_(static_cast<float>(params.number("threshold"))),
        sticky_after_(static_cast<std::uint32_t>(params.integer("sticky_after"))),
        attend_all_(params.choice("attend") == "all"),
        format_(format_of(params.choice("compression"))) {
    const MonarchPreset& preset = preset_of(params);
    window_ = static_cast<std::uint64_t>(preset_value(params, "window", preset.window));
    max_hot_ = static_cast<std::uint64_t>(preset_value(params, "max_hot", preset.max_hot));
    sticky_tokens_ =
        static_cast<std::uint64_t>(preset_value(params, "sticky_tokens", preset.sticky_tokens));
    capacity_ = (max_hot_ + page_ - 1) / page_ * page_;
    // The window's pages are always hot, so they must fit in the hot capacity even when the
    // window starts mid-page.
    if (window_ + page_ - 1 > capacity_) {
      throw ParameterValueError("window " + std::to_string(window_) + " (plus a partial page of " +
                                    std::to_string(page_ - 1) + ") does not fit in max_hot " +
                                    std::to_string(max_hot_) + " rounded up to pages",
                                "monarch", "window");
    }
  }

  void start(const ReplayShape& shape, std::vector<LayerPlacement>& placement) override {
    const std::uint64_t prompt = shape.prompt_tokens;
    grow(prompt);
    // Monarch makes the prompt tokens with the most prefill attention sticky, up to the room
    // the window leaves. Prefill attention to position j comes only from queries j and later,
    // and early queries concentrate on early tokens, so those are the first positions; replay
    // takes them without the prefill rows, and starts every EMA at 0 (docs/REPLAY.md).
    const std::uint64_t window = std::min(window_, prompt);
    const std::uint64_t room = max_hot_ > window ? max_hot_ - window : 0;
    for (std::uint64_t token = 0; token < std::min({sticky_tokens_, prompt, room}); ++token) {
      make_sticky(token);
    }
    apply(prompt, placement);
  }

  void observe(const StepView& view, std::vector<LayerPlacement>& placement) override {
    const std::uint64_t tokens = placement.front().size();
    grow(tokens);
    update_scores(view, placement.front());
    apply(tokens, placement);
  }

  // Monarch's attention reads only the hot pages: a cold page's share of a step is lost to the
  // model until the page comes back (attend=all books it as held, as a decompressing T2 would).
  [[nodiscard]] double own_kept_mass(const StepView& view, std::uint32_t layer) const override {
    const std::vector<float>& row = view.rows[layer];
    if (attend_all_ || hot_tokens_ + (row.size() - hot_mask_.size()) >= row.size()) {
      return -1.0;  // every token is hot: the placement says it all
    }
    // The step's own token is not in hot_mask_ yet (observe() has not run): it is hot.
    const std::span<const float> known(row.data(), hot_mask_.size());
    return kernels::dot(known, hot_mask_) +
           kernels::sum({row.data() + known.size(), row.size() - known.size()});
  }

  [[nodiscard]] CompressedFormat compressed_format() const override { return format_; }
  [[nodiscard]] bool attends_compressed() const override { return attend_all_; }

 private:
  // Extends the per-token state to `tokens` (new tokens are hot: computed in HBM).
  void grow(std::uint64_t tokens) {
    const std::uint64_t before = ema_.size();
    ema_.resize(tokens, 0.0F);
    promotions_.resize(tokens, 0);
    sticky_.resize(tokens, 0);
    hot_mask_.resize(tokens, 1.0F);
    scores_.resize(tokens, 0.0F);
    hot_tokens_ += tokens - before;
    hot_page_.resize((tokens + page_ - 1) / page_, 1);
  }

  void make_sticky(std::uint64_t token) {
    if (sticky_[token] == 0) {
      sticky_[token] = 1;
      sticky_list_.push_back(token);
    }
  }

  void count_promotion(std::uint64_t token) {
    if (++promotions_[token] >= sticky_after_) {
      make_sticky(token);
    }
  }

  // All EMAs decay; hot tokens (what this step's attention read) take max(EMA, score), where
  // the score is the attention averaged over layers, renormalised to what each layer read.
  void update_scores(const StepView& view, const LayerPlacement& tiers) {
    for (float& ema : ema_) {
      ema *= decay_;
    }
    std::uint32_t valid = 0;
    for (std::uint32_t layer = 0; layer < view.rows.size(); ++layer) {
      valid += std::isfinite(view.total_mass[layer]) && view.kept_mass[layer] > 0 ? 1 : 0;
    }
    if (valid == 0) {
      return;
    }
    std::fill(scores_.begin(), scores_.end(), 0.0F);
    for (std::uint32_t layer = 0; layer < view.rows.size(); ++layer) {
      if (!std::isfinite(view.total_mass[layer]) || view.kept_mass[layer] <= 0) {
        continue;
      }
      kernels::accumulate(scores_, view.rows[layer], tiers.hbm_mask(),
                          static_cast<float>(1.0 / (view.kept_mass[layer] * valid)));
    }
    for (std::uint64_t token = 0; token < scores_.size(); ++token) {
      if (hot_mask_[token] > 0.5F) {
        ema_[token] = std::max(ema_[token], scores_[token]);
        if (scores_[token] >= threshold_) {
          count_promotion(token);
        }
      }
    }
  }

  // Chooses the hot pages and moves the pages that change, in every layer.
  void apply(std::uint64_t tokens, std::vector<LayerPlacement>& placement) {
    const std::uint64_t pages = hot_page_.size();
    wanted_.assign(pages, 0);
    std::uint64_t hot = 0;
    const auto page_size = [&](std::uint64_t page) {
      return std::min(page_, tokens - page * page_);
    };
    // Adds a page if it fits in the hot capacity; true when the page is (now) hot.
    const auto want = [&](std::uint64_t page) {
      if (wanted_[page] != 0) {
        return true;
      }
      if (hot + page_size(page) > capacity_) {
        return false;
      }
      wanted_[page] = 1;
      hot += page_size(page);
      return true;
    };
    const std::uint64_t first_recent = tokens > window_ ? tokens - window_ : 0;
    for (std::uint64_t page = first_recent / page_; page < pages; ++page) {
      (void)want(page);  // fits by the check in the constructor
    }
    // Sticky tokens next, best EMA first. Monarch's own code never drops a sticky page and
    // would run out of page slots (RuntimeError) when they outgrow max_hot; replay keeps the
    // best that fit.
    const auto by_ema = [this](std::uint64_t a, std::uint64_t b) {
      return ema_[a] != ema_[b] ? ema_[a] > ema_[b] : a < b;
    };
    std::sort(sticky_list_.begin(), sticky_list_.end(), by_ema);
    std::uint64_t desired = tokens - first_recent;
    for (const std::uint64_t token : sticky_list_) {
      desired += token < first_recent ? 1 : 0;
      if (token < first_recent) {
        (void)want(token / page_);
      }
    }
    // Then tokens outside the window and not sticky whose EMA reaches the threshold, best
    // first, while the desired tokens number fewer than max_hot; each promotion counts.
    candidates_.clear();
    for (std::uint64_t token = 0; token < first_recent; ++token) {
      if (ema_[token] >= threshold_ && sticky_[token] == 0) {
        candidates_.push_back(token);
      }
    }
    std::sort(candidates_.begin(), candidates_.end(), by_ema);
    for (const std::uint64_t token : candidates_) {
      if (desired >= max_hot_) {
        break;
      }
      if (want(token / page_)) {
        ++desired;
        count_promotion(token);
      }
    }
    for (std::uint64_t page = 0; page < pages; ++page) {
      if (wanted_[page] != hot_page_[page]) {
        const Tier tier = wanted_[page] != 0 ? Tier::kHbm : Tier::kCompressed;
        const float mask = wanted_[page] != 0 ? 1.0F : 0.0F;
        for (std::uint64_t token = page * page_; token < page * page_ + page_size(page); ++token) {
          for (auto& layer : placement) {
            layer.move(token, tier);
          }
          hot_mask_[token] = mask;
        }
        hot_page_[page] = wanted_[page];
      }
    }
    hot_tokens_ = hot;
  }

  std::uint64_t page_;
  float decay_;
  float threshold_;
  std::uint32_t sticky_after_;
  bool attend_all_;
  CompressedFormat format_;
  std::uint64_t window_ = 0;
  std::uint64_t max_hot_ = 0;
  std::uint64_t sticky_tokens_ = 0;
  std::uint64_t capacity_ = 0;  // max_hot rounded up to whole pages

  std::vector<float> ema_;
  std::vector<std::uint32_t> promotions_;
  std::vector<char> sticky_;
  std::vector<std::uint64_t> sticky_list_;
  std::vector<float> hot_mask_;  // 1 for tokens on hot pages (the same in every layer)
  std::vector<float> scores_;
  std::vector<char> hot_page_;
  std::vector<char> wanted_;
  std::vector<std::uint64_t> candidates_;
  std::uint64_t hot_tokens_ = 0;
};

// The policy's own check of its values together (the window within the hot capacity), with
// the preset's values, for PolicyRegistry::check: building the policy runs it.
void check_values(const PolicyParameters& params) {
  PolicyParameters resolved = params;
  resolve_preset(resolved, ReplayShape{});
  static_cast<void>(MonarchPolicy(resolved));
}

}  // namespace

PolicyInfo monarch_policy_info() {
  return PolicyInfo{
      "monarch",
      "Monarch: pages of 16 tokens hot in HBM (recent window, sticky and high-EMA tokens) or "
      "cold, compressed in host memory; residency shared by all layers; never evicts",
      "Monarch (github.com/JohannaWeb/Monarch, src/monarch_paging.py), REFERENCE.md §1.2",
      {{"preset",
        ParamType::kChoice,
        "default",
        "window / max_hot / sticky_tokens: fast 256/384/16, default 512/768/16, accurate "
        "768/1024/32; parameters given explicitly win",
        0,
        0,
        {"fast", "default", "accurate"}},
       {"window", ParamType::kInteger, "512", "most recent tokens always hot", 1, 1e9, {}},
       {"max_hot",
        ParamType::kInteger,
        "768",
        "most tokens hot (HBM), rounded up to whole pages",
        1,
        1e9,
        {}},
       {"sticky_tokens",
        ParamType::kInteger,
        "16",
        "prompt tokens sticky from the start (replay: the first ones)",
        0,
        1e9,
        {}},
       {"page", ParamType::kInteger, "16", "tokens per page", 1, 4096, {}},
       {"decay", ParamType::kNumber, "0.92", "importance EMA decay per step", 0, 1, {}},
       {"threshold",
        ParamType::kNumber,
        "0.12",
        "attention (mean over heads and layers) that promotes a token",
        0,
        1,
        {}},
       {"sticky_after",
        ParamType::kInteger,
        "2",
        "promotions after which a token stays hot",
        1,
        1e9,
        {}},
       {"attend",
        ParamType::kChoice,
        "hot",
        "what a step's attention reads: hot pages only, as Monarch (the share on cold pages is "
        "lost that step), or all (cold pages decompressed and read)",
        0,
        0,
        {"hot", "all"}},
       {"compression",
        ParamType::kChoice,
        "turboquant",
        "cold page format: turboquant (Monarch's default: polar base + a 1-bit residual stored "
        "as a byte, 16 bits per element), polar-int4 (keys polar 8 bits, values int4 in "
        "groups of 64, 6.25 bits per element on average) or int8 (not Monarch's: int8 with a "
        "float32 scale per KV head for K and for V, the live cache's T2 format)",
        0,
        0,
        {"turboquant", "polar-int4", "int8"}}},
      [](const PolicyParameters& params, const ReplayShape&) -> std::unique_ptr<Policy> {
        return std::make_unique<MonarchPolicy>(params);
      },
      resolve_preset,
      check_values};
}

}  // namespace kvtier::replay
