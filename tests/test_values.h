// Deterministic pseudo-random test inputs that any rank can recompute for any other: a hash of
// (seed, rank, step, index), no generator state, so a check may read any value as often as it
// likes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace gradex::test {

// A value in [-1, 1) for (seed, rank, step, index).
inline float test_value(uint64_t seed, int rank, int step, uint64_t i) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ull ^ (static_cast<uint64_t>(rank) << 48) ^
               (static_cast<uint64_t>(step) << 32) ^ i;
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return static_cast<float>(static_cast<double>(x >> 40) / static_cast<double>(1ull << 23) - 1.0);
}

inline std::vector<float> test_vector(uint64_t seed, int rank, int step, size_t n) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i)
    v[i] = test_value(seed, rank, step, i);
  return v;
}

}  // namespace gradex::test
