// Hugging Face byte-level BPE from a tokenizer.json written here: GPT-2's byte mapping, the
// Llama-3 / Qwen2 pre-tokenizer regexes, merges applied by rank, added tokens, BOS from the
// post-processor, and decode(encode(text)) == text.
#include <catch2/catch.hpp>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/errors.hpp"
#include "kernels/byte_level.hpp"
#include "kernels/tokenizer.hpp"
#include "tests/kernels/support/model_files.hpp"

namespace kk = kvtier::kernels;
using Json = nlohmann::json;

namespace {

// transformers' Llama-3 pre-tokenizer pattern; Qwen2's differs only in \p{N} (single digits).
constexpr const char* kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

using Pieces = std::vector<std::string_view>;

// Byte-level vocabulary: the 256 byte characters (id = byte), then merged tokens in merge order.
Json tokenizer_json(const std::vector<std::pair<std::string, std::string>>& merges,
                    bool array_merges) {
  Json vocab = Json::object();
  for (int byte = 0; byte < 256; ++byte) {
    vocab[kk::bytes_to_byte_level(std::string(1, static_cast<char>(byte)))] = byte;
  }
  Json merge_list = Json::array();
  int next_id = 256;
  for (const auto& [left, right] : merges) {
    std::string merged = left;
    merged += right;
    if (!vocab.contains(merged)) {
      vocab[merged] = next_id++;
    }
    std::string line = left;
    line += ' ';
    line += right;
    merge_list.push_back(array_merges ? Json::array({left, right}) : Json(line));
  }
  return {
      {"version", "1.0"},
      {"added_tokens",
       {{{"id", 1000}, {"content", "<|begin_of_text|>"}, {"special", true}},
        {{"id", 1001}, {"content", "<|eot|>"}, {"special", true}}}},
      {"normalizer", nullptr},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         {{{"type", "Split"},
           {"pattern", {{"Regex", kLlama3Pattern}}},
           {"behavior", "Isolated"},
           {"invert", false}},
          {{"type", "ByteLevel"},
           {"add_prefix_space", false},
           {"trim_offsets", true},
           {"use_regex", false}}}}}},
      {"post_processor",
       {{"type", "TemplateProcessing"},
        {"single",
         {{{"SpecialToken", {{"id", "<|begin_of_text|>"}, {"type_id", 0}}}},
          {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
        {"special_tokens",
         {{"<|begin_of_text|>",
           {{"id", "<|begin_of_text|>"}, {"ids", {1000}}, {"tokens", {"<|begin_of_text|>"}}}}}}}},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model",
       {{"type", "BPE"},
        {"vocab", vocab},
        {"merges", merge_list},
        {"ignore_merges", false},
        {"continuing_subword_prefix", nullptr},
        {"end_of_word_suffix", nullptr}}}};
}

std::unique_ptr<kk::Tokenizer> write_and_load(const kk::testing::TempDir& temp, const Json& json) {
  std::ofstream(temp.path() / "tokenizer.json") << json.dump();
  std::ofstream(temp.path() / "tokenizer_config.json") << R"({"eos_token": "<|eot|>"})";
  return kk::load_tokenizer(temp.path());
}

// Ids of merged tokens in the vocabulary built above.
std::int32_t id_of(const Json& json, const std::string& token) {
  return json["model"]["vocab"][kk::bytes_to_byte_level(token)].get<std::int32_t>();
}

}  // namespace

TEST_CASE("GPT-2 byte-to-unicode mapping", "[kernels][tokenizer][bpe]") {
  CHECK(kk::bytes_to_byte_level("a") == "a");
  CHECK(kk::bytes_to_byte_level(" ") == "\xC4\xA0");                   // U+0120 'Ġ'
  CHECK(kk::bytes_to_byte_level("\n") == "\xC4\x8A");                  // U+010A 'Ċ'
  CHECK(kk::bytes_to_byte_level(std::string(1, '\0')) == "\xC4\x80");  // U+0100
  CHECK(kk::bytes_to_byte_level("\xAD") == "\xC5\x83");  // U+0143: soft hyphen is remapped
  CHECK(kk::bytes_to_byte_level("\xFF") == "\xC3\xBF");  // U+00FF: printable, kept
  std::string all;
  for (int byte = 0; byte < 256; ++byte) {
    all += static_cast<char>(byte);
  }
  CHECK(kk::byte_level_to_bytes(kk::bytes_to_byte_level(all)) == all);
}

