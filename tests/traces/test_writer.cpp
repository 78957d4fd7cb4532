// Writer contract: rows checked as they come, nothing left behind unless finished, same
// content gives the same bytes.

#include <catch2/catch.hpp>

#include <hdf5.h>
#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

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

// The stored bytes of the chunk of `dataset` at `offset`, inflated when deflate was applied, then
// unshuffled (elements of `element_bytes`): what the chunk held before the filters.
std::vector<unsigned char> chunk_bytes(const std::filesystem::path& path,
                                       const std::string& dataset, hsize_t offset,
                                       std::size_t chunk_bytes, std::size_t element_bytes,
                                       bool filtered) {
  const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  REQUIRE(file >= 0);
  const hid_t data = H5Dopen2(file, dataset.c_str(), H5P_DEFAULT);
  REQUIRE(data >= 0);
  const hsize_t offsets[1] = {offset};
  hsize_t stored = 0;
  REQUIRE(H5Dget_chunk_storage_size(data, offsets, &stored) >= 0);
  std::vector<unsigned char> raw(stored);
  std::uint32_t mask = 0;
  REQUIRE(H5Dread_chunk(data, H5P_DEFAULT, offsets, &mask, raw.data()) >= 0);
  H5Dclose(data);
  H5Fclose(file);
  if (!filtered) {
    return raw;
  }
  std::vector<unsigned char> shuffled(chunk_bytes);
  if ((mask & 2U) == 0) {  // deflated
    uLongf size = chunk_bytes;
    REQUIRE(uncompress(shuffled.data(), &size, raw.data(), raw.size()) == Z_OK);
    REQUIRE(size == chunk_bytes);
  } else {
    REQUIRE(raw.size() == chunk_bytes);
    shuffled = raw;
  }
  std::vector<unsigned char> plain(chunk_bytes);
  const std::size_t elements = chunk_bytes / element_bytes;
  for (std::size_t i = 0; i < elements; ++i) {
    for (std::size_t k = 0; k < element_bytes; ++k) {
      plain[i * element_bytes + k] = shuffled[k * elements + i];
    }
  }
  return plain;
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

TEST_CASE("a trace that cannot be created says why", "[traces]") {
  const auto folder = trace_scratch() / "writer_uncreatable";
  std::filesystem::create_directories(folder);
  const auto file = folder / "a-file";
  std::ofstream(file) << "not a folder";
  const config::TraceMeta meta = tiny_meta(4, 2, {config::GRANULARITY_MEAN});
  // Its folder cannot be made: a file stands where a folder of its path would be.
  CHECK_THROWS_WITH(traces::TraceWriter(file / "below" / "t.h5", meta),
                    Catch::Contains("cannot create the trace file's folder") &&
                        Catch::Contains("Not a directory"));
  CHECK_THROWS_WITH(traces::TraceWriter(file / "t.h5", meta),
                    Catch::Contains("cannot create the trace file's folder"));
  // The file itself cannot be made (a name longer than any file system allows): the operating
  // system's reason.
  CHECK_THROWS_WITH(
      traces::TraceWriter(folder / (std::string(300, 'n') + ".h5"), meta),
      Catch::Contains("cannot create the trace file (system error: File name too long)"));
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

TEST_CASE("every granularity, many small chunks: the same bytes whatever the threads", "[traces]") {
  // Prefill windows and key norms are written after the rows, as `trace synth` does, while
  // chunks of rows may still be compressing: the file must not depend on when they finish.
  const config::TraceMeta meta = [] {
    config::TraceMeta m =
        tiny_meta(6, 40,
                  {config::GRANULARITY_MEAN, config::GRANULARITY_HEADS, config::GRANULARITY_TOP_K,
                   config::GRANULARITY_PREFILL_WINDOW, config::GRANULARITY_KEY_NORMS});
    m.set_top_k(4);
    m.set_prefill_window(3);
    return m;
  }();
  for (const int level : {0, 1, 6}) {
    for (const std::uint32_t chunk : {37U, 200U, 65536U}) {
      traces::WriterOptions options;
      options.created = "2026-01-01T00:00:00Z";
      options.deflate_level = level;
      options.chunk_elements = chunk;
      std::string first;
      for (const unsigned threads : {0U, 1U, 3U, 6U}) {
        INFO("level " << level << ", chunk " << chunk << ", threads " << threads);
        options.compression_threads = threads;
        const auto path = trace_scratch() / "threads.h5";
        kvtier::test::write_test_trace(path, meta, options);
        if (threads == 0) {
          first = bytes_of(path);
        } else {
          CHECK(bytes_of(path) == first);
        }
      }
    }
  }
}

TEST_CASE("reused chunk buffers: rows read back exactly and edge chunks are zero-padded",
          "[traces]") {
  // Mean rows of random weights (full-entropy FP16 chunks, stored without deflate at level 1)
  // and of smooth ones, over many small chunks of five layers: every chunk but the first
  // reuses the buffers of one already written, so stale bytes would show in the rows read back
  // or in the padding of the last chunk.
  const std::uint32_t steps = 64;
  const config::TraceMeta meta = tiny_meta(3, steps, {config::GRANULARITY_MEAN});
  for (const int level : {0, 1, 6}) {
    for (const unsigned threads : {0U, 2U}) {
      INFO("level " << level << ", threads " << threads);
      traces::WriterOptions options;
      options.deflate_level = level;
      options.chunk_elements = 96;
      options.compression_threads = threads;
      const auto path = trace_scratch() / "reuse.h5";
      std::mt19937 random(11);
      std::uniform_real_distribution<float> uniform(0.0F, 1.0F);
      std::vector<std::vector<std::vector<float>>> written(5);
      {
        traces::TraceWriter writer(path, meta, options);
        const traces::TraceShape& shape = writer.shape();
        writer.write_tokens(std::vector<std::int32_t>(shape.tokens(), 1));
        for (std::uint32_t step = 0; step < steps; ++step) {
          for (std::uint32_t layer = 0; layer < 5; ++layer) {
            std::vector<float> row = kvtier::test::test_row(layer, step, 0, shape.row_length(step));
            if ((step + layer) % 3 != 0) {
              for (float& weight : row) {
                weight = uniform(random) / static_cast<float>(row.size());
              }
            }
            writer.append_mean_row(layer, row);
            written[layer].push_back(std::move(row));
          }
        }
        writer.finish();
      }
      const traces::TraceReader reader(path);
      const traces::TraceShape& shape = reader.shape();
      traces::DenseRows rows;
      for (std::uint32_t layer = 0; layer < 5; ++layer) {
        reader.read_mean(layer, {0, steps}, rows);
        for (std::uint32_t step = 0; step < steps; ++step) {
          const std::span<const float> row = rows.row(step);
          REQUIRE(row.size() == written[layer][step].size());
          for (std::size_t i = 0; i < row.size(); ++i) {
            // FP16 keeps 11 significant bits: within 2^-11 relative.
            REQUIRE(std::abs(row[i] - written[layer][step][i]) <=
                    written[layer][step][i] / 2048.0F + 1e-7F);
          }
        }
        // The last chunk: zeros past the dataset's end.
        const std::uint64_t packed = shape.packed_elements();
        const std::uint64_t last = (packed - 1) / options.chunk_elements * options.chunk_elements;
        const std::vector<unsigned char> chunk =
            chunk_bytes(path, traces::mean_path(layer), last,
                        std::size_t{options.chunk_elements} * 2, 2, level > 0);
        const std::size_t used = (packed - last) * 2;
        REQUIRE(used < chunk.size());
        CHECK(std::all_of(chunk.begin() + static_cast<std::ptrdiff_t>(used), chunk.end(),
                          [](unsigned char byte) { return byte == 0; }));
      }
    }
  }
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
