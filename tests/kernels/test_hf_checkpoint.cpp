// Hugging Face directories written by the tests: stories260K converted to the HF Llama layout
// must give the llama2.c loader's logits; random Qwen2/Qwen3/Mistral-shaped models must load
// with their extra tensors and run deterministically; broken directories name what is wrong.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <fstream>

#include "common/errors.hpp"
#include "kernels/engine.hpp"
#include "kernels/generate.hpp"
#include "kernels/hf_checkpoint.hpp"
#include "kernels/llama2c_checkpoint.hpp"
#include "kernels/safetensors.hpp"
#include "tests/kernels/support/model_files.hpp"

namespace kk = kvtier::kernels;
using kk::testing::stories_dir;
using kk::testing::TempDir;

namespace {

std::vector<float> run_prompt(const std::shared_ptr<const kk::ModelWeights>& weights,
                              const std::vector<std::int32_t>& prompt) {
  const auto engine = kk::make_cpu_engine(weights);
  const auto logits = engine->prefill(prompt);
  return {logits.begin(), logits.end()};
}

std::vector<std::int32_t> greedy(const std::shared_ptr<const kk::ModelWeights>& weights, int n) {
  const auto engine = kk::make_cpu_engine(weights);
  kk::GenerationOptions options;
  options.max_new_tokens = n;
  const std::int32_t bos = 1;
  return kk::generate(*engine, {&bos, 1}, options).tokens;
}

float max_difference(const std::vector<float>& a, const std::vector<float>& b) {
  float largest = 0.0F;
  for (std::size_t i = 0; i < a.size(); ++i) {
    largest = std::max(largest, std::abs(a[i] - b[i]));
  }
  return largest;
}

std::vector<std::int32_t> prompt() {
  return {1, 403, 407, 261, 378, 432, 383, 286};
}

}  // namespace

TEST_CASE("stories260K in the Hugging Face Llama layout gives the llama2.c loader's logits",
          "[kernels][hf]") {
  const auto original = std::make_shared<const kk::ModelWeights>(
      kk::load_llama2c_checkpoint(stories_dir() / "stories260K.bin"));
  const TempDir temp("hf-stories");
  kk::testing::export_hf_model(*original, temp.path() / "f32", kk::TensorDtype::kF32, 1);
  kk::testing::export_hf_model(*original, temp.path() / "sharded", kk::TensorDtype::kF32, 3);
  kk::testing::export_hf_model(*original, temp.path() / "bf16", kk::TensorDtype::kBF16, 1);
  kk::testing::export_hf_model(*original, temp.path() / "f16", kk::TensorDtype::kF16, 2);

  const auto converted =
      std::make_shared<const kk::ModelWeights>(kk::load_model(temp.path() / "f32"));
  CHECK(converted->rope_layout == kk::RopeLayout::kHalfSplit);
  CHECK(converted->spec.architecture() == kvtier::config::LLAMA);
  CHECK(converted->spec.weight_dtype() == kvtier::config::FP32);
  CHECK(converted->storage.converted_bytes() == 0);  // mapped in place
  const std::vector<float> expected = run_prompt(original, prompt());
  // Same weights, rotary pairs permuted: only the order of float sums differs.
  CHECK(max_difference(run_prompt(converted, prompt()), expected) < 1e-4F);
  CHECK(greedy(converted, 40) == greedy(original, 40));

  const auto sharded =
      std::make_shared<const kk::ModelWeights>(kk::load_model(temp.path() / "sharded"));
  CHECK(run_prompt(sharded, prompt()) == run_prompt(converted, prompt()));

  // 16-bit weights are converted once to float32; rounding moves logits a little.
  const auto bf16 = std::make_shared<const kk::ModelWeights>(kk::load_model(temp.path() / "bf16"));
  CHECK(bf16->spec.weight_dtype() == kvtier::config::BF16);
  CHECK(bf16->storage.converted_bytes() > 0);
  CHECK(max_difference(run_prompt(bf16, prompt()), expected) < 0.5F);
  const auto f16 = std::make_shared<const kk::ModelWeights>(kk::load_model(temp.path() / "f16"));
  CHECK(f16->spec.weight_dtype() == kvtier::config::FP16);
  CHECK(max_difference(run_prompt(f16, prompt()), expected) < 0.05F);
}

