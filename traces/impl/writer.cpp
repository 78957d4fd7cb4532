#include "traces/writer.hpp"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <system_error>
#include <vector>

#include "common/errors.hpp"
#include "common/temporary_file.hpp"
#include "traces/impl/chunk_stream.hpp"
#include "traces/impl/h5.hpp"
#include "traces/impl/half_convert.hpp"
#include "traces/impl/meta.hpp"

namespace kvtier::traces {
namespace {

using h5::Blame;
using h5::Handle;

// One layer's datasets and the streams appending to them.
struct LayerOutput {
  Handle mean, heads, topk_indices, topk_weights, topk_residual, prefill;
  std::optional<ChunkStream> mean_stream, heads_stream, indices_stream, weights_stream,
      residual_stream;
  std::uint32_t mean_rows = 0;
  std::uint32_t head_rows = 0;
  std::uint32_t topk_rows = 0;
  bool prefill_written = false;
  bool key_norms_written = false;
};

}  // namespace

class TraceWriter::Impl {
 public:
  Impl(std::filesystem::path path, config::TraceMeta meta, WriterOptions options)
      : final_path_(std::move(path)),
        temporary_(final_path_),
        name_(final_path_.string()),
        meta_(std::move(meta)),
        options_(std::move(options)),
        shape_(checked_shape(meta_, name_ + ", /meta")),
        pipeline_(options_.compression_threads) {
    if (options_.deflate_level < 0 || options_.deflate_level > 9 || options_.chunk_elements == 0) {
      throw ConfigError("deflate level must be 0..9 and chunk elements at least 1", name_);
    }
    h5::silence_library_errors();
    half_type_ = h5::make_half_type();
    weight_type_ = shape_.weight_type == WeightType::kFloat16 ? half_type_.get() : H5T_IEEE_F32LE;
    create_file();
    layers_.resize(shape_.layers.count);
    for (std::uint32_t i = 0; i < shape_.layers.count; ++i) {
      create_layer(shape_.layers.first + i, layers_[i]);
    }
  }

  [[nodiscard]] const TraceShape& shape() const noexcept { return shape_; }
  [[nodiscard]] const config::TraceMeta& meta() const noexcept { return meta_; }

  void write_tokens(std::span<const std::int32_t> tokens) {
    const std::string where_text = h5::where(name_, kTokensPath);
    require(tokens.size() == shape_.tokens(),
            "expected " + std::to_string(shape_.tokens()) + " tokens, got " +
                std::to_string(tokens.size()),
            where_text);
    write_pending_chunks();
    h5::check(
        H5Dwrite(tokens_.get(), H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, tokens.data()),
        Blame::kOutput, "cannot write tokens", where_text);
    tokens_written_ = true;
  }

  void append_mean_row(std::uint32_t layer, std::span<const float> row) {
    LayerOutput& out = output(layer, shape_.has_mean, "mean");
    if (!row_fits(out.mean_rows, row.size(), 1)) {
      check_row(out.mean_rows, row.size(), 1, h5::where(name_, mean_path(layer)));
    }
    out.mean_stream->append(stored_weights(row), row.size());
    ++out.mean_rows;
  }

  void append_head_rows(std::uint32_t layer, std::span<const float> rows) {
    LayerOutput& out = output(layer, shape_.has_heads, "heads");
    if (!row_fits(out.head_rows, rows.size(), shape_.heads)) {
      check_row(out.head_rows, rows.size(), shape_.heads, h5::where(name_, heads_path(layer)));
    }
    out.heads_stream->append(stored_weights(rows), rows.size() / shape_.heads);
    ++out.head_rows;
  }

  void append_topk_row(std::uint32_t layer, std::span<const std::int32_t> indices,
                       std::span<const float> weights, float residual) {
    LayerOutput& out = output(layer, shape_.has_topk, "topk");
    if (out.topk_rows >= shape_.steps || indices.size() != shape_.top_k ||
        weights.size() != shape_.top_k) {
      const std::string where_text = h5::where(name_, topk_weights_path(layer));
      require(out.topk_rows < shape_.steps, "more top-k rows than steps", where_text);
      require(false, "a top-k row needs exactly " + std::to_string(shape_.top_k) + " entries",
              where_text);
    }
    out.indices_stream->append(indices.data(), indices.size());
    out.weights_stream->append(stored_weights(weights), weights.size());
    out.residual_stream->append(&residual, 1);
    ++out.topk_rows;
  }

