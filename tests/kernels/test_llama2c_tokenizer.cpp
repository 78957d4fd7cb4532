// llama2.c's tokenizer.bin (the fixture's tok512.bin): encodings equal to run.c's encode(), and
// decode(encode(text)) == text.
#include <catch2/catch.hpp>
#include <fstream>

#include "common/errors.hpp"
#include "kernels/tokenizer.hpp"
#include "tests/kernels/support/model_files.hpp"

namespace kk = kvtier::kernels;

namespace {

std::unique_ptr<kk::Tokenizer> tok512() {
  return kk::load_tokenizer(kk::testing::stories_dir() / "tok512.bin");
}

}  // namespace

TEST_CASE("tok512 encodes as llama2.c's run.c does", "[kernels][tokenizer][llama2c]") {
  const auto tokenizer = tok512();
  CHECK(tokenizer->kind() == "llama2.c");
  CHECK(tokenizer->vocab_size() == 512);
  CHECK(tokenizer->bos_id() == 1);
  CHECK(tokenizer->eos_id() == 2);
  // Expected ids: run.c's encode(tokenizer, text, bos=1, eos=0) on tok512.bin.
  using Ids = std::vector<std::int32_t>;
  CHECK(tokenizer->encode_prompt("Once upon a time, there was a little girl named Lily.") ==
        Ids{1, 403, 407, 261, 378, 432, 383, 286, 261, 376, 298, 315, 421, 395, 317, 426});
  CHECK(tokenizer->encode_prompt("Hello world") == Ids{1, 346, 306, 414, 263, 304, 341});
  CHECK(tokenizer->encode_prompt("  two  spaces") ==
        Ids{1, 410, 410, 259, 424, 414, 410, 262, 427, 412, 331, 419});
  // Characters outside the vocabulary fall back to byte tokens (id = byte + 3).
  CHECK(tokenizer->encode_prompt("caf\xC3\xA9 \xE2\x98\x83 \xE6\x97\xA5\xE6\x9C\xAC") ==
        Ids{1, 280, 412, 431, 485, 410, 229, 155, 134, 410, 233, 154, 168, 233, 159, 175});
  CHECK(tokenizer->encode_prompt("line one\nline two") ==
        Ids{1, 278, 271, 411, 353, 411, 13, 421, 271, 411, 259, 424, 414});
  CHECK(tokenizer->encode_prompt("") == Ids{1});
  CHECK(tokenizer->encode_prompt("a") == Ids{1, 261});
}

TEST_CASE("tok512 decodes what it encodes", "[kernels][tokenizer][llama2c]") {
  const auto tokenizer = tok512();
  for (const std::string text :
       {"Once upon a time, there was a little girl named Lily.", "Hello world", "two  spaces ",
        "caf\xC3\xA9 \xE2\x98\x83 \xE6\x97\xA5\xE6\x9C\xAC", "line one\nline two\n\ttab", "a",
        "{[<0x41>]}"}) {
    CAPTURE(text);
    CHECK(tokenizer->decode(tokenizer->encode(text)) == text);
    CHECK(tokenizer->decode(tokenizer->encode_prompt(text)) == text);  // BOS decodes to nothing
  }
}

TEST_CASE("a damaged tokenizer.bin is refused", "[kernels][tokenizer][errors]") {
  const kk::testing::TempDir temp("bad-tokenizer");
  const auto path = temp.path() / "tokenizer.bin";
  // max_token_length 16, then a token claiming 64 bytes in a file that ends at once.
  const std::string truncated("\x10\x00\x00\x00\x00\x00\x80\x3f\x40\x00", 10);
  std::ofstream(path, std::ios::binary) << truncated;
  CHECK_THROWS_AS(kk::load_llama2c_tokenizer(path), kvtier::DataError);
  CHECK_THROWS_AS(kk::load_tokenizer(temp.path() / "tokenizer.txt"), kvtier::DataError);
}

TEST_CASE("a token length past the end of tokenizer.bin is refused before allocating it",
          "[kernels][tokenizer][errors]") {
  // Found by fuzzing (docs/FUZZING.md): a 12-byte file whose header allows tokens of almost 2 GB
  // and whose first token claims 1.75 GB made the loader allocate that much before reading.
  const kk::testing::TempDir temp("huge-token");
  const auto path = temp.path() / "tokenizer.bin";
  const std::string huge_length("\xF0\xFF\xFF\x7F\x00\x00\x80\x3f\x00\x00\x00\x70", 12);
  std::ofstream(path, std::ios::binary) << huge_length;
  try {
    static_cast<void>(kk::load_llama2c_tokenizer(path));
    FAIL("expected a DataError");
  } catch (const kvtier::DataError& error) {
    CHECK(std::string(error.what()) ==
          "token 0 has length 1879048192 but the file has 0 bytes left");
    CHECK(error.where() == path.string());
    CHECK(error.exit_code() == kvtier::ExitCode::kBadData);
  }
}

TEST_CASE("only <0xNN> with two hex digits is a byte piece", "[kernels][tokenizer][errors]") {
  // Found by fuzzing (docs/FUZZING.md): the byte-piece parser (shared with sentencepiece models)
  // read "<0x-8>" as byte 4294967288 and indexed its 256-entry table with it, and read "<0x 8>"
  // as byte 8.
  const kk::testing::TempDir temp("byte-pieces");
  const auto path = temp.path() / "tokenizer.bin";
  {
    std::ofstream out(path, std::ios::binary);
    const std::int32_t max_token_length = 8;
    out.write(reinterpret_cast<const char*>(&max_token_length), sizeof(max_token_length));
    for (const std::string piece : {"<unk>", "<s>", "</s>", "<0x 8>", "<0x-8>", "<0x41>"}) {
      const float score = 0.0F;
      const auto length = static_cast<std::int32_t>(piece.size());
      out.write(reinterpret_cast<const char*>(&score), sizeof(score));
      out.write(reinterpret_cast<const char*>(&length), sizeof(length));
      out << piece;
    }
  }
  const auto tokenizer = kk::load_llama2c_tokenizer(path);
  const std::vector<std::int32_t> ids = {3, 4, 5};
  CHECK(tokenizer->decode(ids) == "<0x 8><0x-8>A");
}
