#include "traces/impl/structure.hpp"

#include <algorithm>
#include <filesystem>
#include <memory>

#include "common/errors.hpp"
#include "traces/impl/half_convert.hpp"
#include "traces/impl/meta.hpp"

namespace kvtier::traces {
namespace {

using h5::Blame;
using h5::Handle;

// What a dataset's elements must be.
enum class Element { kWeight, kFloat32, kInt32, kUInt64 };

std::string dims_text(const std::vector<hsize_t>& dims) {
  std::string text = "[";
  for (std::size_t i = 0; i < dims.size(); ++i) {
    text += (i == 0 ? "" : ", ") + std::to_string(dims[i]);
  }
  return text + "]";
}

class DatasetChecker {
 public:
  DatasetChecker(const OpenTrace& trace, std::size_t cache_bytes,
                 std::vector<TraceProblem>& problems)
      : trace_(trace), problems_(problems) {
    access_ = h5::checked(H5Pcreate(H5P_DATASET_ACCESS), H5Pclose, Blame::kInput,
                          "cannot create dataset access properties", trace.file_name);
    // 521 slots: HDF5's default hash size, prime as its documentation asks.
    h5::check(H5Pset_chunk_cache(access_.get(), 521, cache_bytes, 1.0), Blame::kInput,
              "cannot set the chunk cache", trace.file_name);
  }

  // The dataset at `path` when it exists with exactly `dims` and elements of `element`;
  // otherwise an invalid handle and a problem recorded.
  Handle open(const std::string& path, const std::vector<hsize_t>& dims, Element element) {
    const std::string where_text = h5::where(trace_.file_name, path);
    if (!h5::exists(trace_.file.get(), path)) {
      return problem("missing dataset " + path, where_text);
    }
    H5O_info_t info{};
    if (H5Oget_info_by_name2(trace_.file.get(), path.c_str(), &info, H5O_INFO_BASIC, H5P_DEFAULT) <
            0 ||
        info.type != H5O_TYPE_DATASET) {
      return problem(path + " is not a dataset", where_text);
    }
    Handle dataset(H5Dopen2(trace_.file.get(), path.c_str(), access_.get()), H5Dclose);
    if (!dataset.valid()) {
      return problem("cannot open " + path + " (damaged file)", where_text);
    }
    std::vector<hsize_t> actual;
    try {
      actual = h5::dimensions(dataset.get(), where_text);
    } catch (const DataError& error) {
      return problem(error.what(), where_text);
    }
    if (actual != dims) {
      return problem(
          path + " has dimensions " + dims_text(actual) + ", /meta implies " + dims_text(dims),
          where_text);
    }
    if (!h5::storage_consistent(dataset.get())) {
      return problem(path + " has a damaged storage layout", where_text);
    }
    const Handle type(H5Dget_type(dataset.get()), H5Tclose);
    if (!type.valid() || !element_matches(type.get(), element)) {
      return problem(path + " has the wrong element type (expected " + element_name(element) + ")",
                     where_text);
    }
    return dataset;
  }

 private:
  Handle problem(std::string what, const std::string& where_text) {
    problems_.push_back({std::move(what), where_text});
    return {};
  }

  bool element_matches(hid_t type, Element element) const {
    const H5T_class_t type_class = H5Tget_class(type);
    const std::size_t size = H5Tget_size(type);
    const H5T_order_t order = H5Tget_order(type);
    if (order != H5T_ORDER_LE) {
      return false;
    }
    switch (element) {
      case Element::kWeight:
        if (trace_.shape.weight_type == WeightType::kFloat16) {
          return H5Tequal(type, trace_.half_type.get()) > 0;
        }
        return H5Tequal(type, H5T_IEEE_F32LE) > 0;
      case Element::kFloat32: return H5Tequal(type, H5T_IEEE_F32LE) > 0;
      case Element::kInt32:
        return type_class == H5T_INTEGER && size == 4 && H5Tget_sign(type) == H5T_SGN_2;
      case Element::kUInt64:
        return type_class == H5T_INTEGER && size == 8 && H5Tget_sign(type) == H5T_SGN_NONE;
    }
    return false;
  }

  std::string element_name(Element element) const {
    switch (element) {
      case Element::kWeight:
        return trace_.shape.weight_type == WeightType::kFloat16 ? "IEEE float16 LE"
                                                                : "IEEE float32 LE";
      case Element::kFloat32: return "IEEE float32 LE";
      case Element::kInt32: return "int32 LE";
      case Element::kUInt64: return "uint64 LE";
    }
    return "?";
  }

