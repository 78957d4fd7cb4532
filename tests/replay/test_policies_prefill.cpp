// SnapKV, PyramidKV and AdaKV: the prompt compressed once from the prefill window's attention;
// the selection rules on small inputs, and the placements they produce.

#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <numeric>

#include "common/errors.hpp"
#include "replay/engine.hpp"
#include "replay/policies.hpp"
#include "tests/replay/synthetic_source.hpp"

using kvtier::replay::LayerPlacement;
using kvtier::replay::Pooling;
using kvtier::replay::Tier;
using kvtier::test::RichShape;

namespace {

const RichShape kShape{};  // 3 layers, 120-token prompt, 60 steps, 4 heads, window 32

// The prompt positions each layer holds after start().
std::vector<std::vector<std::uint64_t>> kept_prompt(const std::string& policy,
                                                    const RichShape& shape = kShape) {
  auto source = kvtier::test::rich_attention(shape, 9);
  std::vector<std::vector<std::uint64_t>> kept(shape.layers);
  kvtier::test::CheckedPolicy checked(
      kvtier::test::make_policy(policy, source),
      [&](std::int64_t step, const std::vector<LayerPlacement>& placement) {
        if (step == -1) {
          for (std::uint32_t layer = 0; layer < shape.layers; ++layer) {
            for (std::uint64_t token = 0; token < shape.prompt; ++token) {
              if (placement[layer].tier(token) != Tier::kEvicted) {
                kept[layer].push_back(token);
              }
            }
          }
        }
        // Generated tokens are never touched.
        for (const LayerPlacement& layer : placement) {
          for (std::uint64_t token = shape.prompt; token < layer.size(); ++token) {
            REQUIRE(layer.tier(token) == Tier::kHbm);
          }
        }
      });
  (void)kvtier::replay::replay(source, checked);
  return kept;
}

// What SnapKV should keep in `layer`: the top (budget − window) of the head-mean pooled scores,
// plus the window.
std::vector<std::uint64_t> expected_snap(const RichShape& shape, std::uint32_t layer,
                                         std::uint64_t budget, std::uint32_t window,
                                         Pooling pooling) {
  auto source = kvtier::test::rich_attention(shape, 9);
  const auto weights = source.read_prefill_window(layer);
  const auto scores = kvtier::replay::snap_head_scores(weights, shape.heads, shape.window,
                                                       shape.prompt, window, 7, pooling);
  std::vector<float> mean(scores.front().size(), 0.0F);
  for (const auto& head : scores) {
    for (std::size_t i = 0; i < mean.size(); ++i) {
      mean[i] += head[i] / static_cast<float>(shape.heads);
    }
  }
  auto kept = kvtier::replay::top_positions(mean, budget - window);
  for (std::uint64_t token = shape.prompt - window; token < shape.prompt; ++token) {
    kept.push_back(token);
  }
  return kept;
}

}  // namespace

TEST_CASE("pooling follows torch's max_pool1d and avg_pool1d with half-kernel padding",
          "[replay]") {
  const std::vector<float> scores{1, 3, 2, 0, 5};
  CHECK(kvtier::replay::pool_scores(scores, 3, Pooling::kMax) == std::vector<float>{3, 3, 3, 5, 5});
  const auto average = kvtier::replay::pool_scores(scores, 3, Pooling::kAverage);
  const std::vector<float> expected{4.0F / 3, 2.0F, 5.0F / 3, 7.0F / 3, 5.0F / 3};
  for (std::size_t i = 0; i < scores.size(); ++i) {
    CHECK(average[i] == Approx(expected[i]));
  }
  CHECK(kvtier::replay::pool_scores(scores, 1, Pooling::kMax) == scores);
  CHECK(kvtier::replay::pool_scores(scores, 5, Pooling::kMax) == std::vector<float>{3, 3, 5, 5, 5});
}

TEST_CASE("top positions prefer higher scores, then earlier positions, and rank NaN last",
          "[replay]") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> scores{0.5F, nan, 0.9F, 0.5F, 0.1F, 0.5F};
  CHECK(kvtier::replay::top_positions(scores, 1) == std::vector<std::uint64_t>{2});
  CHECK(kvtier::replay::top_positions(scores, 3) == std::vector<std::uint64_t>{0, 2, 3});
  CHECK(kvtier::replay::top_positions(scores, 5) == std::vector<std::uint64_t>{0, 2, 3, 4, 5});
  CHECK(kvtier::replay::top_positions(scores, 9).size() == 6);
  CHECK(kvtier::replay::top_positions(scores, 0).empty());
}

