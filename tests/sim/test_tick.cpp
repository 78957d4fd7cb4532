#include <catch2/catch.hpp>

#include <cmath>
#include <stdexcept>
#include <type_traits>

#include "sim/tick.hpp"
#include "tests/sim/catch_tick.hpp"

using kvtier::sim::from_microseconds;
using kvtier::sim::from_nanoseconds;
using kvtier::sim::from_seconds;
using kvtier::sim::Rounding;
using kvtier::sim::Tick;
using kvtier::sim::transfer_duration;

TEST_CASE("Tick unit constructors are exact integer picoseconds", "[sim][tick]") {
  CHECK(Tick::ps(7).picoseconds() == 7);
  CHECK(Tick::ns(3).picoseconds() == 3'000);
  CHECK(Tick::us(2).picoseconds() == 2'000'000);
  CHECK(Tick::ms(5).picoseconds() == 5'000'000'000);
  CHECK(Tick::s(1).picoseconds() == 1'000'000'000'000);
  CHECK(Tick() == Tick::zero());
}

TEST_CASE("Tick arithmetic and comparisons behave like integers", "[sim][tick]") {
  const Tick a = Tick::ns(5);
  const Tick b = Tick::ns(3);
  CHECK(a + b == Tick::ns(8));
  CHECK(a - b == Tick::ns(2));
  CHECK(b - a == -Tick::ns(2));
  CHECK(a * 4 == Tick::ns(20));
  CHECK(3 * a == Tick::ns(15));
  CHECK(Tick::ps(7) / 2 == Tick::ps(3));
  CHECK(b < a);
  CHECK(a >= a);
  Tick sum = a;
  sum += b;
  sum -= Tick::ps(1);
  CHECK(sum.picoseconds() == 7'999);
}

TEST_CASE("Tick has no implicit conversion from floating point", "[sim][tick]") {
  STATIC_REQUIRE_FALSE(std::is_convertible_v<double, Tick>);
  STATIC_REQUIRE_FALSE(std::is_constructible_v<Tick, double>);
  STATIC_REQUIRE_FALSE(std::is_convertible_v<std::int64_t, Tick>);
}

TEST_CASE("Tick throws instead of wrapping past about 106 days", "[sim][tick]") {
  CHECK_THROWS_AS(Tick::max() + Tick::ps(1), std::overflow_error);
  CHECK_THROWS_AS(-Tick::max() - Tick::ps(2), std::overflow_error);
  CHECK_THROWS_AS(Tick::s(9'300'000), std::overflow_error);  // 107.6 days
  CHECK_NOTHROW(Tick::s(9'200'000));                         // 106.5 days
  CHECK_THROWS_AS(Tick::max() * 2, std::overflow_error);
  CHECK_THROWS_AS(Tick::ns(1) / 0, std::overflow_error);
}

TEST_CASE("conversions from real-valued time round as asked", "[sim][tick]") {
  CHECK(from_seconds(1.5e-6, Rounding::kNearest) == Tick::ps(1'500'000));
  CHECK(from_nanoseconds(0.0004, Rounding::kNearest) == Tick::ps(0));
  CHECK(from_nanoseconds(0.5e-3, Rounding::kNearest) == Tick::ps(1));  // half away from zero
  CHECK(from_nanoseconds(0.0001, Rounding::kUp) == Tick::ps(1));
  CHECK(from_nanoseconds(0.0019, Rounding::kDown) == Tick::ps(1));
  CHECK(from_nanoseconds(-0.0001, Rounding::kDown) == Tick::ps(-1));
  CHECK(from_microseconds(2.5, Rounding::kUp) == Tick::ps(2'500'000));
}

TEST_CASE("directed rounding ignores decimal representation noise", "[sim][tick]") {
  // 1.5e-6 * 1e12 is 1500000.0000000002 in double; rounding up must not add a picosecond.
  CHECK(from_seconds(1.5e-6, Rounding::kUp) == Tick::ps(1'500'000));
  CHECK(from_seconds(0.3, Rounding::kDown) == Tick::ps(300'000'000'000));
  CHECK(from_microseconds(0.1, Rounding::kUp) == Tick::ps(100'000));
}

TEST_CASE("conversions reject NaN and out-of-range values", "[sim][tick]") {
  CHECK_THROWS_AS(from_seconds(std::nan(""), Rounding::kNearest), std::invalid_argument);
  CHECK_THROWS_AS(from_seconds(1e7, Rounding::kNearest), std::overflow_error);  // 115 days
  CHECK_THROWS_AS(from_seconds(1.0 / 0.0, Rounding::kUp), std::overflow_error);
}

TEST_CASE("a transfer's duration rounds up to the next picosecond", "[sim][tick]") {
  // 1000 bytes at 3 GB/s is 333333.33... ps.
  CHECK(transfer_duration(1000, 3e9) == Tick::ps(333'334));
  CHECK(transfer_duration(3000, 3e9) == Tick::ps(1'000'000));
  CHECK(transfer_duration(0, 3e9) == Tick::zero());
  CHECK(transfer_duration(1, 1e12) == Tick::ps(1));
  CHECK(transfer_duration(1, 3e12) == Tick::ps(1));  // a third of a picosecond still costs one
  // Whole numbers are exact even where a double quotient is not: 10^6 bytes at 7 B/s is
  // 142857142857142857.14... ps, which a double cannot hold to the picosecond.
  CHECK(transfer_duration(1e6, 7) == Tick::ps(142'857'142'857'142'858));
  // A fractional (shared) rate: 10^6 bytes at a third of 3 GB/s is exactly 1 ms.
  CHECK(transfer_duration(1e6, 3e9 / 3) == Tick::ms(1));
}

TEST_CASE("transfer_duration rejects nonsense inputs", "[sim][tick]") {
  CHECK_THROWS_AS(transfer_duration(-1, 1e9), std::invalid_argument);
  CHECK_THROWS_AS(transfer_duration(1, 0), std::invalid_argument);
  CHECK_THROWS_AS(transfer_duration(1e18, 1), std::overflow_error);
}