TEST_CASE(
    "Qwen2, Qwen3 and Mistral shaped models load their extra tensors and run "
    "deterministically",
    "[kernels][hf]") {
  const TempDir temp("hf-random");
  for (const auto architecture : {kvtier::config::QWEN2, kvtier::config::QWEN3,
                                  kvtier::config::MISTRAL, kvtier::config::LLAMA}) {
    const kvtier::config::ModelSpec spec = kk::testing::small_spec(architecture);
    const auto directory = temp.path() / kvtier::config::Architecture_Name(architecture);
    kk::testing::write_random_hf_model(spec, directory, 7);
    const auto weights = std::make_shared<const kk::ModelWeights>(kk::load_model(directory));
    CAPTURE(kvtier::config::Architecture_Name(architecture));
    CHECK(weights->spec.architecture() == architecture);
    CHECK(weights->spec.head_dim() == spec.head_dim());
    const kk::LayerWeights& layer = weights->layers[1];
    CHECK(layer.q_bias.present() == (architecture == kvtier::config::QWEN2));
    CHECK(layer.v_bias.present() == (architecture == kvtier::config::QWEN2));
    CHECK(layer.q_norm.present() == (architecture == kvtier::config::QWEN3));
    CHECK(layer.k_norm.cols == (architecture == kvtier::config::QWEN3 ? 16 : 0));
    CHECK(layer.wq.rows == static_cast<std::int64_t>(spec.num_attention_heads() * spec.head_dim()));
    CHECK(weights->spec.sliding_window() == spec.sliding_window());
    CHECK((weights->lm_head.data == weights->token_embedding.data) == spec.tie_word_embeddings());

    const std::vector<std::int32_t> prompt = {3, 14, 15, 9, 26, 5, 35, 8};
    const std::vector<float> first = run_prompt(weights, prompt);
    CHECK(first.size() == 64);
    CHECK(std::all_of(first.begin(), first.end(), [](float x) { return std::isfinite(x); }));
    CHECK(run_prompt(weights, prompt) == first);
    // A different prompt changes the logits (the weights are wired in).
    CHECK(run_prompt(weights, {3, 14, 15, 9, 26, 5, 35, 9}) != first);
  }
}

