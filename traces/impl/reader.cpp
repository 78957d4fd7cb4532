#include "traces/reader.hpp"

#include <algorithm>
#include <cmath>
#include <optional>

#include "common/errors.hpp"
#include "traces/impl/chunk_reader.hpp"
#include "traces/impl/half_convert.hpp"
#include "traces/impl/structure.hpp"

namespace kvtier::traces {

namespace {

std::string steps_text(StepRange steps) {
  return steps.count == 1
             ? ", step " + std::to_string(steps.first)
             : ", steps " + std::to_string(steps.first) + ".." + std::to_string(steps.end() - 1);
}

constexpr const char* kNotAProbability =
    "attention weight outside [0, 1] (NaN, infinite, negative or above 1 + 2^-10)";

// Whether every weight read could be a probability (is_weight). Branch-free, so that the check
// vectorises (GCC vectorises an unsigned OR reduction here, not a bool's).
bool probabilities(std::span<const float> weights) {
  unsigned outside = 0;
  for (const float w : weights) {
    outside |= static_cast<unsigned>(!is_weight(w));
  }
  return outside == 0;
}

}  // namespace

class TraceReader::Impl {
 public:
  Impl(const std::filesystem::path& path, const ReaderOptions& options)
      : trace_(open_trace(path.string())) {
    std::vector<TraceProblem> problems;
    datasets_ = open_datasets(trace_, options.chunk_cache_bytes, problems);
    if (!problems.empty()) {
      throw DataError(problems.front().what, problems.front().where);
    }
    fast_.resize(static_cast<std::size_t>(trace_.shape.layers.count) * 3);
  }

  [[nodiscard]] const OpenTrace& trace() const noexcept { return trace_; }
  [[nodiscard]] const TraceShape& shape() const noexcept { return trace_.shape; }

  [[nodiscard]] std::string where(std::string_view dataset) const {
    return h5::where(trace_.file_name, dataset);
  }

  const LayerDatasets& layer(std::uint32_t layer_index, bool present, const char* what) const {
    if (!present) {
      throw DataError(std::string("the trace has no ") + what + " granularity", trace_.file_name);
    }
    if (!shape().has_layer(layer_index)) {
      throw DataError("layer " + std::to_string(layer_index) + " is not in the trace (layers " +
                          std::to_string(shape().layers.first) + ".." +
                          std::to_string(shape().layers.end() - 1) + ")",
                      trace_.file_name);
    }
    return datasets_.layers[layer_index - shape().layers.first];
  }

  void check_steps(StepRange steps) const {
    if (steps.count == 0 || steps.end() > shape().steps || steps.end() < steps.first) {
      throw DataError("steps " + std::to_string(steps.first) + ".." +
                          std::to_string(static_cast<std::uint64_t>(steps.first) + steps.count) +
                          " are outside the trace's " + std::to_string(shape().steps) + " steps",
                      trace_.file_name);
    }
  }

  // Reads weights and refuses any that is no probability — NaN, infinite, negative or above 1 —
  // so that no tool computes on a broken row (`trace validate` reports every such row and also
  // checks the sums; readers stop at the first).
  void read_weights(hid_t dataset, std::span<const hsize_t> start, std::span<const hsize_t> count,
                    std::vector<float>& out, const std::string& where_text) const {
    read_weight_block(trace_, dataset, start, count, out, raw_, where_text);
    if (!probabilities(out)) {
      const auto bad = std::find_if(out.begin(), out.end(), [](float w) { return !is_weight(w); });
      throw DataError(std::string(kNotAProbability) + " (element " +
                          std::to_string(bad - out.begin()) + " of the block read)",
                      where_text);
    }
  }

  // The fast path for one weight dataset (kind 0 mean, 1 heads, 2 top-k weights) of a layer,
  // or nullptr when its layout needs the generic path.
  ChunkReader* fast(std::uint32_t layer_index, int kind, hid_t dataset, std::uint32_t lanes,
                    const std::string& where_text) const {
    FastSlot& slot = fast_[(layer_index - shape().layers.first) * 3 + kind];
    if (!slot.tried) {
      slot.tried = true;
      slot.reader = ChunkReader::open(dataset, shape().weight_type, lanes, where_text);
    }
    return slot.reader ? &*slot.reader : nullptr;
  }

