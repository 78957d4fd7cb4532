// Every granularity written and read back; partial reads of step and layer ranges.

#include <catch2/catch.hpp>

#include <hdf5.h>

#include <algorithm>

#include <cmath>

#include "sim/random.hpp"
#include "tests/traces/trace_fixture.hpp"
#include "traces/half.hpp"
#include "traces/reader.hpp"

namespace {

using kvtier::test::test_row;
using kvtier::test::tiny_meta;
using kvtier::test::trace_scratch;
namespace traces = kvtier::traces;
namespace config = kvtier::config;

float stored(float value, config::DType dtype) {
  return dtype == config::FP16 ? traces::half_to_float(traces::float_to_half(value)) : value;
}

config::TraceMeta full_meta(config::DType dtype) {
  config::TraceMeta meta =
      tiny_meta(13, 21,
                {config::GRANULARITY_MEAN, config::GRANULARITY_HEADS, config::GRANULARITY_TOP_K,
                 config::GRANULARITY_PREFILL_WINDOW, config::GRANULARITY_KEY_NORMS},
                dtype);
  meta.set_top_k(6);
  meta.set_prefill_window(4);
  return meta;
}

}  // namespace

TEST_CASE("every granularity round-trips exactly (after FP16 rounding)", "[traces]") {
  for (const config::DType dtype : {config::FP16, config::FP32}) {
    INFO("dtype " << config::DType_Name(dtype));
    const auto path = trace_scratch() / ("all_" + config::DType_Name(dtype) + ".h5");
    const config::TraceMeta meta = full_meta(dtype);
    traces::WriterOptions options;
    options.chunk_elements = 50;  // many chunks, rows crossing chunk boundaries
    options.producer = "test";
    options.created = "2026-01-01T00:00:00Z";
    kvtier::test::write_test_trace(path, meta, options);

    const traces::TraceReader reader(path);
    CHECK(reader.producer() == "test");
    CHECK(reader.created() == "2026-01-01T00:00:00Z");
    CHECK(reader.meta().SerializeAsString() == meta.SerializeAsString());
    const traces::TraceShape& shape = reader.shape();
    const std::vector<std::int32_t> tokens = reader.read_tokens();
    REQUIRE(tokens.size() == 34);
    CHECK(tokens[33] == (33 * 37) % 512);

    traces::DenseRows mean;
    traces::HeadRows heads;
    traces::TopKRows topk;
    for (std::uint32_t layer = 0; layer < 5; ++layer) {
      reader.read_mean(layer, {0, shape.steps}, mean);
      reader.read_heads(layer, {0, shape.steps}, heads);
      reader.read_topk(layer, {0, shape.steps}, topk);
      for (std::uint32_t step = 0; step < shape.steps; ++step) {
        const auto n = shape.row_length(step);
        const auto expected = test_row(layer, step, kvtier::test::kMeanHead, n);
        const auto row = mean.row(step);
        REQUIRE(row.size() == n);
        for (std::size_t i = 0; i < n; ++i) {
          REQUIRE(row[i] == stored(expected[i], dtype));
        }
        for (std::uint32_t head = 0; head < shape.heads; ++head) {
          const auto head_expected = test_row(layer, step, head, n);
          const auto head_row = heads.row(head, step);
          for (std::size_t i = 0; i < n; ++i) {
            REQUIRE(head_row[i] == stored(head_expected[i], dtype));
          }
        }
        std::vector<std::int32_t> indices;
        std::vector<float> weights;
        float residual = 0.0F;
        kvtier::test::top_entries(expected, 6, indices, weights, residual);
        for (std::uint32_t i = 0; i < 6; ++i) {
          REQUIRE(topk.indices[step * 6 + i] == indices[i]);
          REQUIRE(topk.weights[step * 6 + i] == stored(weights[i], dtype));
        }
        REQUIRE(topk.residual[step] == residual);
      }
      const std::vector<float> window = reader.read_prefill_window(layer);
      REQUIRE(window.size() == std::size_t{8} * 4 * 13);
      const auto first_query = test_row(layer, 0, 3, 10);  // head 3, query 0 at position 9
      CHECK(window[(3 * 4 + 0) * 13 + 9] == stored(first_query[9], dtype));
      CHECK(window[(3 * 4 + 0) * 13 + 10] == 0.0F);
      const std::vector<float> norms = reader.read_key_norms(layer);
      REQUIRE(norms.size() == std::size_t{4} * 34);
      CHECK(norms[20] == static_cast<float>(layer) + 0.25F * 7);
    }
  }
}

