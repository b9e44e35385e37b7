// Absent contributions (gradex_submit_absent, gx.join): a rank that has run out of data still takes
// part in every exchange, contributing exact zeros, with its momentum and DGC residual untouched.
// The reference is the same job in which that rank instead restores a fresh state (u = v = 0) and
// submits zeros: from a fresh state a zero gradient sends zeros and keeps u and v at zero, so every
// other rank must see bit-identical exchanges in both jobs.
#include <gtest/gtest.h>

#include <stdlib.h>

#include <cstring>
#include <fstream>
#include <limits>

#include "capi/engine_access.h"
#include "compress/half/cast.h"
#include "process_ranks.h"
#include "rank_checks.h"
#include "sync/engine/engine.h"

using namespace gradex::test;

namespace {

constexpr int kWorld = 3;
constexpr int kAbsentRank = 2;
constexpr int kSteps = 8;
constexpr int kAbsentFrom = 2;  // rank 2 is absent from this step on
constexpr size_t kDense = 3000;
constexpr size_t kDgc = 20000;
const char* const kKeys[] = {"dense32", "dense16", "dgc"};

// DGC above 10,000 elements; momentum everywhere; warm-up: with 3 ranks the DGC tensor's steps 0-3
// are dense steps (density 0.25) and steps 4+ sparse, so the absent phase covers both.
const std::vector<std::string> kEnv = {"GRADEX_SPARSITY=0.99", "GRADEX_DENSE_THRESHOLD=10000",
                                       "GRADEX_WARMUP_STEPS=16", "GRADEX_MOMENTUM=0.9",
                                       "GRADEX_FP16=1"};

void append_file(const std::string& path, const void* data, size_t bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::app);
  f.write(static_cast<const char*>(data), static_cast<std::streamsize>(bytes));
}

struct Snapshot {
  std::vector<float> u, v;
  bool operator==(const Snapshot& o) const {
    return u.size() == o.u.size() && v.size() == o.v.size() &&
           std::memcmp(u.data(), o.u.data(), u.size() * 4) == 0 &&
           std::memcmp(v.data(), o.v.data(), v.size() * 4) == 0;
  }
};

Snapshot snapshot(gradex_engine_t* engine, const std::string& key) {
  auto& e = gradex::capi::engine_of(engine);
  return {e.momentum_of(key), e.residual_of(key)};
}

enum class Mode {
  kAbsent,     // rank 2 submits absent contributions (its buffers hold NaN: never read)
  kFreshZeros  // the reference: rank 2 restores a fresh state and submits zeros
};

