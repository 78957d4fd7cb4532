#include "traces/impl/half_convert.hpp"

#include "traces/half.hpp"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <immintrin.h>
#define KVTIER_HAVE_F16C_PATH 1
#endif

namespace kvtier::traces {
namespace {

// A half that is a weight: +0 .. kMostWeightHalf, or −0 (0x8000). Every other half with the sign
// bit set is negative or a negative NaN; above kMostWeightHalf lie larger values, infinity and
// NaN.
bool half_is_weight(std::uint16_t half) noexcept {
  return half <= kMostWeightHalf || half == 0x8000U;
}

#if defined(KVTIER_HAVE_F16C_PATH)
// half_is_weight's negation for eight halves, as 16-bit lane masks. Signed compares: the
// weights are 0 .. kMostWeightHalf, every half with the sign bit is negative as an int16, and
// −0 is INT16_MIN.
__attribute__((target("avx,f16c"))) __m128i halves_not_weights(__m128i halves) noexcept {
  const __m128i above = _mm_cmpgt_epi16(halves, _mm_set1_epi16(kMostWeightHalf));
  const __m128i negative = _mm_cmpgt_epi16(_mm_setzero_si128(), halves);
  const __m128i minus_zero = _mm_cmpeq_epi16(halves, _mm_set1_epi16(static_cast<short>(0x8000)));
  return _mm_or_si128(above, _mm_andnot_si128(minus_zero, negative));
}
// CPUID leaf 1: ECX bit 29 F16C, bit 28 AVX, bit 27 OSXSAVE; and the OS must save the YMM
// registers (XCR0 bits 1 and 2). Asked directly because compilers disagree on the names
// __builtin_cpu_supports accepts.
bool cpu_has_f16c() noexcept {
  unsigned eax = 0;
  unsigned ebx = 0;
  unsigned ecx = 0;
  unsigned edx = 0;
  if (__get_cpuid(1, &eax, &ebx, &ecx, &edx) == 0) {
    return false;
  }
  constexpr unsigned kNeeded = (1U << 29) | (1U << 28) | (1U << 27);
  if ((ecx & kNeeded) != kNeeded) {
    return false;
  }
  unsigned xcr0_low = 0;
  unsigned xcr0_high = 0;
  __asm__("xgetbv" : "=a"(xcr0_low), "=d"(xcr0_high) : "c"(0));
  return (xcr0_low & 6U) == 6U;
}

__attribute__((target("avx,f16c"))) void to_halves_f16c(const float* in, std::uint16_t* out,
                                                        std::size_t count) noexcept {
  std::size_t i = 0;
  for (; i + 8 <= count; i += 8) {
    const __m128i halves =
        _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), halves);
  }
  for (; i < count; ++i) {
    out[i] = float_to_half(in[i]);
  }
}

__attribute__((target("avx,f16c"))) void to_floats_f16c(const std::uint16_t* in, float* out,
                                                        std::size_t count) noexcept {
  std::size_t i = 0;
  for (; i + 8 <= count; i += 8) {
    const __m128i halves = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i));
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(halves));
  }
  for (; i < count; ++i) {
    out[i] = half_to_float(in[i]);
  }
}
__attribute__((target("avx,f16c"))) bool planes_to_floats_f16c(const unsigned char* low,
                                                               const unsigned char* high,
                                                               float* out,
                                                               std::size_t count) noexcept {
  __m128i special = _mm_setzero_si128();
  std::size_t i = 0;
  for (; i + 8 <= count; i += 8) {
    const __m128i halves =
        _mm_unpacklo_epi8(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(low + i)),
                          _mm_loadl_epi64(reinterpret_cast<const __m128i*>(high + i)));
    special = _mm_or_si128(special, halves_not_weights(halves));
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(halves));
  }
  bool weights = _mm_movemask_epi8(special) == 0;
  for (; i < count; ++i) {
    const auto half = static_cast<std::uint16_t>(low[i] | (high[i] << 8));
    weights = weights && half_is_weight(half);
    out[i] = half_to_float(half);
  }
  return weights;
}

// Little-endian halves stored one after another (unshuffled chunks).
__attribute__((target("avx,f16c"))) bool halves_to_floats_checked_f16c(const unsigned char* bytes,
                                                                       float* out,
                                                                       std::size_t count) noexcept {
  __m128i special = _mm_setzero_si128();
  std::size_t i = 0;
  for (; i + 8 <= count; i += 8) {
    const __m128i halves = _mm_loadu_si128(reinterpret_cast<const __m128i*>(bytes + 2 * i));
    special = _mm_or_si128(special, halves_not_weights(halves));
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(halves));
  }
  bool weights = _mm_movemask_epi8(special) == 0;
  for (; i < count; ++i) {
    const auto half = static_cast<std::uint16_t>(bytes[2 * i] | (bytes[2 * i + 1] << 8));
    weights = weights && half_is_weight(half);
    out[i] = half_to_float(half);
  }
  return weights;
}
#endif

#if defined(KVTIER_HAVE_F16C_PATH)
// Asked once: CPUID traps to the hypervisor in a virtual machine and costs microseconds, more
// than converting a row. A constant of the machine, not state.
bool use_f16c() noexcept {
  static const bool available = cpu_has_f16c();
  return available;
}
#endif

}  // namespace

void floats_to_halves(const float* in, std::uint16_t* out, std::size_t count) noexcept {
#if defined(KVTIER_HAVE_F16C_PATH)
  if (use_f16c()) {
    to_halves_f16c(in, out, count);
    return;
  }
#endif
  for (std::size_t i = 0; i < count; ++i) {
    out[i] = float_to_half(in[i]);
  }
}

void halves_to_floats(const std::uint16_t* in, float* out, std::size_t count) noexcept {
#if defined(KVTIER_HAVE_F16C_PATH)
  if (use_f16c()) {
    to_floats_f16c(in, out, count);
    return;
  }
#endif
  for (std::size_t i = 0; i < count; ++i) {
    out[i] = half_to_float(in[i]);
  }
}

bool byte_planes_to_floats(const unsigned char* low, const unsigned char* high, std::size_t stride,
                           float* out, std::size_t count) noexcept {
#if defined(KVTIER_HAVE_F16C_PATH)
  if (stride == 1 && use_f16c()) {
    return planes_to_floats_f16c(low, high, out, count);
  }
  if (stride == 2 && high == low + 1 && use_f16c()) {
    return halves_to_floats_checked_f16c(low, out, count);
  }
#endif
  bool weights = true;
  for (std::size_t i = 0; i < count; ++i) {
    const auto half = static_cast<std::uint16_t>(low[i * stride] | (high[i * stride] << 8));
    weights = weights && half_is_weight(half);
    out[i] = half_to_float(half);
  }
  return weights;
}

}  // namespace kvtier::traces