  // Columns [first, first + count) of every lane of a weight dataset, lane-major.
  void read_columns(std::uint32_t layer_index, int kind, hid_t dataset, std::uint32_t lanes,
                    std::uint64_t first, std::uint64_t count, std::vector<float>& out,
                    const std::string& where_text) const {
    if (ChunkReader* reader = fast(layer_index, kind, dataset, lanes, where_text)) {
      out.resize(lanes * count);
      if (!reader->read(first, count, scratch_, out.data())) {
        throw DataError(kNotAProbability, where_text);
      }
      return;
    }
    const hsize_t start_1d[1] = {first};
    const hsize_t count_1d[1] = {count};
    const hsize_t start_2d[2] = {0, first};
    const hsize_t count_2d[2] = {lanes, count};
    if (lanes == 1) {
      read_weights(dataset, start_1d, count_1d, out, where_text);
    } else {
      read_weights(dataset, start_2d, count_2d, out, where_text);
    }
  }

  void fill_offsets(StepRange steps, std::vector<std::uint64_t>& offsets) const {
    offsets.resize(steps.count + std::size_t{1});
    const std::uint64_t base = shape().row_offset(steps.first);
    for (std::uint32_t i = 0; i <= steps.count; ++i) {
      offsets[i] = shape().row_offset(steps.first + std::uint64_t{i}) - base;
    }
  }

  struct FastSlot {
    bool tried = false;
    std::optional<ChunkReader> reader;
  };