TEST_CASE("the Llama-3 and Qwen2 regexes pre-tokenize like transformers", "[kernels][bpe]") {
  const kk::RegexSplitter llama3(kLlama3Pattern);
  CHECK(llama3.split("Hello world's 12345!!\n\n  x") ==
        Pieces{"Hello", " world", "'s", " ", "123", "45", "!!\n\n", " ", " x"});
  CHECK(llama3.split("DON'T stop") == Pieces{"DON", "'T", " stop"});
  CHECK(llama3.split("caf\xC3\xA9 \xE6\x97\xA5\xE6\x9C\xAC") ==
        Pieces{"caf\xC3\xA9", " \xE6\x97\xA5\xE6\x9C\xAC"});
  std::string qwen2_pattern = kLlama3Pattern;
  qwen2_pattern.replace(qwen2_pattern.find(R"(\p{N}{1,3})"), 10, R"(\p{N})");
  const kk::RegexSplitter qwen2(qwen2_pattern);
  CHECK(qwen2.split("x 2024") == Pieces{"x", " ", "2", "0", "2", "4"});
  CHECK_THROWS_WITH(llama3.split("bad \xFF utf8"), Catch::Contains("not valid UTF-8"));
  CHECK_THROWS_AS(kk::RegexSplitter("(unclosed"), kvtier::DataError);
}

TEST_CASE("merges apply by rank, leftmost first among equal ranks", "[kernels][bpe]") {
  const kk::testing::TempDir temp("bpe-ranks");
  for (const bool array_merges : {false, true}) {
    // "hello": "l l" (rank 0) merges first, then "h e", "he ll", "hell o"; merging "e l"
    // (rank 1) before "l l" would have left h + el + l + o.
    const Json json = tokenizer_json({{"l", "l"},
                                      {"e", "l"},
                                      {"h", "e"},
                                      {"he", "ll"},
                                      {"hell", "o"},
                                      {"a", "a"},
                                      {"\xC4\xA0", "w"}},
                                     array_merges);
    const auto tokenizer = write_and_load(temp, json);
    CHECK(tokenizer->kind() == "byte-level-bpe");
    using Ids = std::vector<std::int32_t>;
    CHECK(tokenizer->encode("hello") == Ids{id_of(json, "hello")});
    // By rank, not position: in "hel" the later pair "e l" (rank 1) beats "h e" (rank 2).
    CHECK(tokenizer->encode("hel") == Ids{'h', id_of(json, "el")});
    CHECK(tokenizer->encode("aaa") == Ids{id_of(json, "aa"), 'a'});
    CHECK(tokenizer->encode("hello w") == Ids{id_of(json, "hello"), id_of(json, " w")});
    CHECK(tokenizer->encode("\n") == Ids{'\n'});
  }
}

TEST_CASE("added tokens, BOS and EOS, and round trips", "[kernels][bpe]") {
  const kk::testing::TempDir temp("bpe-added");
  const Json json = tokenizer_json({{"h", "e"}, {"he", "l"}, {"hel", "l"}, {"hell", "o"}}, false);
  const auto tokenizer = write_and_load(temp, json);
  CHECK(tokenizer->bos_id() == 1000);
  CHECK(tokenizer->eos_id() == 1001);
  CHECK(tokenizer->vocab_size() == 1002);
  using Ids = std::vector<std::int32_t>;
  CHECK(tokenizer->encode_prompt("hello<|eot|>") == Ids{1000, id_of(json, "hello"), 1001});
  for (const std::string text :
       {"hello world", "na\xC3\xAFve caf\xC3\xA9 \xE2\x80\x94 \xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E",
        "tabs\tand\nnewlines\r\n  spaces  ", "emoji \xF0\x9F\x99\x82!", "<|begin_of_text|>hi"}) {
    CAPTURE(text);
    CHECK(tokenizer->decode(tokenizer->encode(text)) == text);
  }
  CHECK_THROWS_AS(tokenizer->encode("\xC3("), kvtier::DataError);
}

