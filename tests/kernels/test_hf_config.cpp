// config.json → ModelSpec for the supported architectures, with the fields a real config has.
#include <catch2/catch.hpp>
#include <fstream>

#include "common/errors.hpp"
#include "kernels/hf_checkpoint.hpp"
#include "tests/kernels/support/model_files.hpp"

namespace kk = kvtier::kernels;

namespace {

kvtier::config::ModelSpec read(const kk::testing::TempDir& temp, const std::string& json) {
  std::ofstream(temp.path() / "config.json") << json;
  return kk::read_hf_config(temp.path() / "config.json");
}

}  // namespace

TEST_CASE("a Llama-3.1 config.json with llama3 RoPE scaling", "[kernels][hf]") {
  const kk::testing::TempDir temp("config-llama31");
  const auto spec = read(temp, R"({
    "architectures": ["LlamaForCausalLM"], "attention_bias": false, "bos_token_id": 128000,
    "eos_token_id": 128001, "hidden_act": "silu", "hidden_size": 4096,
    "intermediate_size": 14336, "max_position_embeddings": 131072, "model_type": "llama",
    "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
    "rms_norm_eps": 1e-05, "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0,
    "high_freq_factor": 4.0, "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
    "vocab_size": 128256})");
  CHECK(spec.architecture() == kvtier::config::LLAMA);
  CHECK(spec.head_dim() == 128);  // hidden_size / num_attention_heads when not stated
  CHECK(spec.num_key_value_heads() == 8);
  CHECK(spec.rope_theta() == 500000.0);
  CHECK(spec.rope_scaling().rope_type() == "llama3");
  CHECK(spec.rope_scaling().original_max_position_embeddings() == 8192);
  CHECK(spec.weight_dtype() == kvtier::config::BF16);
  CHECK_FALSE(spec.has_sliding_window());
  kk::check_engine_spec(spec, "config.json");
}

TEST_CASE("Qwen2, Qwen3 and Mistral specifics", "[kernels][hf]") {
  const kk::testing::TempDir temp("config-others");
  const std::string common = R"("hidden_size": 64, "intermediate_size": 128,
      "max_position_embeddings": 4096, "num_attention_heads": 4, "num_hidden_layers": 2,
      "num_key_value_heads": 2, "rms_norm_eps": 1e-06, "vocab_size": 100)";
  auto spec = read(temp, R"({"architectures": ["Qwen2ForCausalLM"], "use_sliding_window": false,
      "sliding_window": 4096, "tie_word_embeddings": true, )" +
                             common + "}");
  CHECK(spec.attention_bias());  // Qwen2 always has q/k/v biases
  CHECK_FALSE(spec.qk_norm());
  CHECK_FALSE(spec.has_sliding_window());  // use_sliding_window false
  CHECK(spec.tie_word_embeddings());
  CHECK(spec.rope_theta() == 10000.0);  // transformers' default when absent

  spec = read(temp, R"({"architectures": ["Qwen3ForCausalLM"], "head_dim": 32, )" + common + "}");
  CHECK(spec.qk_norm());
  CHECK(spec.head_dim() == 32);
  CHECK_FALSE(spec.attention_bias());

  spec = read(
      temp, R"({"architectures": ["MistralForCausalLM"], "sliding_window": 4096, )" + common + "}");
  CHECK(spec.sliding_window() == 4096);

  CHECK_THROWS_WITH(read(temp, R"({"architectures": ["Qwen2ForCausalLM"],
      "use_sliding_window": true, )" +
                                   common + "}"),
                    Catch::Contains("'use_sliding_window'"));
  spec = read(temp, R"({"architectures": ["LlamaForCausalLM"],
      "rope_scaling": {"type": "yarn", "factor": 4.0}, )" +
                        common + "}");
  CHECK_THROWS_WITH(kk::check_engine_spec(spec, "config.json"),
                    Catch::Contains("rope_scaling.rope_type 'yarn' is not supported"));
  CHECK_THROWS_WITH(read(temp, R"({"architectures": ["LlamaForCausalLM"],
      "num_attention_heads": "four", "hidden_size": 64, "intermediate_size": 128,
      "num_hidden_layers": 2})"),
                    Catch::Contains("'num_attention_heads' must be a positive integer"));
  CHECK_THROWS_AS(read(temp, "{not json"), kvtier::DataError);
}

