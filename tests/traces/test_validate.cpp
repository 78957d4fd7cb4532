// `validate_trace`: every value problem is found and placed; valid traces pass.

#include <catch2/catch.hpp>

#include "tests/traces/trace_fixture.hpp"
#include "traces/validate.hpp"
#include "traces/writer.hpp"

namespace {

namespace traces = kvtier::traces;
namespace config = kvtier::config;
using kvtier::test::test_row;
using kvtier::test::tiny_meta;
using kvtier::test::trace_scratch;

bool mentions(const traces::ValidationReport& report, const std::string& what,
              const std::string& where) {
  for (const auto& problem : report.problems) {
    if (problem.what.find(what) != std::string::npos &&
        problem.where.find(where) != std::string::npos) {
      return true;
    }
  }
  return false;
}

}  // namespace

TEST_CASE("a valid trace of every granularity passes", "[traces][validate]") {
  for (const config::DType dtype : {config::FP16, config::FP32}) {
    config::TraceMeta meta =
        tiny_meta(20, 15,
                  {config::GRANULARITY_MEAN, config::GRANULARITY_HEADS, config::GRANULARITY_TOP_K,
                   config::GRANULARITY_PREFILL_WINDOW, config::GRANULARITY_KEY_NORMS},
                  dtype);
    meta.set_top_k(40);  // longer than the first rows: padded
    meta.set_prefill_window(5);
    const auto path = trace_scratch() / ("valid_" + config::DType_Name(dtype) + ".h5");
    kvtier::test::write_test_trace(path, meta);
    const traces::ValidationReport report = traces::validate_trace(path);
    for (const auto& problem : report.problems) {
      UNSCOPED_INFO(problem.what << " (" << problem.where << ")");
    }
    CHECK(report.valid());
    // mean + heads + top-k rows per layer, plus the prefill queries of every head.
    CHECK(report.rows_checked == std::uint64_t{5} * (15 + 8 * 15 + 15 + 8 * 5));
  }
}

TEST_CASE("bad rows, tokens and top-k entries are each reported with their place",
          "[traces][validate]") {
  config::TraceMeta meta = tiny_meta(6, 30, {config::GRANULARITY_MEAN, config::GRANULARITY_TOP_K});
  meta.set_top_k(3);
  const auto path = trace_scratch() / "bad_values.h5";
  {
    traces::TraceWriter writer(path, meta);
    std::vector<std::int32_t> tokens(36, 5);
    tokens[7] = 512;  // vocabulary is 0..511
    tokens[8] = -1;
    writer.write_tokens(tokens);
    for (std::uint32_t step = 0; step < 30; ++step) {
      for (std::uint32_t layer = 0; layer < 5; ++layer) {
        std::vector<float> row = test_row(layer, step, 0, 7 + step);
        if (layer == 2) {
          for (float& w : row) {
            w *= 0.5F;  // every row of layer 2 sums to 0.5
          }
        }
        if (layer == 3 && step == 4) {
          row[0] = -row[0];
        }
        writer.append_mean_row(layer, row);
        std::vector<std::int32_t> indices = {0, 1, 2};
        std::vector<float> weights = {row[0], row[1], row[2]};
        float residual = 0.0F;
        for (std::size_t i = 3; i < row.size(); ++i) {
          residual += row[i];
        }
        if (layer == 0 && step == 9) {
          indices[2] = 1;  // duplicate
        }
        if (layer == 1 && step == 11) {
          indices[1] = 7 + 11;  // one past the row's last position
        }
        writer.append_topk_row(layer, indices, weights, residual);
      }
    }
    writer.finish();
  }
  traces::ValidationOptions options;
  options.max_listed_per_kind = 5;
  const traces::ValidationReport report = traces::validate_trace(path, options);
  CHECK_FALSE(report.valid());
  CHECK(mentions(report, "token 512 is outside the vocabulary", "/tokens, position 7"));
  CHECK(mentions(report, "token -1 is outside", "/tokens, position 8"));
  CHECK(mentions(report, "row sums to 0.49", "/attention/mean/layer_002, step 0"));
  CHECK(mentions(report, "negative weight", "/attention/mean/layer_003, step 4"));
  CHECK(mentions(report, "distinct positions", "/attention/topk/layer_000/indices, step 9"));
  CHECK(mentions(report, "distinct positions", "/attention/topk/layer_001/indices, step 11"));
  // Layer 2: 30 bad mean rows and 30 bad top-k rows; 5 of each listed, the rest counted.
  CHECK(report.unlisted_problems == 25 + 25);
  const traces::InvalidTrace error(report);
  CHECK(error.exit_code() == kvtier::ExitCode::kBadData);
  CHECK(error.lines().size() == report.problems.size() + 1);
  for (const auto& line : error.lines()) {
    CHECK_THAT(line, Catch::StartsWith("kvtier: error: "));
  }
}
