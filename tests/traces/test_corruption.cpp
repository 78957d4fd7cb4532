// Each class of bad input is refused with one DataError naming the file and the dataset, and
// `validate_trace` reports it instead of throwing.

#include <catch2/catch.hpp>

#include <hdf5.h>
#include <zlib.h>

#include <cmath>
#include <fstream>
#include <iterator>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "tests/traces/trace_fixture.hpp"
#include "traces/attention_map.hpp"
#include "traces/half.hpp"
#include "traces/reader.hpp"
#include "traces/validate.hpp"

namespace {

namespace traces = kvtier::traces;
namespace config = kvtier::config;
namespace fs = std::filesystem;
using kvtier::test::trace_scratch;

config::TraceMeta corruptible_meta() {
  config::TraceMeta meta =
      kvtier::test::tiny_meta(6, 10, {config::GRANULARITY_MEAN, config::GRANULARITY_TOP_K});
  meta.set_top_k(4);
  return meta;
}

// A fresh valid trace to damage.
fs::path fresh(const std::string& name) {
  fs::path path = trace_scratch() / (name + ".h5");
  traces::WriterOptions options;
  options.chunk_elements = 32;
  kvtier::test::write_test_trace(path, corruptible_meta(), options);
  return path;
}

// Opens with the HDF5 library directly to damage one thing.
class RawFile {
 public:
  explicit RawFile(const fs::path& path) : id_(H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT)) {
    REQUIRE(id_ >= 0);
  }
  ~RawFile() { H5Fclose(id_); }
  RawFile(const RawFile&) = delete;
  RawFile& operator=(const RawFile&) = delete;
  [[nodiscard]] hid_t id() const { return id_; }

  void write_element(const char* dataset, hid_t memory_type, hsize_t index,
                     const void* value) const {
    const hid_t set = H5Dopen2(id_, dataset, H5P_DEFAULT);
    REQUIRE(set >= 0);
    const hid_t space = H5Dget_space(set);
    const hsize_t one = 1;
    REQUIRE(H5Sselect_hyperslab(space, H5S_SELECT_SET, &index, nullptr, &one, nullptr) >= 0);
    const hid_t memory = H5Screate_simple(1, &one, nullptr);
    REQUIRE(H5Dwrite(set, memory_type, memory, space, H5P_DEFAULT, value) >= 0);
    H5Sclose(memory);
    H5Sclose(space);
    H5Dclose(set);
  }

  void replace_root_uint(const char* name, std::uint32_t value) const {
    REQUIRE(H5Adelete(id_, name) >= 0);
    const hid_t space = H5Screate(H5S_SCALAR);
    const hid_t attribute = H5Acreate2(id_, name, H5T_STD_U32LE, space, H5P_DEFAULT, H5P_DEFAULT);
    REQUIRE(H5Awrite(attribute, H5T_NATIVE_UINT32, &value) >= 0);
    H5Aclose(attribute);
    H5Sclose(space);
  }

  void replace_meta(const std::string& bytes) const {
    REQUIRE(H5Ldelete(id_, "/meta", H5P_DEFAULT) >= 0);
    const hsize_t size = bytes.size();
    const hid_t space = H5Screate_simple(1, &size, nullptr);
    const hid_t set =
        H5Dcreate2(id_, "/meta", H5T_STD_U8LE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    REQUIRE(H5Dwrite(set, H5T_NATIVE_UCHAR, H5S_ALL, H5S_ALL, H5P_DEFAULT, bytes.data()) >= 0);
    H5Dclose(set);
    H5Sclose(space);
  }

 private:
  hid_t id_;
};

// Opening must fail with one DataError whose place names the file and `dataset`.
void expect_refused(const fs::path& path, const std::string& dataset, const std::string& what) {
  try {
    const traces::TraceReader reader(path);
    FAIL("the reader accepted " << path);
  } catch (const kvtier::DataError& error) {
    INFO(error.what() << " (" << error.where() << ")");
    CHECK_THAT(error.where(), Catch::Contains(path.string()) && Catch::Contains(dataset));
    CHECK_THAT(error.what(), Catch::Contains(what));
    CHECK(error.lines().size() == 1);
  }
  const traces::ValidationReport report = traces::validate_trace(path);
  CHECK_FALSE(report.valid());
}

}  // namespace

