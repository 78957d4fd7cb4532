// The per-layer budget search (stages 1–2, docs/REPLAY.md "Budget search"): its classifier,
// Pareto bookkeeping, determinism across seeds and thread counts, and that it finds the layers
// that need budget on attention where the answer is known.

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>
#include <vector>

#include "common/errors.hpp"
#include "replay/budget_search.hpp"
#include "replay/impl/layer_profile.hpp"
#include "replay/impl/mlp.hpp"
#include "replay/impl/pareto.hpp"
#include "sim/random.hpp"
#include "tests/replay/synthetic_source.hpp"

using kvtier::replay::BudgetBounds;
using kvtier::replay::MemoryTrace;
using kvtier::replay::SearchOptions;
using kvtier::replay::SearchResult;
using kvtier::replay::detail::Objectives;
using Budgets = std::vector<std::uint64_t>;

namespace {

// Attention where the answer is known: "local" layers attend to a sink and the last few
// tokens, "long-range" layers spread their attention over the whole context (a flat background
// plus heavy hitters every 7 positions). A budget beyond a handful of tokens buys nothing in a
// local layer and recall in proportion to its size in a long-range one.
bool long_range(std::uint32_t layer) {
  return layer % 3 == 1;  // layers 1, 4, 7 of 8
}

MemoryTrace split_attention(std::uint32_t layers, std::uint64_t prompt, std::uint64_t steps,
                            std::uint64_t seed) {
  kvtier::sim::RandomStream random(seed);
  std::vector<std::vector<std::vector<float>>> rows(steps);
  for (std::uint64_t step = 0; step < steps; ++step) {
    const std::uint64_t visible = prompt + step + 1;
    rows[step].resize(layers);
    for (std::uint32_t layer = 0; layer < layers; ++layer) {
      std::vector<double> weights(visible);
      for (std::uint64_t token = 0; token < visible; ++token) {
        const double distance = static_cast<double>(visible - 1 - token);
        const double noise = 0.2 * random.uniform_01();
        if (long_range(layer)) {
          weights[token] = 1.0 + noise + (token % 7 == 3 ? 3.0 : 0.0);
        } else {
          weights[token] = 0.01 * noise + std::exp(-distance / 2.0) + (token == 0 ? 1.0 : 0.0);
        }
      }
      const double total = std::accumulate(weights.begin(), weights.end(), 0.0);
      rows[step][layer].resize(visible);
      for (std::uint64_t token = 0; token < visible; ++token) {
        rows[step][layer][token] = static_cast<float>(weights[token] / total);
      }
    }
  }
  return MemoryTrace(layers, prompt, std::move(rows), "split attention " + std::to_string(seed));
}

constexpr std::uint32_t kLayers = 8;
constexpr std::uint64_t kPrompt = 96;
constexpr std::uint64_t kSteps = 48;

kvtier::replay::ReplayRecall recall_on(std::initializer_list<std::uint64_t> seeds) {
  static const auto registry = kvtier::replay::builtin_policies();
  std::vector<kvtier::replay::SourceFactory> sources;
  for (const std::uint64_t seed : seeds) {
    sources.push_back(split_attention(kLayers, kPrompt, kSteps, seed).factory());
  }
  return kvtier::replay::ReplayRecall(registry, "h2o", std::move(sources));
}

// A cheap objective with a known optimum: layer l's recall saturates with its budget at a
// layer-specific rate; layers 2 and 5 need 32 times the budget of the others.
std::vector<double> analytic_recall(std::span<const std::uint64_t> budgets) {
  std::vector<double> recall(budgets.size());
  for (std::size_t l = 0; l < budgets.size(); ++l) {
    const double scale = (l == 2 || l == 5) ? 2048.0 : 64.0;
    recall[l] = 1.0 - std::exp(-static_cast<double>(budgets[l]) / scale);
  }
  return recall;
}

double mean(const std::vector<double>& values) {
  return std::accumulate(values.begin(), values.end(), 0.0) / static_cast<double>(values.size());
}

bool same_points(const std::vector<kvtier::replay::BudgetPoint>& a,
                 const std::vector<kvtier::replay::BudgetPoint>& b) {
  if (a.size() != b.size()) {
    return false;
  }
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (a[i].budgets != b[i].budgets || a[i].recall != b[i].recall ||
        a[i].mean_budget != b[i].mean_budget || a[i].generation != b[i].generation ||
        a[i].layer_recall != b[i].layer_recall) {
      return false;
    }
  }
  return true;
}