TEST_CASE("broken Hugging Face directories name the field or tensor at fault",
          "[kernels][hf][errors]") {
  const TempDir temp("hf-broken");
  const auto spec = kk::testing::small_spec(kvtier::config::QWEN2);
  const auto directory = temp.path() / "model";
  kk::testing::write_random_hf_model(spec, directory, 1);

  SECTION("unsupported architecture") {
    std::ofstream(directory / "config.json")
        << R"({"architectures": ["GPT2LMHeadModel"], "hidden_size": 48})";
    CHECK_THROWS_WITH(kk::load_model(directory),
                      Catch::Contains("'architectures': 'GPT2LMHeadModel' is not supported"));
  }
  SECTION("missing config field") {
    std::ofstream(directory / "config.json")
        << R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 48})";
    CHECK_THROWS_WITH(kk::load_model(directory), Catch::Contains("'intermediate_size'"));
  }
  SECTION("a tensor is missing") {
    auto without_bias = spec;
    without_bias.set_architecture(kvtier::config::LLAMA);
    without_bias.set_attention_bias(false);
    kk::testing::write_random_hf_model(without_bias, directory, 1);
    // Declared as Qwen2 (which always has biases) over weights that have none.
    std::ofstream(directory / "config.json") << kk::testing::hf_config_text(spec);
    try {
      static_cast<void>(kk::load_model(directory));
      FAIL("expected a DataError");
    } catch (const kvtier::DataError& error) {
      CHECK(std::string(error.what()) == "missing tensor 'model.layers.0.self_attn.q_proj.bias'");
      CHECK(error.exit_code() == kvtier::ExitCode::kBadData);
    }
  }
  SECTION("a shape disagrees with config.json") {
    auto wider = spec;
    wider.set_intermediate_size(100);
    std::ofstream(directory / "config.json") << kk::testing::hf_config_text(wider);
    CHECK_THROWS_WITH(kk::load_model(directory),
                      Catch::Contains("tensor 'model.layers.0.mlp.gate_proj.weight' has shape "
                                      "[96, 48]; the model's configuration implies [100, 48]"));
  }
  SECTION("a dtype the engine does not read") {
    const std::string header =
        R"({"model.embed_tokens.weight":{"dtype":"I32","shape":[64,48],"data_offsets":[0,12288]}})";
    const std::uint64_t length = header.size();
    std::ofstream out(directory / "model.safetensors", std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(&length), 8);
    out << header << std::string(12288, '\0');
    out.close();
    CHECK_THROWS_WITH(kk::load_model(directory),
                      Catch::Contains("tensor 'model.embed_tokens.weight' has dtype I32"));
  }
  // From fuzzing the loaders (docs/FUZZING.md): a float in a shape was converted to int64 unchecked
  // (undefined), and a shape of 2^64 elements wrapped to none and passed as an empty tensor.
  const auto write_header = [&](const std::string& header) {
    const std::uint64_t length = header.size();
    std::ofstream out(directory / "model.safetensors", std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(&length), 8);
    out << header;
  };
  SECTION("a shape that is not a list of non-negative integers") {
    for (const std::string shape : {"[1e30]", "[-1]", "[2.5]", "\"8\""}) {
      CAPTURE(shape);
      write_header(R"({"model.norm.weight":{"dtype":"F32","shape":)" + shape +
                   R"(,"data_offsets":[0,0]}})");
      CHECK_THROWS_WITH(kk::load_model(directory),
                        "tensor 'model.norm.weight' field 'shape' must be a list of non-negative "
                        "integers");
    }
    write_header(R"({"model.norm.weight":{"dtype":"F32","shape":[0],"data_offsets":[0,1e30]}})");
    CHECK_THROWS_WITH(kk::load_model(directory), Catch::Contains("field 'data_offsets'"));
  }
  SECTION("a shape whose size wraps around") {
    write_header(R"({"model.norm.weight":{"dtype":"F32","shape":[4294967296,4294967296],)"
                 R"("data_offsets":[0,0]}})");
    try {
      const kk::SafetensorsFile file(directory / "model.safetensors");
      FAIL("expected a DataError");
    } catch (const kvtier::DataError& error) {
      CHECK(std::string(error.what()) ==
            "tensor 'model.norm.weight' has a shape too large to address");
      CHECK(error.where() == (directory / "model.safetensors").string());
    }
  }
  SECTION("a shard index naming a file outside the model's folder") {
    std::filesystem::remove(directory / "model.safetensors");
    for (const std::string shard : {"../model.safetensors", "/etc/passwd", "", ".."}) {
      CAPTURE(shard);
      std::ofstream(directory / "model.safetensors.index.json", std::ios::trunc)
          << R"({"weight_map": {"model.norm.weight": ")" << shard << R"("}})";
      CHECK_THROWS_WITH(kk::load_model(directory),
                        "weight_map entry 'model.norm.weight' is not a file name of the model's "
                        "folder");
    }
  }
  SECTION("a safetensors header that runs past the file") {
    const std::uint64_t length = 1000;
    std::ofstream out(directory / "model.safetensors", std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(&length), 8);
    out << "{}";
    out.close();
    CHECK_THROWS_WITH(kk::load_model(directory), Catch::Contains("does not fit the file"));
  }
}
