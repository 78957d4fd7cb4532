#include <catch2/catch.hpp>

#include <google/protobuf/descriptor.h>

#include <set>

#include "common/errors.hpp"
#include "configs/schema/options.pb.h"
#include "configs/schema/sweep.pb.h"
#include "configs/units.hpp"

using kvtier::ConfigError;
using kvtier::units::convert;

TEST_CASE("unit strings convert into the field's unit", "[units]") {
  CHECK(convert("80GiB", "GiB", false, "t") == Approx(80.0));
  CHECK(convert("80GiB", "B", false, "t") == Approx(80.0 * 1024 * 1024 * 1024));
  CHECK(convert("40 GB", "GiB", false, "t") == Approx(40e9 / (1024.0 * 1024 * 1024)));
  CHECK(convert("4.8TB/s", "GB/s", false, "t") == Approx(4800.0));
  CHECK(convert("25GiB/s", "GB/s", false, "t") == Approx(25.0 * 1.073741824));
  CHECK(convert("5us", "us", false, "t") == Approx(5.0));
  CHECK(convert("5ms", "us", false, "t") == Approx(5000.0));
  CHECK(convert("250ns", "us", false, "t") == Approx(0.25));
  CHECK(convert("2s", "us", false, "t") == Approx(2e6));
  CHECK(convert("989TFLOP/s", "TFLOP/s", false, "t") == Approx(989.0));
  CHECK(convert("1.2PFLOP/s", "TFLOP/s", false, "t") == Approx(1200.0));
  CHECK(convert("10/s", "1/s", false, "t") == Approx(10.0));
}

// Between decimal units the written number is scaled by an exact power of ten: through the base
// unit "2ms" came out as 2000.0000000000002 us, which `config check` printed.
TEST_CASE("decimal unit conversions are exact where the number is", "[units]") {
  CHECK(convert("2ms", "us", false, "t") == 2000.0);
  CHECK(convert("4.8TB/s", "GB/s", false, "t") == 4800.0);
  CHECK(convert("1.5us", "ps", false, "t") == 1.5e6);
  CHECK(convert("3 MB", "B", false, "t") == 3e6);
  CHECK(convert("700ns", "us", false, "t") == 0.7);
  // Where multiplying or dividing the parsed number by the power of ten would round twice.
  CHECK(convert("2.002ms", "us", false, "t") == 2002.0);
  CHECK(convert("446.9ns", "us", false, "t") == 0.4469);
  CHECK(convert("8.2s", "us", false, "t") == 8.2e6);
  CHECK(convert("526.30s", "us", false, "t") == 526300000.0);
  CHECK(convert("16.98MB/s", "GB/s", false, "t") == 0.01698);
  CHECK(convert("7.836GFLOP/s", "TFLOP/s", false, "t") == 0.007836);
  CHECK(convert("1.5e-3s", "us", false, "t") == 1500.0);
  CHECK(convert("+2E+0ms", "us", false, "t") == 2000.0);
  CHECK(convert("64 GB", "GB", false, "t") == 64.0);
  // Binary units stay exact through the base: their factors are powers of two.
  CHECK(convert("1.5GiB", "MiB", false, "t") == 1536.0);
}

TEST_CASE("counts take SI and binary multipliers and percentages", "[units]") {
  CHECK(convert("64k", "tokens", false, "t") == 64000.0);
  CHECK(convert("2Ki", "tokens", false, "t") == 2048.0);
  CHECK(convert("128Ki", "tokens", false, "t") == 131072.0);
  CHECK(convert("1M", "1", false, "t") == 1e6);
  CHECK(convert("50%", "1", false, "t") == Approx(0.5));
  CHECK(convert("4k tokens", "tokens", false, "t") == 4000.0);
  CHECK(convert("4096", "1", false, "t") == 4096.0);
}

TEST_CASE("a bare number takes the field's unit only where the field was named exactly",
          "[units]") {
  CHECK(convert("80", "GiB", true, "t") == 80.0);
  CHECK_THROWS_WITH(convert("80", "GiB", false, "t"), Catch::Contains("needs a unit"));
  // A count multiplier is no size unit.
  CHECK_THROWS_WITH(convert("64k", "GiB", true, "t"), Catch::Contains("needs a unit"));
}

TEST_CASE("malformed and wrong-dimension values are rejected with the reason", "[units]") {
  CHECK_THROWS_AS(convert("abc", "GiB", true, "ctx"), ConfigError);
  CHECK_THROWS_AS(convert("", "GiB", true, "ctx"), ConfigError);
  CHECK_THROWS_AS(convert("1e999", "GiB", true, "ctx"), ConfigError);
  CHECK_THROWS_WITH(convert("80GiBs", "GiB", true, "ctx"), Catch::Contains("unknown unit 'GiBs'"));
  CHECK_THROWS_WITH(convert("10Gbps", "GB/s", true, "ctx"), Catch::Contains("unknown unit"));
  CHECK_THROWS_WITH(convert("5us", "GiB", true, "ctx"),
                    Catch::Contains("is a duration") && Catch::Contains("expected a size"));
  CHECK_THROWS_WITH(convert("80GiB", "GB/s", true, "ctx"), Catch::Contains("expected a bandwidth"));
  CHECK_THROWS_WITH(convert("3 tokens", "requests", true, "ctx"),
                    Catch::Contains("expected a request count"));
  try {
    (void)convert("5us", "GiB", true, "--set x=5us");
  } catch (const ConfigError& error) {
    CHECK(error.where() == "--set x=5us");
  }
}

namespace {

void collect_units(const google::protobuf::Descriptor* type, std::set<std::string>& units,
                   std::set<const google::protobuf::Descriptor*>& seen) {
  if (!seen.insert(type).second) {
    return;
  }
  for (int i = 0; i < type->field_count(); ++i) {
    const auto* field = type->field(i);
    const std::string& unit = field->options().GetExtension(kvtier::config::unit);
    if (!unit.empty()) {
      units.insert(unit);
    }
    if (field->message_type() != nullptr) {
      collect_units(field->message_type(), units, seen);
    }
  }
}

}  // namespace

TEST_CASE("every unit the schema declares is one the parser knows", "[units]") {
  std::set<std::string> units;
  std::set<const google::protobuf::Descriptor*> seen;
  collect_units(kvtier::config::SweepSpec::descriptor(), units, seen);
  REQUIRE(units.size() >= 8);
  for (const auto& unit : units) {
    INFO("unit " << unit);
    CHECK(kvtier::units::find_unit(unit).has_value());
  }
}