  const OpenTrace& trace_;
  std::vector<TraceProblem>& problems_;
  Handle access_;
};

// Row offsets must be exactly the packed layout: 0, then each row's length added in turn.
void check_row_offsets(const OpenTrace& trace, hid_t dataset, std::vector<TraceProblem>& problems) {
  const TraceShape& shape = trace.shape;
  const std::string where_text = h5::where(trace.file_name, kRowOffsetsPath);
  constexpr std::uint64_t kBlock = 1U << 16;
  std::vector<std::uint64_t> block;
  std::uint64_t previous = 0;
  for (std::uint64_t first = 0; first <= shape.steps; first += kBlock) {
    const std::uint64_t count = std::min<std::uint64_t>(kBlock, shape.steps + 1 - first);
    block.resize(count);
    try {
      h5::read_1d(dataset, H5T_NATIVE_UINT64, first, count, block.data(), where_text);
    } catch (const DataError& error) {
      problems.push_back({error.what(), error.where()});
      return;
    }
    for (std::uint64_t i = 0; i < count; ++i) {
      const std::uint64_t index = first + i;
      const std::uint64_t value = block[i];
      if (index == 0 ? value != 0 : value <= previous) {
        problems.push_back({"row offsets out of order at entry " + std::to_string(index) + " (" +
                                std::to_string(value) + " after " + std::to_string(previous) + ")",
                            where_text + ", entry " + std::to_string(index)});
        return;
      }
      if (value != shape.row_offset(index)) {
        problems.push_back({"row offset " + std::to_string(index) + " is " + std::to_string(value) +
                                ", /meta implies " + std::to_string(shape.row_offset(index)),
                            where_text + ", entry " + std::to_string(index)});
        return;
      }
      previous = value;
    }
  }
}

}  // namespace

OpenTrace open_trace(const std::string& path) {
  h5::silence_library_errors();
  OpenTrace trace;
  trace.file_name = path;
  std::error_code error;
  if (!std::filesystem::is_regular_file(path, error)) {
    throw DataError(std::filesystem::is_directory(path, error) ? "a folder, not a trace file"
                    : std::filesystem::exists(path, error)
                        ? "not a regular file, so not a trace file"
                        : "no such trace file",
                    path);
  }
  const htri_t is_hdf5 = H5Fis_hdf5(path.c_str());
  if (is_hdf5 <= 0) {
    throw DataError("not an HDF5 file", path);
  }
  trace.file = Handle(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  if (!trace.file.valid()) {
    throw DataError("cannot open the HDF5 file (truncated or damaged)", path);
  }
  trace.half_type = h5::make_half_type();
  check_root_attributes(trace.file.get(), path);
  const Handle root = h5::checked(H5Oopen(trace.file.get(), "/", H5P_DEFAULT), H5Oclose,
                                  Blame::kInput, "cannot open the root group", path);
  const std::string root_where = path + ", root attributes";
  if (h5::has_attribute(root.get(), "producer")) {
    trace.producer = h5::read_string_attribute(root.get(), "producer", root_where);
  }
  if (h5::has_attribute(root.get(), "created")) {
    trace.created = h5::read_string_attribute(root.get(), "created", root_where);
  }
  trace.meta = read_meta(trace.file.get(), path);
  trace.shape = checked_shape(trace.meta, h5::where(path, kMetaPath));
  return trace;
}

TraceDatasets open_datasets(const OpenTrace& trace, std::size_t cache_bytes,
                            std::vector<TraceProblem>& problems) {
  const TraceShape& shape = trace.shape;
  DatasetChecker checker(trace, cache_bytes, problems);
  TraceDatasets datasets;
  datasets.tokens = checker.open(std::string(kTokensPath), {shape.tokens()}, Element::kInt32);
  const hsize_t packed = shape.packed_elements();
  if (shape.has_dense()) {
    datasets.row_offsets =
        checker.open(std::string(kRowOffsetsPath), {shape.steps + hsize_t{1}}, Element::kUInt64);
    if (datasets.row_offsets.valid()) {
      check_row_offsets(trace, datasets.row_offsets.get(), problems);
    }
  }
  if (shape.has_key_norms) {
    datasets.key_norms =
        checker.open(std::string(kKeyNormsPath),
                     {shape.layers.count, shape.kv_heads, shape.tokens()}, Element::kFloat32);
  }
  datasets.layers.resize(shape.layers.count);
  for (std::uint32_t i = 0; i < shape.layers.count; ++i) {
    const std::uint32_t layer = shape.layers.first + i;
    LayerDatasets& out = datasets.layers[i];
    if (shape.has_mean) {
      out.mean = checker.open(mean_path(layer), {packed}, Element::kWeight);
    }
    if (shape.has_heads) {
      out.heads = checker.open(heads_path(layer), {shape.heads, packed}, Element::kWeight);
    }
    if (shape.has_topk) {
      const std::vector<hsize_t> rows = {shape.steps, shape.top_k};
      out.topk_indices = checker.open(topk_indices_path(layer), rows, Element::kInt32);
      out.topk_weights = checker.open(topk_weights_path(layer), rows, Element::kWeight);
      out.topk_residual = checker.open(topk_residual_path(layer), {shape.steps}, Element::kFloat32);
    }
    if (shape.has_prefill) {
      out.prefill =
          checker.open(prefill_path(layer),
                       {shape.heads, shape.prefill_window, shape.prompt_tokens}, Element::kWeight);
    }
  }
  return datasets;
}

void read_weight_block(const OpenTrace& trace, hid_t dataset, std::span<const hsize_t> start,
                       std::span<const hsize_t> count, std::vector<float>& out,
                       std::vector<std::uint16_t>& scratch, const std::string& where_text) {
  std::uint64_t elements = 1;
  for (const hsize_t n : count) {
    elements *= n;
  }
  out.resize(elements);
  if (trace.shape.weight_type == WeightType::kFloat32) {
    h5::read_block(dataset, H5T_NATIVE_FLOAT, start, count, out.data(), where_text);
    return;
  }
  scratch.resize(elements);
  h5::read_block(dataset, trace.half_type.get(), start, count, scratch.data(), where_text);
  halves_to_floats(scratch.data(), out.data(), elements);
}

}  // namespace kvtier::traces
