// Stage 3 of the budget search: a winner's shape rescaled to any mean budget (REFERENCE.md
// §1.3): exact totals, bounds, the affine map, redistribution, rounding ties, infeasible targets.

#include <catch2/catch.hpp>

#include <numeric>
#include <vector>

#include "common/errors.hpp"
#include "replay/budget_rescale.hpp"
#include "sim/random.hpp"

using kvtier::replay::BudgetBounds;
using kvtier::replay::rescale_budgets;
using Budgets = std::vector<std::uint64_t>;

namespace {

std::uint64_t total(const Budgets& budgets) {
  return std::accumulate(budgets.begin(), budgets.end(), std::uint64_t{0});
}

}  // namespace

TEST_CASE("rescaling hits the exact total inside the bounds for many shapes and targets",
          "[budget_rescale]") {
  kvtier::sim::RandomStream random(7);
  const BudgetBounds bounds;  // 64 .. 4096
  for (const std::size_t layers : {1, 2, 3, 5, 28, 32, 80}) {
    for (int trial = 0; trial < 40; ++trial) {
      // Shapes from flat to extreme: budgets log-uniform over [1, 8192], some layers pinned.
      Budgets shape(layers);
      for (auto& w : shape) {
        w = static_cast<std::uint64_t>(std::exp(random.uniform_01() * std::log(8192.0))) +
            (trial % 5 == 0 ? 0 : 1);
      }
      for (const std::uint64_t target :
           {std::uint64_t{64}, std::uint64_t{65}, std::uint64_t{100}, std::uint64_t{257},
            std::uint64_t{1000}, std::uint64_t{1023}, std::uint64_t{2048}, std::uint64_t{4000},
            std::uint64_t{4095}, std::uint64_t{4096}, 64 + random.uniform_below(4096 - 64 + 1)}) {
        INFO("layers " << layers << ", trial " << trial << ", target " << target);
        const Budgets result = rescale_budgets(shape, target, bounds);
        REQUIRE(result.size() == layers);
        CHECK(total(result) == target * layers);
        for (const std::uint64_t b : result) {
          CHECK(b >= bounds.floor);
          CHECK(b <= bounds.cap);
        }
      }
    }
  }
}

TEST_CASE("rescaling maps the shape affinely, keeping the floor fixed", "[budget_rescale]") {
  // Excess over the floor [0, 64, 128] has mean 64; target 256 needs a mean excess of 192.
  CHECK(rescale_budgets(Budgets{64, 128, 192}, 256) == Budgets{64, 256, 448});
  // And back down.
  CHECK(rescale_budgets(Budgets{64, 256, 448}, 128) == Budgets{64, 128, 192});
  // A uniform shape stays uniform at any target.
  CHECK(rescale_budgets(Budgets(6, 500), 777) == Budgets(6, 777));
  // A shape with no excess over the floor is shifted.
  CHECK(rescale_budgets(Budgets(4, 64), 300) == Budgets(4, 300));
  // The ends of the range.
  CHECK(rescale_budgets(Budgets{64, 128, 4096}, 64) == Budgets(3, 64));
  CHECK(rescale_budgets(Budgets{64, 128, 1000}, 4096) == Budgets(3, 4096));
  // Other bounds.
  CHECK(rescale_budgets(Budgets{16, 32, 48}, 40, {16, 64}) == Budgets{16, 40, 64});
}

TEST_CASE("rescaling clamps to the cap and spreads the remainder over free layers",
          "[budget_rescale]") {
  // The affine map sends layer 2 to ≈5819, clamped to 4096; layer 0 sits at the floor, so the
  // whole remainder goes to layer 1, the only layer not at a bound.
  CHECK(rescale_budgets(Budgets{64, 100, 4000}, 2000) == Budgets{64, 1840, 4096});
  // Both layers at a bound after clamping: the floor layer is the only one that can grow.
  CHECK(rescale_budgets(Budgets{64, 4096}, 3000) == Budgets{1904, 4096});
  // Layer 0 maps below the floor and is raised to it; layer 1 gives up the difference.
  CHECK(rescale_budgets(Budgets{10, 200}, 100) == Budgets{64, 136});
  // The remainder is shared in proportion to the free layers' budgets: scale s = 5744/8408
  // gives [64, 64 + 136s, 64 + 336s, 4096 (clamped)], and the free pair takes 6000 − 64 − 4096.
  const Budgets spread = rescale_budgets(Budgets{64, 200, 400, 8000}, 1500);
  const double scale = 5744.0 / 8408.0;
  const double share = (64 + 136 * scale) / ((64 + 136 * scale) + (64 + 336 * scale));
  CHECK(spread[0] == 64);
  CHECK(spread[3] == 4096);
  CHECK(spread[1] + spread[2] == 1840);
  CHECK(static_cast<double>(spread[1]) == Approx(1840 * share).margin(1.0));
  // A second round: layer 2 passes the cap after the first spread; layer 1 takes the rest.
  CHECK(rescale_budgets(Budgets{64, 200, 400, 8000}, 3000) == Budgets{64, 3744, 4096, 4096});
}

TEST_CASE("largest-remainder rounding, equal fractions to the lower layer", "[budget_rescale]") {
  // Excess [1, 2, 4] scaled by 18/7: [2.571, 5.143, 10.286]; one token short, to layer 0.
  CHECK(rescale_budgets(Budgets{65, 66, 68}, 70) == Budgets{67, 69, 74});
  // Excess [1, 1, 2] scaled by 1.5: [65.5, 65.5, 67]; one token to share between two equal
  // fractions: the lower layer gets it.
  CHECK(rescale_budgets(Budgets{65, 65, 66}, 66) == Budgets{66, 65, 67});
  // Excess [1, 1, 1, 1, 4] scaled by 5/8: four fractions of 0.625 and one of 0.5, three
  // tokens to give: layers 0, 1 and 2.
  CHECK(rescale_budgets(Budgets{65, 65, 65, 65, 68}, 65) == Budgets{65, 65, 65, 64, 66});
}

TEST_CASE("rescaling rejects infeasible targets and bounds", "[budget_rescale]") {
  const Budgets shape{64, 128, 256};
  CHECK_THROWS_AS(rescale_budgets(shape, 63), kvtier::ConfigError);
  CHECK_THROWS_WITH(rescale_budgets(shape, 63), Catch::Contains("infeasible"));
  CHECK_THROWS_AS(rescale_budgets(shape, 4097), kvtier::ConfigError);
  CHECK_THROWS_WITH(rescale_budgets(shape, 4097), Catch::Contains("cap 4096"));
  CHECK_THROWS_AS(rescale_budgets(shape, 100, {0, 4096}), kvtier::ConfigError);
  CHECK_THROWS_AS(rescale_budgets(shape, 100, {200, 100}), kvtier::ConfigError);
  CHECK_THROWS_AS(rescale_budgets(shape, 100, {64, std::uint64_t{1} << 40}), kvtier::ConfigError);
  CHECK_THROWS_AS(rescale_budgets(Budgets{}, 100), kvtier::ConfigError);
  // floor == cap: only that mean is feasible.
  CHECK(rescale_budgets(shape, 100, {100, 100}) == Budgets(3, 100));
  CHECK_THROWS_AS(rescale_budgets(shape, 101, {100, 100}), kvtier::ConfigError);
}
