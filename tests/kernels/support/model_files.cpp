#include "tests/kernels/support/model_files.hpp"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>

#include "kernels/llama2c_checkpoint.hpp"
#include "kernels/tokenizer.hpp"

namespace kvtier::kernels::testing {

using Json = nlohmann::json;

float prefill_decode_gap(Engine& batched, Engine& stepwise, std::span<const std::int32_t> prompt) {
  const std::span<const float> batched_logits = batched.prefill(prompt);
  const std::vector<float> expected(batched_logits.begin(), batched_logits.end());
  std::span<const float> logits;
  for (const std::int32_t token : prompt) {
    logits = stepwise.decode(token);
  }
  if (logits.size() != expected.size()) {
    return std::numeric_limits<float>::infinity();
  }
  float gap = 0.0F;
  for (std::size_t i = 0; i < expected.size(); ++i) {
    const float difference = std::abs(logits[i] - expected[i]);
    if (std::isnan(difference)) {
      return std::numeric_limits<float>::infinity();  // std::max would drop it
    }
    gap = std::max(gap, difference);
  }
  return gap;
}

std::shared_ptr<const ModelWeights> stories_model() {
  static const auto weights = std::make_shared<const ModelWeights>(
      load_llama2c_checkpoint(stories_dir() / "stories260K.bin"));
  return weights;
}

std::vector<std::int32_t> stories_prompt(const std::string& text) {
  return load_llama2c_tokenizer(stories_dir() / "tok512.bin")->encode_prompt(text);
}

TempDir::TempDir(const std::string& name)
    : path_(std::filesystem::temp_directory_path() /
            ("kvtier-test-" + std::to_string(::getpid()) + "-" + name)) {
  std::filesystem::remove_all(path_);
  std::filesystem::create_directories(path_);
}

TempDir::~TempDir() {
  std::error_code ignored;
  std::filesystem::remove_all(path_, ignored);
}

void write_safetensors(const std::filesystem::path& path,
                       const std::vector<TensorToWrite>& tensors) {
  Json header = Json::object();
  std::string data;
  for (const TensorToWrite& tensor : tensors) {
    const std::size_t begin = data.size();
    for (const float value : tensor.values) {
      if (tensor.dtype == TensorDtype::kF32) {
        data.append(reinterpret_cast<const char*>(&value), sizeof(value));
      } else {
        const std::uint16_t bits =
            tensor.dtype == TensorDtype::kF16 ? float_to_half(value) : float_to_bfloat16(value);
        data.append(reinterpret_cast<const char*>(&bits), sizeof(bits));
      }
    }
    header[tensor.name] = {{"dtype", std::string(tensor_dtype_name(tensor.dtype))},
                           {"shape", tensor.shape},
                           {"data_offsets", {begin, data.size()}}};
  }
  header["__metadata__"] = {{"format", "pt"}};
  std::string header_text = header.dump();
  header_text.append((8 - header_text.size() % 8) % 8, ' ');  // keep the data 8-byte aligned
  const std::uint64_t length = header_text.size();
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(&length), sizeof(length));
  out << header_text << data;
}

namespace {

std::string class_name(config::Architecture architecture) {
  switch (architecture) {
    case config::MISTRAL: return "MistralForCausalLM";
    case config::QWEN2: return "Qwen2ForCausalLM";
    case config::QWEN3: return "Qwen3ForCausalLM";
    default: return "LlamaForCausalLM";
  }
}

}  // namespace

std::string hf_config_text(const config::ModelSpec& spec) {
  Json json = {{"architectures", {class_name(spec.architecture())}},
               {"hidden_size", spec.hidden_size()},
               {"intermediate_size", spec.intermediate_size()},
               {"num_hidden_layers", spec.num_hidden_layers()},
               {"num_attention_heads", spec.num_attention_heads()},
               {"num_key_value_heads", spec.num_key_value_heads()},
               {"head_dim", spec.head_dim()},
               {"vocab_size", spec.vocab_size()},
               {"max_position_embeddings", spec.max_position_embeddings()},
               {"rope_theta", spec.rope_theta()},
               {"rms_norm_eps", spec.rms_norm_eps()},
               {"tie_word_embeddings", spec.tie_word_embeddings()},
               {"torch_dtype", "float32"}};
  if (spec.has_sliding_window()) {
    json["sliding_window"] = spec.sliding_window();
  }
  return json.dump(2);
}

