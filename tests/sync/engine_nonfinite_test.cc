// Non-finite gradients: a NaN/Inf on one rank is known to every rank (a flag in negotiation) before
// any state changes, so every rank treats the tensor the same way: no rank changes its momentum or
// residual, GRADEX_NONFINITE applies everywhere, and ranks stay identical afterwards.
#include <gtest/gtest.h>

#include <stdlib.h>

#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>

#include "capi/engine_access.h"
#include "process_ranks.h"
#include "rank_checks.h"

using namespace gradex::test;

namespace {

const float kInf = std::numeric_limits<float>::infinity();
const float kNaN = std::numeric_limits<float>::quiet_NaN();

void append_file(const std::string& path, const std::vector<float>& v) {
  std::ofstream f(path, std::ios::binary | std::ios::app);
  f.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size() * 4));
}

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

struct Snapshot {
  std::vector<float> u, v;
  bool operator==(const Snapshot& o) const {
    // Bitwise: memcmp-like equality of the float patterns.
    return u.size() == o.u.size() && v.size() == o.v.size() &&
           std::equal(u.begin(), u.end(), o.u.begin(),
                      [](float a, float b) { return std::memcmp(&a, &b, 4) == 0; }) &&
           std::equal(v.begin(), v.end(), o.v.begin(),
                      [](float a, float b) { return std::memcmp(&a, &b, 4) == 0; });
  }
};

Snapshot snapshot(gradex_engine_t* engine, const std::string& key) {
  auto& e = gradex::capi::engine_of(engine);
  return {e.momentum_of(key), e.residual_of(key)};
}

}  // namespace

// Rank 1 submits an Inf in a DGC tensor and a NaN in a dense one at step 2. Every rank's average of
// both is NaN (a GradScaler skips the step everywhere), every rank's state of both is as before the
// step, the untouched tensor is exchanged normally, and every later result is identical on every
// rank. Run once with the DGC tensor on sparse steps, once in its dense warm-up.
TEST(EngineNonFinite, OneRanksInfIsSeenByEveryRankAndChangesNoState) {
  for (const char* warmup : {"0", "400"}) {
    const int world = 4;
    const uint64_t big = 30000, small = 500;
    const ScratchDir scratch("nonfinite");
    const std::string& dir = scratch.path();
    auto results = run_ranks(
        world,
        {"GRADEX_SPARSITY=0.99", "GRADEX_DENSE_THRESHOLD=1000", "GRADEX_MOMENTUM=0.9",
         "GRADEX_FP16=0", std::string("GRADEX_WARMUP_STEPS=") + warmup},
        [&](RankContext& ctx) -> std::string {
          for (auto [key, n] :
               {std::pair<const char*, uint64_t>{"dgc", big}, {"bias", small}, {"other", small}})
            RANK_OK(gradex_register_tensor(ctx.engine, key, n, GRADEX_FLOAT32, GRADEX_DEVICE_CPU));
          Snapshot dgc_before, bias_before;
          for (int step = 0; step < 6; ++step) {
            std::vector<float> d = test_vector(41, ctx.rank, step, big);
            std::vector<float> b = test_vector(42, ctx.rank, step, small);
            std::vector<float> o = test_vector(43, ctx.rank, step, small);
            const bool bad = step == 2;
            if (bad && ctx.rank == 1) {
              d[123] = kInf;
              b[7] = kNaN;
              b[8] = -kInf;
            }
            if (bad) {
              dgc_before = snapshot(ctx.engine, "dgc");
              bias_before = snapshot(ctx.engine, "bias");
            }
            gradex_handle_t hd, hb, ho;
            RANK_OK(gradex_submit(ctx.engine, "dgc", d.data(), &hd));
            RANK_OK(gradex_submit(ctx.engine, "bias", b.data(), &hb));
            RANK_OK(gradex_submit(ctx.engine, "other", o.data(), &ho));
            RANK_OK(gradex_wait(ctx.engine, hd));
            RANK_OK(gradex_wait(ctx.engine, hb));
            RANK_OK(gradex_wait(ctx.engine, ho));
            RANK_OK(gradex_end_step(ctx.engine, nullptr));
            for (const auto* v : {&d, &b}) {
              size_t nan = 0;
              for (float x : *v)
                nan += std::isnan(x);
              RANK_REQUIRE(nan == (bad ? v->size() : 0),
                           "step " << step << ": " << nan << " NaN of " << v->size());
            }
            for (float x : o)
              RANK_REQUIRE(std::isfinite(x), "step " << step << ": unaffected tensor not finite");
            if (bad) {
              RANK_REQUIRE(snapshot(ctx.engine, "dgc") == dgc_before, "DGC state changed");
              RANK_REQUIRE(snapshot(ctx.engine, "bias") == bias_before, "momentum changed");
              RANK_REQUIRE(!bias_before.u.empty() && !dgc_before.u.empty(), "no momentum kept");
            }
            const std::string file = dir + "/rank" + std::to_string(ctx.rank);
            append_file(file, d);
            append_file(file, b);
            append_file(file, o);
          }
          // Identical states too: each rank's momentum and residual into the file.
          for (const char* key : {"dgc", "bias"}) {
            Snapshot s = snapshot(ctx.engine, key);
            RANK_REQUIRE(s.u.size() > 0, "momentum of " << key);
            for (float x : s.u)
              RANK_REQUIRE(std::isfinite(x), "momentum of " << key << " poisoned");
            for (float x : s.v)
              RANK_REQUIRE(std::isfinite(x), "residual of " << key << " poisoned");
          }
          gradex_stats_t s;
          RANK_OK(gradex_get_stats(ctx.engine, 0, &s));
          RANK_REQUIRE(s.nonfinite == (ctx.rank == 1 ? 3u : 0u), "nonfinite count " << s.nonfinite);
          return "";
        });
    ASSERT_EQ(failures(results), "") << "GRADEX_WARMUP_STEPS=" << warmup;
    // Every rank received bit-identical results at every step (NaN patterns included).
    const std::string first = read_file(dir + "/rank0");
    ASSERT_EQ(first.size(), 6 * (big + 2 * small) * 4);
    for (int r = 1; r < world; ++r)
      EXPECT_TRUE(read_file(dir + "/rank" + std::to_string(r)) == first)
          << "rank " << r << " received other results than rank 0";
  }
}

