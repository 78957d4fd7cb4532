#include "kernels/model_weights.hpp"

#include <string>

#include "common/errors.hpp"

namespace kvtier::kernels {

void check_engine_spec(const config::ModelSpec& spec, const std::string& where) {
  const auto require_positive = [&](bool has, std::uint32_t value, const char* field) {
    if (!has || value == 0) {
      throw DataError(std::string("model field '") + field + "' is missing or zero", where);
    }
  };
  if (spec.has_moe()) {
    throw DataError("model '" + spec.name() +
                        "' is a mixture of experts, which kvtier simulates (kvtier sim) but whose "
                        "engine runs dense models only (field moe)",
                    where);
  }
  if (spec.has_mla()) {
    throw DataError("model '" + spec.name() +
                        "' uses multi-head latent attention, which kvtier simulates (kvtier sim) "
                        "but whose engine does not run (field mla)",
                    where);
  }
  if (spec.has_sliding_window_pattern()) {
    throw DataError("model '" + spec.name() +
                        "' has hybrid attention, which kvtier simulates (kvtier sim) but whose "
                        "engine does not run (field sliding_window_pattern)",
                    where);
  }
  if (spec.architecture() == config::GEMMA3) {
    throw DataError("model '" + spec.name() +
                        "' is a Gemma 3, which kvtier simulates (kvtier sim) but whose engine does "
                        "not run (field architecture)",
                    where);
  }
  require_positive(spec.has_num_hidden_layers(), spec.num_hidden_layers(), "num_hidden_layers");
  require_positive(spec.has_hidden_size(), spec.hidden_size(), "hidden_size");
  require_positive(spec.has_num_attention_heads(), spec.num_attention_heads(),
                   "num_attention_heads");
  require_positive(spec.has_num_key_value_heads(), spec.num_key_value_heads(),
                   "num_key_value_heads");
  require_positive(spec.has_head_dim(), spec.head_dim(), "head_dim");
  require_positive(spec.has_intermediate_size(), spec.intermediate_size(), "intermediate_size");
  require_positive(spec.has_vocab_size(), spec.vocab_size(), "vocab_size");
  require_positive(spec.has_max_position_embeddings(), spec.max_position_embeddings(),
                   "max_position_embeddings");
  // Positions are indexed with int, as in the engines' kernels.
  if (spec.max_position_embeddings() > 0x7FFFFFFFU) {
    throw DataError("model field 'max_position_embeddings' " +
                        std::to_string(spec.max_position_embeddings()) +
                        " is more positions than the engines index (at most 2147483647)",
                    where);
  }
  if (spec.num_attention_heads() % spec.num_key_value_heads() != 0) {
    throw DataError("num_attention_heads (" + std::to_string(spec.num_attention_heads()) +
                        ") is not a multiple of num_key_value_heads (" +
                        std::to_string(spec.num_key_value_heads()) + ")",
                    where);
  }
  if (spec.head_dim() % 2 != 0) {
    throw DataError(
        "head_dim " + std::to_string(spec.head_dim()) + " is odd; rotary embeddings rotate pairs",
        where);
  }
  if (!(spec.rope_theta() > 0.0)) {
    throw DataError("rope_theta must be positive", where);
  }
  if (!(spec.rms_norm_eps() > 0.0)) {
    throw DataError("rms_norm_eps must be positive", where);
  }
  if (spec.has_rope_scaling()) {
    const auto& scaling = spec.rope_scaling();
    if (scaling.rope_type() != "llama3" && scaling.rope_type() != "linear") {
      throw DataError("rope_scaling.rope_type '" + scaling.rope_type() +
                          "' is not supported (supported: llama3, linear)",
                      where);
    }
    if (!(scaling.factor() >= 1.0)) {
      throw DataError("rope_scaling.factor must be at least 1", where);
    }
    if (scaling.rope_type() == "llama3" &&
        (!scaling.has_low_freq_factor() || !scaling.has_high_freq_factor() ||
         !scaling.has_original_max_position_embeddings() || !(scaling.low_freq_factor() > 0.0) ||
         scaling.high_freq_factor() <= scaling.low_freq_factor())) {
      throw DataError(
          "rope_scaling of type llama3 needs 0 < low_freq_factor < high_freq_factor and "
          "original_max_position_embeddings",
          where);
    }
  }
}

void check_forward_tokens(const config::ModelSpec& spec, int position,
                          std::span<const std::int32_t> tokens) {
  if (tokens.empty()) {
    throw DataError("no tokens to run", spec.name());
  }
  const auto end = static_cast<std::int64_t>(position) + static_cast<std::int64_t>(tokens.size());
  if (end > spec.max_position_embeddings()) {
    throw DataError(std::to_string(tokens.size()) + " tokens at position " +
                        std::to_string(position) + " pass the model's max_position_embeddings (" +
                        std::to_string(spec.max_position_embeddings()) + ")",
                    spec.name());
  }
  for (const std::int32_t token : tokens) {
    if (token < 0 || static_cast<std::uint32_t>(token) >= spec.vocab_size()) {
      throw DataError("token id " + std::to_string(token) + " is outside the vocabulary (" +
                          std::to_string(spec.vocab_size()) + " tokens)",
                      spec.name());
    }
  }
}

ExpectedShapes expected_shapes(const config::ModelSpec& spec) {
  ExpectedShapes shapes;
  shapes.hidden = spec.hidden_size();
  shapes.head_dim = spec.head_dim();
  shapes.q_out = static_cast<std::int64_t>(spec.num_attention_heads()) * spec.head_dim();
  shapes.kv_out = static_cast<std::int64_t>(spec.num_key_value_heads()) * spec.head_dim();
  shapes.intermediate = spec.intermediate_size();
  shapes.vocab = spec.vocab_size();
  return shapes;
}

}  // namespace kvtier::kernels