TEST_CASE("partial reads: any step range of any layer", "[traces]") {
  const auto path = trace_scratch() / "partial.h5";
  config::TraceMeta meta = tiny_meta(7, 40, {config::GRANULARITY_MEAN});
  traces::WriterOptions options;
  options.chunk_elements = 64;
  kvtier::test::write_test_trace(path, meta, options);
  const traces::TraceReader reader(path);
  traces::DenseRows rows;
  for (const traces::StepRange range : {traces::StepRange{0, 1}, traces::StepRange{39, 1},
                                        traces::StepRange{5, 17}, traces::StepRange{13, 27}}) {
    reader.read_mean(2, range, rows);
    REQUIRE(rows.offsets.size() == range.count + 1U);
    for (std::uint32_t i = 0; i < range.count; ++i) {
      const std::uint32_t step = range.first + i;
      const auto expected = test_row(2, step, kvtier::test::kMeanHead, 7 + step + 1);
      const auto row = rows.row(i);
      REQUIRE(row.size() == expected.size());
      CHECK(row[row.size() - 1] == stored(expected.back(), config::FP16));
      CHECK(row[0] == stored(expected[0], config::FP16));
    }
  }
  CHECK_THROWS_AS(reader.read_mean(2, {39, 2}, rows), kvtier::DataError);
  CHECK_THROWS_AS(reader.read_mean(5, {0, 1}, rows), kvtier::DataError);
  traces::TopKRows topk;
  CHECK_THROWS_AS(reader.read_topk(0, {0, 1}, topk), kvtier::DataError);

  // Streaming in blocks of at most 100 weights visits each (block, layer) once, in order.
  const auto blocks = reader.plan_blocks({0, 40}, 100);
  for (const auto block : blocks) {
    CHECK((block.count == 1 ||
           reader.shape().row_offset(block.end()) - reader.shape().row_offset(block.first) <= 100));
  }
  std::uint64_t visited = 0;
  std::uint32_t next_step = 0;
  reader.stream_mean({1, 3}, {0, 40}, 100, [&](std::uint32_t layer, const traces::DenseRows& r) {
    CHECK(layer >= 1);
    CHECK(layer <= 3);
    if (layer == 1) {
      CHECK(r.steps.first == next_step);
      next_step = r.steps.end();
    }
    visited += r.steps.count;
  });
  CHECK(visited == std::uint64_t{3} * 40);
}

