#include "kernels/llama2c_checkpoint.hpp"

#include <array>
#include <cstring>
#include <limits>
#include <memory>
#include <string>

#include "common/errors.hpp"
#include "kernels/mapped_file.hpp"

namespace kvtier::kernels {
namespace {

// Header of the legacy export, in file order.
struct Llama2cHeader {
  std::int32_t dim = 0;
  std::int32_t hidden_dim = 0;
  std::int32_t n_layers = 0;
  std::int32_t n_heads = 0;
  std::int32_t n_kv_heads = 0;
  std::int32_t vocab_size = 0;  // negative: the classifier is stored separately
  std::int32_t seq_len = 0;
};
constexpr std::size_t kHeaderBytes = 7 * sizeof(std::int32_t);
// Newer llama2.c exports start with this magic ("ak42") and a version; they are not read here.
constexpr std::uint32_t kVersionedExportMagic = 0x616b3432;

config::ModelSpec spec_from_header(const Llama2cHeader& header, const std::string& name) {
  config::ModelSpec spec;
  spec.set_name(name);
  spec.set_architecture(config::LLAMA);
  spec.set_num_hidden_layers(static_cast<std::uint32_t>(header.n_layers));
  spec.set_hidden_size(static_cast<std::uint32_t>(header.dim));
  spec.set_num_attention_heads(static_cast<std::uint32_t>(header.n_heads));
  spec.set_num_key_value_heads(static_cast<std::uint32_t>(header.n_kv_heads));
  spec.set_head_dim(static_cast<std::uint32_t>(header.dim / header.n_heads));
  spec.set_intermediate_size(static_cast<std::uint32_t>(header.hidden_dim));
  spec.set_vocab_size(static_cast<std::uint32_t>(std::abs(header.vocab_size)));
  spec.set_tie_word_embeddings(header.vocab_size > 0);
  spec.set_attention_bias(false);
  spec.set_qk_norm(false);
  spec.set_max_position_embeddings(static_cast<std::uint32_t>(header.seq_len));
  // run.c fixes these two; the format has no field for them.
  spec.set_rope_theta(10000.0);
  spec.set_rms_norm_eps(1e-5);
  spec.set_weight_dtype(config::FP32);
  spec.set_activation_dtype(config::FP32);
  spec.set_kv_dtype(config::FP32);
  return spec;
}

void check_header(const Llama2cHeader& header, const std::string& where) {
  const std::array<std::pair<const char*, std::int32_t>, 6> positive{{
      {"dim", header.dim},
      {"hidden_dim", header.hidden_dim},
      {"n_layers", header.n_layers},
      {"n_heads", header.n_heads},
      {"n_kv_heads", header.n_kv_heads},
      {"seq_len", header.seq_len},
  }};
  for (const auto& [field, value] : positive) {
    if (value <= 0) {
      throw DataError(std::string("llama2.c header field ") + field + " is " +
                          std::to_string(value) + "; it must be positive",
                      where);
    }
  }
  // Negative marks a separate classifier; its magnitude is the vocabulary, so INT32_MIN, whose
  // magnitude no int32 holds, is refused with 0.
  if (header.vocab_size == 0 || header.vocab_size == std::numeric_limits<std::int32_t>::min()) {
    throw DataError("llama2.c header field vocab_size is " + std::to_string(header.vocab_size),
                    where);
  }
  if (header.dim % header.n_heads != 0) {
    throw DataError("llama2.c header: dim " + std::to_string(header.dim) +
                        " is not a multiple of n_heads " + std::to_string(header.n_heads),
                    where);
  }
}

// Walks the tensors in file order, handing out float32 slices.
class TensorCursor {
 public:
  TensorCursor(std::span<const std::byte> file, std::string where)
      : file_(file), offset_(kHeaderBytes), where_(std::move(where)) {}

  RawTensor next(const std::string& name, std::vector<std::int64_t> shape) {
    std::size_t count = 1;
    for (const std::int64_t extent : shape) {
      count *= static_cast<std::size_t>(extent);
    }
    const std::size_t bytes = count * sizeof(float);
    if (offset_ + bytes > file_.size()) {
      throw DataError("checkpoint ends inside tensor '" + name + "' (needs " +
                          std::to_string(offset_ + bytes) + " bytes, file has " +
                          std::to_string(file_.size()) + ")",
                      where_);
    }
    RawTensor raw{name, TensorDtype::kF32, std::move(shape), file_.subspan(offset_, bytes)};
    offset_ += bytes;
    return raw;
  }
  void skip(const std::string& name, std::size_t floats) {
    next(name, {static_cast<std::int64_t>(floats)});
  }
  [[nodiscard]] std::size_t remaining() const { return file_.size() - offset_; }