TEST(EngineNonFinite, ErrorPolicyFailsEveryRankNamingTheRanks) {
  auto results = run_ranks(
      3, {"GRADEX_NONFINITE=error", "GRADEX_SPARSITY=0.99", "GRADEX_DENSE_THRESHOLD=1000"},
      [&](RankContext& ctx) -> std::string {
        RANK_OK(gradex_register_tensor(ctx.engine, "w", 20000, GRADEX_FLOAT32, GRADEX_DEVICE_CPU));
        for (int step = 0; step < 3; ++step) {
          std::vector<float> g = test_vector(5, ctx.rank, step, 20000);
          if (step == 1 && ctx.rank == 2) g[0] = kNaN;
          Snapshot before = snapshot(ctx.engine, "w");
          gradex_handle_t h;
          RANK_OK(gradex_submit(ctx.engine, "w", g.data(), &h));
          gradex_status_t st = gradex_wait(ctx.engine, h);
          if (step != 1) {
            RANK_REQUIRE(st == GRADEX_OK, "step " << step << ": " << gradex_last_error());
            continue;
          }
          std::string msg = gradex_last_error();
          RANK_REQUIRE(st == GRADEX_ERR_INVALID_ARGUMENT, "status " << st << ": " << msg);
          RANK_REQUIRE(msg.find("'w'") != std::string::npos &&
                           msg.find("ranks [2]") != std::string::npos &&
                           msg.find("GRADEX_NONFINITE=error") != std::string::npos,
                       msg);
          RANK_REQUIRE(snapshot(ctx.engine, "w") == before, "state changed on a failed step");
        }
        return "";
      });
  EXPECT_EQ(failures(results), "");
}

// zero: the rank with the Inf sends 0 in its place; every rank proceeds normally.
TEST(EngineNonFinite, ZeroPolicyReplacesOnlyTheBadValues) {
  const uint64_t n = 1000;
  auto results = run_ranks(
      3, {"GRADEX_NONFINITE=zero", "GRADEX_SPARSITY=0", "GRADEX_FP16=0", "GRADEX_MOMENTUM=0"},
      [&](RankContext& ctx) -> std::string {
        RANK_OK(gradex_register_tensor(ctx.engine, "b", n, GRADEX_FLOAT32, GRADEX_DEVICE_CPU));
        std::vector<float> g = test_vector(8, ctx.rank, 0, n);
        if (ctx.rank == 1) g[5] = kInf;
        gradex_handle_t h;
        RANK_OK(gradex_submit(ctx.engine, "b", g.data(), &h));
        RANK_OK(gradex_wait(ctx.engine, h));
        for (uint64_t i = 0; i < n; ++i) {
          float sum = 0;
          for (int r = 0; r < 3; ++r)
            sum += (r == 1 && i == 5) ? 0.0f : test_value(8, r, 0, i);
          RANK_REQUIRE(g[i] == sum / 3.0f, "element " << i << ": " << g[i]);
        }
        return "";
      });
  EXPECT_EQ(failures(results), "");
}
