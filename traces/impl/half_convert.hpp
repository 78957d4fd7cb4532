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
// Halves whose low bytes are low[i · stride] and high bytes high[i · stride] (shuffled byte
// planes: stride 1; element order: high = low + 1, stride 2), to floats. Returns false when
// one is infinite or NaN.
bool byte_planes_to_floats(const unsigned char* low, const unsigned char* high, std::size_t stride,
                           float* out, std::size_t count) noexcept;

}  // namespace kvtier::traces
