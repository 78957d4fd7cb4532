#pragma once
// Simulated time: an integer number of picoseconds in a strong type (as in SST and gem5). One
// type serves as both a point in time and a duration; the difference of two points is a duration.
//
// Integer picoseconds make event ordering exact and runs reproducible: two events computed to
// happen "at the same time" compare equal, which floating-point seconds do not guarantee.
// int64 picoseconds cover ±9.2e18 ps ≈ ±106 days; every operation that could leave that range
// throws std::overflow_error instead of wrapping.
//
// Every conversion from floating-point quantities (seconds, microseconds, a transfer's bytes and
// bandwidth) lives in this header and sim/impl/tick.cpp, and each states how it rounds.

#include <compare>
#include <concepts>
#include <cstdint>
#include <limits>
#include <stdexcept>

namespace kvtier::sim {

class Tick {
 public:
  constexpr Tick() noexcept = default;

  // Exact constructors from whole units; they throw std::overflow_error past ±106 days.
  [[nodiscard]] static constexpr Tick ps(std::int64_t count) { return Tick(count); }
  [[nodiscard]] static constexpr Tick ns(std::int64_t count) { return scaled(count, 1'000); }
  [[nodiscard]] static constexpr Tick us(std::int64_t count) { return scaled(count, 1'000'000); }
  [[nodiscard]] static constexpr Tick ms(std::int64_t count) {
    return scaled(count, 1'000'000'000);
  }
  [[nodiscard]] static constexpr Tick s(std::int64_t count) { return scaled(count, kPsPerSecond); }
  // A fractional count must go through a conversion that says how it rounds (below).
  template <std::floating_point F>
  static Tick ps(F) = delete;
  template <std::floating_point F>
  static Tick ns(F) = delete;
  template <std::floating_point F>
  static Tick us(F) = delete;
  template <std::floating_point F>
  static Tick ms(F) = delete;
  template <std::floating_point F>
  static Tick s(F) = delete;

  [[nodiscard]] static constexpr Tick zero() noexcept { return Tick(0); }
  [[nodiscard]] static constexpr Tick max() noexcept {
    return Tick(std::numeric_limits<std::int64_t>::max());
  }

  [[nodiscard]] constexpr std::int64_t picoseconds() const noexcept { return ps_; }

  constexpr auto operator<=>(const Tick&) const noexcept = default;

  constexpr Tick& operator+=(Tick other) { return *this = *this + other; }
  constexpr Tick& operator-=(Tick other) { return *this = *this - other; }

  friend constexpr Tick operator+(Tick a, Tick b) {
    std::int64_t sum = 0;
    if (__builtin_add_overflow(a.ps_, b.ps_, &sum)) {
      throw std::overflow_error("sim::Tick overflow in addition (beyond ±106 days)");
    }
    return Tick(sum);
  }
  friend constexpr Tick operator-(Tick a, Tick b) {
    std::int64_t difference = 0;
    if (__builtin_sub_overflow(a.ps_, b.ps_, &difference)) {
      throw std::overflow_error("sim::Tick overflow in subtraction (beyond ±106 days)");
    }
    return Tick(difference);
  }
  friend constexpr Tick operator-(Tick a) { return zero() - a; }
  friend constexpr Tick operator*(Tick a, std::int64_t factor) { return scaled(a.ps_, factor); }
  friend constexpr Tick operator*(std::int64_t factor, Tick a) { return scaled(a.ps_, factor); }
  // Integer division truncates toward zero, as for int64.
  friend constexpr Tick operator/(Tick a, std::int64_t divisor) {
    if (divisor == 0 || (divisor == -1 && a.ps_ == std::numeric_limits<std::int64_t>::min())) {
      throw std::overflow_error("sim::Tick division by zero or overflow");
    }
    return Tick(a.ps_ / divisor);
  }
  template <std::floating_point F>
  friend Tick operator*(Tick, F) = delete;
  template <std::floating_point F>
  friend Tick operator*(F, Tick) = delete;
  template <std::floating_point F>
  friend Tick operator/(Tick, F) = delete;

  static constexpr std::int64_t kPsPerSecond = 1'000'000'000'000;

 private:
  explicit constexpr Tick(std::int64_t picoseconds) noexcept : ps_(picoseconds) {}

  static constexpr Tick scaled(std::int64_t count, std::int64_t factor) {
    std::int64_t product = 0;
    if (__builtin_mul_overflow(count, factor, &product)) {
      throw std::overflow_error("sim::Tick overflow in multiplication (beyond ±106 days)");
    }
    return Tick(product);
  }

  std::int64_t ps_ = 0;
};

// How a conversion from a real number of seconds picks its picosecond.
enum class Rounding {
  kNearest,  // to the nearest picosecond, halfway cases away from zero
  kUp,       // toward +infinity (a duration that must not be shortened)
  kDown,     // toward -infinity
};

// Conversions from real-valued time. Decimal inputs are rarely exact in binary (1.5e-6 s is
// 1500000.0000000002 ps as a double), so kUp and kDown first take a value within one part in
// 10^12 of a whole picosecond to be that picosecond; without this, Rounding::kUp would turn a
// configured 1.5 us into 1500001 ps. NaN throws std::invalid_argument; a value outside ±106 days
// throws std::overflow_error.
[[nodiscard]] Tick from_seconds(double seconds, Rounding rounding);
[[nodiscard]] Tick from_microseconds(double microseconds, Rounding rounding);
[[nodiscard]] Tick from_nanoseconds(double nanoseconds, Rounding rounding);

// Time to move `bytes` at `bytes_per_second`, rounded UP to the next picosecond, so a transfer
// is never reported faster than its bandwidth allows. When both arguments are whole numbers the
// result is exact (128-bit integer ceil(bytes·10^12 / rate)). Otherwise (a max-min share of a link,
// or the fractional bytes a flow has left) the quotient is computed in double precision and
// rounded up with the same noise rule as Rounding::kUp above. bytes ≥ 0 and bytes_per_second > 0,
// else std::invalid_argument.
[[nodiscard]] Tick transfer_duration(double bytes, double bytes_per_second);

// Real-valued views, for reports; not used to order events.
[[nodiscard]] double to_seconds(Tick time) noexcept;
[[nodiscard]] double to_microseconds(Tick time) noexcept;

}  // namespace kvtier::sim