  void write_prefill_window(std::uint32_t layer, std::span<const float> weights) {
    LayerOutput& out = output(layer, shape_.has_prefill, "prefill_window");
    const std::string where_text = h5::where(name_, prefill_path(layer));
    const std::uint64_t expected =
        static_cast<std::uint64_t>(shape_.heads) * shape_.prefill_window * shape_.prompt_tokens;
    require(weights.size() == expected, "expected " + std::to_string(expected) + " weights",
            where_text);
    write_pending_chunks();
    h5::check(H5Dwrite(out.prefill.get(), weight_type_, H5S_ALL, H5S_ALL, H5P_DEFAULT,
                       stored_weights(weights)),
              Blame::kOutput, "cannot write the prefill window", where_text);
    out.prefill_written = true;
  }

  void write_key_norms(std::uint32_t layer, std::span<const float> norms) {
    LayerOutput& out = output(layer, shape_.has_key_norms, "key_norms");
    const std::string where_text = h5::where(name_, kKeyNormsPath);
    require(norms.size() == shape_.kv_heads * shape_.tokens(),
            "expected kv_heads × tokens key norms", where_text);
    write_pending_chunks();
    const hsize_t start[3] = {layer - shape_.layers.first, 0, 0};
    const hsize_t count[3] = {1, shape_.kv_heads, shape_.tokens()};
    const Handle file_space = h5::checked(H5Dget_space(key_norms_.get()), H5Sclose, Blame::kOutput,
                                          "cannot write key norms", where_text);
    h5::check(H5Sselect_hyperslab(file_space.get(), H5S_SELECT_SET, start, nullptr, count, nullptr),
              Blame::kOutput, "cannot write key norms", where_text);
    const Handle memory_space = h5::checked(H5Screate_simple(3, count, nullptr), H5Sclose,
                                            Blame::kOutput, "cannot write key norms", where_text);
    h5::check(H5Dwrite(key_norms_.get(), H5T_NATIVE_FLOAT, memory_space.get(), file_space.get(),
                       H5P_DEFAULT, norms.data()),
              Blame::kOutput, "cannot write key norms", where_text);
    out.key_norms_written = true;
  }

  void finish() {
    require(tokens_written_, "tokens were never written", h5::where(name_, kTokensPath));
    for (LayerOutput& out : layers_) {
      for (auto* stream : {&out.mean_stream, &out.heads_stream, &out.indices_stream,
                           &out.weights_stream, &out.residual_stream}) {
        if (stream->has_value()) {
          (*stream)->finish();
        }
      }
    }
    pipeline_.drain();
    for (std::uint32_t i = 0; i < layers_.size(); ++i) {
      const std::uint32_t layer = shape_.layers.first + i;
      const LayerOutput& out = layers_[i];
      require(!shape_.has_prefill || out.prefill_written, "prefill window never written",
              h5::where(name_, prefill_path(layer)));
      require(!shape_.has_key_norms || out.key_norms_written,
              "key norms of layer " + std::to_string(layer) + " never written",
              h5::where(name_, kKeyNormsPath));
    }
    layers_.clear();
    tokens_.reset();
    key_norms_.reset();
    if (!file_.reset()) {
      h5::raise(Blame::kOutput, "cannot close the trace file (disk full?)", final_path_.string());
    }
    std::error_code error;
    std::filesystem::rename(temporary_.path(), temporary_.target(), error);
    if (error) {
      h5::raise(Blame::kOutput, "cannot move the trace into place: " + error.message(), name_);
    }
    temporary_.release();
  }

 private:
  // Writes every chunk handed to the pipeline so far. Called before HDF5 writes a dataset
  // itself (tokens, prefill window, key norms): HDF5 places data in the file in the order it is
  // written, so the file is then the same as when every chunk is written as soon as it is
  // full (compression_threads 0), whatever the number of threads.
  void write_pending_chunks() { pipeline_.drain(); }

  static void require(bool condition, const std::string& what, const std::string& where_text) {
    if (!condition) {
      h5::raise(Blame::kOutput, what, where_text);
    }
  }

  // Called for every row: the diagnostics are only built when a check fails.
  LayerOutput& output(std::uint32_t layer, bool declared, const char* granularity) {
    if (!declared || !shape_.has_layer(layer)) {
      require(declared, std::string("the trace's /meta does not declare ") + granularity, name_);
      require(false, "layer " + std::to_string(layer) + " is not in the trace", name_);
    }
    return layers_[layer - shape_.layers.first];
  }

  [[nodiscard]] bool row_fits(std::uint32_t rows_so_far, std::size_t size,
                              std::uint32_t lanes) const {
    return rows_so_far < shape_.steps && size == shape_.row_length(rows_so_far) * lanes;
  }