void check_non_dominated(const SearchResult& result) {
  REQUIRE(!result.front.empty());
  for (const auto& member : result.front) {
    for (const auto& other : result.evaluated) {
      INFO("front point " << member.evaluation << " against point " << other.evaluation);
      CHECK_FALSE(kvtier::replay::detail::dominates({other.mean_budget, other.recall},
                                                    {member.mean_budget, member.recall}));
    }
  }
  for (std::size_t k = 1; k < result.front.size(); ++k) {
    CHECK(result.front[k - 1].mean_budget <= result.front[k].mean_budget);
    CHECK(result.front[k - 1].recall <= result.front[k].recall);
  }
}

}  // namespace

TEST_CASE("the MLP learns a separable labelling", "[budget_search]") {
  kvtier::sim::RandomStream random(5);
  const auto sample = [&](Eigen::Index count, Eigen::MatrixXd& x, Eigen::VectorXd& y) {
    x.resize(count, 6);
    y.resize(count);
    for (Eigen::Index i = 0; i < count; ++i) {
      for (Eigen::Index j = 0; j < 6; ++j) {
        x(i, j) = random.uniform_01() - 0.5;
      }
      y(i) = x(i, 0) + 2 * x(i, 3) > 0.1 ? 1.0 : 0.0;
    }
  };
  Eigen::MatrixXd train_x;
  Eigen::VectorXd train_y;
  Eigen::MatrixXd test_x;
  Eigen::VectorXd test_y;
  sample(200, train_x, train_y);
  sample(500, test_x, test_y);
  kvtier::replay::detail::MlpClassifier mlp(6, 16, 1);
  mlp.train(train_x, train_y);
  const Eigen::VectorXd p = mlp.predict(test_x);
  int correct = 0;
  for (Eigen::Index i = 0; i < p.size(); ++i) {
    correct += (p(i) > 0.5) == (test_y(i) > 0.5) ? 1 : 0;
  }
  CHECK(correct >= 475);  // ≥ 95% on unseen points
  // Same seed, same data: the same probabilities.
  kvtier::replay::detail::MlpClassifier again(6, 16, 1);
  again.train(train_x, train_y);
  CHECK(again.predict(test_x) == p);
}

TEST_CASE("Pareto ranks, front, crowding and knee", "[budget_search]") {
  const std::vector<Objectives> points{{100, 0.5}, {200, 0.8}, {300, 0.85}, {150, 0.4},
                                       {200, 0.7}, {400, 0.9}, {100, 0.5}};
  const auto ranks = kvtier::replay::detail::pareto_ranks(points);
  CHECK(ranks == std::vector<std::uint32_t>{0, 0, 0, 1, 1, 0, 0});
  CHECK(kvtier::replay::detail::pareto_front(points) == std::vector<std::size_t>{0, 6, 1, 2, 5});
  const auto distance = kvtier::replay::detail::crowding_distances(points, ranks);
  CHECK(std::isinf(distance[5]));
  CHECK(std::isfinite(distance[1]));
  // The knee: (100, 0.5) (200, 0.8) (300, 0.85) (400, 0.9): scaled, (1/3, 0.75) is farthest
  // above the diagonal.
  const std::vector<Objectives> front{{100, 0.5}, {200, 0.8}, {300, 0.85}, {400, 0.9}};
  CHECK(kvtier::replay::detail::knee_point(front) == 1);
  CHECK(kvtier::replay::detail::select_best(points, 3) == std::vector<std::size_t>{0, 5, 1});
}

TEST_CASE("profile seeds split a budget by the layers' measured recall", "[budget_search]") {
  using kvtier::replay::detail::RecallSample;
  // Layer 0 gains nothing from budget, layer 1 gains steadily, layer 2 early and then little.
  const std::vector<std::vector<RecallSample>> samples{
      {{64, 0.9}, {256, 0.9}, {1024, 0.9}},
      {{64, 0.1}, {256, 0.4}, {1024, 1.0}},
      {{64, 0.5}, {256, 0.9}, {1024, 1.0}, {512, 0.2}}};  // a sample under the envelope
  // 576 tokens above the floor: layer 2's first segment (0.4 per 192 tokens), then layer 1's
  // first (0.3 per 192), then 192 tokens of layer 1's second (0.6 per 768).
  CHECK(kvtier::replay::detail::profile_allocation(samples, 256, {}) == Budgets{64, 448, 256});
  CHECK(kvtier::replay::detail::profile_allocation(samples, 64, {}) == Budgets{64, 64, 64});
  // Beyond every segment, the rest is spread evenly up to the cap.
  CHECK(kvtier::replay::detail::profile_allocation(samples, 4096, {}) == Budgets(3, 4096));
  const Budgets high = kvtier::replay::detail::profile_allocation(samples, 2000, {});
  CHECK(high[0] + high[1] + high[2] == 6000);
  CHECK(high[1] >= 1024);
  CHECK(high[2] >= 1024);
}

