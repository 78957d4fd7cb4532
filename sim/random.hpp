#pragma once
// Seeded pseudo-random streams for models and workloads.
//
// Why not <random>'s engines and distributions: the distributions are implementation-defined,
// so std::uniform_int_distribution gives different numbers under libstdc++ and libc++, and a
// result would depend on the standard library it was built with. This generator (xoshiro256**,
// seeded through splitmix64) and its two distributions are written out here, so a seed means the
// same numbers everywhere. A run derives one stream per purpose from its seed
// (RandomStream(seed, stream_id)), so adding a stream never shifts the numbers of another.

#include <cstdint>

namespace kvtier::sim {

class RandomStream {
  __extension__ typedef unsigned __int128 Uint128;  // __extension__: no -Wpedantic warning

 public:
  explicit RandomStream(std::uint64_t seed, std::uint64_t stream_id = 0) noexcept {
    std::uint64_t mix = seed ^ (stream_id * 0xD1B54A32D192ED03ull);
    for (auto& word : state_) {
      word = splitmix64(mix);
    }
  }

  // Uniform over all 64-bit values.
  std::uint64_t next_u64() noexcept {
    const std::uint64_t result = rotl(state_[1] * 5, 7) * 9;
    const std::uint64_t shifted = state_[1] << 17;
    state_[2] ^= state_[0];
    state_[3] ^= state_[1];
    state_[1] ^= state_[2];
    state_[0] ^= state_[3];
    state_[2] ^= shifted;
    state_[3] = rotl(state_[3], 45);
    return result;
  }

  // Uniform over [0, bound), without modulo bias (Lemire's multiply-and-reject); bound > 0.
  std::uint64_t uniform_below(std::uint64_t bound) noexcept {
    Uint128 product = static_cast<Uint128>(next_u64()) * bound;
    auto low = static_cast<std::uint64_t>(product);
    if (low < bound) {
      const std::uint64_t threshold = (0 - bound) % bound;
      while (low < threshold) {
        product = static_cast<Uint128>(next_u64()) * bound;
        low = static_cast<std::uint64_t>(product);
      }
    }
    return static_cast<std::uint64_t>(product >> 64);
  }

  // Uniform over [0, 1) with 53 random bits.
  double uniform_01() noexcept { return static_cast<double>(next_u64() >> 11) * 0x1.0p-53; }

 private:
  static std::uint64_t rotl(std::uint64_t x, int k) noexcept { return (x << k) | (x >> (64 - k)); }
  static std::uint64_t splitmix64(std::uint64_t& x) noexcept {
    std::uint64_t z = (x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }

  std::uint64_t state_[4];
};

}  // namespace kvtier::sim
