#include "configs/units.hpp"

#include <array>
#include <charconv>
#include <cmath>
#include <string>

#include "common/errors.hpp"

namespace kvtier::units {
namespace {

struct UnitEntry {
  std::string_view symbol;
  Dimension dimension;
  double to_base;
};

constexpr double kKi = 1024.0;
constexpr double kMi = kKi * 1024.0;
constexpr double kGi = kMi * 1024.0;
constexpr double kTi = kGi * 1024.0;

// Symbols accepted on input and in schema annotations. Bits per second are deliberately absent:
// "Gbps" is read as gigabits by some and gigabytes by others.
constexpr std::array kUnits = {
    UnitEntry{"1", Dimension::kNumber, 1.0},
    UnitEntry{"tokens", Dimension::kTokens, 1.0},
    UnitEntry{"token", Dimension::kTokens, 1.0},
    UnitEntry{"requests", Dimension::kRequests, 1.0},
    UnitEntry{"request", Dimension::kRequests, 1.0},
    UnitEntry{"B", Dimension::kBytes, 1.0},
    UnitEntry{"kB", Dimension::kBytes, 1e3},
    UnitEntry{"KB", Dimension::kBytes, 1e3},
    UnitEntry{"MB", Dimension::kBytes, 1e6},
    UnitEntry{"GB", Dimension::kBytes, 1e9},
    UnitEntry{"TB", Dimension::kBytes, 1e12},
    UnitEntry{"KiB", Dimension::kBytes, kKi},
    UnitEntry{"MiB", Dimension::kBytes, kMi},
    UnitEntry{"GiB", Dimension::kBytes, kGi},
    UnitEntry{"TiB", Dimension::kBytes, kTi},
    UnitEntry{"B/s", Dimension::kBandwidth, 1.0},
    UnitEntry{"kB/s", Dimension::kBandwidth, 1e3},
    UnitEntry{"KB/s", Dimension::kBandwidth, 1e3},
    UnitEntry{"MB/s", Dimension::kBandwidth, 1e6},
    UnitEntry{"GB/s", Dimension::kBandwidth, 1e9},
    UnitEntry{"TB/s", Dimension::kBandwidth, 1e12},
    UnitEntry{"KiB/s", Dimension::kBandwidth, kKi},
    UnitEntry{"MiB/s", Dimension::kBandwidth, kMi},
    UnitEntry{"GiB/s", Dimension::kBandwidth, kGi},
    UnitEntry{"TiB/s", Dimension::kBandwidth, kTi},
    UnitEntry{"ps", Dimension::kTime, 1e-12},
    UnitEntry{"ns", Dimension::kTime, 1e-9},
    UnitEntry{"us", Dimension::kTime, 1e-6},
    UnitEntry{"\xC2\xB5s", Dimension::kTime, 1e-6},  // µs
    UnitEntry{"ms", Dimension::kTime, 1e-3},
    UnitEntry{"s", Dimension::kTime, 1.0},
    UnitEntry{"FLOP/s", Dimension::kCompute, 1.0},
    UnitEntry{"GFLOP/s", Dimension::kCompute, 1e9},
    UnitEntry{"TFLOP/s", Dimension::kCompute, 1e12},
    UnitEntry{"PFLOP/s", Dimension::kCompute, 1e15},
    UnitEntry{"TFLOPS", Dimension::kCompute, 1e12},
    UnitEntry{"TOP/s", Dimension::kCompute, 1e12},
    UnitEntry{"TOPS", Dimension::kCompute, 1e12},
    UnitEntry{"1/s", Dimension::kRate, 1.0},
    UnitEntry{"/s", Dimension::kRate, 1.0},
    UnitEntry{"Hz", Dimension::kRate, 1.0},
};

struct Multiplier {
  std::string_view symbol;
  double factor;
};

// Multipliers for plain counts ("64k", "2Mi", "50%").
constexpr std::array kMultipliers = {
    Multiplier{"k", 1e3},  Multiplier{"M", 1e6},  Multiplier{"G", 1e9},  Multiplier{"Ki", kKi},
    Multiplier{"Mi", kMi}, Multiplier{"Gi", kGi}, Multiplier{"%", 0.01},
};

struct SuffixEntry {
  std::string_view unit;
  std::string_view suffix;
};

constexpr std::array kFieldSuffixes = {
    SuffixEntry{"GiB", "_gib"},   SuffixEntry{"MiB", "_mib"},
    SuffixEntry{"B", "_bytes"},   SuffixEntry{"GB/s", "_gb_per_s"},
    SuffixEntry{"us", "_us"},     SuffixEntry{"ps", "_ps"},
    SuffixEntry{"s", "_s"},       SuffixEntry{"TFLOP/s", "_tflops"},
    SuffixEntry{"1/s", "_per_s"}, SuffixEntry{"tokens", "_tokens"},
};

bool is_count_like(Dimension dimension) {
  return dimension == Dimension::kNumber || dimension == Dimension::kTokens ||
         dimension == Dimension::kRequests;
}

std::string_view trim(std::string_view text) {
  while (!text.empty() && (text.front() == ' ' || text.front() == '\t')) {
    text.remove_prefix(1);
  }
  while (!text.empty() && (text.back() == ' ' || text.back() == '\t')) {
    text.remove_suffix(1);
  }
  return text;
}

[[noreturn]] void fail(std::string what, std::string_view context) {
  throw ConfigError(std::move(what), std::string(context));
}

// The decimal number `text` (as from_chars read it: digits, a point, an exponent) times
// 10^shift, correctly rounded; nullopt when that is out of a double's range.
std::optional<double> shifted_decimal(std::string_view text, int shift) {
  std::string mantissa(text);
  long long exponent = 0;
  if (const std::size_t e = mantissa.find_first_of("eE"); e != std::string::npos) {
    std::string_view digits = std::string_view(mantissa).substr(e + 1);
    if (!digits.empty() && digits.front() == '+') {
      digits.remove_prefix(1);
    }
    const auto [end, error] =
        std::from_chars(digits.data(), digits.data() + digits.size(), exponent);
    if (error != std::errc{} || end != digits.data() + digits.size()) {
      return std::nullopt;
    }
    mantissa.resize(e);
  }
  const std::string shifted = mantissa + "e" + std::to_string(exponent + shift);
  double value = 0.0;
  const auto [end, error] = std::from_chars(shifted.data(), shifted.data() + shifted.size(), value);
  if (error != std::errc{} || end != shifted.data() + shifted.size() || !std::isfinite(value)) {
    return std::nullopt;
  }
  return value;
}

}  // namespace

std::string dimension_name(Dimension dimension) {
  std::string what;
  switch (dimension) {
    case Dimension::kNumber: return "a plain number";
    case Dimension::kTokens: return "a token count";
    case Dimension::kRequests: return "a request count";
    case Dimension::kBytes: what = "a size"; break;
    case Dimension::kBandwidth: what = "a bandwidth"; break;
    case Dimension::kTime: what = "a duration"; break;
    case Dimension::kCompute: what = "a compute rate"; break;
    case Dimension::kRate: what = "a rate"; break;
  }
  // Every symbol the parser takes for it, from the one table.
  std::string symbols;
  for (const auto& entry : kUnits) {
    if (entry.dimension == dimension) {
      symbols += (symbols.empty() ? "" : ", ") + std::string(entry.symbol);
    }
  }
  return what + " (" + symbols + ")";
}

std::optional<Unit> find_unit(std::string_view symbol) {
  for (const auto& entry : kUnits) {
    if (entry.symbol == symbol) {
      return Unit{entry.dimension, entry.to_base};
    }
  }
  return std::nullopt;
}

std::optional<std::string_view> field_suffix(std::string_view unit_symbol) {
  for (const auto& entry : kFieldSuffixes) {
    if (entry.unit == unit_symbol) {
      return entry.suffix;
    }
  }
  return std::nullopt;
}

Quantity parse_quantity(std::string_view text, std::string_view context) {
  const std::string_view input = trim(text);
  if (input.empty()) {
    fail("empty value where a number was expected", context);
  }
  double number = 0.0;
  const char* begin = input.data();
  const char* end = input.data() + input.size();
  if (*begin == '+') {
    ++begin;  // from_chars rejects a leading '+', people write it
  }
  const auto [stop, error] = std::from_chars(begin, end, number);
  if (error != std::errc{} || stop == begin) {
    fail("'" + std::string(input) + "' is not a number with an optional unit", context);
  }
  if (!std::isfinite(number)) {
    fail("'" + std::string(input) + "' is not a finite number", context);
  }
  const std::string_view suffix = trim(std::string_view(stop, static_cast<size_t>(end - stop)));
  if (suffix.empty()) {
    return Quantity{number, std::nullopt};
  }
  if (const auto unit = find_unit(suffix)) {
    if (is_count_like(unit->dimension) && unit->dimension != Dimension::kNumber) {
      return Quantity{number, unit->dimension};
    }
    if (unit->dimension == Dimension::kNumber) {
      return Quantity{number, std::nullopt};
    }
    return Quantity{number * unit->to_base, unit->dimension, false,
                    std::string(begin, static_cast<std::size_t>(stop - begin)), unit->to_base};
  }
  for (const auto& multiplier : kMultipliers) {
    if (suffix.substr(0, multiplier.symbol.size()) != multiplier.symbol) {
      continue;
    }
    const std::string_view rest = trim(suffix.substr(multiplier.symbol.size()));
    if (rest.empty()) {
      return Quantity{number * multiplier.factor, std::nullopt, true};
    }
    if (const auto unit = find_unit(rest); unit && is_count_like(unit->dimension)) {
      const auto dimension = unit->dimension == Dimension::kNumber
                                 ? std::optional<Dimension>{}
                                 : std::optional<Dimension>{unit->dimension};
      return Quantity{number * multiplier.factor, dimension, true};
    }
  }
  fail("unknown unit '" + std::string(suffix) + "' in '" + std::string(input) + "'", context);
}

double convert(std::string_view text, std::string_view target_unit, bool bare_numbers_allowed,
               std::string_view context) {
  const auto target = find_unit(target_unit);
  if (!target) {
    fail("schema declares unknown unit '" + std::string(target_unit) + "'", context);
  }
  const Quantity quantity = parse_quantity(text, context);
  const std::string shown(trim(text));
  if (!quantity.dimension) {
    if (is_count_like(target->dimension)) {
      return quantity.base_value;
    }
    if (bare_numbers_allowed && !quantity.scaled) {
      return quantity.base_value;
    }
    fail("'" + shown + "' needs a unit: expected " +
             std::string(dimension_name(target->dimension)) + ", e.g. '" + shown +
             std::string(target_unit) + "'",
         context);
  }
  if (*quantity.dimension != target->dimension) {
    fail("'" + shown + "' is " + std::string(dimension_name(*quantity.dimension)) + ", expected " +
             std::string(dimension_name(target->dimension)),
         context);
  }
  // Decimal units differ by an exact power of ten: move the written number's decimal exponent
  // by it and read it again, rounding once.
  const auto decimal_exponent = [](double factor) -> std::optional<int> {
    const int exponent = static_cast<int>(std::lround(std::log10(factor)));
    return exponent >= -15 && exponent <= 15 && std::pow(10.0, exponent) == factor
               ? std::optional<int>(exponent)
               : std::nullopt;
  };
  const auto from = decimal_exponent(quantity.unit_to_base);
  const auto to = decimal_exponent(target->to_base);
  if (!quantity.written.empty() && from && to) {
    if (const auto shifted = shifted_decimal(quantity.written, *from - *to)) {
      return *shifted;
    }
  }
  return quantity.base_value / target->to_base;
}

}  // namespace kvtier::units