 private:
  std::span<const std::byte> file_;
  std::size_t offset_;
  std::string where_;
};

// A stacked [layers, ...] tensor: each layer's slice is checked and viewed separately.
std::vector<WeightTensor> per_layer(TensorCursor& cursor, const std::string& name, int layers,
                                    const std::vector<std::int64_t>& slice_shape,
                                    WeightStorage& storage, const std::string& where) {
  std::vector<WeightTensor> slices;
  for (int layer = 0; layer < layers; ++layer) {
    const RawTensor raw = cursor.next(name + "[" + std::to_string(layer) + "]", slice_shape);
    slices.push_back(to_float_weight(raw, slice_shape, storage, where));
  }
  return slices;
}

}  // namespace

ModelWeights load_llama2c_checkpoint(const std::filesystem::path& path) {
  const std::string where = path.string();
  auto file = std::make_shared<const MappedFile>(path);
  const std::span<const std::byte> bytes = file->bytes();
  if (bytes.size() < kHeaderBytes) {
    throw DataError("file too short for a llama2.c header (28 bytes)", where);
  }
  std::uint32_t magic = 0;
  std::memcpy(&magic, bytes.data(), sizeof(magic));
  if (magic == kVersionedExportMagic) {
    throw DataError(
        "llama2.c versioned export (magic ak42) is not supported; export the legacy format", where);
  }
  Llama2cHeader header;
  std::memcpy(&header, bytes.data(), kHeaderBytes);
  check_header(header, where);

  ModelWeights model;
  model.spec = spec_from_header(header, path.stem().string());
  model.rope_layout = RopeLayout::kInterleavedPairs;
  model.source = where;
  check_engine_spec(model.spec, where);
  const ExpectedShapes s = expected_shapes(model.spec);
  const int layers = header.n_layers;
  WeightStorage& storage = model.storage;

  TensorCursor cursor(bytes, where);
  model.token_embedding =
      to_float_weight(cursor.next("token_embedding_table", {s.vocab, s.hidden}),
                      std::vector<std::int64_t>{s.vocab, s.hidden}, storage, where);
  const auto attention_norm =
      per_layer(cursor, "rms_att_weight", layers, {s.hidden}, storage, where);
  const auto wq = per_layer(cursor, "wq", layers, {s.q_out, s.hidden}, storage, where);
  const auto wk = per_layer(cursor, "wk", layers, {s.kv_out, s.hidden}, storage, where);
  const auto wv = per_layer(cursor, "wv", layers, {s.kv_out, s.hidden}, storage, where);
  const auto wo = per_layer(cursor, "wo", layers, {s.hidden, s.q_out}, storage, where);
  const auto mlp_norm = per_layer(cursor, "rms_ffn_weight", layers, {s.hidden}, storage, where);
  const auto w1 = per_layer(cursor, "w1", layers, {s.intermediate, s.hidden}, storage, where);
  const auto w2 = per_layer(cursor, "w2", layers, {s.hidden, s.intermediate}, storage, where);
  const auto w3 = per_layer(cursor, "w3", layers, {s.intermediate, s.hidden}, storage, where);
  model.final_norm = to_float_weight(cursor.next("rms_final_weight", {s.hidden}),
                                     std::vector<std::int64_t>{s.hidden}, storage, where);
  // Precomputed RoPE tables of old exports; the engine computes its own frequencies.
  const auto rope_floats =
      static_cast<std::size_t>(header.seq_len) * static_cast<std::size_t>(s.head_dim / 2);
  cursor.skip("freq_cis_real", rope_floats);
  cursor.skip("freq_cis_imag", rope_floats);
  if (model.spec.tie_word_embeddings()) {
    model.lm_head = model.token_embedding;
  } else {
    model.lm_head = to_float_weight(cursor.next("wcls", {s.vocab, s.hidden}),
                                    std::vector<std::int64_t>{s.vocab, s.hidden}, storage, where);
  }
  if (cursor.remaining() != 0) {
    throw DataError(std::to_string(cursor.remaining()) +
                        " bytes follow the last tensor; the header does not describe this file",
                    where);
  }
  for (int layer = 0; layer < layers; ++layer) {
    LayerWeights weights;
    weights.attention_norm = attention_norm[layer];
    weights.wq = wq[layer];
    weights.wk = wk[layer];
    weights.wv = wv[layer];
    weights.wo = wo[layer];
    weights.mlp_norm = mlp_norm[layer];
    weights.w_gate = w1[layer];
    weights.w_down = w2[layer];
    weights.w_up = w3[layer];
    model.layers.push_back(std::move(weights));
  }
  storage.keep(std::move(file));
  return model;
}

}  // namespace kvtier::kernels
