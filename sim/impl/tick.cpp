#include "sim/tick.hpp"

#include <cmath>
#include <string>

namespace kvtier::sim {
namespace {

__extension__ typedef unsigned __int128 Uint128;  // __extension__: no -Wpedantic warning

// 2^63 as a double; every double strictly below it (and ≥ -2^63) converts to int64 safely.
constexpr double kInt64Limit = 9223372036854775808.0;

Tick round_picoseconds(double picoseconds, Rounding rounding, const char* what) {
  if (std::isnan(picoseconds)) {
    throw std::invalid_argument(std::string("sim: ") + what + " is NaN");
  }
  // Decimal inputs such as 1.5e-6 s are not exact in binary, so a directed rounding would turn
  // 1500000.0000000002 ps into 1500001. A value within one part in 10^12 of a whole picosecond is
  // taken to be that picosecond before rounding up or down.
  double whole = std::round(picoseconds);
  const bool is_noise = std::fabs(picoseconds - whole) <= std::fabs(picoseconds) * 1e-12;
  if (!is_noise && rounding == Rounding::kUp) {
    whole = std::ceil(picoseconds);
  } else if (!is_noise && rounding == Rounding::kDown) {
    whole = std::floor(picoseconds);
  }
  if (!(whole < kInt64Limit && whole >= -kInt64Limit)) {
    throw std::overflow_error(std::string("sim: ") + what + " is beyond ±106 days");
  }
  return Tick::ps(static_cast<std::int64_t>(whole));
}

}  // namespace

Tick from_seconds(double seconds, Rounding rounding) {
  return round_picoseconds(seconds * 1e12, rounding, "time in seconds");
}

Tick from_microseconds(double microseconds, Rounding rounding) {
  return round_picoseconds(microseconds * 1e6, rounding, "time in microseconds");
}

Tick from_nanoseconds(double nanoseconds, Rounding rounding) {
  return round_picoseconds(nanoseconds * 1e3, rounding, "time in nanoseconds");
}

Tick transfer_duration(double bytes, double bytes_per_second) {
  if (!(bytes >= 0.0) || std::isinf(bytes)) {
    throw std::invalid_argument("sim: transfer size must be a finite number of bytes >= 0");
  }
  if (!(bytes_per_second > 0.0) || std::isinf(bytes_per_second)) {
    throw std::invalid_argument("sim: bandwidth must be finite and > 0 bytes/s");
  }
  // Whole bytes over a whole-number bandwidth: exact integer ceiling division.
  if (bytes == std::floor(bytes) && bytes_per_second == std::floor(bytes_per_second) &&
      bytes < kInt64Limit && bytes_per_second < kInt64Limit) {
    const auto numerator = static_cast<Uint128>(static_cast<std::uint64_t>(bytes)) *
                           static_cast<Uint128>(Tick::kPsPerSecond);
    const auto denominator = static_cast<Uint128>(static_cast<std::uint64_t>(bytes_per_second));
    const Uint128 picoseconds = (numerator + denominator - 1) / denominator;
    if (picoseconds > static_cast<Uint128>(Tick::max().picoseconds())) {
      throw std::overflow_error("sim: transfer duration is beyond 106 days");
    }
    return Tick::ps(static_cast<std::int64_t>(picoseconds));
  }
  // Fractional bytes or rate (a max-min share): round up, forgiving floating-point noise.
  return round_picoseconds(bytes * 1e12 / bytes_per_second, Rounding::kUp, "transfer duration");
}

double to_seconds(Tick time) noexcept {
  return static_cast<double>(time.picoseconds()) / 1e12;
}

double to_microseconds(Tick time) noexcept {
  return static_cast<double>(time.picoseconds()) / 1e6;
}

}  // namespace kvtier::sim
