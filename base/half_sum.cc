// 16-bit sums for the ring allreduce (base/half_sum.h): each hop widens both operands to fp32,
// adds them once and rounds once (to nearest even, as base/half.h), so a ring of P ranks rounds
// P-1 times.
#include "base/half_sum.h"

#include <atomic>
#include <string>

#include "base/cpu_features.h"
#include "base/error.h"
#include "base/half.h"

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

namespace gradex {

bool cpu_has_avx2_f16c() {
#if defined(__x86_64__)
  static const bool has = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    const bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0;
    return f16c && __builtin_cpu_supports("avx2");
  }();
  return has;
#else
  return false;
#endif
}

namespace {
std::atomic<bool> baseline_forced{false};
}  // namespace

bool cpu_has_avx2() {
#if defined(__x86_64__)
  static const bool has = __builtin_cpu_supports("avx2");
  return has && !baseline_forced.load(std::memory_order_relaxed);
#else
  return false;
#endif
}

void force_baseline_isa(bool on) {
  baseline_forced.store(on, std::memory_order_relaxed);
}

namespace {

template <float (*ToFloat)(uint16_t), uint16_t (*FromFloat)(float)>
void sum_16(uint16_t* acc, const uint16_t* in, size_t count) {
  for (size_t i = 0; i < count; ++i)
    acc[i] = FromFloat(ToFloat(in[i]) + ToFloat(acc[i]));
}

#if defined(__x86_64__)
__attribute__((target("avx2,f16c"))) void sum_fp16_f16c(uint16_t* acc, const uint16_t* in,
                                                        size_t count) {
  size_t i = 0;
  for (; i + 8 <= count; i += 8) {
    __m256 a = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(acc + i)));
    __m256 b = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i)));
    __m128i s = _mm256_cvtps_ph(_mm256_add_ps(b, a), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(acc + i), s);
  }
  sum_16<half_to_float, float_to_half>(acc + i, in + i, count - i);
}

__attribute__((target("avx2"))) __m256 bf16x8_to_float(const uint16_t* p) {
  __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}

// bf16 rounding as float_to_bf16: add 0x7fff plus the kept LSB, keep the top half; NaN -> quiet
// NaN.
__attribute__((target("avx2"))) void sum_bf16_avx2(uint16_t* acc, const uint16_t* in,
                                                   size_t count) {
  const __m256i bias = _mm256_set1_epi32(0x7fff);
  const __m256i one = _mm256_set1_epi32(1);
  const __m256i quiet = _mm256_set1_epi32(0x40);
  size_t i = 0;
  for (; i + 8 <= count; i += 8) {
    __m256 s = _mm256_add_ps(bf16x8_to_float(in + i), bf16x8_to_float(acc + i));
    __m256i bits = _mm256_castps_si256(s);
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), one);
    __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(bits, _mm256_add_epi32(bias, lsb)), 16);
    __m256i nan = _mm256_or_si256(_mm256_srli_epi32(bits, 16), quiet);
    __m256i is_nan = _mm256_castps_si256(_mm256_cmp_ps(s, s, _CMP_UNORD_Q));
    __m256i r = _mm256_blendv_epi8(rounded, nan, is_nan);
    __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(acc + i), _mm256_castsi256_si128(packed));
  }
  sum_16<bf16_to_float, float_to_bf16>(acc + i, in + i, count - i);
}
#endif

}  // namespace

void half_sum_into(uint16_t* acc, const uint16_t* incoming, size_t count, DType type) {
  if (type == DType::kFloat16) {
#if defined(__x86_64__)
    if (cpu_has_avx2_f16c()) return sum_fp16_f16c(acc, incoming, count);
#endif
    return sum_16<half_to_float, float_to_half>(acc, incoming, count);
  }
  if (type == DType::kBFloat16) {
#if defined(__x86_64__)
    if (cpu_has_avx2_f16c()) return sum_bf16_avx2(acc, incoming, count);
#endif
    return sum_16<bf16_to_float, float_to_bf16>(acc, incoming, count);
  }
  throw InvalidArgument(std::string("half_sum_into: type must be fp16 or bf16, got ") +
                        dtype_name(type));
}

}  // namespace gradex