TEST_CASE("tokenizer.json features outside byte-level BPE are refused by name",
          "[kernels][bpe][errors]") {
  const kk::testing::TempDir temp("bpe-refused");
  Json json = tokenizer_json({{"h", "e"}}, false);
  json["model"]["type"] = "WordPiece";
  CHECK_THROWS_WITH(write_and_load(temp, json), Catch::Contains("'WordPiece' is not supported"));
  json = tokenizer_json({{"h", "e"}}, false);
  json["pre_tokenizer"] = {{"type", "Metaspace"}};
  CHECK_THROWS_WITH(write_and_load(temp, json), Catch::Contains("'Metaspace' is not supported"));
  json = tokenizer_json({{"h", "e"}}, false);
  json["model"]["merges"].push_back("x zz");
  CHECK_THROWS_WITH(write_and_load(temp, json), Catch::Contains("merge 'x zz' (rank 1)"));
}

TEST_CASE("damaged token ids and added tokens in tokenizer.json are refused by name",
          "[kernels][bpe][errors]") {
  // From fuzzing the loaders (docs/FUZZING.md): a negative or float id indexed the id table out of
  // bounds, a large id sized it (2^31 - 1 strings: 64 GB), an empty added token matched
  // everywhere without advancing, a BOS id outside the vocabulary was handed to prompts, and a
  // non-string EOS content in tokenizer_config.json escaped as nlohmann's type_error.
  const kk::testing::TempDir temp("bpe-damaged");
  const auto refused = [&](const Json& json, const std::string& message) {
    try {
      static_cast<void>(write_and_load(temp, json));
      FAIL("expected a DataError");
    } catch (const kvtier::DataError& error) {
      CHECK(std::string(error.what()) == message);
      CHECK(error.where() == (temp.path() / "tokenizer.json").string());
    }
  };
  Json json = tokenizer_json({{"h", "e"}}, false);
  json["model"]["vocab"]["zz"] = -5;
  refused(json, R"(vocab token "zz" has id -5; ids are integers from 0 to 2^31 - 2)");
  json["model"]["vocab"]["zz"] = 1e30;
  refused(json, R"(vocab token "zz" has id 1e+30; ids are integers from 0 to 2^31 - 2)");
  json = tokenizer_json({{"h", "e"}}, false);
  json["added_tokens"][1]["id"] = 2147483647;
  refused(json, R"(added token "<|eot|>" has id 2147483647; ids are integers from 0 to 2^31 - 2)");
  json = tokenizer_json({{"h", "e"}}, false);
  json["added_tokens"].push_back({{"id", 1002}, {"content", ""}, {"special", true}});
  refused(json, "added token 1002 has empty content");
  json = tokenizer_json({{"h", "e"}}, false);
  json["post_processor"]["special_tokens"]["<|begin_of_text|>"]["ids"] = {5000};
  refused(json, "post_processor's BOS id 5000 is not a token of the vocabulary");

  json = tokenizer_json({{"h", "e"}}, false);
  std::ofstream(temp.path() / "tokenizer.json") << json.dump();
  std::ofstream(temp.path() / "tokenizer_config.json") << R"({"eos_token": {"content": 5}})";
  try {
    static_cast<void>(kk::load_tokenizer(temp.path()));
    FAIL("expected a DataError");
  } catch (const kvtier::DataError& error) {
    CHECK(std::string(error.what()) ==
          "tokenizer_config.json field 'eos_token.content' must be a string");
    CHECK(error.where() == (temp.path() / "tokenizer_config.json").string());
  }

  // Ids need not be dense: the largest allowed id costs one entry, not a table up to it.
  json = tokenizer_json({{"h", "e"}}, false);
  json["added_tokens"][1]["id"] = 2147483646;
  const auto sparse = write_and_load(temp, json);
  CHECK(sparse->vocab_size() == 2147483647);
  CHECK(sparse->eos_id() == 2147483646);
  CHECK(sparse->decode(std::vector<std::int32_t>{'h', 2147483646, 7000}) == "h<|eot|>");
}