TEST_CASE("not an HDF5 file", "[traces][corruption]") {
  const fs::path path = trace_scratch() / "text.h5";
  std::ofstream(path) << "this is not a trace\n";
  expect_refused(path, "", "not an HDF5 file");
  expect_refused(trace_scratch() / "absent.h5", "", "no such trace file");
}

TEST_CASE("truncated file", "[traces][corruption]") {
  const fs::path path = fresh("truncated");
  const auto size = fs::file_size(path);
  for (const auto keep : {size / 2, size - 100, std::uintmax_t{600}}) {
    INFO("kept " << keep << " of " << size << " bytes");
    fs::resize_file(path, keep);
    try {
      const traces::TraceReader reader(path);
      traces::DenseRows rows;
      for (std::uint32_t layer = 0; layer < 5; ++layer) {
        reader.read_mean(layer, {0, 10}, rows);
      }
      FAIL("a truncated trace was read whole");
    } catch (const kvtier::DataError& error) {
      CHECK_THAT(error.where(), Catch::Contains(path.string()));
    }
  }
}

TEST_CASE("another format or an unknown version", "[traces][corruption]") {
  const fs::path version = fresh("version");
  RawFile(version).replace_root_uint("version", 2);
  expect_refused(version, "root attributes", "unsupported trace format version 2");

  const fs::path plain = trace_scratch() / "plain_hdf5.h5";
  H5Fclose(H5Fcreate(plain.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT));
  expect_refused(plain, "root attributes", "not a kvtier attention trace");
}

TEST_CASE("missing or unreadable /meta", "[traces][corruption]") {
  const fs::path missing = fresh("no_meta");
  REQUIRE(H5Ldelete(RawFile(missing).id(), "/meta", H5P_DEFAULT) >= 0);
  expect_refused(missing, "/meta", "missing dataset /meta");

  const fs::path garbage = fresh("garbage_meta");
  RawFile(garbage).replace_meta("\xff\xff\xff\xff not protobuf");
  expect_refused(garbage, "/meta", "not a serialized TraceMeta");

  // A DType number outside the enum (proto3 keeps it) must not reach code that assumes a
  // known dtype (found by fuzzing).
  const fs::path foreign = fresh("foreign_enum");
  config::TraceMeta meta = corruptible_meta();
  meta.mutable_model()->set_weight_dtype(static_cast<config::DType>(99));
  RawFile(foreign).replace_meta(meta.SerializeAsString());
  expect_refused(foreign, "/meta", "/meta");
}

TEST_CASE("missing dataset", "[traces][corruption]") {
  const fs::path path = fresh("missing_layer");
  REQUIRE(H5Ldelete(RawFile(path).id(), "/attention/mean/layer_002", H5P_DEFAULT) >= 0);
  expect_refused(path, "/attention/mean/layer_002", "missing dataset");

  const fs::path residual = fresh("missing_residual");
  REQUIRE(H5Ldelete(RawFile(residual).id(), "/attention/topk/layer_004/residual", H5P_DEFAULT) >=
          0);
  expect_refused(residual, "/attention/topk/layer_004/residual", "missing dataset");
}

TEST_CASE("dimensions that disagree with /meta", "[traces][corruption]") {
  const fs::path path = fresh("dimensions");
  config::TraceMeta meta = corruptible_meta();
  meta.set_steps(11);
  RawFile(path).replace_meta(meta.SerializeAsString());
  expect_refused(path, "/tokens", "/meta implies [17]");
}

TEST_CASE("row offsets out of order", "[traces][corruption]") {
  const fs::path path = fresh("offsets");
  const std::uint64_t zero = 0;
  RawFile(path).write_element("/attention/row_offsets", H5T_NATIVE_UINT64, 5, &zero);
  expect_refused(path, "/attention/row_offsets", "out of order at entry 5");

  const fs::path shifted = fresh("offsets_shifted");
  const std::uint64_t wrong = 40;  // monotone but not the packed layout (row 5 starts at 45)
  RawFile(shifted).write_element("/attention/row_offsets", H5T_NATIVE_UINT64, 5, &wrong);
  expect_refused(shifted, "/attention/row_offsets", "/meta implies 45");
}

