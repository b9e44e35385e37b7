// CPU features the 16-bit kernels dispatch on (x86-64: AVX2 and F16C), read once. In base/ so
// that comm/'s ring sums (base/half_sum.h) and compress/'s bulk casts share one check.
#pragma once

namespace gradex {

// True when the CPU has AVX2 and F16C. F16C is read from CPUID (leaf 1, ECX bit 29) directly:
// clang before 15 does not know the "f16c" feature string of __builtin_cpu_supports, and the
// fuzzers are built with clang. Always false off x86-64.
bool cpu_has_avx2_f16c();

}  // namespace gradex
