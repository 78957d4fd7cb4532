// sentencepiece tokenizer.model: a tiny BPE model is trained here with Debian's libsentencepiece
// (in a helper process, see support/spm_reference.cpp), then our reader must encode exactly as
// libsentencepiece does and decode back to the input.
#include <catch2/catch.hpp>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <random>
#include <sstream>

#include "common/errors.hpp"
#include "kernels/tokenizer.hpp"
#include "tests/kernels/support/model_files.hpp"
#include "tests/support/paths.hpp"

namespace kk = kvtier::kernels;

namespace {

std::string reference_tool() {
  return kvtier::test::spm_reference_binary();
}

// A few hundred seeded sentences in the style of TinyStories, with some accented words.
void write_corpus(const std::filesystem::path& path) {
  const std::vector<std::string> subjects = {
      "Lily", "Tom", "the little dog", "a happy bird", "Mia", "the old man", "Zo\xC3\xAB"};
  const std::vector<std::string> verbs = {"played", "saw", "wanted", "liked", "found", "ate"};
  const std::vector<std::string> objects = {"a big red ball", "the park",        "some cake",
                                            "a tiny fish",    "the caf\xC3\xA9", "42 apples"};
  std::mt19937_64 random(5);
  std::ofstream out(path);
  for (int line = 0; line < 400; ++line) {
    out << "Once upon a time, " << subjects[random() % subjects.size()] << " "
        << verbs[random() % verbs.size()] << " " << objects[random() % objects.size()]
        << ". They were very happy.\n";
  }
}

void train(const kk::testing::TempDir& temp, const std::string& prefix, const std::string& type,
           const std::string& normalizer, int vocab_size) {
  const std::string command = reference_tool() + " train " + (temp.path() / "corpus.txt").string() +
                              " " + (temp.path() / prefix).string() + " " +
                              std::to_string(vocab_size) + " " + type + " " + normalizer + " 2> " +
                              (temp.path() / (prefix + ".log")).string();
  REQUIRE(std::system(command.c_str()) == 0);
}

std::vector<std::vector<std::int32_t>> reference_encode(const kk::testing::TempDir& temp,
                                                        const std::vector<std::string>& texts) {
  const auto texts_path = temp.path() / "texts.bin";
  {
    std::ofstream out(texts_path, std::ios::binary);
    for (const std::string& text : texts) {
      out << text << '\0';
    }
  }
  const auto output = temp.path() / "ids.txt";
  const std::string command = reference_tool() + " encode " + (temp.path() / "bpe.model").string() +
                              " " + texts_path.string() + " > " + output.string();
  REQUIRE(std::system(command.c_str()) == 0);
  std::ifstream in(output);
  std::vector<std::vector<std::int32_t>> all;
  for (std::string line; std::getline(in, line);) {
    std::istringstream numbers(line);
    all.emplace_back(std::istream_iterator<std::int32_t>(numbers),
                     std::istream_iterator<std::int32_t>());
  }
  return all;
}

}  // namespace

TEST_CASE("a trained sentencepiece BPE model encodes as libsentencepiece does",
          "[kernels][tokenizer][sentencepiece]") {
  if (reference_tool().empty()) {
    WARN("libsentencepiece not found at configure time; reference comparison skipped");
    return;
  }
  const kk::testing::TempDir temp("sentencepiece");
  write_corpus(temp.path() / "corpus.txt");
  train(temp, "bpe", "bpe", "identity", 400);
  const auto tokenizer = kk::load_tokenizer(temp.path() / "bpe.model");
  CHECK(tokenizer->kind() == "sentencepiece");
  CHECK(tokenizer->vocab_size() == 400);
  CHECK(tokenizer->bos_id() == 1);
  CHECK(tokenizer->eos_id() == 2);

  const std::vector<std::string> texts = {
      "Once upon a time, Lily played with a big red ball.",
      "They were very happy.",
      "  two  spaces and a trailing one ",
      "Zo\xC3\xAB ate 42 apples at the caf\xC3\xA9",
      "unseen characters: \xE2\x98\x83 \xE6\x97\xA5\xE6\x9C\xAC and a newline\nhere",
      "a",
      ""};
  const auto expected = reference_encode(temp, texts);
  REQUIRE(expected.size() == texts.size());
  for (std::size_t i = 0; i < texts.size(); ++i) {
    CAPTURE(texts[i]);
    CHECK(tokenizer->encode(texts[i]) == expected[i]);
    CHECK(tokenizer->decode(tokenizer->encode(texts[i])) == texts[i]);
    CHECK(tokenizer->decode(tokenizer->encode_prompt(texts[i])) == texts[i]);
  }
}

