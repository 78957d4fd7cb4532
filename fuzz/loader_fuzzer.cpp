// libFuzzer harness for the model and tokenizer loaders (docs/FUZZING.md).
//
// The first byte of an input picks the file fuzzed (Target below); the rest is that file's
// content. The other files the loader needs are small valid ones written once at start-up into
// a scratch folder, so a mutated config.json meets real weights and mutated weights meet a real
// config.json. A loaded model runs one short prefill on the CPU engine and a loaded tokenizer
// encodes and decodes a fixed text, since a model or vocabulary that loads but is inconsistent
// fails there. A kvtier::Error is the expected outcome for a damaged file; anything else (a
// crash, a sanitizer report, another exception type, a hang) is a finding.
//
// `kvtier_fuzz_loaders -write_seeds=FOLDER` writes the seed corpus (valid files of every target)
// and exits; with KVTIER_FUZZ_PRINT_ERRORS set, each refused input prints its error line.

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/errors.hpp"
#include "fuzz/fuzz_support.hpp"
#include "kernels/byte_level.hpp"
#include "kernels/engine.hpp"
#include "kernels/hf_checkpoint.hpp"
#include "kernels/llama2c_checkpoint.hpp"
#include "kernels/schema/sentencepiece_model.pb.h"
#include "kernels/tokenizer.hpp"
#include "tests/kernels/support/model_files.hpp"

