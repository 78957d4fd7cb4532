#define PCRE2_CODE_UNIT_WIDTH 8
#include "kernels/byte_level.hpp"

#include <pcre2.h>

#include <array>

#include "common/errors.hpp"
#include "common/utf8.hpp"
#include "kernels/impl/score_bpe.hpp"

namespace kvtier::kernels {
namespace {

// GPT-2's table as compile-time constants: the code point each byte maps to, and back.
constexpr bool printable_byte(unsigned int byte) {
  return (byte >= 33 && byte <= 126) || (byte >= 161 && byte <= 172) || (byte >= 174);
}

constexpr std::array<char32_t, 256> make_code_points() {
  std::array<char32_t, 256> table{};
  char32_t next_unprintable = 256;
  for (unsigned int byte = 0; byte < 256; ++byte) {
    table[byte] = printable_byte(byte) ? static_cast<char32_t>(byte) : next_unprintable++;
  }
  return table;
}
constexpr std::array<char32_t, 256> kCodePointOfByte = make_code_points();

// The 68 unprintable bytes map to U+0100..U+0143, so 324 code points cover the table.
constexpr std::array<int, 324> make_bytes() {
  std::array<int, 324> table{};
  table.fill(-1);
  for (unsigned int byte = 0; byte < 256; ++byte) {
    table[kCodePointOfByte[byte]] = static_cast<int>(byte);
  }
  return table;
}
constexpr std::array<int, 324> kByteOfCodePoint = make_bytes();

// The code point of a well-formed UTF-8 character of one or two bytes (the table's range), or
// a value outside the table.
char32_t decode_short_utf8(std::string_view character) {
  if (character.size() == 1) {
    return static_cast<unsigned char>(character[0]);
  }
  if (character.size() == 2) {
    return (static_cast<char32_t>(static_cast<unsigned char>(character[0]) & 0x1FU) << 6) |
           (static_cast<unsigned char>(character[1]) & 0x3FU);
  }
  return kByteOfCodePoint.size();
}

}  // namespace

std::string bytes_to_byte_level(std::string_view bytes) {
  std::string text;
  for (const char byte : bytes) {
    text += utf8_of(kCodePointOfByte[static_cast<unsigned char>(byte)]);
  }
  return text;
}

std::string byte_level_to_bytes(std::string_view text) {
  std::string bytes;
  for (std::size_t at = 0; at < text.size();) {
    const std::size_t length =
        std::min(utf8_length(static_cast<unsigned char>(text[at])), text.size() - at);
    const std::string_view character = text.substr(at, length);
    const char32_t code_point = decode_short_utf8(character);
    if (code_point < kByteOfCodePoint.size() && kByteOfCodePoint[code_point] >= 0) {
      bytes += static_cast<char>(kByteOfCodePoint[code_point]);
    } else {
      bytes += character;
    }
    at += length;
  }
  return bytes;
}

struct RegexSplitter::Compiled {
  pcre2_code* code = nullptr;
  ~Compiled() { pcre2_code_free(code); }
  Compiled() = default;
  Compiled(const Compiled&) = delete;
  Compiled& operator=(const Compiled&) = delete;
  Compiled(Compiled&&) = delete;
  Compiled& operator=(Compiled&&) = delete;
};

RegexSplitter::RegexSplitter(const std::string& pattern) : compiled_(std::make_unique<Compiled>()) {
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  compiled_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                  PCRE2_UTF | PCRE2_UCP, &error_code, &error_offset, nullptr);
  if (compiled_->code == nullptr) {
    std::array<PCRE2_UCHAR, 256> message{};
    pcre2_get_error_message(error_code, message.data(), message.size());
    throw DataError("pre-tokenizer regex does not compile at offset " +
                        std::to_string(error_offset) + ": " +
                        reinterpret_cast<const char*>(message.data()),
                    pattern);
  }
  // JIT makes long prompts several times faster; matching works without it too.
  static_cast<void>(pcre2_jit_compile(compiled_->code, PCRE2_JIT_COMPLETE));
}

RegexSplitter::~RegexSplitter() = default;
RegexSplitter::RegexSplitter(RegexSplitter&&) noexcept = default;
RegexSplitter& RegexSplitter::operator=(RegexSplitter&&) noexcept = default;

std::vector<std::string_view> RegexSplitter::split(std::string_view text) const {
  std::vector<std::string_view> pieces;
  pcre2_match_data* match = pcre2_match_data_create_from_pattern(compiled_->code, nullptr);
  const auto subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  std::size_t piece_start = 0;  // end of the last piece emitted
  std::size_t offset = 0;
  std::uint32_t options = 0;  // UTF-8 is checked on the first call only
  while (offset < text.size()) {
    const int result =
        pcre2_match(compiled_->code, subject, text.size(), offset, options, match, nullptr);
    options = PCRE2_NO_UTF_CHECK;
    if (result == PCRE2_ERROR_NOMATCH) {
      break;
    }
    if (result < 0) {
      pcre2_match_data_free(match);
      throw DataError(result <= PCRE2_ERROR_UTF8_ERR1 && result >= PCRE2_ERROR_UTF8_ERR21
                          ? "text to tokenize is not valid UTF-8"
                          : "pre-tokenizer regex failed with PCRE2 error " +
                                std::to_string(result));
    }
    const PCRE2_SIZE* range = pcre2_get_ovector_pointer(match);
    const std::size_t begin = range[0];
    const std::size_t end = range[1];
    if (end == begin) {
      // An empty match splits nothing; step over one character.
      offset = begin +
               std::min(utf8_length(static_cast<unsigned char>(text[begin])), text.size() - begin);
      continue;
    }
    if (begin > piece_start) {
      pieces.push_back(text.substr(piece_start, begin - piece_start));
    }
    pieces.push_back(text.substr(begin, end - begin));
    piece_start = end;
    offset = end;
  }
  pcre2_match_data_free(match);
  if (piece_start < text.size()) {
    pieces.push_back(text.substr(piece_start));
  }
  return pieces;
}

}  // namespace kvtier::kernels
