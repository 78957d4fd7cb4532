// Format stability: tests/data/trace_v1_golden.h5 (made as tests/data/README.md says) must
// keep reading with the same meta and the same values, whatever changes in the code.

#include <catch2/catch.hpp>

#include <cmath>
#include <numeric>
#include <string>

#include "tests/support/paths.hpp"
#include "traces/reader.hpp"
#include "traces/validate.hpp"

namespace {

namespace traces = kvtier::traces;
namespace config = kvtier::config;

const std::string kGolden =
    std::string(kvtier::test::source_dir()) + "/tests/data/trace_v1_golden.h5";

// Sum of a span in double, to compare whole datasets with one number.
double total(std::span<const float> values) {
  return std::accumulate(values.begin(), values.end(), 0.0);
}

}  // namespace

TEST_CASE("the golden v1 trace reads as it always did", "[traces][golden]") {
  const traces::TraceReader reader(kGolden);
  CHECK(reader.created() == "2026-01-01T00:00:00Z");
  CHECK_THAT(reader.producer(), Catch::StartsWith("kvtier 0.1.0"));
  const config::TraceMeta& meta = reader.meta();
  CHECK(meta.model().name() == "stories260K");
  CHECK(meta.prompt_tokens() == 24);
  CHECK(meta.steps() == 16);
  CHECK(meta.top_k() == 8);
  CHECK(meta.prefill_window() == 4);
  CHECK(meta.source().kind() == config::SOURCE_SYNTHETIC);
  CHECK(meta.source().synthetic().pattern() == "reasoning");
  CHECK(meta.source().synthetic().seed() == 42);
  const traces::TraceShape& shape = reader.shape();
  CHECK(shape.has_mean);
  CHECK(shape.has_heads);
  CHECK(shape.has_topk);
  CHECK(shape.has_prefill);
  CHECK(shape.has_key_norms);
  CHECK(shape.packed_elements() == 520);

  const std::vector<std::int32_t> tokens = reader.read_tokens();
  REQUIRE(tokens.size() == 40);
  traces::DenseRows mean;
  traces::HeadRows heads;
  traces::TopKRows topk;
  reader.read_mean(2, {0, 16}, mean);
  reader.read_heads(3, {5, 7}, heads);
  reader.read_topk(0, {15, 1}, topk);
  const std::vector<float> window = reader.read_prefill_window(1);
  const std::vector<float> norms = reader.read_key_norms(4);
  // Values as the file holds them (exact: hexadecimal floats, sums taken in double).
  CHECK(tokens[0] == 498);
  CHECK(tokens[1] == 460);
  CHECK(tokens[39] == 255);
  CHECK(total(mean.values) == 0x1.fffe6p+3);
  CHECK(mean.values[0] == 0x1.1c8p-4F);
  CHECK(mean.values[519] == 0x1.64cp-5F);
  CHECK(total(heads.values) == 0x1.c0001p+5);
  CHECK(heads.row(2, 3)[10] == 0x1.f44p-7F);
  CHECK(topk.indices[0] == 3);
  CHECK(topk.indices[7] == 37);
  CHECK(topk.weights[0] == 0x1.eecp-5F);
  CHECK(topk.residual[0] == 0x1.35b414p-1F);
  CHECK(total(window) == 0x1.000178p+5);
  CHECK(window[(1 * 4 + 3) * 24 + 23] == 0x1.388p-4F);
  CHECK(total(norms) == 0x1.726c557p+10);
  CHECK(norms[5] == 0x1.2e5e4ep+3F);
  CHECK(traces::validate_trace(kGolden).valid());
}