// Every rank writes each step's three results to dir/rank<r>.
std::string run_rank(RankContext& ctx, Mode mode, const std::string& dir) {
  auto& engine = gradex::capi::engine_of(ctx.engine);
  RANK_OK(gradex_register_tensor(ctx.engine, "dense32", kDense, GRADEX_FLOAT32, GRADEX_DEVICE_CPU));
  RANK_OK(gradex_register_tensor(ctx.engine, "dense16", kDense, GRADEX_FLOAT16, GRADEX_DEVICE_CPU));
  RANK_OK(gradex_register_tensor(ctx.engine, "dgc", kDgc, GRADEX_FLOAT32, GRADEX_DEVICE_CPU));
  RANK_REQUIRE(gradex::sync::is_sparse(engine.applied_policy("dgc").rung.codec), "dgc policy");
  RANK_REQUIRE(!gradex::sync::is_sparse(engine.applied_policy("dense32").rung.codec), "policy");
  const std::vector<uint8_t> fresh = engine.save_state();
  std::vector<Snapshot> before(3);
  uint64_t absent_sparse = 0, absent_dense_dgc = 0;
  std::string state_changed;
  for (int step = 0; step < kSteps; ++step) {
    const bool gone = ctx.rank == kAbsentRank && step >= kAbsentFrom;
    if (gone && step == kAbsentFrom) {
      if (mode == Mode::kFreshZeros) engine.load_state(fresh.data(), fresh.size());
      for (int k = 0; k < 3; ++k)
        before[k] = snapshot(ctx.engine, kKeys[k]);
      RANK_REQUIRE(mode == Mode::kFreshZeros ||
                       (!before[0].u.empty() && !before[2].u.empty() && !before[2].v.empty()),
                   "no momentum or residual to keep");
    }
    std::vector<float> d32 = test_vector(11, ctx.rank, step, kDense);
    std::vector<float> d16f = test_vector(12, ctx.rank, step, kDense);
    std::vector<float> dgc = test_vector(13, ctx.rank, step, kDgc);
    std::vector<uint16_t> d16(kDense);
    gradex::compress::half::to_half(d16f.data(), d16.data(), kDense, gradex::DType::kFloat16, 1.0f);
    if (gone) {
      const float fill = mode == Mode::kAbsent ? std::numeric_limits<float>::quiet_NaN() : 0.0f;
      d32.assign(kDense, fill);
      dgc.assign(kDgc, fill);
      d16.assign(kDense, mode == Mode::kAbsent ? 0x7E00 : 0);  // fp16 NaN / zero
    }
    void* data[3] = {d32.data(), d16.data(), dgc.data()};
    // One tensor at a time: which tensors share a negotiation round (and so a fusion bucket, and
    // the ring's summation order) would otherwise depend on timing, and the two jobs compared
    // bitwise would differ in rounding.
    for (int k = 0; k < 3; ++k) {
      gradex_handle_t h;
      if (gone && mode == Mode::kAbsent)
        RANK_OK(gradex_submit_absent(ctx.engine, kKeys[k], data[k], &h));
      else
        RANK_OK(gradex_submit(ctx.engine, kKeys[k], data[k], &h));
      RANK_OK(gradex_wait(ctx.engine, h));
    }
    RANK_OK(gradex_end_step(ctx.engine, nullptr));
    gradex_stats_t s;
    RANK_OK(gradex_get_stats(ctx.engine, 1, &s));
    RANK_REQUIRE(s.nonfinite == 0, "step " << step << ": a NaN buffer was read");
    if (gone) {
      absent_sparse += s.sparse_exchanges;
      absent_dense_dgc += s.dense_fallbacks;
    }
    if (gone && mode == Mode::kAbsent) {
      // Noted, not returned: the other ranks need this one's remaining steps to finish theirs.
      for (int k = 0; k < 3; ++k)
        if (state_changed.empty() && !(snapshot(ctx.engine, kKeys[k]) == before[k]))
          state_changed = "step " + std::to_string(step) + ": the state of '" + kKeys[k] +
                          "' changed on the absent rank";
    }
    // The present ranks trained: the averages are not all zero.
    float largest = 0;
    for (float x : dgc)
      largest = std::max(largest, std::fabs(x));
    RANK_REQUIRE(largest > 0, "step " << step << ": DGC average all zero");
    const std::string file = dir + "/rank" + std::to_string(ctx.rank);
    append_file(file, d32.data(), d32.size() * 4);
    append_file(file, d16.data(), d16.size() * 2);
    append_file(file, dgc.data(), dgc.size() * 4);
  }
  RANK_REQUIRE(state_changed.empty(), state_changed);
  if (ctx.rank == kAbsentRank)
    RANK_REQUIRE(absent_sparse > 0 && absent_dense_dgc > 0,
                 "absent phase: " << absent_sparse << " sparse and " << absent_dense_dgc
                                  << " dense DGC exchanges (want both)");
  return "";
}

std::string run_job(Mode mode) {
  const ScratchDir scratch("absent");
  const std::string& dir = scratch.path();
  auto results =
      run_ranks(kWorld, kEnv, [&](RankContext& ctx) { return run_rank(ctx, mode, dir); });
  EXPECT_EQ(failures(results), "");
  const std::string first = read_text_file(dir + "/rank0");
  EXPECT_EQ(first.size(), kSteps * (kDense * 6 + kDgc * 4));
  for (int r = 1; r < kWorld; ++r)
    EXPECT_TRUE(read_text_file(dir + "/rank" + std::to_string(r)) == first)
        << "rank " << r << " received other results than rank 0";
  return first;
}

