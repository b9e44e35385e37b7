// Riders' payloads (sync/data/gather_rider.h): every element travels, the average sums the ranks in
// order with the dense route's scaling, 16-bit saturation is counted, and a payload that is not
// this tensor's full payload is a CorruptPayload naming the rank.
#include "sync/data/gather_rider.h"

#include <gtest/gtest.h>

#include <limits>
#include <string>
#include <vector>

#include "base/error.h"

namespace gradex::sync::rider {
namespace {

using compress::wire::PayloadSpan;

std::vector<PayloadSpan> spans(const std::vector<std::vector<uint8_t>>& messages) {
  std::vector<PayloadSpan> out;
  for (const auto& m : messages)
    out.emplace_back(m.data(), m.size());
  return out;
}

TEST(GatherRider, Fp32AverageSumsEveryRankInOrder) {
  const int P = 3;
  const uint64_t n = 1000;
  std::vector<std::vector<uint8_t>> messages(P);
  std::vector<std::vector<float>> x(P, std::vector<float>(n));
  for (int r = 0; r < P; ++r) {
    for (uint64_t i = 0; i < n; ++i)
      x[r][i] = static_cast<float>(i % 17) * 0.25f - static_cast<float>(r) * 1.5f;
    messages[r].push_back(0xAB);  // appended after what the message already holds
    EXPECT_EQ(encode(x[r].data(), n, "w", DType::kFloat32, P, messages[r]), 0u);
    messages[r].erase(messages[r].begin());
  }
  std::vector<float> out(n, 42.0f);
  EXPECT_FALSE(average(spans(messages), "w", n, DType::kFloat32, out.data()));
  for (uint64_t i = 0; i < n; ++i) {
    float want = 0;
    for (int r = 0; r < P; ++r)
      want += (1.0f / P) * x[r][i];
    EXPECT_NEAR(out[i], want, 1e-6f) << i;
  }
}

TEST(GatherRider, SixteenBitWireDividesBeforeTheCastAndCountsSaturation) {
  const int P = 2;
  std::vector<float> x = {1.0f, -3.0f, 200000.0f, 0.5f};  // 200000 / 2 saturates fp16
  std::vector<std::vector<uint8_t>> messages(P);
  EXPECT_EQ(encode(x.data(), x.size(), "h", DType::kFloat16, P, messages[0]), 1u);
  EXPECT_EQ(encode(x.data(), x.size(), "h", DType::kFloat16, P, messages[1]), 1u);
  std::vector<float> out(x.size());
  EXPECT_FALSE(average(spans(messages), "h", x.size(), DType::kFloat16, out.data()));
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], -3.0f);
  EXPECT_EQ(out[2], 2 * 65504.0f);
  EXPECT_EQ(out[3], 0.5f);
  // bf16 keeps the range: nothing saturates.
  std::vector<uint8_t> bf;
  EXPECT_EQ(encode(x.data(), x.size(), "h", DType::kBFloat16, P, bf), 0u);
}

TEST(GatherRider, NonFiniteAveragesAreReported) {
  std::vector<float> x = {1.0f, 3e38f};
  std::vector<std::vector<uint8_t>> messages(2);
  for (auto& m : messages)
    encode(x.data(), x.size(), "k", DType::kFloat32, 1, m);  // sums past fp32's range
  std::vector<float> out(2);
  // weight 1/2 each: 1.5e38 + 1.5e38 = 3e38, finite; with three ranks' weight it would not be.
  EXPECT_FALSE(average(spans(messages), "k", 2, DType::kFloat32, out.data()));
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> y = {inf, 0.0f};
  encode(y.data(), y.size(), "k", DType::kFloat32, 1, messages[1] = {});
  EXPECT_TRUE(average(spans(messages), "k", 2, DType::kFloat32, out.data()));
}

TEST(GatherRider, PayloadsThatAreNotThisTensorsFullValuesAreCorrupt) {
  std::vector<float> x(64, 1.0f);
  std::vector<std::vector<uint8_t>> messages(2);
  encode(x.data(), x.size(), "mine", DType::kFloat32, 2, messages[0]);
  encode(x.data(), x.size(), "other", DType::kFloat32, 2, messages[1]);
  std::vector<float> out(64);
  auto message_of = [&](uint64_t n, DType wire) {
    try {
      average(spans(messages), "mine", n, wire, out.data());
    } catch (const CorruptPayload& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(message_of(64, DType::kFloat32).find("'mine' from rank 1"), std::string::npos);
  EXPECT_NE(message_of(64, DType::kFloat32).find("another tensor's key"), std::string::npos);
  messages[1].clear();
  encode(x.data(), 32, "mine", DType::kFloat32, 2, messages[1]);  // 32 of 64 values
  EXPECT_NE(message_of(64, DType::kFloat32).find("expected all 64 values"), std::string::npos);
  messages[1].clear();
  encode(x.data(), x.size(), "mine", DType::kFloat16, 2, messages[1]);  // another wire type
  EXPECT_NE(message_of(64, DType::kFloat32).find("as fp16"), std::string::npos);
  messages[1].resize(messages[1].size() - 3);  // truncated
  EXPECT_NE(message_of(64, DType::kFloat32).find("from rank 1"), std::string::npos);
}

}  // namespace
}  // namespace gradex::sync::rider