TEST_CASE("SnapKV scores average the window's queries over the prefix", "[replay]") {
  // 1 head, a trace window of 3 queries over a 6-token prompt; the policy observes the last 2.
  const std::vector<float> weights{
      1,    0,    0,    0,    0,    0,      // query at position 3 (outside the policy's window)
      0.5F, 0.1F, 0.1F, 0.2F, 0.1F, 0,      // position 4
      0.2F, 0.3F, 0.1F, 0.1F, 0.2F, 0.1F};  // position 5
  const auto scores = kvtier::replay::snap_head_scores(weights, 1, 3, 6, 2, 1, Pooling::kAverage);
  REQUIRE(scores.size() == 1);
  REQUIRE(scores[0].size() == 4);  // prefix: positions 0 .. 3
  CHECK(scores[0][0] == Approx(0.35));
  CHECK(scores[0][1] == Approx(0.2));
  CHECK(scores[0][2] == Approx(0.1));
  CHECK(scores[0][3] == Approx(0.15));
}

TEST_CASE("AdaKV keeps n*H pairs, each head at least its floor, the rest by score", "[replay]") {
  // Head 0 scores everything above head 1.
  const std::vector<std::vector<float>> scores{{0.9F, 0.8F, 0.7F, 0.6F, 0.5F, 0.4F},
                                               {0.05F, 0.3F, 0.01F, 0.2F, 0.02F, 0.1F}};
  const auto floored = kvtier::replay::adaptive_head_selection(scores, 3, 0.5);
  // n = 3, H = 2: 6 pairs; floor ⌊0.5·3⌋ = 1 per head, the 4 others all go to head 0.
  CHECK(floored[0] == std::vector<std::uint64_t>{0, 1, 2, 3, 4});
  CHECK(floored[1] == std::vector<std::uint64_t>{1});
  const auto free = kvtier::replay::adaptive_head_selection(scores, 3, 0.0);
  CHECK(free[0] == std::vector<std::uint64_t>{0, 1, 2, 3, 4, 5});
  CHECK(free[1].empty());
  const auto even = kvtier::replay::adaptive_head_selection(scores, 3, 1.0);
  CHECK(even[0] == std::vector<std::uint64_t>{0, 1, 2});
  CHECK(even[1] == std::vector<std::uint64_t>{1, 3, 5});
  // Identical heads keep the same tokens: SnapKV's per-head top-n.
  const std::vector<std::vector<float>> same{scores[1], scores[1], scores[1]};
  for (const auto& head : kvtier::replay::adaptive_head_selection(same, 2, 0.2)) {
    CHECK(head == kvtier::replay::top_positions(scores[1], 2));
  }
  // A budget covering the prefix keeps everything.
  CHECK(kvtier::replay::adaptive_head_selection(scores, 6, 0.2)[1].size() == 6);
}

TEST_CASE("SnapKV keeps the window and exactly its budget of prompt tokens", "[replay]") {
  for (const auto pooling : {Pooling::kMax, Pooling::kAverage}) {
    const std::string policy = std::string("snapkv:budget=50,window=16,pooling=") +
                               (pooling == Pooling::kMax ? "max" : "avg");
    INFO(policy);
    const auto kept = kept_prompt(policy);
    for (std::uint32_t layer = 0; layer < kShape.layers; ++layer) {
      CHECK(kept[layer].size() == 50);
      CHECK(kept[layer] == expected_snap(kShape, layer, 50, 16, pooling));
      for (std::uint64_t token = kShape.prompt - 16; token < kShape.prompt; ++token) {
        CHECK(std::find(kept[layer].begin(), kept[layer].end(), token) != kept[layer].end());
      }
    }
  }
  const auto kept = kept_prompt("snapkv:budget=50");
  // The scores find the heavy hitters: the sinks are kept.
  CHECK(kept[0].front() == 0);
  CHECK(kept[0][1] == 1);
}

TEST_CASE("SnapKV edge cases: a prompt within budget, a budget below the window", "[replay]") {
  const auto all = kept_prompt("snapkv:budget=120");
  CHECK(all[0].size() == kShape.prompt);
  // Budget 20 < window 32: only the newest 20 prompt tokens.
  const auto tail = kept_prompt("snapkv:budget=20");
  std::vector<std::uint64_t> newest(20);
  std::iota(newest.begin(), newest.end(), kShape.prompt - 20);
  CHECK(tail[1] == newest);
  // AdaKV then keeps the same tail in every head: SnapKV's placement and mass.
  CHECK(kept_prompt("adakv:budget=20") == tail);
  auto source = kvtier::test::rich_attention(kShape, 9);
  const auto ada = kvtier::test::run_policy(source, "adakv:budget=20");
  const auto snap = kvtier::test::run_policy(source, "snapkv:budget=20");
  for (std::uint64_t step = 0; step < kShape.steps; ++step) {
    CHECK(ada.at(step, 1).mass == snap.at(step, 1).mass);
  }
}

