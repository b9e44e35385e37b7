// GRADEX_SPARSE_COLLECTIVE: the ring, the direct allgatherv (two rounds, or one round trip with
// GRADEX_ALLGATHER_INLINE_KB) and auto's choice deliver bit-identical averages (every rank decodes
// the same payloads in rank order either way), on every rank.
#include <gtest/gtest.h>

#include <cstring>

#include "process_ranks.h"
#include "rank_checks.h"

using namespace gradex::test;

namespace {

// FNV-1a over the bytes of every average a rank received, as "digest:<hex>".
std::vector<std::string> run_digests(const std::string& collective,
                                     const std::string& inline_kb = "64") {
  const int world = 4;
  const uint64_t n = 60000, small = 3000;
  return run_ranks(
      world,
      {"GRADEX_SPARSE_COLLECTIVE=" + collective, "GRADEX_SPARSITY=0.99", "GRADEX_FP16=1",
       "GRADEX_DENSE_THRESHOLD=10000", "GRADEX_RING_CHUNK_KB=4",
       "GRADEX_ALLGATHER_INLINE_KB=" + inline_kb},
      [&](RankContext& ctx) -> std::string {
        RANK_OK(gradex_register_tensor(ctx.engine, "a", n, GRADEX_FLOAT32, GRADEX_DEVICE_CPU));
        RANK_OK(gradex_register_tensor(ctx.engine, "b", n / 3, GRADEX_FLOAT32, GRADEX_DEVICE_CPU));
        RANK_OK(gradex_register_tensor(ctx.engine, "c", small, GRADEX_FLOAT32, GRADEX_DEVICE_CPU));
        uint64_t h = 1469598103934665603ull;
        for (int step = 0; step < 4; ++step) {
          std::vector<float> a = test_vector(5, ctx.rank, step, n);
          std::vector<float> b = test_vector(6, ctx.rank, step, n / 3);
          std::vector<float> c = test_vector(7, ctx.rank, step, small);
          gradex_handle_t ha, hb, hc;
          RANK_OK(gradex_submit(ctx.engine, "a", a.data(), &ha));
          RANK_OK(gradex_submit(ctx.engine, "b", b.data(), &hb));
          RANK_OK(gradex_submit(ctx.engine, "c", c.data(), &hc));
          RANK_OK(gradex_wait(ctx.engine, ha));
          RANK_OK(gradex_wait(ctx.engine, hb));
          RANK_OK(gradex_wait(ctx.engine, hc));
          for (const auto* v : {&a, &b, &c}) {
            const auto* p = reinterpret_cast<const uint8_t*>(v->data());
            for (size_t i = 0; i < v->size() * 4; ++i)
              h = (h ^ p[i]) * 1099511628211ull;
          }
          RANK_OK(gradex_end_step(ctx.engine, nullptr));
        }
        gradex_stats_t s;
        RANK_OK(gradex_get_stats(ctx.engine, 0, &s));
        RANK_REQUIRE(s.sparse_exchanges > 0, "no sparse exchange happened");
        char text[40];
        std::snprintf(text, sizeof text, "digest:%016llx", static_cast<unsigned long long>(h));
        return text;
      });
}

}  // namespace

// A rank's report is "rank R: digest:<hex>" (run_ranks prefixes the rank); "" if none came.
std::string digest_of(const std::string& report) {
  const size_t at = report.find("digest:");
  return at == std::string::npos ? "" : report.substr(at);
}

TEST(EngineSparseCollective, RingAndDirectAreBitIdentical) {
  std::vector<std::string> ring = run_digests("ring");
  std::vector<std::string> direct = run_digests("direct");
  ASSERT_EQ(ring.size(), 4u);
  ASSERT_EQ(direct.size(), 4u);
  for (size_t r = 0; r < ring.size(); ++r) {
    ASSERT_NE(digest_of(ring[r]), "") << "ring: " << ring[r];
    ASSERT_NE(digest_of(direct[r]), "") << "direct: " << direct[r];
    EXPECT_EQ(digest_of(ring[r]), digest_of(ring[0])) << "ranks disagree (ring)";
    EXPECT_EQ(digest_of(direct[r]), digest_of(ring[r])) << "rank " << r;
  }
}

// The one-round path (payloads of a few KB under the 64 KiB default), the two-round direct path
// (GRADEX_ALLGATHER_INLINE_KB=0: sizes first, then payloads), auto with every payload
// above a 1 KiB maximum (the model's direct-or-ring choice) and the ring: the same bits.
TEST(EngineSparseCollective, OneRoundTwoRoundAndAutoAreBitIdentical) {
  const std::vector<std::string> ring = run_digests("ring");
  for (const auto& [collective, inline_kb] : std::vector<std::pair<std::string, std::string>>{
           {"direct", "0"}, {"auto", "64"}, {"auto", "1"}, {"auto", "0"}}) {
    std::vector<std::string> got = run_digests(collective, inline_kb);
    ASSERT_EQ(got.size(), 4u);
    for (size_t r = 0; r < got.size(); ++r) {
      ASSERT_NE(digest_of(got[r]), "") << collective << "/" << inline_kb << ": " << got[r];
      EXPECT_EQ(digest_of(got[r]), digest_of(ring[r]))
          << collective << " with GRADEX_ALLGATHER_INLINE_KB=" << inline_kb << ", rank " << r;
    }
  }
}