namespace {

namespace fs = std::filesystem;
namespace kk = kvtier::kernels;
using Json = nlohmann::json;

// What the first byte of an input selects (modulo the count).
enum class Target : std::uint8_t {
  kHfConfig,          // config.json beside valid weights
  kSafetensors,       // model.safetensors beside a valid config.json
  kShardIndex,        // model.safetensors.index.json beside two valid shards
  kLlama2c,           // a llama2.c checkpoint
  kLlama2cTokenizer,  // tokenizer.bin
  kTokenizerJson,     // tokenizer.json beside a valid tokenizer_config.json
  kTokenizerConfig,   // tokenizer_config.json beside a valid tokenizer.json
  kSentencepiece,     // tokenizer.model
  kCount,
};
constexpr std::array<std::string_view, static_cast<int>(Target::kCount)> kTargetNames = {
    "hf-config",     "safetensors",    "shard-index",      "llama2c",
    "tokenizer-bin", "tokenizer-json", "tokenizer-config", "sentencepiece"};

// The text every loaded tokenizer encodes: ASCII words, digits, contractions, runs of spaces,
// accented letters, CJK, a symbol outside the BMP, and the seeds' added and user-defined tokens.
constexpr std::string_view kText =
    "Once upon a time, Lily's cat   ran 123 km.\n\tNa\xC3\xAFve caf\xC3\xA9 "
    "\xE6\x9D\xB1\xE4\xBA\xAC "
    "\xF0\x9F\x98\x80 <|eot|><|begin_of_text|> <sep>x";

// A tiny Llama whose file holds q/k/v biases and q/k norms as well, so that config.json may
// also declare Qwen2 (biases) or Qwen3 (norms) over the same weights.
kvtier::config::ModelSpec tiny_spec() {
  kvtier::config::ModelSpec spec = kk::testing::small_spec(kvtier::config::LLAMA);
  spec.set_num_hidden_layers(2);
  spec.set_hidden_size(8);
  spec.set_num_attention_heads(2);
  spec.set_num_key_value_heads(1);
  spec.set_head_dim(4);
  spec.set_intermediate_size(16);
  spec.set_vocab_size(16);
  spec.set_max_position_embeddings(32);
  spec.set_tie_word_embeddings(false);
  spec.set_attention_bias(true);
  spec.set_qk_norm(true);
  return spec;
}

using kvtier::fuzz::read_file;
using kvtier::fuzz::write_file;

// llama2.c's legacy export of a tiny model: the header, then every tensor in run.c's order,
// filled with small deterministic values. A negative vocab_size stores the classifier apart.
std::string llama2c_checkpoint(bool shared_classifier) {
  const std::int32_t dim = 8;
  const std::int32_t hidden = 16;
  const std::int32_t layers = 2;
  const std::int32_t heads = 2;
  const std::int32_t kv_heads = 1;
  const std::int32_t vocab = 16;
  const std::int32_t seq_len = 8;
  const std::array<std::int32_t, 7> header = {
      dim, hidden, layers, heads, kv_heads, shared_classifier ? vocab : -vocab, seq_len};
  const std::int32_t head_dim = dim / heads;
  const std::int32_t kv_dim = kv_heads * head_dim;
  std::size_t floats =
      vocab * dim +
      layers * (dim + dim * dim + 2 * kv_dim * dim + dim * dim + dim + 3 * hidden * dim) + dim +
      seq_len * head_dim;
  if (!shared_classifier) {
    floats += vocab * dim;
  }
  std::string bytes(reinterpret_cast<const char*>(header.data()), sizeof(header));
  std::mt19937 random(7);
  for (std::size_t i = 0; i < floats; ++i) {
    const float value = static_cast<float>(random() % 2001) / 1000.0F - 1.0F;
    bytes.append(reinterpret_cast<const char*>(&value), sizeof(value));
  }
  return bytes;
}

// tokenizer.bin: <unk>, <s>, </s>, the 256 byte pieces, single letters and a few merges.
std::string llama2c_tokenizer() {
  std::vector<std::string> pieces = {"<unk>", "\n<s>\n", "\n</s>\n"};
  for (int byte = 0; byte < 256; ++byte) {
    std::array<char, 8> name{};
    std::snprintf(name.data(), name.size(), "<0x%02X>", byte);
    pieces.emplace_back(name.data());
  }
  for (const char* piece : {" ", "a", "c", "e", "n", "o", "t", "h", " t", "he", " the", "on", " on",
                            "ce", "nce", " once"}) {
    pieces.emplace_back(piece);
  }
  std::int32_t longest = 0;
  for (const std::string& piece : pieces) {
    longest = std::max(longest, static_cast<std::int32_t>(piece.size()));
  }
  std::string bytes(reinterpret_cast<const char*>(&longest), sizeof(longest));
  for (std::size_t id = 0; id < pieces.size(); ++id) {
    const float score = id < 259 ? 0.0F : -static_cast<float>(pieces.size() - id);
    const auto length = static_cast<std::int32_t>(pieces[id].size());
    bytes.append(reinterpret_cast<const char*>(&score), sizeof(score));
    bytes.append(reinterpret_cast<const char*>(&length), sizeof(length));
    bytes += pieces[id];
  }
  return bytes;
}

// A byte-level BPE tokenizer.json in the shape Llama 3's has: the 256 byte characters, merges,
// added tokens, a Split + ByteLevel pre-tokenizer and a BOS template. `llama3_style` false gives
// the older GPT-2 shape ("a b" merges, ByteLevel with its own regex and a prefix space).
std::string tokenizer_json(bool llama3_style) {
  Json vocab = Json::object();
  for (int byte = 0; byte < 256; ++byte) {
    vocab[kk::bytes_to_byte_level(std::string(1, static_cast<char>(byte)))] = byte;
  }
  Json merges = Json::array();
  int next_id = 256;
  for (const auto& [left, right] :
       std::vector<std::pair<std::string, std::string>>{{"\xC4\xA0", "t"},
                                                        {"h", "e"},
                                                        {"\xC4\xA0t", "he"},
                                                        {"o", "n"},
                                                        {"c", "e"},
                                                        {"\xC4\xA0", "a"},
                                                        {"1", "2"},
                                                        {"12", "3"}}) {
    const std::string merged = left + right;
    if (!vocab.contains(merged)) {
      vocab[merged] = next_id++;
    }
    merges.push_back(llama3_style ? Json::array({left, right}) : Json(left + " " + right));
  }
  const Json byte_level = {{"type", "ByteLevel"},
                           {"add_prefix_space", !llama3_style},
                           {"trim_offsets", true},
                           {"use_regex", !llama3_style}};
  Json pre_tokenizer = byte_level;
  if (llama3_style) {
    pre_tokenizer = {
        {"type", "Sequence"},
        {"pretokenizers",
         {{{"type", "Split"},
           {"pattern",
            {{"Regex",
              R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"}}},
           {"behavior", "Isolated"},
           {"invert", false}},
          byte_level}}};
  }
  return Json{
      {"version", "1.0"},
      {"added_tokens",
       {{{"id", 300}, {"content", "<|begin_of_text|>"}, {"special", true}},
        {{"id", 301}, {"content", "<|eot|>"}, {"special", true}}}},
      {"normalizer", llama3_style ? Json(nullptr) : Json{{"type", "NFC"}}},
      {"pre_tokenizer", pre_tokenizer},
      {"post_processor",
       {{"type", "TemplateProcessing"},
        {"single",
         {{{"SpecialToken", {{"id", "<|begin_of_text|>"}, {"type_id", 0}}}},
          {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
        {"special_tokens",
         {{"<|begin_of_text|>",
           {{"id", "<|begin_of_text|>"}, {"ids", {300}}, {"tokens", {"<|begin_of_text|>"}}}}}}}},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model",
       {{"type", "BPE"},
        {"vocab", vocab},
        {"merges", merges},
        {"ignore_merges", llama3_style},
        {"continuing_subword_prefix", nullptr},
        {"end_of_word_suffix", nullptr}}}}
      .dump();
}

// A sentencepiece BPE model as Llama 2's is built: <unk>, <s>, </s>, byte pieces, a
// user-defined piece and scored pieces spelling spaces as U+2581.
std::string sentencepiece_model(bool default_normalizer) {
  using Piece = kvtier::spm::ModelProto::SentencePiece;
  kvtier::spm::ModelProto model;
  model.mutable_trainer_spec()->set_model_type(kvtier::spm::TrainerSpec::BPE);
  model.mutable_trainer_spec()->set_byte_fallback(true);
  model.mutable_normalizer_spec()->set_name("identity");
  if (!default_normalizer) {
    model.mutable_normalizer_spec()->set_add_dummy_prefix(false);
    model.mutable_normalizer_spec()->set_remove_extra_whitespaces(false);
  }
  const auto add = [&](const std::string& text, float score, Piece::Type type) {
    Piece* piece = model.add_pieces();
    piece->set_piece(text);
    piece->set_score(score);
    piece->set_type(type);
  };
  add("<unk>", 0.0F, Piece::UNKNOWN);
  add("<s>", 0.0F, Piece::CONTROL);
  add("</s>", 0.0F, Piece::CONTROL);
  for (int byte = 0; byte < 256; ++byte) {
    std::array<char, 8> name{};
    std::snprintf(name.data(), name.size(), "<0x%02X>", byte);
    add(name.data(), 0.0F, Piece::BYTE);
  }
  add("<sep>", 0.0F, Piece::USER_DEFINED);
  float score = 0.0F;
  for (const char* text :
       {"\xE2\x96\x81t", "he", "\xE2\x96\x81the", "on", "ce", "\xE2\x96\x81o", "\xE2\x96\x81on",
        "nce", "\xE2\x96\x81", "a", "c", "e", "h", "n", "o", "t", "\xC3\xA9"}) {
    add(text, score -= 1.0F, Piece::NORMAL);
  }
  return model.SerializeAsString();
}

// config.json variants over the tiny model's weights.
std::vector<std::string> config_variants(const kvtier::config::ModelSpec& spec) {
  const Json base = Json::parse(kk::testing::hf_config_text(spec));
  std::vector<std::string> configs = {base.dump(2)};
  Json qwen2 = base;
  qwen2["architectures"] = {"Qwen2ForCausalLM"};
  qwen2["use_sliding_window"] = false;
  configs.push_back(qwen2.dump());
  Json qwen3 = base;
  qwen3["architectures"] = {"Qwen3ForCausalLM"};
  qwen3["torch_dtype"] = "bfloat16";
  configs.push_back(qwen3.dump());
  Json mistral = base;
  mistral["architectures"] = {"MistralForCausalLM"};
  mistral["sliding_window"] = 4;
  mistral.erase("head_dim");
  configs.push_back(mistral.dump());
  Json llama31 = base;
  llama31["rope_scaling"] = {{"rope_type", "llama3"},
                             {"factor", 8.0},
                             {"low_freq_factor", 1.0},
                             {"high_freq_factor", 4.0},
                             {"original_max_position_embeddings", 16}};
  llama31["attention_bias"] = true;
  configs.push_back(llama31.dump());
  Json linear = base;
  linear["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};
  linear["tie_word_embeddings"] = true;
  linear["torch_dtype"] = "float16";
  configs.push_back(linear.dump());
  return configs;
}

// The file of a target that inputs replace.
std::string_view fuzzed_file(Target target) {
  switch (target) {
    case Target::kHfConfig: return "config.json";
    case Target::kSafetensors: return "model.safetensors";
    case Target::kShardIndex: return "model.safetensors.index.json";
    case Target::kLlama2c: return "model.bin";
    case Target::kLlama2cTokenizer: return "tokenizer.bin";
    case Target::kTokenizerJson: return "tokenizer.json";
    case Target::kTokenizerConfig: return "tokenizer_config.json";
    case Target::kSentencepiece: return "tokenizer.model";
    case Target::kCount: break;
  }
  return "unused";
}

constexpr std::string_view kEosConfig = R"({"eos_token": "<|eot|>"})";

// One folder per target, holding the valid files the target reads beside the fuzzed one; in
// memory when /dev/shm exists, removed at exit.
class Scratch {
 public:
  Scratch() {
    const char* folder = std::getenv("KVTIER_FUZZ_DIR");
    std::string pattern =
        std::string(folder != nullptr ? folder : "/dev/shm") + "/kvtier-fuzz-loaders-XXXXXX";
    if (mkdtemp(pattern.data()) == nullptr) {
      std::perror("mkdtemp");
      std::abort();
    }
    root_ = pattern;
    for (std::size_t target = 0; target < kTargetNames.size(); ++target) {
      fs::create_directories(root_ / kTargetNames[target]);
    }
    const fs::path weights = folder_of(Target::kHfConfig);
    kk::testing::write_random_hf_model(tiny_spec(), weights, 11);
    fs::copy_file(weights / "config.json", folder_of(Target::kSafetensors) / "config.json");
    kk::testing::export_hf_model(kk::load_hf_checkpoint(weights), folder_of(Target::kShardIndex),
                                 kk::TensorDtype::kF32, 2);
    write_file(folder_of(Target::kTokenizerJson) / "tokenizer_config.json", kEosConfig);
    write_file(folder_of(Target::kTokenizerConfig) / "tokenizer.json", tokenizer_json(true));
  }
  ~Scratch() {
    std::error_code ignored;
    fs::remove_all(root_, ignored);
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  Scratch(Scratch&&) = delete;
  Scratch& operator=(Scratch&&) = delete;

  [[nodiscard]] fs::path folder_of(Target target) const {
    return root_ / kTargetNames[static_cast<std::size_t>(target)];
  }
  [[nodiscard]] fs::path file_of(Target target) const {
    return folder_of(target) / fuzzed_file(target);
  }
  [[nodiscard]] const fs::path& root() const { return root_; }

 private:
  fs::path root_;
};

const Scratch& scratch() {
  static const Scratch instance;
  return instance;
}

// An id a tokenizer hands out must index the model's vocabulary; an id outside it means the
// loader accepted an inconsistent file.
void require_in_vocabulary(const kk::Tokenizer& tokenizer, std::span<const std::int32_t> ids,
                           const char* what) {
  for (const std::int32_t id : ids) {
    if (id < 0 || id >= tokenizer.vocab_size()) {
      std::fprintf(stderr, "%s gave id %d outside the vocabulary of %d tokens\n", what, id,
                   tokenizer.vocab_size());
      std::abort();
    }
  }
}

void exercise_tokenizer(const fs::path& path) {
  const std::unique_ptr<kk::Tokenizer> tokenizer = kk::load_tokenizer(path);
  const std::vector<std::int32_t> ids = tokenizer->encode_prompt(kText);
  require_in_vocabulary(*tokenizer, ids, "encode_prompt");
  static_cast<void>(tokenizer->decode(ids));
  static_cast<void>(tokenizer->encode(""));
  static_cast<void>(tokenizer->encode(" "));
  if (const auto eos = tokenizer->eos_id()) {
    require_in_vocabulary(*tokenizer, std::span(&*eos, 1), "eos_id");
  }
  // Every id of a small vocabulary (the first 1,024 of a large one) and some outside it.
  const std::int32_t size = tokenizer->vocab_size();
  std::vector<std::int32_t> probe = {-1, size, std::numeric_limits<std::int32_t>::max(),
                                     std::numeric_limits<std::int32_t>::min()};
  for (std::int32_t id = 0; id < std::min(size, 1024); ++id) {
    probe.push_back(id);
  }
  static_cast<void>(tokenizer->decode(probe));
  static_cast<void>(tokenizer->kind());
}

void exercise_model(const fs::path& path) {
  const auto weights = std::make_shared<const kk::ModelWeights>(kk::load_model(path));
  const std::unique_ptr<kk::Engine> engine = kk::make_cpu_engine(weights);
  const std::vector<std::int32_t> tokens = {
      0, static_cast<std::int32_t>(weights->spec.vocab_size() - 1)};
  static_cast<void>(engine->prefill(tokens));
}

void write_seed(const fs::path& folder, Target target, int variant, std::string_view content) {
  std::string seed(1, static_cast<char>(target));
  seed += content;
  write_file(folder / (std::string(kTargetNames[static_cast<std::size_t>(target)]) + "-" +
                       std::to_string(variant)),
             seed);
}

// Valid files of every target, each behind its selector byte.
void write_seeds(const fs::path& folder) {
  fs::create_directories(folder);
  const Scratch& files = scratch();
  int variant = 0;
  for (const std::string& config : config_variants(tiny_spec())) {
    write_seed(folder, Target::kHfConfig, variant++, config);
  }
  const fs::path weights = files.folder_of(Target::kHfConfig);
  write_seed(folder, Target::kSafetensors, 0, read_file(weights / "model.safetensors"));
  const kk::ModelWeights model = kk::load_hf_checkpoint(weights);
  const fs::path exported = files.root() / "exported";
  variant = 1;
  for (const kk::TensorDtype dtype : {kk::TensorDtype::kF16, kk::TensorDtype::kBF16}) {
    kk::testing::export_hf_model(model, exported, dtype, 1);
    write_seed(folder, Target::kSafetensors, variant++, read_file(exported / "model.safetensors"));
  }
  write_seed(folder, Target::kShardIndex, 0,
             read_file(files.folder_of(Target::kShardIndex) / "model.safetensors.index.json"));
  write_seed(folder, Target::kLlama2c, 0, llama2c_checkpoint(true));
  write_seed(folder, Target::kLlama2c, 1, llama2c_checkpoint(false));
  write_seed(folder, Target::kLlama2cTokenizer, 0, llama2c_tokenizer());
  write_seed(folder, Target::kLlama2cTokenizer, 1,
             read_file(kk::testing::stories_dir() / "tok512.bin"));
  write_seed(folder, Target::kTokenizerJson, 0, tokenizer_json(true));
  write_seed(folder, Target::kTokenizerJson, 1, tokenizer_json(false));
  write_seed(folder, Target::kTokenizerConfig, 0, kEosConfig);
  write_seed(folder, Target::kTokenizerConfig, 1,
             R"({"eos_token": {"content": "<|eot|>", "special": true}, "bos_token": null})");
  write_seed(folder, Target::kSentencepiece, 0, sentencepiece_model(true));
  write_seed(folder, Target::kSentencepiece, 1, sentencepiece_model(false));
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  kvtier::fuzz::write_seeds_if_asked(*argc, *argv, write_seeds);
  static_cast<void>(scratch());
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) {
    return 0;
  }
  const auto target = static_cast<Target>(data[0] % static_cast<std::uint8_t>(Target::kCount));
  const fs::path path = scratch().file_of(target);
  write_file(path, std::string_view(reinterpret_cast<const char*>(data) + 1, size - 1));
  try {
    switch (target) {
      case Target::kHfConfig:
      case Target::kSafetensors:
      case Target::kShardIndex: exercise_model(path.parent_path()); break;
      case Target::kLlama2c: exercise_model(path); break;
      case Target::kTokenizerConfig:
      case Target::kTokenizerJson: exercise_tokenizer(scratch().folder_of(target)); break;
      case Target::kLlama2cTokenizer:
      case Target::kSentencepiece: exercise_tokenizer(path); break;
      case Target::kCount: break;
    }
  } catch (const kvtier::Error& error) {
    // A refused file: the expected outcome.
    kvtier::fuzz::print_error_if_asked(error);
  }
  return 0;
}