TEST_CASE("an out-of-range original_max_position_embeddings is refused by name",
          "[kernels][hf][errors]") {
  // From fuzzing the loaders (docs/FUZZING.md): 1e20 was converted to uint32 unchecked (undefined).
  const kk::testing::TempDir temp("config-rope-positions");
  const auto config = [](const std::string& positions) {
    return R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 64,
        "intermediate_size": 128, "max_position_embeddings": 4096, "num_attention_heads": 4,
        "num_hidden_layers": 2, "vocab_size": 256, "rms_norm_eps": 1e-6,
        "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": )" +
           positions + "}}";
  };
  for (const std::string positions : {"1e20", "-1", "0"}) {
    CAPTURE(positions);
    try {
      static_cast<void>(read(temp, config(positions)));
      FAIL("expected a DataError");
    } catch (const kvtier::DataError& error) {
      CHECK(std::string(error.what()) ==
            "config.json field 'rope_scaling.original_max_position_embeddings' must be a "
            "positive integer below 2^32");
      CHECK(error.where() == (temp.path() / "config.json").string());
    }
  }
  CHECK(read(temp, config("8192.0")).rope_scaling().original_max_position_embeddings() == 8192);
}

TEST_CASE("config.json fields the engines would silently run wrong are refused by name",
          "[kernels][hf]") {
  const kk::testing::TempDir temp("config-refused");
  const std::string common = R"("hidden_size": 64, "intermediate_size": 128,
      "max_position_embeddings": 4096, "num_attention_heads": 4, "num_hidden_layers": 2,
      "num_key_value_heads": 2, "rms_norm_eps": 1e-06, "vocab_size": 100)";
  const auto llama = [&](const std::string& fields) {
    return read(temp, R"({"architectures": ["LlamaForCausalLM"], )" + fields + common + "}");
  };
  // transformers gives o_proj a bias too; the engines add none there.
  CHECK_THROWS_WITH(llama(R"("attention_bias": true, )"),
                    Catch::Contains("config.json field 'attention_bias'"));
  CHECK_THROWS_WITH(read(temp, R"({"architectures": ["Qwen3ForCausalLM"], "attention_bias": true,
      )" + common + "}"),
                    Catch::Contains("config.json field 'attention_bias'"));
  CHECK_THROWS_WITH(llama(R"("mlp_bias": true, )"),
                    Catch::Contains("config.json field 'mlp_bias'"));
  CHECK_THROWS_WITH(llama(R"("hidden_act": "gelu", )"),
                    Catch::Contains("config.json field 'hidden_act': \"gelu\" is not supported"));
  CHECK_NOTHROW(llama(R"("hidden_act": "silu", "attention_bias": false, "mlp_bias": false, )"));
  // MistralAttention has no biases, whatever the config says.
  CHECK_FALSE(read(temp, R"({"architectures": ["MistralForCausalLM"], "attention_bias": true,
      )" + common + "}")
                  .attention_bias());
  // A window wider than every position never binds.
  CHECK_FALSE(read(temp, R"({"architectures": ["MistralForCausalLM"], "sliding_window": 8192,
      )" + common + "}")
                  .has_sliding_window());
}

TEST_CASE("the engines refuse positions they cannot index and a llama3 scaling dividing by zero",
          "[kernels][hf]") {
  const kk::testing::TempDir temp("config-limits");
  const std::string shape = R"("architectures": ["LlamaForCausalLM"], "hidden_size": 64,
      "intermediate_size": 128, "num_attention_heads": 4, "num_hidden_layers": 2,
      "rms_norm_eps": 1e-06, "vocab_size": 100, )";
  auto spec = read(temp, "{" + shape + R"("max_position_embeddings": 4294967295})");
  CHECK_THROWS_WITH(kk::check_engine_spec(spec, "config.json"),
                    Catch::Contains("'max_position_embeddings' 4294967295 is more positions"));
  spec = read(temp, "{" + shape + R"("max_position_embeddings": 2147483647})");
  CHECK_NOTHROW(kk::check_engine_spec(spec, "config.json"));
  spec = read(temp, "{" + shape + R"("max_position_embeddings": 4096, "rope_scaling": {
      "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 0, "high_freq_factor": 4.0,
      "original_max_position_embeddings": 1024}})");
  CHECK_THROWS_WITH(kk::check_engine_spec(spec, "config.json"),
                    Catch::Contains("0 < low_freq_factor < high_freq_factor"));
}