TEST_CASE("PyramidKV gives lower layers more of the prompt", "[replay]") {
  const auto kept = kept_prompt("pyramidkv:budget=80,window=32");
  const auto budgets = kvtier::test::budgets_of("pyramidkv:budget=80", kShape.layers);
  CHECK(budgets == std::vector<std::uint64_t>{95, 80, 65});
  for (std::uint32_t layer = 0; layer < kShape.layers; ++layer) {
    CHECK(kept[layer] == expected_snap(kShape, layer, budgets[layer], 32, Pooling::kMax));
  }
  // Uniform allocation makes it SnapKV.
  CHECK(kept_prompt("pyramidkv:budget=80,window=32,allocation=uniform") ==
        kept_prompt("snapkv:budget=80"));
}

TEST_CASE("AdaKV with identical heads is SnapKV", "[replay]") {
  RichShape same = kShape;
  same.same_heads = true;
  auto source = kvtier::test::rich_attention(same, 4);
  const auto ada = kvtier::test::run_policy(source, "adakv:budget=50");
  const auto snap = kvtier::test::run_policy(source, "snapkv:budget=50");
  for (std::uint64_t step = 0; step < same.steps; ++step) {
    for (std::uint32_t layer = 0; layer < same.layers; ++layer) {
      REQUIRE(ada.at(step, layer).tokens == snap.at(step, layer).tokens);
      REQUIRE(kvtier::test::kept_mass(ada, step, layer) ==
              Approx(kvtier::test::kept_mass(snap, step, layer)).epsilon(1e-5));
    }
  }
}

TEST_CASE("AdaKV holds the union of its heads' tokens and books what each head keeps", "[replay]") {
  auto source = kvtier::test::rich_attention(kShape, 4);
  // The mean-row mass on the tokens each layer holds, at every step.
  std::vector<std::vector<double>> union_mass(kShape.steps, std::vector<double>(kShape.layers));
  kvtier::test::CheckedPolicy checked(
      kvtier::test::make_policy("adakv:budget=50", source),
      [](std::int64_t, const std::vector<LayerPlacement>&) {},
      [&](const kvtier::replay::StepView& view, const std::vector<LayerPlacement>& placement) {
        for (std::uint32_t layer = 0; layer < kShape.layers; ++layer) {
          const auto& row = view.rows[layer];
          double mass = 0.0;
          for (std::uint64_t token = 0; token < row.size(); ++token) {
            mass += placement[layer].tier(token) == Tier::kEvicted ? 0.0 : row[token];
          }
          union_mass[view.step][layer] = mass;
        }
      });
  const auto demand = kvtier::replay::replay(source, checked);
  bool union_larger = false;
  bool heads_below_union = false;
  for (std::uint64_t step = 0; step < kShape.steps; ++step) {
    for (std::uint32_t layer = 0; layer < kShape.layers; ++layer) {
      const std::uint64_t prompt_held = kvtier::test::held_tokens(demand, step, layer) - step - 1;
      // At least the budget (heads overlap at most fully), at most n·H + window.
      REQUIRE(prompt_held >= 50);
      REQUIRE(prompt_held <= std::min<std::uint64_t>(kShape.prompt, 18 * 4 + 32));
      union_larger = union_larger || prompt_held > 50;
      const double kept = kvtier::test::kept_mass(demand, step, layer);
      REQUIRE(kept <= union_mass[step][layer] + 1e-5);
      heads_below_union = heads_below_union || kept < union_mass[step][layer] - 1e-3;
      // Booked on HBM, the rest lost.
      REQUIRE(demand.at(step, layer).mass[1] == 0.0F);
    }
  }
  CHECK(union_larger);
  CHECK(heads_below_union);
}

TEST_CASE("AdaKV without per-head rows approximates each head's share from the mean row",
          "[replay]") {
  RichShape no_heads = kShape;
  no_heads.head_rows = false;
  auto source = kvtier::test::rich_attention(no_heads, 4);
  const auto approx = kvtier::test::run_policy(source, "adakv:budget=50,mass=mean");
  auto with_heads = kvtier::test::rich_attention(kShape, 4);
  const auto exact = kvtier::test::run_policy(with_heads, "adakv:budget=50");
  // Same placement (the selection reads the prefill window only); different kept mass.
  bool differs = false;
  for (std::uint64_t step = 0; step < kShape.steps; ++step) {
    CHECK(approx.at(step, 0).tokens == exact.at(step, 0).tokens);
    differs = differs || std::abs(kvtier::test::kept_mass(approx, step, 0) -
                                  kvtier::test::kept_mass(exact, step, 0)) > 1e-4;
  }
  CHECK(differs);
}
