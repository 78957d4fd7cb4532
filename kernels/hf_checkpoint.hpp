#pragma once
// Hugging Face model directories: config.json plus safetensors weights (one file or shards) in
// F32, F16 or BF16, for LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM (q/k/v biases)
// and Qwen3ForCausalLM (q/k RMSNorm).

#include <filesystem>

#include "configs/schema/model.pb.h"
#include "kernels/model_weights.hpp"

namespace kvtier::kernels {

// Reads config.json into the architecture description; throws DataError naming the field for an
// unsupported architecture or a missing or malformed field. Fields Hugging Face itself defaults
// (num_key_value_heads, head_dim, rope_theta, tie_word_embeddings, attention_bias) take the
// defaults of the architecture's transformers config class.
[[nodiscard]] config::ModelSpec read_hf_config(const std::filesystem::path& config_json);

// Loads a model directory; throws DataError naming the tensor for a missing tensor or a shape or
// dtype mismatch.
[[nodiscard]] ModelWeights load_hf_checkpoint(const std::filesystem::path& directory);

// A llama2.c checkpoint file or a Hugging Face directory, told apart by what `path` is.
[[nodiscard]] ModelWeights load_model(const std::filesystem::path& path);

}  // namespace kvtier::kernels
