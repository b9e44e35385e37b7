// CPU features the 16-bit kernels dispatch on (x86-64: AVX2 and F16C), read once. In base/ so
// that comm/'s ring sums (base/half_sum.h) and compress/'s bulk casts share one check.
#pragma once

namespace gradex {

// True when the CPU has AVX2 and F16C. F16C is read from CPUID (leaf 1, ECX bit 29) directly:
// clang before 15 does not know the "f16c" feature string of __builtin_cpu_supports, and the
// fuzzers are built with clang. Always false off x86-64.
bool cpu_has_avx2_f16c();

// True when the CPU has AVX2 (base/vector_dispatch.h) and the baseline form is not forced. Always
// false off x86-64.
bool cpu_has_avx2();

// Benchmarks and tests: with_vector_isa() bodies run in their baseline form while `on` (to compare
// the two forms side by side); false restores the CPU's choice. Not for concurrent use with them.
void force_baseline_isa(bool on);

// force_baseline_isa(true) while it lives (the CPU's choice restored after).
class BaselineIsaScope {
 public:
  explicit BaselineIsaScope(bool on = true) { force_baseline_isa(on); }
  ~BaselineIsaScope() { force_baseline_isa(false); }
  BaselineIsaScope(const BaselineIsaScope&) = delete;
  BaselineIsaScope& operator=(const BaselineIsaScope&) = delete;
};

}  // namespace gradex