  void check_row(std::uint32_t rows_so_far, std::size_t size, std::uint32_t lanes,
                 const std::string& where_text) const {
    require(rows_so_far < shape_.steps, "more rows than steps", where_text);
    const std::uint64_t expected = shape_.row_length(rows_so_far) * lanes;
    require(size == expected,
            "row " + std::to_string(rows_so_far) + " needs " + std::to_string(expected) +
                " weights, got " + std::to_string(size),
            where_text);
  }

  // Weights in the file's format: FP16 through the scratch buffer, FP32 as given.
  const void* stored_weights(std::span<const float> weights) {
    if (shape_.weight_type == WeightType::kFloat32) {
      return weights.data();
    }
    scratch_.resize(weights.size());
    floats_to_halves(weights.data(), scratch_.data(), weights.size());
    return scratch_.data();
  }

  Handle create_dataset(const std::string& path, hid_t file_type, std::vector<hsize_t> dims,
                        std::vector<hsize_t> chunk, std::size_t element_bytes) {
    const std::string where_text = h5::where(name_, path);
    for (std::size_t i = 0; i < dims.size(); ++i) {
      chunk[i] = std::max<hsize_t>(1, std::min(chunk[i], dims[i]));
    }
    h5::create_parent_groups(file_.get(), path, name_);
    const Handle space =
        h5::checked(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr), H5Sclose,
                    Blame::kOutput, "cannot create a dataspace", where_text);
    const Handle properties =
        h5::chunked_properties(chunk, options_.deflate_level, element_bytes, where_text);
    return h5::checked(H5Dcreate2(file_.get(), path.c_str(), file_type, space.get(), H5P_DEFAULT,
                                  properties.get(), H5P_DEFAULT),
                       H5Dclose, Blame::kOutput, "cannot create dataset", where_text);
  }

  void create_file();
  void create_layer(std::uint32_t layer, LayerOutput& out);

  std::filesystem::path final_path_;
  TemporaryFile temporary_;  // declared before file_: removed only after the file is closed
  std::string name_;
  config::TraceMeta meta_;
  WriterOptions options_;
  TraceShape shape_;
  Handle half_type_;
  hid_t weight_type_ = -1;
  ChunkPipeline pipeline_;  // before the datasets: outlives the streams that feed it
  Handle file_;
  Handle tokens_;
  Handle key_norms_;
  std::vector<LayerOutput> layers_;
  std::vector<std::uint16_t> scratch_;
  bool tokens_written_ = false;
};

void TraceWriter::Impl::create_file() {
  if (final_path_.has_parent_path()) {
    std::error_code error;
    std::filesystem::create_directories(final_path_.parent_path(), error);
    if (error) {
      h5::raise(Blame::kOutput,
                "cannot create the trace file's folder " + final_path_.parent_path().string() +
                    ": " + error.message(),
                final_path_.string());
    }
  }
  file_ = h5::create_file(temporary_.path().string(), "cannot create the trace file",
                          final_path_.string());
  const Handle root = h5::checked(H5Oopen(file_.get(), "/", H5P_DEFAULT), H5Oclose, Blame::kOutput,
                                  "cannot open the root group", name_);
  write_root_attributes(root.get(), options_.producer,
                        options_.created.empty() ? current_utc_time() : options_.created, name_);
  write_meta(file_.get(), meta_, name_);
  const hsize_t chunk = options_.chunk_elements;
  tokens_ = create_dataset(std::string(kTokensPath), H5T_STD_I32LE, {shape_.tokens()}, {chunk}, 4);
  if (shape_.has_dense()) {
    Handle offsets = create_dataset(std::string(kRowOffsetsPath), H5T_STD_U64LE,
                                    {shape_.steps + std::uint64_t{1}}, {chunk}, 8);
    std::vector<std::uint64_t> values(shape_.steps + std::size_t{1});
    for (std::uint32_t step = 0; step <= shape_.steps; ++step) {
      values[step] = shape_.row_offset(step);
    }
    h5::check(
        H5Dwrite(offsets.get(), H5T_NATIVE_UINT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()),
        Blame::kOutput, "cannot write row offsets", h5::where(name_, kRowOffsetsPath));
  }
  if (shape_.has_key_norms) {
    key_norms_ =
        create_dataset(std::string(kKeyNormsPath), H5T_IEEE_F32LE,
                       {shape_.layers.count, shape_.kv_heads, shape_.tokens()},
                       {1, shape_.kv_heads, std::max<hsize_t>(1, chunk / shape_.kv_heads)}, 4);
  }
}

