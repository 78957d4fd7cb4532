// config.json → ModelSpec. Field names and defaults follow the transformers config classes
// (LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config).
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "common/errors.hpp"
#include "kernels/hf_checkpoint.hpp"

namespace kvtier::kernels {
namespace {

using Json = nlohmann::json;

class ConfigReader {
 public:
  ConfigReader(const Json& json, std::string where) : json_(json), where_(std::move(where)) {}

  [[nodiscard]] bool has(const char* field) const {
    return json_.contains(field) && !json_.at(field).is_null();
  }
  [[nodiscard]] std::uint32_t positive(const char* field) const {
    if (!has(field)) {
      throw DataError(std::string("config.json has no field '") + field + "'", where_);
    }
    const Json& value = json_.at(field);
    if (!value.is_number_integer() || value.get<std::int64_t>() <= 0 ||
        value.get<std::int64_t>() > 0xFFFFFFFFLL) {
      throw DataError(std::string("config.json field '") + field + "' must be a positive integer",
                      where_);
    }
    return value.get<std::uint32_t>();
  }
  [[nodiscard]] std::uint32_t positive_or(const char* field, std::uint32_t fallback) const {
    return has(field) ? positive(field) : fallback;
  }
  [[nodiscard]] double number(const Json& object, const char* field, const char* path) const {
    if (!object.contains(field) || !object.at(field).is_number()) {
      throw DataError(std::string("config.json field '") + path + "' must be a number", where_);
    }
    return object.at(field).get<double>();
  }
  [[nodiscard]] double number_or(const char* field, double fallback) const {
    return has(field) ? number(json_, field, field) : fallback;
  }
  [[nodiscard]] bool boolean_or(const char* field, bool fallback) const {
    if (!has(field)) {
      return fallback;
    }
    if (!json_.at(field).is_boolean()) {
      throw DataError(std::string("config.json field '") + field + "' must be true or false",
                      where_);
    }
    return json_.at(field).get<bool>();
  }
  [[nodiscard]] const std::string& where() const { return where_; }