TEST_CASE("the search is deterministic for a seed and independent of the thread count",
          "[budget_search]") {
  SearchOptions options;
  options.bounds = {8, 512};
  options.evaluations = 60;
  options.seed = 3;
  const auto recall = recall_on({1});
  options.jobs = 1;
  const SearchResult one = kvtier::replay::search_budgets(kLayers, recall, options);
  options.jobs = 3;
  const SearchResult three = kvtier::replay::search_budgets(kLayers, recall, options);
  CHECK(one.evaluated.size() == 60);
  CHECK(same_points(one.evaluated, three.evaluated));
  CHECK(same_points(one.front, three.front));
  CHECK(one.winner == three.winner);
  check_non_dominated(one);
  for (const auto& point : one.evaluated) {
    CHECK(point.budgets.size() == kLayers);
    for (const std::uint64_t b : point.budgets) {
      CHECK(b >= 8);
      CHECK(b <= 512);
    }
  }
  options.seed = 4;
  const SearchResult other = kvtier::replay::search_budgets(kLayers, recall, options);
  CHECK_FALSE(same_points(one.evaluated, other.evaluated));
}

TEST_CASE("the search finds the layers that need budget in an analytic objective",
          "[budget_search]") {
  SearchOptions options;
  options.evaluations = 180;
  options.jobs = 2;
  const SearchResult result = kvtier::replay::search_budgets(8, analytic_recall, options);
  CHECK(result.evaluated.size() == 180);
  check_non_dominated(result);
  const auto& winner = result.front[result.winner].budgets;
  // Rescaled to 512 tokens a layer: layers 2 and 5 hold more than the uniform share.
  const Budgets rescaled = kvtier::replay::rescale_budgets(winner, 512, options.bounds);
  CHECK(rescaled[2] > 512);
  CHECK(rescaled[5] > 512);
  CHECK(mean(analytic_recall(rescaled)) > mean(analytic_recall(Budgets(8, 512))));
}

TEST_CASE("on local and long-range layers the search favours the long-range ones",
          "[budget_search]") {
  SearchOptions options;
  options.bounds = {8, 256};
  options.evaluations = 180;
  options.seed = 1;
  options.jobs = 2;
  const SearchResult result = kvtier::replay::search_budgets(kLayers, recall_on({1, 2}), options);
  check_non_dominated(result);
  const auto& winner = result.front[result.winner].budgets;
  INFO("winner " << kvtier::replay::explicit_budget_policy("h2o", winner));
  // Against uniform at equal mean budgets, on a held-out trace.
  const std::vector<std::uint64_t> targets{24, 32, 48};
  const auto comparisons =
      kvtier::replay::compare_with_uniform(recall_on({3}), winner, targets, options.bounds, 2);
  REQUIRE(comparisons.size() == 3);
  for (const auto& comparison : comparisons) {
    INFO("target " << comparison.target_mean << ": "
                   << kvtier::replay::explicit_budget_policy("h2o", comparison.budgets)
                   << ", recall " << comparison.searched_recall << " vs uniform "
                   << comparison.uniform_recall);
    double long_budget = 0.0;
    double local_budget = 0.0;
    for (std::uint32_t l = 0; l < kLayers; ++l) {
      (long_range(l) ? long_budget : local_budget) += static_cast<double>(comparison.budgets[l]);
    }
    CHECK(long_budget / 3 > static_cast<double>(comparison.target_mean));
    CHECK(local_budget / 5 < static_cast<double>(comparison.target_mean));
    CHECK(comparison.searched_recall > comparison.uniform_recall + 0.02);
  }
}

