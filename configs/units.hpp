#pragma once
// Unit strings on the command line and in sweep axes ("80GiB", "4.8TB/s", "5us", "64k", "50%").
// Every config field declares its unit in the schema; a value given with a unit is converted to
// it, and a unit of another dimension is an error. Decimal prefixes are SI (k = 1000); binary
// prefixes are spelt Ki, Mi, Gi, Ti.

#include <optional>
#include <string>
#include <string_view>

namespace kvtier::units {

enum class Dimension {
  kNumber,    // plain count or ratio ("1"); accepts k/M/G/Ki/Mi/Gi multipliers and "%"
  kTokens,    // token counts; like kNumber
  kRequests,  // request counts; like kNumber
  kBytes,
  kBandwidth,  // bytes per second
  kTime,
  kCompute,  // operations per second (FLOP/s or OP/s)
  kRate,     // events per second
};

[[nodiscard]] std::string dimension_name(Dimension dimension);

struct Unit {
  Dimension dimension;
  double to_base;  // multiply a value in this unit by this to get the dimension's base unit
};

// The unit a schema field declares (e.g. "GiB"), or nothing when the string is not a unit.
[[nodiscard]] std::optional<Unit> find_unit(std::string_view symbol);

// A number with an optional unit, already in its dimension's base unit (bytes, B/s, seconds...).
struct Quantity {
  double base_value = 0.0;
  std::optional<Dimension> dimension;  // empty: a bare number (possibly with k/M/% multiplier)
  bool scaled = false;                 // a count multiplier (k, Mi, %) was applied
  // With a unit: the number's text as written and the unit's factor to the base unit, so that a
  // conversion between decimal units moves the decimal exponent and rounds once: "2ms" is 2000
  // us, where 0.002 s / 1e-6 is 2000.0000000000002. Empty without a unit.
  std::string written = {};
  double unit_to_base = 1.0;
};

// Parses "80GiB", "4.8 TB/s", "5us", "64k", "0.5", "50%". Throws ConfigError naming `context`
// when the text is not a number followed by a known unit.
[[nodiscard]] Quantity parse_quantity(std::string_view text, std::string_view context);

// Converts `text` into `target_unit` (a schema unit symbol). A bare number is taken to be in
// the target unit when `bare_numbers_allowed`; otherwise a unit is demanded, so that a value
// never silently changes meaning.
[[nodiscard]] double convert(std::string_view text, std::string_view target_unit,
                             bool bare_numbers_allowed, std::string_view context);

// The suffix a field name carries for its unit ("GiB" -> "_gib", "GB/s" -> "_gb_per_s").
[[nodiscard]] std::optional<std::string_view> field_suffix(std::string_view unit_symbol);

}  // namespace kvtier::units
