#include <catch2/catch.hpp>

#include <stdexcept>
#include <vector>

#include "sim/max_min_fair.hpp"

using kvtier::sim::max_min_fair_rates;
using Paths = std::vector<std::vector<std::uint32_t>>;

TEST_CASE("flows alone on a link share it equally", "[sim][maxmin]") {
  const std::vector<double> capacity{12.0};
  CHECK(max_min_fair_rates(capacity, Paths{{0}, {0}, {0}}) == std::vector<double>{4, 4, 4});
}

TEST_CASE("three flows over two links get the textbook max-min allocation", "[sim][maxmin]") {
  // Link 0 (capacity 10) carries flows 0 and 1; link 1 (capacity 16) carries flows 0 and 2.
  // Link 0 is the bottleneck at 5 each; flow 2 then takes the 16 − 5 = 11 left on link 1.
  const std::vector<double> capacity{10.0, 16.0};
  CHECK(max_min_fair_rates(capacity, Paths{{0, 1}, {0}, {1}}) == std::vector<double>{5, 5, 11});
}

TEST_CASE("a chain of bottlenecks fills level by level", "[sim][maxmin]") {
  // Bertsekas & Gallager-style line: links A(1), B(2), C(10). Flow 0 crosses all three,
  // flow 1 uses A, flow 2 uses B, flow 3 uses C. A freezes flows 0 and 1 at 0.5; B has 1.5 left
  // for flow 2; C has 9.5 left for flow 3.
  const std::vector<double> capacity{1.0, 2.0, 10.0};
  CHECK(max_min_fair_rates(capacity, Paths{{0, 1, 2}, {0}, {1}, {2}}) ==
        std::vector<double>{0.5, 0.5, 1.5, 9.5});
}

TEST_CASE("no link is oversubscribed and every flow is limited by a full link", "[sim][maxmin]") {
  const std::vector<double> capacity{7.0, 3.0, 11.0, 5.0};
  const Paths paths{{0, 1}, {1, 2}, {2, 3}, {0, 3}, {2}, {0, 2, 3}};
  const std::vector<double> rates = max_min_fair_rates(capacity, paths);
  std::vector<double> load(capacity.size(), 0.0);
  for (std::size_t f = 0; f < paths.size(); ++f) {
    for (const auto link : paths[f]) {
      load[link] += rates[f];
    }
  }
  for (std::size_t l = 0; l < capacity.size(); ++l) {
    CHECK(load[l] <= capacity[l] * (1 + 1e-12));
  }
  // Max-min optimality: each flow crosses a saturated link on which it has the largest rate.
  for (std::size_t f = 0; f < paths.size(); ++f) {
    bool has_bottleneck = false;
    for (const auto link : paths[f]) {
      bool largest = true;
      for (std::size_t g = 0; g < paths.size(); ++g) {
        for (const auto other : paths[g]) {
          largest = largest && !(other == link && rates[g] > rates[f] * (1 + 1e-12));
        }
      }
      has_bottleneck = has_bottleneck || (load[link] >= capacity[link] * (1 - 1e-12) && largest);
    }
    CHECK(has_bottleneck);
  }
}

TEST_CASE("max-min inputs are checked", "[sim][maxmin]") {
  CHECK_THROWS_AS(max_min_fair_rates(std::vector<double>{1.0}, Paths{{}}), std::invalid_argument);
  CHECK_THROWS_AS(max_min_fair_rates(std::vector<double>{1.0}, Paths{{1}}), std::invalid_argument);
  CHECK_THROWS_AS(max_min_fair_rates(std::vector<double>{0.0}, Paths{{0}}), std::invalid_argument);
  CHECK(max_min_fair_rates(std::vector<double>{1.0}, Paths{}).empty());
}
