// The stories260K fixture through the llama2.c loader and the CPU engine, including the greedy
// golden text that llama2.c's run.c produces.
#include <catch2/catch.hpp>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include "common/errors.hpp"
#include "kernels/engine.hpp"
#include "kernels/generate.hpp"
#include "kernels/llama2c_checkpoint.hpp"
#include "kernels/tokenizer.hpp"
#include "tests/kernels/support/model_files.hpp"
#include "tests/support/config_fixture.hpp"

namespace kk = kvtier::kernels;
using kk::testing::stories_dir;

namespace {

std::shared_ptr<const kk::ModelWeights> stories() {
  return kk::testing::stories_model();
}

std::string read_text(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

TEST_CASE("llama2.c loader reads the stories260K header into a ModelSpec", "[kernels][llama2c]") {
  const auto model = stories();
  const auto& spec = model->spec;
  CHECK(spec.name() == "stories260K");
  CHECK(spec.architecture() == kvtier::config::LLAMA);
  CHECK(spec.hidden_size() == 64);
  CHECK(spec.intermediate_size() == 172);
  CHECK(spec.num_hidden_layers() == 5);
  CHECK(spec.num_attention_heads() == 8);
  CHECK(spec.num_key_value_heads() == 4);
  CHECK(spec.head_dim() == 8);
  CHECK(spec.vocab_size() == 512);
  CHECK(spec.max_position_embeddings() == 512);
  CHECK(spec.tie_word_embeddings());
  CHECK(model->rope_layout == kk::RopeLayout::kInterleavedPairs);
  CHECK(model->lm_head.data == model->token_embedding.data);
  // float32 checkpoints are used in place: nothing was converted.
  CHECK(model->storage.converted_bytes() == 0);
  REQUIRE(model->layers.size() == 5);
  CHECK(model->layers[4].w_down.rows == 64);
  CHECK(model->layers[4].w_down.cols == 172);
}

TEST_CASE("greedy decoding of stories260K from BOS reproduces the golden text",
          "[kernels][llama2c][golden]") {
  const auto engine = kk::make_cpu_engine(stories());
  const auto tokenizer = kk::load_llama2c_tokenizer(stories_dir() / "tok512.bin");
  kk::GenerationOptions options;
  options.max_new_tokens = 60;  // run.c -n 60: 60 forward passes from BOS
  options.sampling = kk::SamplingOptions::greedy();
  options.stop_tokens = {1};  // run.c stops when the model emits BOS
  const std::int32_t bos = 1;
  const kk::GenerationResult result = kk::generate(*engine, {&bos, 1}, options);
  CHECK(result.generated().size() == 60);
  // run.c prints each token after BOS, then a newline.
  const std::string text = tokenizer->decode(result.generated()) + "\n";
  CHECK(text == read_text(stories_dir() / "golden_t0_n60.txt"));
}

TEST_CASE("a batched prefill gives the logits of token-by-token decoding", "[kernels][engine]") {
  const auto weights = stories();
  const auto batched = kk::make_cpu_engine(weights);
  const auto stepwise = kk::make_cpu_engine(weights);
  const std::vector<std::int32_t> prompt = {1, 403, 407, 261, 378, 432, 383, 286, 261, 376};
  CHECK(kk::testing::prefill_decode_gap(*batched, *stepwise, prompt) <= 1e-4F);
  CHECK(batched->position() == 10);
  // Decoding continues from a prefill as from decodes.
  const auto next_batched = batched->decode(42);
  const std::vector<float> continued(next_batched.begin(), next_batched.end());
  const auto next_stepwise = stepwise->decode(42);
  for (std::size_t i = 0; i < continued.size(); ++i) {
    REQUIRE(next_stepwise[i] == Approx(continued[i]).margin(1e-4));
  }
}

TEST_CASE("running the same tokens twice gives bit-identical logits", "[kernels][engine]") {
  const auto engine = kk::make_cpu_engine(stories());
  const std::vector<std::int32_t> prompt = {1, 346, 306, 414, 263, 304, 341};
  const auto first = engine->prefill(prompt);
  const std::vector<float> kept(first.begin(), first.end());
  engine->reset();
  const auto second = engine->prefill(prompt);
  CHECK(std::equal(kept.begin(), kept.end(), second.begin(), second.end()));
}

TEST_CASE("positions past max_position_embeddings are refused with exit code 3",
          "[kernels][engine][errors]") {
  const auto engine = kk::make_cpu_engine(stories());
  const std::vector<std::int32_t> too_long(513, 1);
  try {
    static_cast<void>(engine->prefill(too_long));
    FAIL("expected a DataError");
  } catch (const kvtier::DataError& error) {
    CHECK(error.exit_code() == kvtier::ExitCode::kBadData);
    CHECK_THAT(error.what(), Catch::Contains("max_position_embeddings (512)"));
  }
  const std::int32_t outside = 512;
  CHECK_THROWS_AS(engine->decode(outside), kvtier::DataError);
  kk::GenerationOptions options;
  options.max_new_tokens = 600;
  const std::int32_t bos = 1;
  CHECK_THROWS_AS(kk::generate(*engine, {&bos, 1}, options), kvtier::DataError);
}

TEST_CASE("a truncated llama2.c checkpoint names the tensor it ends in",
          "[kernels][llama2c][errors]") {
  const kk::testing::TempDir temp("truncated");
  const std::string bytes = read_text(stories_dir() / "stories260K.bin");
  const auto path = temp.path() / "cut.bin";
  std::ofstream(path, std::ios::binary) << bytes.substr(0, 400000);
  try {
    static_cast<void>(kk::load_llama2c_checkpoint(path));
    FAIL("expected a DataError");
  } catch (const kvtier::DataError& error) {
    CHECK_THAT(error.what(), Catch::Contains("checkpoint ends inside tensor 'w1[0]'"));
    CHECK(error.where() == path.string());
  }
  std::ofstream(path, std::ios::binary) << bytes << "extra";
  CHECK_THROWS_WITH(kk::load_llama2c_checkpoint(path), Catch::Contains("bytes follow"));
  CHECK_THROWS_AS(kk::load_llama2c_checkpoint(temp.path() / "absent.bin"), kvtier::DataError);
  // vocab_size (the sixth header field) INT32_MIN: negative marks a separate classifier, and
  // this one's magnitude is no int32.
  std::string header = bytes;
  const std::int32_t smallest = std::numeric_limits<std::int32_t>::min();
  std::memcpy(header.data() + 5 * sizeof(std::int32_t), &smallest, sizeof smallest);
  std::ofstream(path, std::ios::binary) << header;
  CHECK_THROWS_WITH(kk::load_llama2c_checkpoint(path),
                    "llama2.c header field vocab_size is -2147483648");
}

TEST_CASE("the stories260K model preset describes the real checkpoint", "[kernels][llama2c]") {
  kvtier::config::ModelSpec preset;
  (void)kvtier::test::loader().load_preset(
      *kvtier::test::builtin_presets().find("model", "stories260K"), preset, {});
  const auto loaded = stories();
  // Everything but the provenance fields must agree.
  preset.clear_preset();
  preset.clear_hf_repo();
  CHECK(preset.DebugString() == loaded->spec.DebugString());
}

TEST_CASE("the tests find the fixture under KVTIER_FIXTURES when it is set", "[kernels][llama2c]") {
  const std::filesystem::path source = stories_dir();
  const kk::testing::TempDir temp("fixtures");
  std::filesystem::create_directories(temp.path() / "stories260K");
  std::filesystem::copy_file(source / "stories260K.bin",
                             temp.path() / "stories260K" / "stories260K.bin");
  REQUIRE(::setenv("KVTIER_FIXTURES", temp.path().c_str(), 1) == 0);
  const std::filesystem::path moved = stories_dir();
  const bool loads =
      kk::load_llama2c_checkpoint(moved / "stories260K.bin").spec.name() == "stories260K";
  REQUIRE(::unsetenv("KVTIER_FIXTURES") == 0);
  CHECK(moved == temp.path() / "stories260K");
  CHECK(loads);
  CHECK(stories_dir() == source);
}
