// DMS's delayed eviction against immediate eviction, and KNorm's lowest-norm rule.

#include <catch2/catch.hpp>

#include <algorithm>
#include <numeric>
#include <set>

#include "replay/engine.hpp"
#include "tests/replay/synthetic_source.hpp"

using kvtier::replay::LayerPlacement;
using kvtier::replay::ReplayDemand;
using kvtier::replay::Tier;
using kvtier::test::RichShape;

namespace {

RichShape dms_shape() {
  RichShape shape;
  shape.prompt = 80;
  shape.steps = 150;
  return shape;
}

// Evicted tokens of every layer after start (index 0) and after each step (index step + 1).
using EvictedSets = std::vector<std::vector<std::set<std::uint64_t>>>;

ReplayDemand run_tracking(const std::string& policy, EvictedSets& evicted) {
  auto source = kvtier::test::rich_attention(dms_shape(), 21);
  evicted.clear();
  kvtier::test::CheckedPolicy checked(
      kvtier::test::make_policy(policy, source),
      [&](std::int64_t /*step*/, const std::vector<LayerPlacement>& placement) {
        std::vector<std::set<std::uint64_t>> sets(placement.size());
        for (std::size_t layer = 0; layer < placement.size(); ++layer) {
          for (std::uint64_t token = 0; token < placement[layer].size(); ++token) {
            if (placement[layer].tier(token) == Tier::kEvicted) {
              sets[layer].insert(token);
            }
          }
        }
        evicted.push_back(std::move(sets));
      });
  return kvtier::replay::replay(source, checked);
}

void require_same(const ReplayDemand& a, const ReplayDemand& b) {
  for (std::uint64_t step = 0; step < a.steps(); ++step) {
    for (std::uint32_t layer = 0; layer < a.layers(); ++layer) {
      INFO("step " << step << " layer " << layer);
      REQUIRE(a.at(step, layer).tokens == b.at(step, layer).tokens);
      REQUIRE(a.at(step, layer).mass == b.at(step, layer).mass);
      REQUIRE(a.at(step, layer).evicted == b.at(step, layer).evicted);
    }
  }
}

}  // namespace

TEST_CASE("DMS without delay is immediate eviction", "[replay]") {
  auto source = kvtier::test::rich_attention(dms_shape(), 21);
  for (const char* budget : {"budget=40", "allocation=explicit,budgets=25/60/40"}) {
    INFO(budget);
    // The attention scorer is H2O with no recent window; the key-norm scorer is KNorm.
    require_same(kvtier::test::run_policy(source, std::string("dms:delay=0,") + budget),
                 kvtier::test::run_policy(source, std::string("h2o:recent=0,") + budget));
    require_same(
        kvtier::test::run_policy(source, std::string("dms:delay=0,scorer=knorm,") + budget),
        kvtier::test::run_policy(source, std::string("knorm:") + budget));
  }
}

TEST_CASE("DMS keeps a marked token until it leaves the window", "[replay]") {
  // With key norms the marks do not depend on what attention the held tokens get, so the
  // delayed policy marks exactly what the immediate one evicts, and evicts each such token
  // precisely once it is older than the window.
  constexpr std::uint64_t kDelay = 24;
  EvictedSets immediate;
  EvictedSets delayed;
  (void)run_tracking("dms:budget=40,scorer=knorm,delay=0", immediate);
  const auto demand =
      run_tracking("dms:budget=40,scorer=knorm,delay=" + std::to_string(kDelay), delayed);
  REQUIRE(immediate.size() == delayed.size());
  bool held_back = false;
  for (std::size_t index = 0; index < delayed.size(); ++index) {
    const std::uint64_t tokens = dms_shape().prompt + index;  // after start: the prompt
    const std::uint64_t window_start = tokens > kDelay ? tokens - kDelay : 0;
    for (std::size_t layer = 0; layer < delayed[index].size(); ++layer) {
      std::set<std::uint64_t> expected;
      for (const std::uint64_t token : immediate[index][layer]) {
        if (token < window_start) {
          expected.insert(token);
        }
      }
      REQUIRE(delayed[index][layer] == expected);
      held_back = held_back || expected.size() < immediate[index][layer].size();
    }
  }
  CHECK(held_back);
  // The price: up to `delay` marked tokens held beyond the budget.
  std::uint64_t most = 0;
  for (std::uint64_t step = 0; step < dms_shape().steps; ++step) {
    const std::uint64_t held = kvtier::test::held_tokens(demand, step, 0);
    REQUIRE(held <= 40 + kDelay);
    most = std::max(most, held);
  }
  CHECK(most > 40);
}

TEST_CASE("DMS with the attention scorer never evicts a token inside its window", "[replay]") {
  constexpr std::uint64_t kDelay = 32;
  EvictedSets delayed;
  const auto demand = run_tracking("dms:budget=40,delay=" + std::to_string(kDelay), delayed);
  for (std::size_t index = 0; index < delayed.size(); ++index) {
    const std::uint64_t tokens = dms_shape().prompt + index;
    for (const auto& layer : delayed[index]) {
      REQUIRE((layer.empty() || *layer.rbegin() < tokens - kDelay));
    }
  }
  // It evicts, and keeps more attention than immediate eviction at the same budget.
  CHECK(demand.summary().evicted > 0);
  auto source = kvtier::test::rich_attention(dms_shape(), 21);
  const auto immediate = kvtier::test::run_policy(source, "dms:budget=40,delay=0");
  CHECK(demand.summary().mean_kept_mass > immediate.summary().mean_kept_mass);
}

TEST_CASE("KNorm keeps the lowest-norm keys outside its recent window", "[replay]") {
  auto source = kvtier::test::rich_attention(dms_shape(), 21);
  const std::uint32_t kv_heads = source.kv_heads();
  for (const std::uint64_t recent : {0, 10}) {
    INFO("recent " << recent);
    constexpr std::uint64_t kBudget = 40;
    EvictedSets evicted;
    (void)run_tracking("knorm:budget=40,recent=" + std::to_string(recent), evicted);
    for (std::uint32_t layer = 0; layer < dms_shape().layers; ++layer) {
      // Mean over the KV heads, as the policy reads them.
      const auto values = source.read_key_norms(layer);
      const std::uint64_t positions = values.size() / kv_heads;
      std::vector<float> norms(positions, 0.0F);
      for (std::uint32_t head = 0; head < kv_heads; ++head) {
        for (std::uint64_t i = 0; i < positions; ++i) {
          norms[i] += values[head * positions + i] / static_cast<float>(kv_heads);
        }
      }
      for (std::size_t index = 0; index < evicted.size(); ++index) {
        const std::uint64_t tokens = dms_shape().prompt + index;
        const std::uint64_t first_recent = tokens - recent;
        // Held older tokens are the lowest-norm (budget − recent) of all older tokens.
        std::vector<std::uint64_t> older(first_recent);
        std::iota(older.begin(), older.end(), 0);
        std::stable_sort(older.begin(), older.end(),
                         [&](auto a, auto b) { return norms[a] < norms[b]; });
        older.resize(std::min<std::uint64_t>(older.size(), kBudget - recent));
        std::set<std::uint64_t> expected_held(older.begin(), older.end());
        std::set<std::uint64_t> held;
        for (std::uint64_t token = 0; token < first_recent; ++token) {
          if (evicted[index][layer].count(token) == 0) {
            held.insert(token);
          }
        }
        REQUIRE(held == expected_held);
        // Recent tokens are all held.
        REQUIRE((evicted[index][layer].empty() || *evicted[index][layer].rbegin() < first_recent));
      }
    }
  }
}
