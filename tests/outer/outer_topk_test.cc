// DiLoCo's top-k pseudo-gradient codec (GRADEX_OUTER_BITS=topk): the error-feedback invariant
// element by element and bit for bit, the selection, payload validation, and, with real ranks over
// UCX, density 1 top-k against a dense fp32 average of the same pseudo-gradients (bit-exact).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "base/error.h"
#include "outer/outer.h"
#include "process_ranks.h"
#include "rank_checks.h"

using namespace gradex::test;
using gradex::outer::TopkCodec;

namespace {

uint32_t bits_of(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}

TEST(OuterTopk, ErrorFeedbackInvariantIsExact) {
  const size_t n = 1003;
  TopkCodec codec(0.05, n, 7, gradex::compress::WireOptions{});
  ASSERT_EQ(codec.k(), 51u);  // ceil(0.05 * 1003)
  std::vector<uint8_t> payload;
  for (int round = 0; round < 20; ++round) {
    std::vector<float> delta = test_vector(11, 0, round, n);
    if (round == 3) delta[5] = 0.0f;  // a zero stays unsent
    const std::vector<float> old = codec.residual();
    ASSERT_EQ(codec.encode(delta.data(), payload), 0u);
    std::vector<float> sent(n, 0.0f);
    codec.decode_add(payload.data(), payload.size(), sent.data());
    size_t count = 0;
    float min_sent = std::numeric_limits<float>::infinity(), max_kept = 0.0f;
    for (size_t i = 0; i < n; ++i) {
      const float v = old[i] + delta[i];
      const float kept = codec.residual()[i];
      // Exactly one of sent / kept is the element, the other +0.
      ASSERT_EQ(bits_of(sent[i] + kept), bits_of(v)) << "round " << round << " element " << i;
      ASSERT_TRUE(sent[i] == 0.0f || kept == 0.0f) << "element " << i << " both sent and kept";
      if (sent[i] != 0.0f) {
        ++count;
        min_sent = std::min(min_sent, std::fabs(sent[i]));
      } else {
        max_kept = std::max(max_kept, std::fabs(kept));
      }
    }
    EXPECT_EQ(count, codec.k()) << "round " << round;
    EXPECT_GE(min_sent, max_kept) << "round " << round << ": a larger entry stayed behind";
  }
}

TEST(OuterTopk, NonFiniteEntriesAreCountedAndDropped) {
  TopkCodec codec(1.0, 4, 0, gradex::compress::WireOptions{});
  std::vector<float> delta{1.0f, std::numeric_limits<float>::quiet_NaN(),
                           std::numeric_limits<float>::infinity(), -2.0f};
  std::vector<uint8_t> payload;
  EXPECT_EQ(codec.encode(delta.data(), payload), 2u);
  std::vector<float> sent(4, 0.0f);
  codec.decode_add(payload.data(), payload.size(), sent.data());
  EXPECT_EQ(sent, (std::vector<float>{1.0f, 0.0f, 0.0f, -2.0f}));
  EXPECT_EQ(codec.residual(), std::vector<float>(4, 0.0f));
}

TEST(OuterTopk, ForeignOrCorruptPayloadsAreRejected) {
  TopkCodec a(0.5, 10, 1, {}), b(0.5, 10, 2, {}), c(0.5, 11, 1, {});
  std::vector<float> delta = test_vector(3, 0, 0, 11), acc(11, 0.0f);
  std::vector<uint8_t> payload;
  a.encode(delta.data(), payload);
  EXPECT_THROW(b.decode_add(payload.data(), payload.size(), acc.data()), gradex::MismatchError);
  EXPECT_THROW(c.decode_add(payload.data(), payload.size(), acc.data()), gradex::MismatchError);
  payload.back() ^= 1;
  EXPECT_THROW(a.decode_add(payload.data(), payload.size(), acc.data()), gradex::CorruptPayload);
  EXPECT_THROW(TopkCodec(0.0, 10, 0, {}), gradex::ConfigError);
  EXPECT_THROW(TopkCodec(1.5, 10, 0, {}), gradex::ConfigError);
}

// Density 1 sends every non-zero entry of delta, so with lr 1 and no momentum each sync must give
// exactly theta_global - (0 + d_0 + d_1 + d_2) / 3 with d_q = theta_global - theta_local_q: the
// dense fp32 average of the pseudo-gradients in rank order.
TEST(OuterTopk, DensityOneEqualsDenseFp32AveragingOfDeltas) {
  const int world = 3;
  auto results = run_ranks(
      world,
      {"GRADEX_OUTER_PERIOD=2", "GRADEX_OUTER_LR=1", "GRADEX_OUTER_MOMENTUM=0",
       "GRADEX_OUTER_BITS=topk", "GRADEX_OUTER_DENSITY=1", "GRADEX_TIMEOUT_S=30"},
      [&](RankContext& ctx) -> std::string {
        gradex_outer_t* outer = nullptr;
        RANK_OK(create_outer(ctx.rank, world, &outer));
        std::vector<float> w = test_vector(21, ctx.rank, 0, 777);
        RANK_OK(gradex_outer_add_tensor(outer, "w", w.data(), w.size(), 0));
        RANK_OK(gradex_outer_start(outer));
        std::vector<float> global = w;  // rank 0's values, broadcast by start
        std::vector<std::vector<float>> local(world, global);
        for (int step = 1; step <= 8; ++step) {
          for (int q = 0; q < world; ++q)
            for (size_t i = 0; i < w.size(); ++i)
              local[q][i] -= 0.1f * (local[q][i] - 0.3f * static_cast<float>(q) +
                                     0.05f * test_value(5, q, step, i));
          w = local[ctx.rank];
          int merged = 0;
          RANK_OK(gradex_outer_step(outer, &merged));
          RANK_REQUIRE(merged == (step % 2 == 0 ? 1 : 0), "step " << step << " merged " << merged);
          if (!merged) continue;
          for (size_t i = 0; i < w.size(); ++i) {
            float s = 0.0f;
            for (int q = 0; q < world; ++q)
              s += global[i] - local[q][i];
            global[i] = global[i] - 1.0f * (s / static_cast<float>(world));
          }
          for (int q = 0; q < world; ++q)
            local[q] = global;
          RANK_REQUIRE(std::memcmp(w.data(), global.data(), 4 * w.size()) == 0,
                       "step " << step << ": the model differs from dense fp32 averaging");
          std::vector<float> g(w.size());
          RANK_OK(gradex_outer_global(outer, "w", g.data(), g.size()));
          RANK_REQUIRE(std::memcmp(g.data(), global.data(), 4 * g.size()) == 0,
                       "step " << step << ": the global copy differs from dense fp32 averaging");
        }
        RANK_OK(gradex_outer_destroy(outer));
        return "";
      },
      std::chrono::seconds(120), false);
  EXPECT_EQ(failures(results), "");
}

}  // namespace
