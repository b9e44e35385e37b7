#include "base/half.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

using namespace gradex;

// Every fp16 bit pattern survives fp16 -> fp32 -> fp16 (nan stays nan).
TEST(Half, AllHalfPatternsRoundTrip) {
  for (uint32_t h = 0; h < 0x10000u; ++h) {
    float f = half_to_float(static_cast<uint16_t>(h));
    uint16_t back = float_to_half(f);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(half_to_float(back)));
    } else {
      EXPECT_EQ(back, h) << std::hex << h;
    }
  }
}

// Rounding is to nearest, ties to even: compare against the two neighbouring fp16 values.
TEST(Half, RoundsToNearestEven) {
  uint32_t state = 12345;
  for (int i = 0; i < 200000; ++i) {
    state = state * 1664525u + 1013904223u;
    float f = bits_float((state & 0x8fffffffu) % 0x47800000u);  // finite, below fp16 overflow
    uint16_t h = float_to_half(f);
    float r = half_to_float(h);
    double err = std::fabs(static_cast<double>(r) - f);
    // neighbours of h in magnitude
    uint16_t up = static_cast<uint16_t>(h + 1), down = static_cast<uint16_t>(h - 1);
    if ((h & 0x7fffu) < 0x7bffu) {
      EXPECT_LE(err, std::fabs((double)half_to_float(up) - f)) << f;
    }
    if ((h & 0x7fffu) > 0) {
      EXPECT_LE(err, std::fabs((double)half_to_float(down) - f)) << f;
    }
  }
  EXPECT_EQ(float_to_half(65504.f), 0x7bffu);
  EXPECT_EQ(float_to_half(65520.f), 0x7c00u);             // ties away from max go to inf
  EXPECT_EQ(float_to_half(1.0f + 1.0f / 2048), 0x3c00u);  // tie -> even
  EXPECT_EQ(float_to_half(5.9604644775390625e-8f), 1u);   // smallest subnormal
}

TEST(Bf16, RoundTripAndRounding) {
  for (uint32_t b = 0; b < 0x10000u; ++b) {
    float f = bf16_to_float(static_cast<uint16_t>(b));
    if (std::isnan(f)) continue;
    EXPECT_EQ(float_to_bf16(f), b);
  }
  EXPECT_EQ(float_to_bf16(bits_float(0x3f808000u)), 0x3f80u);  // tie -> even (down)
  EXPECT_EQ(float_to_bf16(bits_float(0x3f818000u)), 0x3f82u);  // tie -> even (up)
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
}