namespace {

std::vector<float> values_of(const WeightTensor& weight) {
  return {weight.data, weight.data + weight.rows * weight.cols};
}

// transformers' convert_llama_weights_to_hf permute(): row 2i + a of each head moves to
// a * head_dim / 2 + i, turning interleaved rotary pairs into half-split ones.
std::vector<float> permute_for_half_split(const WeightTensor& weight, std::int64_t head_dim) {
  std::vector<float> out(static_cast<std::size_t>(weight.rows * weight.cols));
  const std::int64_t half = head_dim / 2;
  for (std::int64_t row = 0; row < weight.rows; ++row) {
    const std::int64_t head = row / head_dim;
    const std::int64_t within = row % head_dim;
    const std::int64_t target = head * head_dim + (within % 2) * half + within / 2;
    std::memcpy(&out[static_cast<std::size_t>(target * weight.cols)],
                weight.data + row * weight.cols, static_cast<std::size_t>(weight.cols) * 4);
  }
  return out;
}

void write_directory(const std::filesystem::path& directory, const config::ModelSpec& spec,
                     std::vector<TensorToWrite> tensors, int shards) {
  std::filesystem::create_directories(directory);
  std::ofstream(directory / "config.json") << hf_config_text(spec);
  if (shards <= 1) {
    write_safetensors(directory / "model.safetensors", tensors);
    return;
  }
  Json weight_map = Json::object();
  const std::size_t per_shard =
      (tensors.size() + static_cast<std::size_t>(shards) - 1) / static_cast<std::size_t>(shards);
  for (int shard = 0; shard < shards; ++shard) {
    const std::string name = "model-0000" + std::to_string(shard + 1) + "-of-0000" +
                             std::to_string(shards) + ".safetensors";
    const std::size_t begin = static_cast<std::size_t>(shard) * per_shard;
    const std::size_t end = std::min(tensors.size(), begin + per_shard);
    std::vector<TensorToWrite> part(tensors.begin() + static_cast<std::ptrdiff_t>(begin),
                                    tensors.begin() + static_cast<std::ptrdiff_t>(end));
    for (const TensorToWrite& tensor : part) {
      weight_map[tensor.name] = name;
    }
    write_safetensors(directory / name, part);
  }
  std::ofstream(directory / "model.safetensors.index.json")
      << Json{{"metadata", Json::object()}, {"weight_map", weight_map}}.dump(2);
}

}  // namespace

void export_hf_model(const ModelWeights& model, const std::filesystem::path& directory,
                     TensorDtype dtype, int shards) {
  const std::int64_t head_dim = model.spec.head_dim();
  const bool permute = model.rope_layout == RopeLayout::kInterleavedPairs;
  std::vector<TensorToWrite> tensors;
  const auto add = [&](const std::string& name, const WeightTensor& weight, bool rotary_rows) {
    if (!weight.present()) {
      return;
    }
    std::vector<std::int64_t> shape = weight.rows == 1
                                          ? std::vector<std::int64_t>{weight.cols}
                                          : std::vector<std::int64_t>{weight.rows, weight.cols};
    tensors.push_back(
        {name, dtype, shape,
         rotary_rows && permute ? permute_for_half_split(weight, head_dim) : values_of(weight)});
  };
  add("model.embed_tokens.weight", model.token_embedding, false);
  for (std::size_t layer = 0; layer < model.layers.size(); ++layer) {
    const LayerWeights& w = model.layers[layer];
    const std::string prefix = "model.layers." + std::to_string(layer) + ".";
    add(prefix + "input_layernorm.weight", w.attention_norm, false);
    add(prefix + "self_attn.q_proj.weight", w.wq, true);
    add(prefix + "self_attn.k_proj.weight", w.wk, true);
    add(prefix + "self_attn.v_proj.weight", w.wv, false);
    add(prefix + "self_attn.o_proj.weight", w.wo, false);
    add(prefix + "post_attention_layernorm.weight", w.mlp_norm, false);
    add(prefix + "mlp.gate_proj.weight", w.w_gate, false);
    add(prefix + "mlp.up_proj.weight", w.w_up, false);
    add(prefix + "mlp.down_proj.weight", w.w_down, false);
  }
  add("model.norm.weight", model.final_norm, false);
  if (!model.spec.tie_word_embeddings()) {
    add("lm_head.weight", model.lm_head, false);
  }
  write_directory(directory, model.spec, std::move(tensors), shards);
}