void TraceWriter::Impl::create_layer(std::uint32_t layer, LayerOutput& out) {
  const std::size_t weight_size = weight_bytes(shape_.weight_type);
  const std::uint64_t packed = shape_.packed_elements();
  const std::uint64_t chunk = options_.chunk_elements;
  const int level = options_.deflate_level;
  if (shape_.has_mean) {
    const ChunkGeometry geometry{1, 1, 1, std::min(chunk, packed), packed, weight_size};
    out.mean = create_dataset(mean_path(layer), weight_type_, {packed}, {geometry.chunk_columns},
                              weight_size);
    out.mean_stream.emplace(out.mean.get(), geometry, level, h5::where(name_, mean_path(layer)),
                            pipeline_);
  }
  if (shape_.has_heads) {
    const std::uint64_t columns =
        std::min<std::uint64_t>(packed, std::max<std::uint64_t>(1, chunk / shape_.heads));
    const ChunkGeometry geometry{shape_.heads, 1, 2, columns, packed, weight_size};
    out.heads = create_dataset(heads_path(layer), weight_type_, {shape_.heads, packed},
                               {shape_.heads, columns}, weight_size);
    out.heads_stream.emplace(out.heads.get(), geometry, level, h5::where(name_, heads_path(layer)),
                             pipeline_);
  }
  if (shape_.has_topk) {
    const std::uint64_t k = shape_.top_k;
    const std::uint64_t rows =
        std::min<std::uint64_t>(shape_.steps, std::max<std::uint64_t>(1, chunk / k));
    const std::uint64_t total = shape_.steps * k;
    out.topk_indices =
        create_dataset(topk_indices_path(layer), H5T_STD_I32LE, {shape_.steps, k}, {rows, k}, 4);
    out.topk_weights = create_dataset(topk_weights_path(layer), weight_type_, {shape_.steps, k},
                                      {rows, k}, weight_size);
    const std::uint64_t residual_chunk = std::min<std::uint64_t>(shape_.steps, chunk);
    out.topk_residual = create_dataset(topk_residual_path(layer), H5T_IEEE_F32LE, {shape_.steps},
                                       {residual_chunk}, 4);
    out.indices_stream.emplace(out.topk_indices.get(),
                               ChunkGeometry{1, shape_.top_k, 2, rows * k, total, 4}, level,
                               h5::where(name_, topk_indices_path(layer)), pipeline_);
    out.weights_stream.emplace(out.topk_weights.get(),
                               ChunkGeometry{1, shape_.top_k, 2, rows * k, total, weight_size},
                               level, h5::where(name_, topk_weights_path(layer)), pipeline_);
    out.residual_stream.emplace(out.topk_residual.get(),
                                ChunkGeometry{1, 1, 1, residual_chunk, shape_.steps, 4}, level,
                                h5::where(name_, topk_residual_path(layer)), pipeline_);
  }
  if (shape_.has_prefill) {
    const hsize_t window = shape_.prefill_window;
    out.prefill = create_dataset(prefill_path(layer), weight_type_,
                                 {shape_.heads, window, shape_.prompt_tokens},
                                 {1, window, std::max<hsize_t>(1, chunk / window)}, weight_size);
  }
}

TraceWriter::TraceWriter(std::filesystem::path path, config::TraceMeta meta, WriterOptions options)
    : impl_(std::make_unique<Impl>(std::move(path), std::move(meta), std::move(options))) {}
TraceWriter::~TraceWriter() = default;
const TraceShape& TraceWriter::shape() const noexcept {
  return impl_->shape();
}
const config::TraceMeta& TraceWriter::meta() const noexcept {
  return impl_->meta();
}
void TraceWriter::write_tokens(std::span<const std::int32_t> tokens) {
  impl_->write_tokens(tokens);
}
void TraceWriter::append_mean_row(std::uint32_t layer, std::span<const float> row) {
  impl_->append_mean_row(layer, row);
}
void TraceWriter::append_head_rows(std::uint32_t layer, std::span<const float> rows) {
  impl_->append_head_rows(layer, rows);
}
void TraceWriter::append_topk_row(std::uint32_t layer, std::span<const std::int32_t> indices,
                                  std::span<const float> weights, float residual) {
  impl_->append_topk_row(layer, indices, weights, residual);
}
void TraceWriter::write_prefill_window(std::uint32_t layer, std::span<const float> weights) {
  impl_->write_prefill_window(layer, weights);
}
void TraceWriter::write_key_norms(std::uint32_t layer, std::span<const float> norms) {
  impl_->write_key_norms(layer, norms);
}
void TraceWriter::finish() {
  impl_->finish();
}

}  // namespace kvtier::traces
