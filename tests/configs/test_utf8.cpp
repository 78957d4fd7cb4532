// Text recorded in outputs is valid UTF-8 (common/utf8.hpp, configs/utf8_fields.hpp).

#include <catch2/catch.hpp>

#include <cstdint>
#include <string>

#include "common/utf8.hpp"
#include "configs/schema/sweep.pb.h"
#include "configs/utf8_fields.hpp"

namespace {

const std::string kReplacement = "\xEF\xBF\xBD";

}  // namespace

TEST_CASE("UTF-8 validity follows RFC 3629", "[utf8]") {
  for (const std::string& valid : {std::string(), std::string("plain"), std::string("caf\xC3\xA9"),
                                   std::string("\xE2\x82\xAC"), std::string("\xF0\x9F\x99\x82"),
                                   std::string("\xF4\x8F\xBF\xBF")}) {
    CAPTURE(valid);
    CHECK(kvtier::is_valid_utf8(valid));
    CHECK(kvtier::valid_utf8(valid) == valid);
  }
  for (const std::string& invalid : {std::string("caf\xE9"),           // Latin-1
                                     std::string("\xC0\xAF"),          // overlong '/'
                                     std::string("\xE0\x80\xAF"),      // overlong, three bytes
                                     std::string("\xED\xA0\x80"),      // a UTF-16 surrogate
                                     std::string("\xF4\x90\x80\x80"),  // above U+10FFFF
                                     std::string("\xF5\x80\x80\x80"),  // no such lead byte
                                     std::string("\xE2\x82"),          // cut short
                                     std::string("\x80")}) {           // a lone continuation byte
    CAPTURE(invalid);
    CHECK_FALSE(kvtier::is_valid_utf8(invalid));
    CHECK(kvtier::is_valid_utf8(kvtier::valid_utf8(invalid)));
  }
  // One replacement per byte that starts no valid sequence; the valid text around is kept.
  CHECK(kvtier::valid_utf8("caf\xE9!") == "caf" + kReplacement + "!");
  CHECK(kvtier::valid_utf8("\xE2\x82"
                           "a") == kReplacement + kReplacement + "a");
}

TEST_CASE("every string field of a message is made valid UTF-8, nested and repeated", "[utf8]") {
  kvtier::config::SweepSpec spec;
  spec.set_name("grid \xFF");
  kvtier::config::SweepAxis& axis = *spec.add_axis();
  axis.set_path("seed");
  axis.add_values("1");
  axis.add_values("caf\xE9");
  spec.mutable_base()->mutable_model()->set_name("m\xC0");
  kvtier::config::make_strings_valid_utf8(spec);
  CHECK(spec.name() == "grid " + kReplacement);
  CHECK(spec.axis(0).path() == "seed");
  CHECK(spec.axis(0).values(0) == "1");
  CHECK(spec.axis(0).values(1) == "caf" + kReplacement);
  CHECK(spec.base().model().name() == "m" + kReplacement);
  std::string bytes;
  CHECK(spec.SerializeToString(&bytes));
  kvtier::config::SweepSpec parsed;
  CHECK(parsed.ParseFromString(bytes));
}

TEST_CASE("utf8_of writes each code point as its shortest sequence, one to four bytes", "[utf8]") {
  CHECK(kvtier::utf8_of(U'a') == "a");
  CHECK(kvtier::utf8_of(U'\u00e9') == "\xC3\xA9");
  CHECK(kvtier::utf8_of(U'\u2581') == "\xE2\x96\x81");
  CHECK(kvtier::utf8_of(U'\U0001F600') == "\xF0\x9F\x98\x80");
  CHECK(kvtier::utf8_of(U'\U0010FFFF') == "\xF4\x8F\xBF\xBF");
  // Every scalar value at the edges of each length is a valid sequence of that length.
  for (const char32_t code :
       {0x7FU, 0x80U, 0x7FFU, 0x800U, 0xD7FFU, 0xE000U, 0xFFFFU, 0x10000U, 0x10FFFFU}) {
    CAPTURE(static_cast<std::uint32_t>(code));
    const std::string text = kvtier::utf8_of(code);
    CHECK(kvtier::is_valid_utf8(text));
    CHECK(text.size() == (code < 0x80 ? 1U : code < 0x800 ? 2U : code < 0x10000 ? 3U : 4U));
  }
}
