#include "kernels/hf_checkpoint.hpp"

#include <string>

#include "common/errors.hpp"
#include "kernels/llama2c_checkpoint.hpp"
#include "kernels/safetensors.hpp"

namespace kvtier::kernels {
namespace {

class HfTensorReader {
 public:
  HfTensorReader(const SafetensorsCheckpoint& checkpoint, WeightStorage& storage)
      : checkpoint_(checkpoint), storage_(storage) {}

  WeightTensor load(const std::string& name, std::vector<std::int64_t> shape) {
    return to_float_weight(checkpoint_.tensor(name), shape, storage_, checkpoint_.where(name));
  }

 private:
  const SafetensorsCheckpoint& checkpoint_;
  WeightStorage& storage_;
};

config::DType spec_dtype(TensorDtype dtype) {
  switch (dtype) {
    case TensorDtype::kF32: return config::FP32;
    case TensorDtype::kF16: return config::FP16;
    case TensorDtype::kBF16: return config::BF16;
  }
  return config::FP32;
}

LayerWeights load_layer(HfTensorReader& reader, const config::ModelSpec& spec, int layer) {
  const ExpectedShapes s = expected_shapes(spec);
  const std::string prefix = "model.layers." + std::to_string(layer) + ".";
  LayerWeights weights;
  weights.attention_norm = reader.load(prefix + "input_layernorm.weight", {s.hidden});
  weights.wq = reader.load(prefix + "self_attn.q_proj.weight", {s.q_out, s.hidden});
  weights.wk = reader.load(prefix + "self_attn.k_proj.weight", {s.kv_out, s.hidden});
  weights.wv = reader.load(prefix + "self_attn.v_proj.weight", {s.kv_out, s.hidden});
  weights.wo = reader.load(prefix + "self_attn.o_proj.weight", {s.hidden, s.q_out});
  if (spec.attention_bias()) {
    weights.q_bias = reader.load(prefix + "self_attn.q_proj.bias", {s.q_out});
    weights.k_bias = reader.load(prefix + "self_attn.k_proj.bias", {s.kv_out});
    weights.v_bias = reader.load(prefix + "self_attn.v_proj.bias", {s.kv_out});
  }
  if (spec.qk_norm()) {
    weights.q_norm = reader.load(prefix + "self_attn.q_norm.weight", {s.head_dim});
    weights.k_norm = reader.load(prefix + "self_attn.k_norm.weight", {s.head_dim});
  }
  weights.mlp_norm = reader.load(prefix + "post_attention_layernorm.weight", {s.hidden});
  weights.w_gate = reader.load(prefix + "mlp.gate_proj.weight", {s.intermediate, s.hidden});
  weights.w_up = reader.load(prefix + "mlp.up_proj.weight", {s.intermediate, s.hidden});
  weights.w_down = reader.load(prefix + "mlp.down_proj.weight", {s.hidden, s.intermediate});
  return weights;
}

}  // namespace

ModelWeights load_hf_checkpoint(const std::filesystem::path& directory) {
  ModelWeights model;
  model.spec = read_hf_config(directory / "config.json");
  model.rope_layout = RopeLayout::kHalfSplit;
  model.source = directory.string();
  check_engine_spec(model.spec, (directory / "config.json").string());

  const SafetensorsCheckpoint checkpoint = SafetensorsCheckpoint::open_directory(directory);
  HfTensorReader reader(checkpoint, model.storage);
  const ExpectedShapes s = expected_shapes(model.spec);
  model.token_embedding = reader.load("model.embed_tokens.weight", {s.vocab, s.hidden});
  // The storage format is whatever the file holds, whatever config.json's torch_dtype says.
  model.spec.set_weight_dtype(spec_dtype(checkpoint.tensor("model.embed_tokens.weight").dtype));
  for (std::uint32_t layer = 0; layer < model.spec.num_hidden_layers(); ++layer) {
    model.layers.push_back(load_layer(reader, model.spec, static_cast<int>(layer)));
  }
  model.final_norm = reader.load("model.norm.weight", {s.hidden});
  model.lm_head = model.spec.tie_word_embeddings()
                      ? model.token_embedding
                      : reader.load("lm_head.weight", {s.vocab, s.hidden});
  checkpoint.keep_mappings(model.storage);
  return model;
}

ModelWeights load_model(const std::filesystem::path& path) {
  std::error_code error;
  if (std::filesystem::is_directory(path, error)) {
    return load_hf_checkpoint(path);
  }
  if (std::filesystem::is_regular_file(path, error)) {
    return load_llama2c_checkpoint(path);
  }
  throw DataError("no model checkpoint (a llama2.c file or a Hugging Face directory)",
                  path.string());
}

}  // namespace kvtier::kernels
