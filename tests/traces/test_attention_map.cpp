// Attention maps (`kvtier trace info --format html`): each cell the mass on its positions,
// averaged over the steps read for its row; empty past the causal edge.

#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

#include "common/errors.hpp"
#include "tests/traces/trace_fixture.hpp"
#include "traces/attention_map.hpp"
#include "traces/reader.hpp"

namespace {

using kvtier::test::kMeanHead;
using kvtier::test::test_row;

// Σ of test_row(layer, step)'s weights at positions [from, to), those past the row excluded.
double row_mass(std::uint32_t layer, std::uint32_t step, std::uint64_t length, std::uint64_t from,
                std::uint64_t to) {
  const std::vector<float> row = test_row(layer, step, kMeanHead, length);
  double mass = 0.0;
  for (std::uint64_t p = from; p < std::min(to, length); ++p) {
    mass += static_cast<double>(row[p]);
  }
  return mass;
}

}  // namespace

TEST_CASE("an attention map's cells are the mass on their positions, averaged over the steps read",
          "[traces]") {
  // 10 prompt tokens and 6 steps: 16 positions in 4 columns of 4, 3 rows of 2 steps.
  const auto path = kvtier::test::trace_scratch() / "map.h5";
  kvtier::test::write_test_trace(
      path,
      kvtier::test::tiny_meta(10, 6, {kvtier::config::GRANULARITY_MEAN}, kvtier::config::FP32));
  const kvtier::traces::TraceReader reader(path);
  const auto map = kvtier::traces::attention_map(reader, 2, {3, 4, 4});
  REQUIRE(map.step_bins == 3);
  REQUIRE(map.position_bins == 4);
  CHECK(map.steps_per_bin == 2);
  CHECK(map.positions_per_bin == 4);
  CHECK_FALSE(map.from_topk);
  for (std::uint32_t row = 0; row < 3; ++row) {
    const std::uint32_t first = 2 * row;
    const std::uint64_t reach = 10 + first + 2;  // the row's later step's length
    double total = 0.0;
    for (std::uint32_t column = 0; column < 4; ++column) {
      INFO("row " << row << ", column " << column);
      if (column * 4 >= reach) {
        CHECK(std::isnan(map.at(row, column)));
        continue;
      }
      double expected = 0.0;
      for (const std::uint32_t step : {first, first + 1}) {
        expected += row_mass(2, step, 10 + step + 1, column * 4, column * 4 + 4) / 2.0;
      }
      CHECK(map.at(row, column) == Approx(expected).epsilon(1e-12));
      total += map.at(row, column);
    }
    CHECK(total == Approx(1.0).epsilon(1e-6));
  }
  // Rows of the first two steps reach 12 positions: their last column is empty.
  CHECK(std::isnan(map.at(0, 3)));
  CHECK_FALSE(std::isnan(map.at(2, 3)));
}

TEST_CASE("an attention map of top-k rows places their entries and leaves out the residual",
          "[traces]") {
  const auto path = kvtier::test::trace_scratch() / "map-topk.h5";
  auto meta = kvtier::test::tiny_meta(12, 8, {kvtier::config::GRANULARITY_TOP_K});
  meta.set_top_k(4);
  kvtier::test::write_test_trace(path, meta);
  const kvtier::traces::TraceReader reader(path);
  const auto map = kvtier::traces::attention_map(reader, 0, {8, 20, 1});
  CHECK(map.from_topk);
  for (std::uint32_t row = 0; row < map.step_bins; ++row) {
    double total = 0.0;
    for (std::uint32_t column = 0; column < map.position_bins; ++column) {
      total += std::isnan(map.at(row, column)) ? 0.0 : map.at(row, column);
    }
    CHECK(total > 0.0);
    CHECK(total < 1.0);  // four entries of a row of 13 or more
  }
}

TEST_CASE("an attention map refuses a layer outside the trace and empty bins", "[traces]") {
  const auto path = kvtier::test::trace_scratch() / "map-refused.h5";
  kvtier::test::write_test_trace(path,
                                 kvtier::test::tiny_meta(4, 2, {kvtier::config::GRANULARITY_MEAN}));
  const kvtier::traces::TraceReader reader(path);
  CHECK_THROWS_AS(kvtier::traces::attention_map(reader, 5), kvtier::DataError);
  CHECK_THROWS_AS(kvtier::traces::attention_map(reader, 0, {0, 4, 1}), kvtier::ConfigError);
}
