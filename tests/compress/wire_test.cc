// Wire format round trips over every coding, value type and the zstd stage; coding sizes; the
// compressor -> encoder -> decoder -> accumulate path.
#include <gtest/gtest.h>

#include <tuple>

#include "compress/compress.h"
#include "compress/wire/index_coding.h"
#include "test_util.h"

namespace gradex::compress {
namespace {

using wire::DecodedPayload;

class WireRoundTrip : public ::testing::TestWithParam<std::tuple<IndexCoding, DType, int, double>> {
};

TEST_P(WireRoundTrip, DecodesWhatWasEncoded) {
  auto [coding, dtype, zstd_level, density] = GetParam();
  const uint64_t numel = 200003;
  auto idx = test::random_support(numel, static_cast<size_t>(density * numel), 11);
  std::vector<float> values(idx.size());
  for (size_t j = 0; j < idx.size(); ++j) {
    bool sat;
    values[j] = half::round_to(0.001f * (j % 977) - 0.3f, dtype, &sat);
  }
  wire::SparseRef ref{numel, idx.data(), values.data(), idx.size(), dtype};
  std::vector<uint8_t> bytes;
  wire::encode(ref, 0xfeedbeefcafe1234ull, {coding, zstd_level}, bytes);
  DecodedPayload p = wire::decode(bytes.data(), bytes.size());
  EXPECT_EQ(p.header.key, 0xfeedbeefcafe1234ull);
  EXPECT_EQ(p.header.numel, numel);
  EXPECT_EQ(p.header.value_dtype, dtype);
  if (coding != IndexCoding::kAuto) {
    EXPECT_EQ(p.header.index_coding, coding);
  }
  EXPECT_EQ(p.indices, idx);
  EXPECT_EQ(p.values, values);
}

INSTANTIATE_TEST_SUITE_P(
    Sweep, WireRoundTrip,
    ::testing::Combine(::testing::Values(IndexCoding::kVarint, IndexCoding::kRice,
                                         IndexCoding::kBitmap, IndexCoding::kAuto),
                       ::testing::Values(DType::kFloat32, DType::kFloat16, DType::kBFloat16),
                       ::testing::Values(0, 3), ::testing::Values(0.0, 0.001, 0.3)));

TEST(Wire, RiceMeetsTheBitsPerIndexTargetOnRandomSupports) {
  const uint64_t numel = 25'000'000;
  auto idx = test::random_support(numel, numel / 1000, 3);
  wire::IndexPlan rice = wire::rice_plan(idx.data(), idx.size());
  double bits = 8.0 * rice.bytes / idx.size();
  EXPECT_LE(bits, 12.0);  // entropy ~11.4 bits; the target is at most 14
  double varint_bits = 8.0 * wire::varint_bytes(idx.data(), idx.size()) / idx.size();
  EXPECT_GT(varint_bits, bits);
  EXPECT_EQ(wire::best_plan(IndexCoding::kAuto, idx.data(), idx.size(), numel).coding,
            IndexCoding::kRice);
}

TEST(Wire, AutoPicksTheBitmapForDenseSupports) {
  const uint64_t numel = 10000;
  auto idx = test::random_support(numel, 5000, 4);
  EXPECT_EQ(wire::best_plan(IndexCoding::kAuto, idx.data(), idx.size(), numel).coding,
            IndexCoding::kBitmap);
}

TEST(Wire, ZstdIsKeptOnlyWhenItShrinks) {
  const uint64_t numel = 1 << 20;
  std::vector<uint32_t> idx;
  for (uint32_t i = 0; i < 4096; ++i)
    idx.push_back(1000 + i);  // clustered: compresses well
  std::vector<float> values(idx.size(), 0.25f);
  std::vector<uint8_t> plain, packed;
  wire::encode({numel, idx.data(), values.data(), idx.size(), DType::kFloat32}, 1,
               {IndexCoding::kVarint, 0}, plain);
  wire::encode({numel, idx.data(), values.data(), idx.size(), DType::kFloat32}, 1,
               {IndexCoding::kVarint, 3}, packed);
  EXPECT_LT(packed.size(), plain.size() / 4);
  EXPECT_TRUE(wire::parse_header(packed.data(), packed.size()).zstd);
  EXPECT_EQ(wire::decode(packed.data(), packed.size()).indices, idx);
  // Random fp32 values do not compress: the stage is skipped.
  auto g = test::random_grad(64, 1);
  std::vector<uint32_t> few = {1, 5, 9, 13};
  std::vector<uint8_t> random_payload;
  wire::encode({numel, few.data(), g.data(), 4, DType::kFloat32}, 1, {IndexCoding::kAuto, 19},
               random_payload);
  EXPECT_FALSE(wire::parse_header(random_payload.data(), random_payload.size()).zstd);
}

TEST(Wire, CompressorToAccumulate) {
  DgcOptions o;
  o.sparsity = 0.99;
  o.value_dtype = DType::kFloat16;
  const size_t n = 100000;
  DgcCompressor dgc(n, o);
  auto g = test::random_grad(n, 8);
  const Selection& sel = dgc.step(g.data());
  std::vector<uint8_t> bytes = wire::encode(sel, 42, WireOptions());
  DecodedPayload p = wire::decode(bytes.data(), bytes.size());
  ASSERT_EQ(p.indices, sel.indices);
  ASSERT_EQ(p.values, sel.values);  // fp16-representable values survive exactly
  std::vector<float> sum(n, 1.0f);
  wire::accumulate(p, sum.data(), n, 0.5f);
  for (size_t j = 0; j < p.indices.size(); ++j)
    ASSERT_EQ(sum[p.indices[j]], 1.0f + 0.5f * sel.values[j]);
  EXPECT_THROW(wire::accumulate(p, sum.data(), n - 1, 1.0f), InvalidArgument);
}

TEST(Wire, EncoderRejectsBadInput) {
  std::vector<uint32_t> idx = {3, 3};
  std::vector<float> val = {1, 2};
  std::vector<uint8_t> out;
  EXPECT_THROW(wire::encode({10, idx.data(), val.data(), 2, DType::kFloat32}, 0, {}, out),
               InvalidArgument);
  idx = {3, 10};
  EXPECT_THROW(wire::encode({10, idx.data(), val.data(), 2, DType::kFloat32}, 0, {}, out),
               InvalidArgument);
}

TEST(Wire, EmptySelectionRoundTrips) {
  std::vector<uint8_t> out;
  wire::encode({0, nullptr, nullptr, 0, DType::kFloat32}, 7, {}, out);
  DecodedPayload p = wire::decode(out.data(), out.size());
  EXPECT_EQ(p.header.key, 7u);
  EXPECT_TRUE(p.indices.empty());
}

}  // namespace
}  // namespace gradex::compress