  OpenTrace trace_;
  TraceDatasets datasets_;
  mutable std::vector<FastSlot> fast_;
  mutable ChunkScratch scratch_;
  mutable std::vector<std::uint16_t> raw_;
};

TraceReader::TraceReader(const std::filesystem::path& path, ReaderOptions options)
    : impl_(std::make_unique<Impl>(path, options)) {}
TraceReader::TraceReader(TraceReader&&) noexcept = default;
TraceReader& TraceReader::operator=(TraceReader&&) noexcept = default;
TraceReader::~TraceReader() = default;

const std::string& TraceReader::file_name() const noexcept {
  return impl_->trace().file_name;
}
const config::TraceMeta& TraceReader::meta() const noexcept {
  return impl_->trace().meta;
}
const TraceShape& TraceReader::shape() const noexcept {
  return impl_->shape();
}
const std::string& TraceReader::producer() const noexcept {
  return impl_->trace().producer;
}
const std::string& TraceReader::created() const noexcept {
  return impl_->trace().created;
}

std::vector<std::int32_t> TraceReader::read_tokens() const {
  std::vector<std::int32_t> tokens(shape().tokens());
  h5::read_1d(impl_->datasets_.tokens.get(), H5T_NATIVE_INT32, 0, tokens.size(), tokens.data(),
              impl_->where(kTokensPath));
  return tokens;
}

void TraceReader::read_mean(std::uint32_t layer, StepRange steps, DenseRows& out) const {
  const LayerDatasets& datasets = impl_->layer(layer, shape().has_mean, "mean");
  impl_->check_steps(steps);
  out.steps = steps;
  impl_->fill_offsets(steps, out.offsets);
  impl_->read_columns(layer, 0, datasets.mean.get(), 1, shape().row_offset(steps.first),
                      out.offsets.back(), out.values,
                      impl_->where(mean_path(layer)) + steps_text(steps));
}

void TraceReader::read_heads(std::uint32_t layer, StepRange steps, HeadRows& out) const {
  const LayerDatasets& datasets = impl_->layer(layer, shape().has_heads, "heads");
  impl_->check_steps(steps);
  out.steps = steps;
  out.heads = shape().heads;
  impl_->fill_offsets(steps, out.offsets);
  impl_->read_columns(layer, 1, datasets.heads.get(), shape().heads,
                      shape().row_offset(steps.first), out.offsets.back(), out.values,
                      impl_->where(heads_path(layer)) + steps_text(steps));
}

void TraceReader::read_topk(std::uint32_t layer, StepRange steps, TopKRows& out) const {
  const LayerDatasets& datasets = impl_->layer(layer, shape().has_topk, "topk");
  impl_->check_steps(steps);
  out.steps = steps;
  out.k = shape().top_k;
  const hsize_t start[2] = {steps.first, 0};
  const hsize_t count[2] = {steps.count, shape().top_k};
  out.indices.resize(static_cast<std::size_t>(steps.count) * shape().top_k);
  h5::read_block(datasets.topk_indices.get(), H5T_NATIVE_INT32, start, count, out.indices.data(),
                 impl_->where(topk_indices_path(layer)));
  impl_->read_columns(layer, 2, datasets.topk_weights.get(), 1,
                      static_cast<std::uint64_t>(steps.first) * shape().top_k,
                      static_cast<std::uint64_t>(steps.count) * shape().top_k, out.weights,
                      impl_->where(topk_weights_path(layer)) + steps_text(steps));
  out.residual.resize(steps.count);
  h5::read_1d(datasets.topk_residual.get(), H5T_NATIVE_FLOAT, steps.first, steps.count,
              out.residual.data(), impl_->where(topk_residual_path(layer)));
}

std::vector<float> TraceReader::read_prefill_window(std::uint32_t layer) const {
  const LayerDatasets& datasets = impl_->layer(layer, shape().has_prefill, "prefill_window");
  const hsize_t start[3] = {0, 0, 0};
  const hsize_t count[3] = {shape().heads, shape().prefill_window, shape().prompt_tokens};
  std::vector<float> weights;
  impl_->read_weights(datasets.prefill.get(), start, count, weights,
                      impl_->where(prefill_path(layer)));
  return weights;
}

std::vector<float> TraceReader::read_key_norms(std::uint32_t layer) const {
  (void)impl_->layer(layer, shape().has_key_norms, "key_norms");
  const hsize_t start[3] = {layer - shape().layers.first, 0, 0};
  const hsize_t count[3] = {1, shape().kv_heads, shape().tokens()};
  std::vector<float> norms(static_cast<std::size_t>(shape().kv_heads) * shape().tokens());
  h5::read_block(impl_->datasets_.key_norms.get(), H5T_NATIVE_FLOAT, start, count, norms.data(),
                 impl_->where(kKeyNormsPath));
  const auto bad = std::find_if(norms.begin(), norms.end(),
                                [](float n) { return !(n >= 0.0F && std::isfinite(n)); });
  if (bad != norms.end()) {
    throw DataError("key norm is negative, NaN or infinite (layer " + std::to_string(layer) +
                        ", element " + std::to_string(bad - norms.begin()) + ")",
                    impl_->where(kKeyNormsPath));
  }
  return norms;
}

std::vector<StepRange> TraceReader::plan_blocks(StepRange steps, std::uint64_t max_elements) const {
  impl_->check_steps(steps);
  return plan_step_blocks(shape(), steps, max_elements);
}

void TraceReader::stream_mean(
    LayerRange layers, StepRange steps, std::uint64_t max_elements,
    const std::function<void(std::uint32_t, const DenseRows&)>& visit) const {
  if (layers.count == 0 || !shape().has_layer(layers.first) ||
      !shape().has_layer(layers.end() - 1)) {
    throw DataError("layer range outside the trace", file_name());
  }
  DenseRows rows;
  for (const StepRange block : plan_blocks(steps, max_elements)) {
    for (std::uint32_t layer = layers.first; layer < layers.end(); ++layer) {
      read_mean(layer, block, rows);
      visit(layer, rows);
    }
  }
}

TraceReader::StorageSizes TraceReader::attention_storage() const {
  StorageSizes sizes;
  const TraceShape& s = shape();
  const std::uint64_t weight = weight_bytes(s.weight_type);
  for (const LayerDatasets& layer : impl_->datasets_.layers) {
    if (s.has_mean) {
      sizes.stored_bytes += h5::storage_bytes(layer.mean.get());
      sizes.logical_bytes += s.packed_elements() * weight;
    }
    if (s.has_heads) {
      sizes.stored_bytes += h5::storage_bytes(layer.heads.get());
      sizes.logical_bytes += s.packed_elements() * s.heads * weight;
    }
    if (s.has_topk) {
      sizes.stored_bytes += h5::storage_bytes(layer.topk_indices.get()) +
                            h5::storage_bytes(layer.topk_weights.get()) +
                            h5::storage_bytes(layer.topk_residual.get());
      sizes.logical_bytes += static_cast<std::uint64_t>(s.steps) * (s.top_k * (4 + weight) + 4);
    }
    if (s.has_prefill) {
      sizes.stored_bytes += h5::storage_bytes(layer.prefill.get());
      sizes.logical_bytes +=
          static_cast<std::uint64_t>(s.heads) * s.prefill_window * s.prompt_tokens * weight;
    }
  }
  return sizes;
}

}  // namespace kvtier::traces
