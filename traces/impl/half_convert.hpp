#pragma once
// Bulk float <-> half conversion for the writer and the fast read path. On x86 CPUs with F16C
// (every x86-64 since 2013) the conversions use its vector instructions, chosen at run time so
// the build stays portable; elsewhere the scalar routines of traces/half.hpp. Both give the
// same bits (round to nearest even; tests/traces/test_half.cpp checks). Internal to traces/.

#include <cstddef>
#include <cstdint>

namespace kvtier::traces {

void floats_to_halves(const float* in, std::uint16_t* out, std::size_t count) noexcept;
void halves_to_floats(const std::uint16_t* in, float* out, std::size_t count) noexcept;
// The largest attention weight a read accepts: 1, with the slack of one FP16 ulp for a float
// mean of probabilities that rounds a hair above it (its half is 0x3C01).
inline constexpr float kMostWeight = 1.0F + 0x1p-10F;
inline constexpr std::uint16_t kMostWeightHalf = 0x3C01;

// Whether a float weight could be a probability: in [0, kMostWeight] (−0 included, NaN not).
[[nodiscard]] inline bool is_weight(float w) noexcept {
  return w >= 0.0F && w <= kMostWeight;
}

// Halves whose low bytes are low[i · stride] and high bytes high[i · stride] (shuffled byte
// planes: stride 1; element order: high = low + 1, stride 2), to floats. Returns false when
// one is no weight (is_weight): NaN, infinite, negative or above kMostWeight.
bool byte_planes_to_floats(const unsigned char* low, const unsigned char* high, std::size_t stride,
                           float* out, std::size_t count) noexcept;

}  // namespace kvtier::traces
