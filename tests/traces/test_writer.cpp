// Writer contract: rows checked as they come, nothing left behind unless finished, same
// content gives the same bytes.

#include <catch2/catch.hpp>

#include <fstream>
#include <iterator>

#include "tests/traces/trace_fixture.hpp"
#include "traces/reader.hpp"
#include "traces/writer.hpp"

namespace {

namespace traces = kvtier::traces;
namespace config = kvtier::config;
using kvtier::test::tiny_meta;
using kvtier::test::trace_scratch;

std::string bytes_of(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

bool folder_has_temporaries(const std::filesystem::path& folder) {
  for (const auto& entry : std::filesystem::directory_iterator(folder)) {
    if (entry.path().string().find(".tmp.") != std::string::npos) {
      return true;
    }
  }
  return false;
}

}  // namespace

TEST_CASE("rows of the wrong length or beyond the last step are refused", "[traces]") {
  const auto folder = trace_scratch() / "writer_errors";
  const auto path = folder / "t.h5";
  {
    traces::TraceWriter writer(path, tiny_meta(4, 2, {config::GRANULARITY_MEAN}));
    CHECK_THROWS_AS(writer.append_mean_row(0, std::vector<float>(4, 0.25F)), kvtier::Error);
    CHECK_NOTHROW(writer.append_mean_row(0, kvtier::test::test_row(0, 0, 0, 5)));
    CHECK_THROWS_AS(writer.append_mean_row(7, kvtier::test::test_row(0, 1, 0, 6)), kvtier::Error);
    std::vector<float> heads(std::size_t{8} * 6, 0.0F);
    CHECK_THROWS_AS(writer.append_head_rows(0, heads), kvtier::Error);  // no heads granularity
    CHECK_THROWS_WITH(writer.finish(), Catch::Contains("tokens were never written"));
  }
  // Abandoned: neither the trace nor a temporary file is left.
  CHECK_FALSE(std::filesystem::exists(path));
  CHECK_FALSE(folder_has_temporaries(folder));
}

TEST_CASE("an incomplete trace is never renamed into place", "[traces]") {
  const auto folder = trace_scratch() / "writer_incomplete";
  const auto path = folder / "t.h5";
  {
    traces::TraceWriter writer(path, tiny_meta(4, 3, {config::GRANULARITY_MEAN}));
    writer.write_tokens(std::vector<std::int32_t>(7, 1));
    for (std::uint32_t layer = 0; layer < 5; ++layer) {
      writer.append_mean_row(layer, kvtier::test::test_row(layer, 0, 0, 5));
    }
    CHECK_THROWS_WITH(writer.finish(), Catch::Contains("incomplete dataset"));
  }
  CHECK_FALSE(std::filesystem::exists(path));
  CHECK_FALSE(folder_has_temporaries(folder));
}

TEST_CASE("invalid meta is refused before any file is made", "[traces]") {
  const auto path = trace_scratch() / "bad_meta.h5";
  config::TraceMeta meta = tiny_meta(4, 3, {config::GRANULARITY_TOP_K});  // no top_k value
  CHECK_THROWS_WITH(traces::TraceWriter(path, meta), Catch::Contains("top_k"));
  meta = tiny_meta(4, 3, {config::GRANULARITY_MEAN});
  meta.set_num_layers(9);  // the model has 5
  CHECK_THROWS_WITH(traces::TraceWriter(path, meta), Catch::Contains("layers"));
  meta = tiny_meta(4, 3, {config::GRANULARITY_MEAN});
  meta.clear_source();
  CHECK_THROWS_AS(traces::TraceWriter(path, meta), kvtier::DataError);
  CHECK_FALSE(std::filesystem::exists(path));
}

TEST_CASE("the same content gives byte-identical files, whatever the threads", "[traces]") {
  const config::TraceMeta meta =
      tiny_meta(9, 12, {config::GRANULARITY_MEAN, config::GRANULARITY_HEADS});
  traces::WriterOptions options;
  options.created = "2026-01-01T00:00:00Z";
  options.chunk_elements = 100;
  const auto first = trace_scratch() / "same_1.h5";
  const auto second = trace_scratch() / "same_2.h5";
  const auto threaded = trace_scratch() / "same_3.h5";
  options.compression_threads = 0;  // compressed on this thread
  kvtier::test::write_test_trace(first, meta, options);
  kvtier::test::write_test_trace(second, meta, options);
  options.compression_threads = 3;  // compressed on three workers, written in order
  kvtier::test::write_test_trace(threaded, meta, options);
  CHECK(bytes_of(first) == bytes_of(second));
  CHECK(bytes_of(first) == bytes_of(threaded));
}

TEST_CASE("uncompressed and compressed traces hold the same rows", "[traces]") {
  const config::TraceMeta meta = tiny_meta(9, 12, {config::GRANULARITY_MEAN});
  traces::WriterOptions plain;
  plain.deflate_level = 0;
  traces::WriterOptions packed;
  packed.deflate_level = 9;
  packed.chunk_elements = 16;
  kvtier::test::write_test_trace(trace_scratch() / "plain.h5", meta, plain);
  kvtier::test::write_test_trace(trace_scratch() / "packed.h5", meta, packed);
  const traces::TraceReader a(trace_scratch() / "plain.h5");
  const traces::TraceReader b(trace_scratch() / "packed.h5");
  traces::DenseRows rows_a;
  traces::DenseRows rows_b;
  a.read_mean(3, {0, 12}, rows_a);
  b.read_mean(3, {0, 12}, rows_b);
  CHECK(rows_a.values == rows_b.values);
}