// Where two result files first differ: "step S, tensor 'K', element I".
std::string first_difference(const std::string& a, const std::string& b) {
  const size_t step_bytes = kDense * 6 + kDgc * 4;
  for (size_t at = 0; at < std::min(a.size(), b.size()); ++at) {
    if (a[at] == b[at]) continue;
    const size_t step = at / step_bytes, in = at % step_bytes;
    if (in < kDense * 4)
      return "step " + std::to_string(step) + ", 'dense32' element " + std::to_string(in / 4);
    if (in < kDense * 6)
      return "step " + std::to_string(step) + ", 'dense16' element " +
             std::to_string((in - kDense * 4) / 2);
    return "step " + std::to_string(step) + ", 'dgc' element " +
           std::to_string((in - kDense * 6) / 4);
  }
  return "sizes " + std::to_string(a.size()) + " vs " + std::to_string(b.size());
}

}  // namespace

TEST(EngineAbsent, AbsentRankContributesZerosAndKeepsItsState) {
  const std::string absent = run_job(Mode::kAbsent);
  const std::string reference = run_job(Mode::kFreshZeros);
  ASSERT_EQ(absent.size(), reference.size());
  EXPECT_TRUE(absent == reference)
      << "the absent job's averages differ from the job where the rank sent zeros from a fresh "
      << "state, first at " << first_difference(absent, reference);
}

// fp32 dense without momentum: the average is exactly the present ranks' sum over the world size.
TEST(EngineAbsent, DenseFp32IsThePresentRanksSum) {
  auto results = run_ranks(
      kWorld, {"GRADEX_SPARSITY=0", "GRADEX_FP16=0"}, [&](RankContext& ctx) -> std::string {
        RANK_OK(gradex_register_tensor(ctx.engine, "b", 999, GRADEX_FLOAT32, GRADEX_DEVICE_CPU));
        for (int step = 0; step < 3; ++step) {
          std::vector<float> g = test_vector(3, ctx.rank, step, 999);
          gradex_handle_t h;
          if (ctx.rank == kAbsentRank)
            RANK_OK(gradex_submit_absent(ctx.engine, "b", g.data(), &h));
          else
            RANK_OK(gradex_submit(ctx.engine, "b", g.data(), &h));
          RANK_OK(gradex_wait(ctx.engine, h));
          for (size_t i = 0; i < 999; ++i) {
            // Adding the absent rank's exact 0 changes no sum, whatever the ring's order.
            const float sum = test_value(3, 0, step, i) + test_value(3, 1, step, i);
            const float want = sum / 3.0f, want_scaled = sum * (1.0f / 3.0f);
            RANK_REQUIRE(g[i] == want || g[i] == want_scaled,
                         "step " << step << " element " << i << ": " << g[i] << " vs " << want);
          }
        }
        return "";
      });
  EXPECT_EQ(failures(results), "");
}

TEST(EngineAbsent, RefusedInLocalSgdLocalPhase) {
  auto results = run_ranks(
      2, {"GRADEX_LOCALSGD_PERIOD=2", "GRADEX_SPARSITY=0"}, [&](RankContext& ctx) -> std::string {
        RANK_OK(gradex_register_tensor(ctx.engine, "b", 10, GRADEX_FLOAT32, GRADEX_DEVICE_CPU));
        std::vector<float> g(10, 1.0f);
        gradex_handle_t h;
        RANK_REQUIRE(
            gradex_submit_absent(ctx.engine, "b", g.data(), &h) == GRADEX_ERR_INVALID_ARGUMENT,
            "absent in the local phase was accepted");
        RANK_REQUIRE(std::string(gradex_last_error()).find("LocalSGD") != std::string::npos,
                     gradex_last_error());
        return "";
      });
  EXPECT_EQ(failures(results), "");
}