TEST_CASE("an attention map refuses a top-k index outside its row", "[traces][corruption]") {
  config::TraceMeta meta = kvtier::test::tiny_meta(6, 10, {config::GRANULARITY_TOP_K});
  meta.set_top_k(4);
  const fs::path path = trace_scratch() / "map-bad-index.h5";
  kvtier::test::write_test_trace(path, meta);
  {
    // Step 0's first entry of the [steps, k] indices.
    const RawFile file(path);
    const hid_t set = H5Dopen2(file.id(), "/attention/topk/layer_000/indices", H5P_DEFAULT);
    REQUIRE(set >= 0);
    const hid_t space = H5Dget_space(set);
    REQUIRE(H5Sget_simple_extent_ndims(space) == 2);
    const hsize_t start[2] = {0, 0};
    const hsize_t count[2] = {1, 1};
    REQUIRE(H5Sselect_hyperslab(space, H5S_SELECT_SET, start, nullptr, count, nullptr) >= 0);
    const hid_t memory = H5Screate_simple(2, count, nullptr);
    const std::int32_t outside = 100'000'000;
    REQUIRE(H5Dwrite(set, H5T_NATIVE_INT32, memory, space, H5P_DEFAULT, &outside) >= 0);
    H5Sclose(memory);
    H5Sclose(space);
    H5Dclose(set);
  }
  const traces::TraceReader reader(path);
  CHECK_THROWS_WITH(traces::attention_map(reader, 0),
                    Catch::Contains("top-k index 100000000 of layer 0, step 0 is outside its row "
                                    "of 7 positions"));
}

TEST_CASE("NaN rows are refused by reads and reported by validation", "[traces][corruption]") {
  const fs::path path = fresh("nan");
  const std::uint16_t nan = 0x7E00;
  // Element 50 of layer 1: step 5 (rows 0..4 hold 7+8+9+10+11 = 45 weights).
  {
    RawFile raw(path);
    const hid_t half = H5Tcopy(H5T_IEEE_F32LE);
    H5Tset_fields(half, 15, 10, 5, 0, 10);
    H5Tset_size(half, 2);
    H5Tset_ebias(half, 15);
    raw.write_element("/attention/mean/layer_001", half, 50, &nan);
    H5Tclose(half);
  }
  const traces::TraceReader reader(path);
  traces::DenseRows rows;
  CHECK_NOTHROW(reader.read_mean(1, {0, 5}, rows));
  CHECK_NOTHROW(reader.read_mean(1, {6, 4}, rows));
  try {
    reader.read_mean(1, {5, 1}, rows);
    FAIL("a NaN row was read");
  } catch (const kvtier::DataError& error) {
    CHECK_THAT(error.what(), Catch::Contains("NaN"));
    CHECK_THAT(error.where(), Catch::Contains(path.string()) &&
                                  Catch::Contains("/attention/mean/layer_001, step 5"));
  }
  const traces::ValidationReport report = traces::validate_trace(path);
  REQUIRE(report.problems.size() == 1);
  CHECK_THAT(report.problems[0].what, Catch::Contains("NaN"));
  CHECK_THAT(report.problems[0].where, Catch::EndsWith("/attention/mean/layer_001, step 5"));
}

