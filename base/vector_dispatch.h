// Hot loops compiled twice, for the baseline x86-64 ISA (SSE2, 4 floats a vector) and for AVX2 (8),
// and run in the form the CPU has, chosen once per process. The codecs' encode is arithmetic-bound
// (a division, a rounding and an exactness check per element): AVX2 halves it.
//
// A body given to with_vector_isa() must be a lambda marked GX_VECTOR_BODY, and every function it
// calls in its loops must be GX_ALWAYS_INLINE: then the whole loop is compiled inside each caller,
// with that caller's ISA (a function left out of line would run the baseline's code in both).
// Both forms compute the same bits wherever the body's arithmetic is IEEE add, subtract, multiply,
// divide, min, max and conversions, with no contraction into FMA: those round identically at every
// vector width, and the AVX2 target enables no FMA instructions.
#pragma once

#include "base/cpu_features.h"

#define GX_ALWAYS_INLINE inline __attribute__((always_inline))
#define GX_VECTOR_BODY __attribute__((always_inline))

namespace gradex {

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
namespace detail {
template <class Body>
__attribute__((target("avx2"))) auto run_avx2(Body& body) {
  return body();
}
}  // namespace detail

template <class Body>
auto with_vector_isa(Body&& body) {
  if (cpu_has_avx2()) return detail::run_avx2(body);
  return body();
}
#else
template <class Body>
auto with_vector_isa(Body&& body) {
  return body();
}
#endif

}  // namespace gradex