TEST_CASE("datasets laid out by other tools read the same", "[traces]") {
  // kvtier's own layout takes the fast path; a contiguous or differently chunked dataset (as
  // h5py might write one) goes through HDF5's own reading and must give the same rows.
  const auto path = trace_scratch() / "other_layout.h5";
  config::TraceMeta meta = tiny_meta(9, 14, {config::GRANULARITY_MEAN, config::GRANULARITY_HEADS});
  kvtier::test::write_test_trace(path, meta);
  traces::DenseRows mean_before;
  traces::HeadRows heads_before;
  {
    const traces::TraceReader reader(path);
    reader.read_mean(1, {0, 14}, mean_before);
    reader.read_heads(2, {0, 14}, heads_before);
  }
  const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  REQUIRE(file >= 0);
  const hid_t half = H5Tcopy(H5T_IEEE_F32LE);
  H5Tset_fields(half, 15, 10, 5, 0, 10);
  H5Tset_size(half, 2);
  H5Tset_ebias(half, 15);
  auto replace = [&](const char* name, const std::vector<hsize_t>& dims,
                     const std::vector<hsize_t>& chunk, const std::vector<float>& values) {
    REQUIRE(H5Ldelete(file, name, H5P_DEFAULT) >= 0);
    const hid_t space = H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr);
    const hid_t properties = H5Pcreate(H5P_DATASET_CREATE);
    if (!chunk.empty()) {
      H5Pset_chunk(properties, static_cast<int>(chunk.size()), chunk.data());
      H5Pset_deflate(properties, 4);
    }
    const hid_t set = H5Dcreate2(file, name, half, space, H5P_DEFAULT, properties, H5P_DEFAULT);
    REQUIRE(set >= 0);
    REQUIRE(H5Dwrite(set, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()) >= 0);
    H5Dclose(set);
    H5Pclose(properties);
    H5Sclose(space);
  };
  const hsize_t packed = mean_before.values.size();
  replace("/attention/mean/layer_001", {packed}, {}, mean_before.values);
  replace("/attention/heads/layer_002", {8, packed}, {1, 37}, heads_before.values);
  H5Tclose(half);
  H5Fclose(file);
  const traces::TraceReader reader(path);
  traces::DenseRows mean_after;
  traces::HeadRows heads_after;
  reader.read_mean(1, {3, 9}, mean_after);
  reader.read_heads(2, {3, 9}, heads_after);
  const std::uint64_t base = reader.shape().row_offset(3);
  for (std::size_t i = 0; i < mean_after.values.size(); ++i) {
    REQUIRE(mean_after.values[i] == mean_before.values[base + i]);
  }
  for (std::uint32_t head = 0; head < 8; ++head) {
    for (std::uint32_t step = 0; step < 9; ++step) {
      const auto before = heads_before.row(head, step + 3);
      const auto after = heads_after.row(head, step);
      REQUIRE(std::equal(before.begin(), before.end(), after.begin(), after.end()));
    }
  }
}

TEST_CASE("HDF5's own filters decode the chunks kvtier compresses", "[traces]") {
  // Noisy rows (random mantissas: the low byte plane is stored) and smooth rows (both planes
  // coded), at the fast level 1 and at level 6; HDF5 reads them through its filter pipeline.
  for (const int level : {1, 6}) {
    for (const bool noisy : {true, false}) {
      INFO("level " << level << (noisy ? ", noisy" : ", smooth"));
      const auto path = trace_scratch() /
                        ("filters_" + std::to_string(level) + (noisy ? "_noisy.h5" : "_smooth.h5"));
      const config::TraceMeta meta = tiny_meta(500, 40, {config::GRANULARITY_MEAN});
      traces::WriterOptions options;
      options.deflate_level = level;
      options.chunk_elements = 4096;
      {
        traces::TraceWriter writer(path, meta, options);
        writer.write_tokens(std::vector<std::int32_t>(540, 3));
        kvtier::sim::RandomStream random(5, 0);
        for (std::uint32_t step = 0; step < 40; ++step) {
          for (std::uint32_t layer = 0; layer < 5; ++layer) {
            std::vector<float> row = test_row(layer, step, 0, 501 + step);
            if (noisy) {
              for (float& w : row) {
                w = static_cast<float>(std::pow(10.0, -6.0 + 4.0 * random.uniform_01()));
              }
            }
            writer.append_mean_row(layer, row);
          }
        }
        writer.finish();
      }
      const traces::TraceReader reader(path);
      traces::DenseRows rows;
      reader.read_mean(4, {0, 40}, rows);
      std::vector<float> direct(rows.values.size());
      const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
      const hid_t set = H5Dopen2(file, "/attention/mean/layer_004", H5P_DEFAULT);
      REQUIRE(H5Dread(set, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, direct.data()) >= 0);
      H5Dclose(set);
      H5Fclose(file);
      CHECK(direct == rows.values);
    }
  }
}