void write_random_hf_model(const config::ModelSpec& spec, const std::filesystem::path& directory,
                           std::uint64_t seed) {
  std::mt19937_64 random(seed);
  const auto uniform = [&](float scale) {
    return scale * (static_cast<float>(random() >> 40) / 8388608.0F - 1.0F);
  };
  std::vector<TensorToWrite> tensors;
  const auto matrix = [&](const std::string& name, std::int64_t rows, std::int64_t cols) {
    std::vector<float> values(static_cast<std::size_t>(rows * cols));
    const float scale = 1.0F / std::sqrt(static_cast<float>(cols));
    for (float& value : values) {
      value = uniform(scale);
    }
    tensors.push_back({name, TensorDtype::kF32, {rows, cols}, std::move(values)});
  };
  const auto vector = [&](const std::string& name, std::int64_t size, float base) {
    std::vector<float> values(static_cast<std::size_t>(size));
    for (float& value : values) {
      value = base + uniform(0.1F);
    }
    tensors.push_back({name, TensorDtype::kF32, {size}, std::move(values)});
  };
  const ExpectedShapes s = expected_shapes(spec);
  matrix("model.embed_tokens.weight", s.vocab, s.hidden);
  for (std::uint32_t layer = 0; layer < spec.num_hidden_layers(); ++layer) {
    const std::string prefix = "model.layers." + std::to_string(layer) + ".";
    vector(prefix + "input_layernorm.weight", s.hidden, 1.0F);
    matrix(prefix + "self_attn.q_proj.weight", s.q_out, s.hidden);
    matrix(prefix + "self_attn.k_proj.weight", s.kv_out, s.hidden);
    matrix(prefix + "self_attn.v_proj.weight", s.kv_out, s.hidden);
    matrix(prefix + "self_attn.o_proj.weight", s.hidden, s.q_out);
    if (spec.attention_bias()) {
      vector(prefix + "self_attn.q_proj.bias", s.q_out, 0.0F);
      vector(prefix + "self_attn.k_proj.bias", s.kv_out, 0.0F);
      vector(prefix + "self_attn.v_proj.bias", s.kv_out, 0.0F);
    }
    if (spec.qk_norm()) {
      vector(prefix + "self_attn.q_norm.weight", s.head_dim, 1.0F);
      vector(prefix + "self_attn.k_norm.weight", s.head_dim, 1.0F);
    }
    vector(prefix + "post_attention_layernorm.weight", s.hidden, 1.0F);
    matrix(prefix + "mlp.gate_proj.weight", s.intermediate, s.hidden);
    matrix(prefix + "mlp.up_proj.weight", s.intermediate, s.hidden);
    matrix(prefix + "mlp.down_proj.weight", s.hidden, s.intermediate);
  }
  vector("model.norm.weight", s.hidden, 1.0F);
  if (!spec.tie_word_embeddings()) {
    matrix("lm_head.weight", s.vocab, s.hidden);
  }
  write_directory(directory, spec, std::move(tensors), 1);
}

config::ModelSpec small_spec(config::Architecture architecture) {
  config::ModelSpec spec;
  spec.set_name("small");
  spec.set_architecture(architecture);
  spec.set_num_hidden_layers(2);
  spec.set_hidden_size(48);
  spec.set_num_attention_heads(4);
  spec.set_num_key_value_heads(2);
  // Qwen3 states head_dim explicitly, and it need not be hidden / heads.
  spec.set_head_dim(architecture == config::QWEN3 ? 16 : 12);
  spec.set_intermediate_size(96);
  spec.set_vocab_size(64);
  spec.set_max_position_embeddings(128);
  spec.set_rope_theta(architecture == config::QWEN2 ? 1000000.0 : 10000.0);
  spec.set_rms_norm_eps(1e-6);
  spec.set_tie_word_embeddings(architecture == config::QWEN2);
  spec.set_attention_bias(architecture == config::QWEN2);
  spec.set_qk_norm(architecture == config::QWEN3);
  if (architecture == config::MISTRAL) {
    spec.set_sliding_window(4);
  }
  return spec;
}

}  // namespace kvtier::kernels::testing