TEST_CASE("weights that are no probability and broken key norms are refused by reads",
          "[traces][corruption]") {
  // Before, a negative or huge weight replayed to a kept mass of 1e28 with exit 0. Each storage
  // dtype has its own read path (FP16 through the half conversions, FP32 directly).
  const auto fresh_as = [](const std::string& name, config::DType dtype) {
    config::TraceMeta meta = corruptible_meta();
    meta.set_attention_dtype(dtype);
    const fs::path path = trace_scratch() / (name + ".h5");
    traces::WriterOptions options;
    options.chunk_elements = 32;
    kvtier::test::write_test_trace(path, meta, options);
    return path;
  };
  for (const auto& [weight, dtype] :
       {std::pair{-0.5F, config::FP16}, std::pair{2.0F, config::FP16},
        std::pair{-0.5F, config::FP32}, std::pair{2.0F, config::FP32},
        std::pair{std::numeric_limits<float>::infinity(), config::FP32}}) {
    INFO("weight " << weight << ", stored as " << config::DType_Name(dtype));
    const fs::path path = fresh_as("bad_weight_" + config::DType_Name(dtype), dtype);
    RawFile(path).write_element("/attention/mean/layer_001", H5T_NATIVE_FLOAT, 50, &weight);
    const traces::TraceReader reader(path);
    traces::DenseRows rows;
    CHECK_NOTHROW(reader.read_mean(1, {0, 5}, rows));
    try {
      reader.read_mean(1, {5, 1}, rows);
      FAIL("a weight outside [0, 1] was read");
    } catch (const kvtier::DataError& error) {
      CHECK_THAT(error.what(), Catch::Contains("outside [0, 1]"));
      CHECK_THAT(error.where(), Catch::Contains("/attention/mean/layer_001, step 5"));
    }
  }
  // −0 compares equal to 0: a weight.
  const fs::path minus_zero = fresh("minus_zero");
  const float zero = -0.0F;
  RawFile(minus_zero).write_element("/attention/mean/layer_001", H5T_NATIVE_FLOAT, 50, &zero);
  traces::DenseRows rows;
  CHECK_NOTHROW(traces::TraceReader(minus_zero).read_mean(1, {5, 1}, rows));

  config::TraceMeta meta = corruptible_meta();
  meta.add_granularities(config::GRANULARITY_KEY_NORMS);
  const fs::path path = trace_scratch() / "nan_norm.h5";
  kvtier::test::write_test_trace(path, meta, {});
  {
    // The norms are [layers][kv_heads][tokens]: rewritten whole, one value of layer 0 NaN.
    const RawFile raw(path);
    const hid_t set =
        H5Dopen2(raw.id(), std::string(kvtier::traces::kKeyNormsPath).c_str(), H5P_DEFAULT);
    REQUIRE(set >= 0);
    const hid_t space = H5Dget_space(set);
    std::vector<float> norms(static_cast<std::size_t>(H5Sget_simple_extent_npoints(space)));
    REQUIRE(H5Dread(set, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, norms.data()) >= 0);
    norms[3] = std::numeric_limits<float>::quiet_NaN();
    REQUIRE(H5Dwrite(set, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, norms.data()) >= 0);
    H5Sclose(space);
    H5Dclose(set);
  }
  const traces::TraceReader reader(path);
  CHECK_THROWS_WITH(reader.read_key_norms(0), Catch::Contains("key norm is negative, NaN"));
  CHECK_NOTHROW(reader.read_key_norms(1));
}

TEST_CASE("a chunk that inflates to less than its size is refused, not overread",
          "[traces][corruption]") {
  // The class of damage fuzzing found (docs/FUZZING.md): a valid zlib stream that holds fewer
  // bytes than the chunk. HDF5 1.10 would copy past its buffer; kvtier checks every chunk.
  for (const char* dataset : {"/tokens", "/attention/mean/layer_003"}) {
    INFO(dataset);
    const fs::path path = fresh(std::string("short_chunk") + (dataset[1] == 't' ? "_t" : "_m"));
    {
      RawFile raw(path);
      const hid_t set = H5Dopen2(raw.id(), dataset, H5P_DEFAULT);
      REQUIRE(set >= 0);
      const unsigned char few[8] = {1, 2, 3, 4, 5, 6, 7, 8};
      std::vector<unsigned char> packed(compressBound(sizeof(few)));
      uLongf size = packed.size();
      REQUIRE(compress2(packed.data(), &size, few, sizeof(few), 1) == Z_OK);
      const hsize_t origin[1] = {0};
      REQUIRE(H5Dwrite_chunk(set, H5P_DEFAULT, 0, origin, size, packed.data()) >= 0);
      H5Dclose(set);
    }
    try {
      const traces::TraceReader reader(path);
      traces::DenseRows rows;
      (void)reader.read_tokens();
      reader.read_mean(3, {0, 2}, rows);
      FAIL("a short chunk was read");
    } catch (const kvtier::DataError& error) {
      CHECK_THAT(error.where(), Catch::Contains(path.string()) && Catch::Contains(dataset));
    }
    CHECK_FALSE(traces::validate_trace(path).valid());
  }
}
