// The exchange's cheaper forms must be bit-identical to the plain ones: a DGC step that clears its
// gradient, payloads appended in place, and payload views added by element range.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <tuple>

#include "base/half_sum.h"
#include "compress/compress.h"
#include "test_util.h"

namespace gradex::compress {
namespace {

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

class StepAndClear : public ::testing::TestWithParam<std::tuple<float, bool, DType>> {};

TEST_P(StepAndClear, SameSelectionAndStateAsStepAndLeavesZeros) {
  auto [momentum, nesterov, dtype] = GetParam();
  DgcOptions o;
  o.sparsity = 0.99;
  o.momentum = momentum;
  o.nesterov = nesterov;
  o.value_dtype = dtype;
  o.threads = 3;  // several chunks: each clears its own range
  o.parallel_min_elements = 1024;
  const size_t n = 300001;
  DgcCompressor plain(n, o), clearing(n, o);
  for (int s = 0; s < 6; ++s) {
    std::vector<float> g = test::random_grad(n, 70 + s, 1.0f + s % 2, 13);
    std::vector<float> g2 = g;
    const Selection& a = plain.step(g.data(), 0.75f);
    const Selection& b = clearing.step_and_clear(g2.data(), 0.75f);
    ASSERT_EQ(a.indices, b.indices) << "step " << s;
    ASSERT_TRUE(same_bits(a.values, b.values)) << "step " << s;
    ASSERT_EQ(std::memcmp(plain.residual(), clearing.residual(), n * 4), 0) << "step " << s;
    if (momentum > 0) {
      ASSERT_EQ(std::memcmp(plain.momentum_buffer(), clearing.momentum_buffer(), n * 4), 0);
    }
    ASSERT_TRUE(same_bits(g2, std::vector<float>(n, 0.0f))) << "step " << s;
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, StepAndClear,
                         ::testing::Values(std::make_tuple(0.0f, false, DType::kFloat32),
                                           std::make_tuple(0.9f, false, DType::kFloat32),
                                           std::make_tuple(0.9f, true, DType::kFloat16),
                                           std::make_tuple(0.5f, false, DType::kBFloat16)));

TEST(WireAppend, AppendsTheSamePayloadAfterWhatIsThere) {
  const uint64_t numel = 50000;
  std::vector<uint32_t> idx = test::random_support(numel, 400, 5);
  std::vector<float> val = test::random_grad(idx.size(), 6);
  for (int zstd : {0, 3}) {
    wire::SparseRef ref{numel, idx.data(), val.data(), idx.size(), DType::kFloat32};
    std::vector<uint8_t> alone, framed = {1, 2, 3};
    wire::encode(ref, 99, {IndexCoding::kAuto, zstd}, alone);
    wire::encode_append(ref, 99, {IndexCoding::kAuto, zstd}, framed);
    ASSERT_EQ(framed.size(), 3 + alone.size());
    EXPECT_EQ(std::vector<uint8_t>(framed.begin(), framed.begin() + 3),
              (std::vector<uint8_t>{1, 2, 3}));
    EXPECT_EQ(std::vector<uint8_t>(framed.begin() + 3, framed.end()), alone);
  }
}

class ViewRanges : public ::testing::TestWithParam<std::tuple<DType, IndexCoding, int>> {};

TEST_P(ViewRanges, RangesAddExactlyWhatAccumulateAdds) {
  auto [dtype, coding, zstd] = GetParam();
  const uint64_t numel = 70001;
  // Values exactly representable in the wire type, as the compressor produces them.
  std::vector<uint32_t> idx = test::random_support(numel, 3000, 11);
  std::vector<float> val = test::random_grad(idx.size(), 12);
  for (float& v : val) {
    bool saturated;
    v = half::round_to(v, dtype, &saturated);
  }
  std::vector<uint8_t> bytes;
  wire::encode({numel, idx.data(), val.data(), idx.size(), dtype}, 3, {coding, zstd}, bytes);

  std::vector<float> want = test::random_grad(numel, 13), got = want;
  wire::accumulate(wire::decode(bytes.data(), bytes.size()), want.data(), numel, 0.25f);
  wire::DecodeScratch scratch;
  wire::PayloadView view = wire::decode_view(bytes.data(), bytes.size(), scratch);
  EXPECT_EQ(view.header.selected, idx.size());
  // Uneven ranges, an empty one and one past an index boundary.
  const size_t cuts[] = {0, 1, 999, 999, 35000, 35001, 69999, numel};
  for (size_t k = 0; k + 1 < std::size(cuts); ++k)
    wire::add_range(view, got.data(), numel, 0.25f, cuts[k], cuts[k + 1]);
  EXPECT_TRUE(same_bits(want, got));
  EXPECT_THROW(wire::add_range(view, got.data(), numel - 1, 1.0f, 0, numel), InvalidArgument);
}

INSTANTIATE_TEST_SUITE_P(
    Types, ViewRanges,
    ::testing::Combine(::testing::Values(DType::kFloat32, DType::kFloat16, DType::kBFloat16),
                       ::testing::Values(IndexCoding::kVarint, IndexCoding::kRice,
                                         IndexCoding::kBitmap),
                       ::testing::Values(0, 3)));

TEST(ViewRanges, DamagedPayloadsAreRefusedLikeDecode) {
  std::vector<uint32_t> idx = {1, 5, 9};
  std::vector<float> val = {1, 2, 3};
  std::vector<uint8_t> bytes;
  wire::encode({10, idx.data(), val.data(), 3, DType::kFloat32}, 1, {}, bytes);
  bytes.back() ^= 1;
  wire::DecodeScratch scratch;
  EXPECT_THROW(wire::decode_view(bytes.data(), bytes.size(), scratch), CorruptPayload);
  EXPECT_THROW(wire::decode_view(bytes.data(), 10, scratch), CorruptPayload);
}

// The non-finite scans of every type against std::isfinite on the widened value, on sizes that
// run on one thread and on the pool.
TEST(NonFiniteScan, CountsAndZeroesExactlyTheNonFiniteValues) {
  for (size_t n : {size_t{0}, size_t{5}, size_t{4099}, (size_t{1} << 21) + 9}) {
    std::vector<float> f = test::random_grad(n, 21);
    for (size_t i = 3; i < n; i += 997)
      f[i] = (i / 997) % 3 == 0 ? INFINITY : (i / 997) % 3 == 1 ? -INFINITY : NAN;
    size_t want = 0;
    for (float x : f)
      want += !std::isfinite(x);
    EXPECT_EQ(half::count_nonfinite(f.data(), n), want) << n;
    std::vector<float> z = f;
    EXPECT_EQ(half::zero_nonfinite(z.data(), n), want) << n;
    for (size_t i = 0; i < n; ++i)
      ASSERT_TRUE(std::isfinite(f[i]) ? z[i] == f[i] : (z[i] == 0.0f && !std::signbit(z[i])));
    for (DType t : {DType::kFloat16, DType::kBFloat16}) {
      std::vector<uint16_t> h(n);
      half::to_half(f.data(), h.data(), n, t, 1.0f);  // finite values saturate: stay finite
      EXPECT_EQ(half::count_nonfinite(h.data(), n, t), want) << n << " " << dtype_name(t);
      std::vector<uint16_t> hz = h;
      EXPECT_EQ(half::zero_nonfinite(hz.data(), n, t), want);
      for (size_t i = 0; i < n; ++i)
        ASSERT_EQ(hz[i], std::isfinite(f[i]) ? h[i] : uint16_t{0}) << i;
    }
  }
  uint16_t h = 0;
  EXPECT_THROW(half::count_nonfinite(&h, 1, DType::kFloat32), InvalidArgument);
}

// The ring's 16-bit sums (SIMD where the CPU has it) against the scalar widen-add-round.
TEST(SumInto, MatchesWidenAddRoundOnce) {
  const size_t n = 1003;  // a SIMD body and a scalar tail
  std::vector<float> a = test::random_grad(n, 41, 100.0f), b = test::random_grad(n, 42, 100.0f);
  for (DType t : {DType::kFloat16, DType::kBFloat16}) {
    std::vector<uint16_t> acc(n), in(n);
    half::to_half(a.data(), acc.data(), n, t, 1.0f);
    half::to_half(b.data(), in.data(), n, t, 1.0f);
    std::vector<uint16_t> want(n);
    for (size_t i = 0; i < n; ++i)
      want[i] = t == DType::kFloat16 ? float_to_half(half_to_float(in[i]) + half_to_float(acc[i]))
                                     : float_to_bf16(bf16_to_float(in[i]) + bf16_to_float(acc[i]));
    half_sum_into(acc.data(), in.data(), n, t);
    EXPECT_EQ(acc, want) << dtype_name(t);
  }
  uint16_t x = 0;
  EXPECT_THROW(half_sum_into(&x, &x, 1, DType::kFloat32), InvalidArgument);
}

}  // namespace
}  // namespace gradex::compress