 private:
  const Json& json_;
  std::string where_;
};

config::Architecture architecture_of(const Json& json, const std::string& where) {
  if (!json.contains("architectures") || !json["architectures"].is_array() ||
      json["architectures"].empty() || !json["architectures"][0].is_string()) {
    throw DataError("config.json has no 'architectures' list", where);
  }
  const auto name = json["architectures"][0].get<std::string>();
  if (name == "LlamaForCausalLM") {
    return config::LLAMA;
  }
  if (name == "MistralForCausalLM") {
    return config::MISTRAL;
  }
  if (name == "Qwen2ForCausalLM") {
    return config::QWEN2;
  }
  if (name == "Qwen3ForCausalLM") {
    return config::QWEN3;
  }
  throw DataError("config.json field 'architectures': '" + name +
                      "' is not supported (supported: LlamaForCausalLM, MistralForCausalLM, "
                      "Qwen2ForCausalLM, Qwen3ForCausalLM)",
                  where);
}

config::DType dtype_of(const std::string& torch_dtype, const std::string& where) {
  if (torch_dtype == "float32") {
    return config::FP32;
  }
  if (torch_dtype == "float16") {
    return config::FP16;
  }
  if (torch_dtype == "bfloat16") {
    return config::BF16;
  }
  throw DataError("config.json field 'torch_dtype': '" + torch_dtype +
                      "' is not supported (float32, float16, bfloat16)",
                  where);
}

void read_rope_scaling(const Json& json, const ConfigReader& reader, config::ModelSpec& spec) {
  if (!reader.has("rope_scaling")) {
    return;
  }
  const Json& scaling = json.at("rope_scaling");
  if (!scaling.is_object()) {
    throw DataError("config.json field 'rope_scaling' must be an object or null", reader.where());
  }
  // Older configs name the type "type", newer ones "rope_type".
  const char* type_field = scaling.contains("rope_type") ? "rope_type" : "type";
  if (!scaling.contains(type_field) || !scaling.at(type_field).is_string()) {
    throw DataError("config.json field 'rope_scaling.rope_type' is missing", reader.where());
  }
  auto& out = *spec.mutable_rope_scaling();
  out.set_rope_type(scaling.at(type_field).get<std::string>());
  if (out.rope_type() == "default") {
    spec.clear_rope_scaling();
    return;
  }
  out.set_factor(reader.number(scaling, "factor", "rope_scaling.factor"));
  if (scaling.contains("low_freq_factor")) {
    out.set_low_freq_factor(
        reader.number(scaling, "low_freq_factor", "rope_scaling.low_freq_factor"));
  }
  if (scaling.contains("high_freq_factor")) {
    out.set_high_freq_factor(
        reader.number(scaling, "high_freq_factor", "rope_scaling.high_freq_factor"));
  }
  if (scaling.contains("original_max_position_embeddings")) {
    const double positions = reader.number(scaling, "original_max_position_embeddings",
                                           "rope_scaling.original_max_position_embeddings");
    // Range-checked before the conversion, which is undefined for a value out of range.
    if (!(positions >= 1.0 && positions <= 4294967295.0)) {
      throw DataError(
          "config.json field 'rope_scaling.original_max_position_embeddings' must be a positive "
          "integer below 2^32",
          reader.where());
    }
    out.set_original_max_position_embeddings(static_cast<std::uint32_t>(positions));
  }
}

}  // namespace

config::ModelSpec read_hf_config(const std::filesystem::path& config_json) {
  const std::string where = config_json.string();
  std::ifstream in(config_json);
  if (!in) {
    throw DataError("cannot open config.json", where);
  }
  Json json;
  try {
    json = Json::parse(in);
  } catch (const Json::exception& error) {
    throw DataError(std::string("invalid JSON: ") + error.what(), where);
  }
  if (!json.is_object()) {
    throw DataError("config.json is not a JSON object", where);
  }
  const ConfigReader reader(json, where);
  config::ModelSpec spec;
  spec.set_name(config_json.parent_path().filename().string());
  spec.set_architecture(architecture_of(json, where));
  spec.set_hidden_size(reader.positive("hidden_size"));
  spec.set_intermediate_size(reader.positive("intermediate_size"));
  spec.set_num_hidden_layers(reader.positive("num_hidden_layers"));
  spec.set_num_attention_heads(reader.positive("num_attention_heads"));
  spec.set_num_key_value_heads(
      reader.positive_or("num_key_value_heads", spec.num_attention_heads()));
  spec.set_head_dim(
      reader.positive_or("head_dim", spec.hidden_size() / spec.num_attention_heads()));
  spec.set_vocab_size(reader.positive("vocab_size"));
  spec.set_max_position_embeddings(reader.positive("max_position_embeddings"));
  spec.set_rope_theta(reader.number_or("rope_theta", 10000.0));
  spec.set_rms_norm_eps(reader.number(json, "rms_norm_eps", "rms_norm_eps"));
  spec.set_tie_word_embeddings(reader.boolean_or("tie_word_embeddings", false));
  // Qwen2's attention always has q/k/v biases and Mistral's none. Llama's and Qwen3's
  // attention_bias gives o_proj a bias as well, which the engines do not add: refused rather
  // than run wrong.
  spec.set_attention_bias(spec.architecture() == config::QWEN2);
  if (spec.architecture() != config::QWEN2 && spec.architecture() != config::MISTRAL &&
      reader.boolean_or("attention_bias", false)) {
    throw DataError(
        "config.json field 'attention_bias': true (biases on q/k/v and o_proj) is not supported",
        where);
  }
  if (spec.architecture() == config::LLAMA && reader.boolean_or("mlp_bias", false)) {
    throw DataError("config.json field 'mlp_bias': true (MLP biases) is not supported", where);
  }
  if (reader.has("hidden_act") &&
      (!json.at("hidden_act").is_string() || json.at("hidden_act").get<std::string>() != "silu")) {
    throw DataError("config.json field 'hidden_act': " + json.at("hidden_act").dump() +
                        " is not supported (the engines run SwiGLU: silu)",
                    where);
  }
  spec.set_qk_norm(spec.architecture() == config::QWEN3);
  // A window of all the positions or more never binds (and the schema refuses more).
  if (spec.architecture() == config::MISTRAL && reader.has("sliding_window")) {
    if (const std::uint32_t window = reader.positive("sliding_window");
        window <= spec.max_position_embeddings()) {
      spec.set_sliding_window(window);
    }
  }
  if ((spec.architecture() == config::QWEN2 || spec.architecture() == config::QWEN3) &&
      reader.boolean_or("use_sliding_window", false)) {
    throw DataError(
        "config.json field 'use_sliding_window': per-layer sliding windows (max_window_layers) "
        "are not supported",
        where);
  }
  read_rope_scaling(json, reader, spec);
  const bool has_dtype = json.contains("torch_dtype") && json["torch_dtype"].is_string();
  spec.set_weight_dtype(has_dtype ? dtype_of(json["torch_dtype"].get<std::string>(), where)
                                  : config::FP32);
  // The CPU engine computes and caches in float32 whatever the storage format.
  spec.set_activation_dtype(config::FP32);
  spec.set_kv_dtype(config::FP32);
  return spec;
}

}  // namespace kvtier::kernels
