// Small helpers for code that runs inside a forked rank: failures are returned as strings.
#pragma once

#include <cmath>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "gradex/gradex.h"

#define RANK_REQUIRE(cond, what)                                                           \
  do {                                                                                     \
    if (!(cond)) {                                                                         \
      std::ostringstream rank_require_os_;                                                 \
      rank_require_os_ << what << " [" #cond " at " << __FILE__ << ":" << __LINE__ << "]"; \
      return rank_require_os_.str();                                                       \
    }                                                                                      \
  } while (0)

#define RANK_OK(call) RANK_REQUIRE((call) == GRADEX_OK, #call << ": " << gradex_last_error())

namespace gradex::test {

// gradex_explain's text for `engine` ("" when the call fails: the caller's check then fails).
inline std::string explain_text(gradex_engine_t* engine) {
  size_t length = 0;
  if (gradex_explain(engine, nullptr, 0, &length) != GRADEX_OK) return "";
  std::string text(length, '\0');
  if (gradex_explain(engine, text.data(), text.size(), &length) != GRADEX_OK) return "";
  return text;
}

// Deterministic pseudo-random values in [-1, 1) for (seed, rank, step, index).
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
