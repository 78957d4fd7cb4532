// Conversions: per-head to mean, dense to top-k, slices, recompression; streamed in blocks.

#include <catch2/catch.hpp>

#include "tests/traces/trace_fixture.hpp"
#include "traces/convert.hpp"
#include "traces/half.hpp"
#include "traces/reader.hpp"
#include "traces/validate.hpp"

namespace {

namespace traces = kvtier::traces;
namespace config = kvtier::config;
using kvtier::test::trace_scratch;

std::filesystem::path source_trace() {
  static const std::filesystem::path path = [] {
    config::TraceMeta meta = kvtier::test::tiny_meta(
        11, 30,
        {config::GRANULARITY_MEAN, config::GRANULARITY_HEADS, config::GRANULARITY_PREFILL_WINDOW,
         config::GRANULARITY_KEY_NORMS});
    meta.set_prefill_window(3);
    auto file = trace_scratch() / "convert_source.h5";
    kvtier::test::write_test_trace(file, meta);
    return file;
  }();
  return path;
}

float half_round(float value) {
  return traces::half_to_float(traces::float_to_half(value));
}

}  // namespace

TEST_CASE("per-head rows average into mean rows", "[traces][convert]") {
  traces::ConvertOptions options;
  options.heads_to_mean = true;
  options.block_elements = 500;  // many blocks
  const auto out = trace_scratch() / "to_mean.h5";
  CHECK(traces::convert_trace(source_trace(), out, options) == "heads -> mean; deflate 1");
  const traces::TraceReader in(source_trace());
  const traces::TraceReader converted(out);
  CHECK(converted.shape().has_mean);
  CHECK_FALSE(converted.shape().has_heads);
  CHECK(converted.meta().source().kind() == config::SOURCE_CONVERTED);
  CHECK(converted.meta().source().converted_from() == "convert_source.h5");
  CHECK(converted.meta().source().original().tool() == "kvtier tests");
  traces::HeadRows heads;
  traces::DenseRows mean;
  for (std::uint32_t layer = 0; layer < 5; ++layer) {
    in.read_heads(layer, {0, 30}, heads);
    converted.read_mean(layer, {0, 30}, mean);
    for (std::uint32_t step = 0; step < 30; ++step) {
      const auto row = mean.row(step);
      for (std::size_t p = 0; p < row.size(); ++p) {
        float sum = 0.0F;
        for (std::uint32_t head = 0; head < 8; ++head) {
          sum += heads.row(head, step)[p];
        }
        REQUIRE(row[p] == half_round(sum / 8.0F));
      }
    }
  }
  CHECK(converted.read_prefill_window(2) == in.read_prefill_window(2));
  CHECK(traces::validate_trace(out).valid());
}

TEST_CASE("dense rows become top-k rows", "[traces][convert]") {
  traces::ConvertOptions options;
  options.top_k = 5;
  options.drop_dense = true;
  const auto out = trace_scratch() / "to_topk.h5";
  (void)traces::convert_trace(source_trace(), out, options);
  const traces::TraceReader in(source_trace());
  const traces::TraceReader converted(out);
  CHECK_FALSE(converted.shape().has_dense());
  REQUIRE(converted.shape().top_k == 5);
  traces::DenseRows mean;
  traces::TopKRows topk;
  std::vector<std::int32_t> indices;
  std::vector<float> weights;
  for (std::uint32_t layer = 0; layer < 5; ++layer) {
    in.read_mean(layer, {0, 30}, mean);
    converted.read_topk(layer, {0, 30}, topk);
    for (std::uint32_t step = 0; step < 30; ++step) {
      const auto row = mean.row(step);
      float residual = 0.0F;
      kvtier::test::top_entries({row.begin(), row.end()}, 5, indices, weights, residual);
      for (std::uint32_t i = 0; i < 5; ++i) {
        REQUIRE(topk.indices[step * 5 + i] == indices[i]);
        REQUIRE(topk.weights[step * 5 + i] == weights[i]);
      }
      REQUIRE(topk.residual[step] == Approx(residual).margin(1e-6));
    }
  }
  CHECK(traces::validate_trace(out).valid());
  // Top-k rows cannot be turned back into dense ones.
  traces::ConvertOptions again;
  again.top_k = 3;
  CHECK_THROWS_AS(traces::convert_trace(out, trace_scratch() / "again.h5", again),
                  kvtier::ConfigError);
  CHECK_FALSE(std::filesystem::exists(trace_scratch() / "again.h5"));
}

TEST_CASE("slicing steps and layers keeps the rows they select", "[traces][convert]") {
  traces::ConvertOptions options;
  options.steps = traces::StepRange{7, 15};
  options.layers = traces::LayerRange{1, 3};
  options.writer.deflate_level = 6;
  options.writer.chunk_elements = 77;
  const auto out = trace_scratch() / "sliced.h5";
  (void)traces::convert_trace(source_trace(), out, options);
  const traces::TraceReader in(source_trace());
  const traces::TraceReader sliced(out);
  const traces::TraceShape& shape = sliced.shape();
  CHECK(shape.prompt_tokens == 18);
  CHECK(shape.steps == 15);
  CHECK(shape.layers.first == 1);
  CHECK(shape.layers.count == 3);
  CHECK_FALSE(shape.has_prefill);  // the prompt changed, so the window no longer applies
  CHECK(shape.has_key_norms);
  const auto tokens = in.read_tokens();
  CHECK(sliced.read_tokens() == std::vector<std::int32_t>(tokens.begin(), tokens.begin() + 33));
  traces::DenseRows original;
  traces::DenseRows kept;
  traces::HeadRows original_heads;
  traces::HeadRows kept_heads;
  for (std::uint32_t layer = 1; layer <= 3; ++layer) {
    in.read_mean(layer, {7, 15}, original);
    sliced.read_mean(layer, {0, 15}, kept);
    CHECK(original.values == kept.values);
    in.read_heads(layer, {7, 15}, original_heads);
    sliced.read_heads(layer, {0, 15}, kept_heads);
    CHECK(original_heads.values == kept_heads.values);
    const auto norms = in.read_key_norms(layer);
    const auto kept_norms = sliced.read_key_norms(layer);
    REQUIRE(kept_norms.size() == std::size_t{4} * 33);
    CHECK(kept_norms[33 + 5] == norms[41 + 5]);  // KV head 1, position 5
  }
  CHECK_THROWS_AS(sliced.read_mean(0, {0, 1}, kept), kvtier::DataError);
  CHECK(traces::validate_trace(out).valid());

  options.steps = traces::StepRange{20, 11};  // past the last step
  CHECK_THROWS_AS(traces::convert_trace(source_trace(), trace_scratch() / "bad.h5", options),
                  kvtier::ConfigError);
}