TEST_CASE("the policy string of a budget vector", "[budget_search]") {
  CHECK(kvtier::replay::explicit_budget_policy("h2o", Budgets{64, 128, 96}) ==
        "h2o:allocation=explicit,budgets=64/128/96");
  CHECK(kvtier::replay::explicit_budget_policy("h2o:recent=0.3", Budgets{64, 128}) ==
        "h2o:recent=0.3,allocation=explicit,budgets=64/128");
  CHECK(kvtier::replay::explicit_budget_policy("snapkv", Budgets(4, 256)) ==
        "snapkv:allocation=uniform,budget=256");
  // A uniform vector is uniform whatever the policy's default allocation: pyramidkv's vector
  // (256, 256, 256, 256) replays the same budgets as snapkv's, not PyramidKV's pyramid.
  const auto registry_for_shapes = kvtier::replay::builtin_policies();
  for (const char* base : {"snapkv", "pyramidkv"}) {
    INFO(base);
    const auto spec = kvtier::replay::parse_policy_string(
        kvtier::replay::explicit_budget_policy(base, Budgets(4, 256)));
    const auto* info = registry_for_shapes.find(base);
    REQUIRE(info != nullptr);
    const kvtier::replay::PolicyParameters params(base, info->params, spec);
    CHECK(kvtier::replay::layer_budgets(params, 4) == Budgets(4, 256));
  }
  const auto registry = kvtier::replay::builtin_policies();
  CHECK_NOTHROW(kvtier::replay::check_base_policy(registry, "h2o"));
  CHECK_NOTHROW(kvtier::replay::check_base_policy(registry, "h2o:recent=0.25"));
  CHECK_THROWS_AS(kvtier::replay::check_base_policy(registry, "tiered"), kvtier::ConfigError);
  CHECK_THROWS_AS(kvtier::replay::check_base_policy(registry, "nonesuch"), kvtier::ConfigError);
  CHECK_THROWS_WITH(kvtier::replay::check_base_policy(registry, "h2o:budget=64"),
                    Catch::Contains("budget"));
  // The string is one the registry takes, and the vector reaches the policy.
  const auto recall = recall_on({1});
  CHECK(mean(recall(Budgets{8, 200, 8, 8, 200, 8, 8, 200})) > mean(recall(Budgets(8, 8))));
}

TEST_CASE("search options and failures", "[budget_search]") {
  SearchOptions options;
  options.evaluations = 0;
  CHECK_THROWS_AS(kvtier::replay::search_budgets(4, analytic_recall, options), kvtier::ConfigError);
  options.evaluations = 10;
  options.jobs = 0;
  CHECK_THROWS_AS(kvtier::replay::search_budgets(4, analytic_recall, options), kvtier::ConfigError);
  options.jobs = 2;
  options.bounds = {100, 50};
  CHECK_THROWS_AS(kvtier::replay::search_budgets(4, analytic_recall, options), kvtier::ConfigError);
  options.bounds = {};
  CHECK_THROWS_AS(kvtier::replay::search_budgets(0, analytic_recall, options), kvtier::ConfigError);
  // A failing evaluation surfaces, whatever the threads.
  const auto failing = [](std::span<const std::uint64_t>) -> std::vector<double> {
    throw kvtier::DataError("broken trace", "calibration.h5");
  };
  CHECK_THROWS_AS(kvtier::replay::search_budgets(4, failing, options), kvtier::DataError);
  const auto not_a_number = [](std::span<const std::uint64_t> budgets) {
    return std::vector<double>(budgets.size(), std::nan(""));
  };
  CHECK_THROWS_AS(kvtier::replay::search_budgets(4, not_a_number, options), kvtier::DataError);
  // Tiny searches still end with a front and a winner.
  options.evaluations = 1;
  const SearchResult one = kvtier::replay::search_budgets(4, analytic_recall, options);
  CHECK(one.evaluated.size() == 1);
  CHECK(one.front.size() == 1);
  // floor == cap: a single possible vector.
  options.evaluations = 50;
  options.bounds = {64, 64};
  const SearchResult fixed = kvtier::replay::search_budgets(4, analytic_recall, options);
  CHECK(fixed.evaluated.size() == 1);
  // The winner at a mean budget limit.
  options.bounds = {};
  options.winner_max_mean = 300;
  const SearchResult limited = kvtier::replay::search_budgets(4, analytic_recall, options);
  CHECK(limited.front[limited.winner].mean_budget <= 300);
  options.winner_max_mean = 10;
  CHECK_THROWS_AS(kvtier::replay::search_budgets(4, analytic_recall, options), kvtier::ConfigError);
}

TEST_CASE("a memory trace replays like its source", "[budget_search]") {
  auto source = kvtier::test::synthetic_attention(3, 20, 30, 9);
  MemoryTrace copy(source);
  CHECK(copy.layers() == 3);
  CHECK(copy.prompt_tokens() == 20);
  CHECK(copy.steps() == 30);
  std::vector<std::vector<float>> a;
  std::vector<std::vector<float>> b;
  for (std::uint64_t step = 0; step < 30; ++step) {
    source.read_step(step, a);
    copy.factory()()->read_step(step, b);
    CHECK(a == b);
  }
  CHECK_THROWS_AS(copy.read_key_norms(0), kvtier::DataError);
}