TEST_CASE("sentencepiece models this reader does not implement are refused by name",
          "[kernels][tokenizer][sentencepiece][errors]") {
  if (reference_tool().empty()) {
    WARN("libsentencepiece not found at configure time; test skipped");
    return;
  }
  const kk::testing::TempDir temp("sentencepiece-refused");
  write_corpus(temp.path() / "corpus.txt");
  train(temp, "unigram", "unigram", "identity", 300);
  CHECK_THROWS_WITH(kk::load_tokenizer(temp.path() / "unigram.model"),
                    Catch::Contains("model_type UNIGRAM is not supported"));
  train(temp, "nfkc", "bpe", "nmt_nfkc", 400);
  CHECK_THROWS_WITH(kk::load_tokenizer(temp.path() / "nfkc.model"),
                    Catch::Contains("normalizer 'nmt_nfkc'"));
  std::ofstream(temp.path() / "junk.model") << "not a protobuf \xFF\xFF\xFF";
  CHECK_THROWS_AS(kk::load_tokenizer(temp.path() / "junk.model"), kvtier::DataError);
}

TEST_CASE("a sentencepiece model spelling whitespace as a suffix, or holding nothing, is refused",
          "[kernels][tokenizer][sentencepiece][errors]") {
  const kk::testing::TempDir temp("sentencepiece-suffix");
  // One normal piece "a"; trainer_spec: model_type BPE, treat_whitespace_as_suffix (field 24).
  const auto suffix = temp.path() / "suffix.model";
  std::ofstream(suffix, std::ios::binary) << std::string(
      "\x0A\x03\x0A\x01"
      "a"
      "\x12\x05\x18\x02\xC0\x01\x01",
      12);
  CHECK_THROWS_WITH(kk::load_sentencepiece_model(suffix),
                    Catch::Contains("treat_whitespace_as_suffix is not supported"));
  const auto empty = temp.path() / "empty.model";
  std::ofstream(empty, std::ios::binary).flush();
  CHECK_THROWS_WITH(kk::load_sentencepiece_model(empty),
                    Catch::Contains("not a sentencepiece model (no pieces)"));
}

TEST_CASE("a sentencepiece model without an <unk> piece is refused",
          "[kernels][tokenizer][sentencepiece][errors]") {
  // From fuzzing the loaders (docs/FUZZING.md): such a model loaded and encoded unknown text as id
  // 0, outside its vocabulary. Serialised by hand: one normal piece "a", model_type BPE.
  const kk::testing::TempDir temp("sentencepiece-no-unk");
  const auto path = temp.path() / "tokenizer.model";
  std::ofstream(path, std::ios::binary) << std::string(
      "\x0A\x03\x0A\x01"
      "a"
      "\x12\x02\x18\x02",
      9);
  try {
    static_cast<void>(kk::load_sentencepiece_model(path));
    FAIL("expected a DataError");
  } catch (const kvtier::DataError& error) {
    CHECK(std::string(error.what()) ==
          "sentencepiece model has no <unk> piece (a piece of type UNKNOWN)");
    CHECK(error.where() == path.string());
  }
}
