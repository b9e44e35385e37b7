// The engine over each host backend (GRADEX_BACKEND=cpu and thrust-omp): exactly the code CUDA
// tensors run, minus the copies. A restored engine continues as the saving one (results,
// residuals); the Thrust-on-OpenMP backend must agree with the CPU backend bit for bit wherever
// the maths is the same (dense tensors: momentum, clipping, 16-bit casts, fusion; DGC's dense
// warm-up step) and keep DGC's error feedback exact otherwise; every rank must see the same
// averages on every backend. (The CPU backend's results equal the classic host path's it
// replaced: tests/sync/engine_golden_test.cc.) CTest label `backend`.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "backend_runs.h"
#include "capi/engine_access.h"
#include "process_ranks.h"
#include "rank_checks.h"

using namespace gradex::test;

namespace {

struct TensorSpec {
  const char* key;
  uint64_t n;
  bool dgc;
};
// Two DGC tensors (one by override) and three dense ones. GRADEX_FUSION_MB=0.005 keeps every dense
// tensor in a bucket of its own: which tensors share a round depends on timing, and a fused
// bucket's layout changes the ring's summation order, so only unfused runs can be compared bit for
// bit across backends (the backends' gather of many entries is tested in compress/backend).
const TensorSpec kTensors[] = {{"fc.weight", 40000, true},
                               {"fc.bias", 300, false},
                               {"conv.weight", 9000, false},
                               {"emb.weight", 20000, true},
                               {"bn.weight", 3000, false}};
constexpr int kTensorCount = 5;
constexpr int kSteps = 7;
constexpr int kNanStep = 4;  // rank 1's fc.weight and fc.bias hold Inf/NaN in this step
const std::vector<std::string> kTrainEnv = {
    "GRADEX_SPARSITY=0.99",   "GRADEX_WARMUP_STEPS=3", "GRADEX_SPARSITY_OVERRIDES=emb:0.95",
    "GRADEX_FUSION_MB=0.005", "GRADEX_CLIP_NORM=20",   "GRADEX_TIMEOUT_S=60",
    "GRADEX_MOMENTUM=0.9"};

uint64_t floats_per_step() {
  uint64_t n = 0;
  for (const TensorSpec& t : kTensors)
    n += t.n;
  return n;
}

// One training step: every tensor submitted (in a rank-dependent order), clipped by the step's
// norm, its average appended to `file`.
std::string train_step(RankContext& ctx, int step, const std::string& file) {
  std::vector<std::vector<float>> g(kTensorCount);
  double sq = 0;
  for (int i = 0; i < kTensorCount; ++i) {
    g[i] = test_vector(100 + i, ctx.rank, step, kTensors[i].n);
    for (float x : g[i])
      sq += static_cast<double>(x) * x;
  }
  if (step == kNanStep && ctx.rank == 1) {
    g[0][7] = std::numeric_limits<float>::infinity();
    g[1][3] = std::numeric_limits<float>::quiet_NaN();
  }
  RANK_OK(gradex_set_gradient_norm(ctx.engine, std::sqrt(sq)));
  gradex_handle_t h[kTensorCount];
  for (int k = 0; k < kTensorCount; ++k) {
    const int i = (k + ctx.rank) % kTensorCount;
    RANK_OK(gradex_submit(ctx.engine, kTensors[i].key, g[i].data(), &h[i]));
  }
  for (int i = 0; i < kTensorCount; ++i) {
    RANK_OK(gradex_wait(ctx.engine, h[i]));
    append_floats(file, g[i]);
  }
  RANK_OK(gradex_end_step(ctx.engine, nullptr));
  return "";
}

std::string train(RankContext& ctx, const std::string& backend, const ScratchDir& dir) {
  for (const TensorSpec& t : kTensors)
    RANK_OK(gradex_register_tensor(ctx.engine, t.key, t.n, GRADEX_FLOAT32, GRADEX_DEVICE_CPU));
  auto& engine = gradex::capi::engine_of(ctx.engine);
  for (const TensorSpec& t : kTensors)
    RANK_REQUIRE(gradex::sync::is_sparse(engine.applied_policy(t.key).rung.codec) == t.dgc,
                 t.key << " has the wrong policy");
  for (int step = 0; step < kSteps; ++step) {
    std::string err = train_step(ctx, step, dir.file(backend, "out", ctx.rank));
    if (!err.empty()) return "step " + std::to_string(step) + ": " + err;
  }
  const std::string state_file = dir.file(backend, "state", ctx.rank);
  for (const TensorSpec& t : kTensors) {
    append_floats(state_file, engine.residual_of(t.key));
    append_floats(state_file, engine.momentum_of(t.key));
  }
  size_t size = 0;
  RANK_OK(gradex_save_state(ctx.engine, nullptr, 0, &size));
  std::vector<uint8_t> saved(size);
  RANK_OK(gradex_save_state(ctx.engine, saved.data(), saved.size(), &size));
  append_bytes(dir.file(backend, "blob", ctx.rank), saved.data(), saved.size());
  // A restored engine continues exactly as the one that saved (same two steps twice).
  for (int step = kSteps; step < kSteps + 2; ++step)
    if (std::string err = train_step(ctx, step, dir.file(backend, "resume_a", ctx.rank));
        !err.empty())
      return err;
  RANK_OK(gradex_load_state(ctx.engine, saved.data(), saved.size()));
  for (const TensorSpec& t : kTensors) {
    std::vector<float> r = engine.residual_of(t.key);
    append_floats(dir.file(backend, "restored", ctx.rank), r);
  }
  for (int step = kSteps; step < kSteps + 2; ++step)
    if (std::string err = train_step(ctx, step, dir.file(backend, "resume_b", ctx.rank));
        !err.empty())
      return err;
  uint64_t staged = 1;
  RANK_OK(gradex_get_staged_bytes(ctx.engine, 0, &staged));
  RANK_REQUIRE(staged == 0, "host backends stage nothing, " << staged << " bytes reported");
  return "";
}

// Compares per step and tensor; `all` selects whether tensor i of step s must match.
template <class Select>
std::string compare_steps(const std::vector<float>& a, const std::vector<float>& b, int steps,
                          Select select) {
  const uint64_t per_step = floats_per_step();
  if (a.size() != b.size() || a.size() != per_step * steps)
    return "sizes " + std::to_string(a.size()) + " / " + std::to_string(b.size());
  uint64_t at = 0;
  for (int s = 0; s < steps; ++s) {
    for (int i = 0; i < kTensorCount; ++i) {
      const uint64_t n = kTensors[i].n;
      if (select(s, i)) {
        std::vector<float> x(a.begin() + at, a.begin() + at + n);
        std::vector<float> y(b.begin() + at, b.begin() + at + n);
        int64_t d = first_difference(x, y);
        if (d >= 0)
          return std::string("step ") + std::to_string(s) + " tensor " + kTensors[i].key +
                 " element " + std::to_string(d) + ": " + std::to_string(x[d]) + " vs " +
                 std::to_string(y[d]);
      }
      at += n;
    }
  }
  return "";
}

}  // namespace

TEST(EngineBackend, BackendsAgreeAndRestore) {
  const int world = 3;
  const ScratchDir dir("backend");
  const std::vector<std::string> backends = engine_backends();
  for (const std::string& backend : backends) {
    std::vector<std::string> env = kTrainEnv;
    env.push_back("GRADEX_BACKEND=" + backend);
    auto results = run_ranks(
        world, env, [&](RankContext& ctx) { return train(ctx, backend, dir); },
        std::chrono::seconds(400));
    ASSERT_EQ(failures(results), "") << "GRADEX_BACKEND=" << backend;
  }
  auto all = [](int, int) { return true; };
  for (const std::string& backend : backends)
    for (const char* kind : {"out", "state", "resume_a", "resume_b", "restored", "blob"})
      for (int r = 0; r < world; ++r)
        ASSERT_FALSE(read_bytes(dir.file(backend, kind, r)).empty()) << backend << " " << kind;
  for (const std::string& backend : backends) {
    // Every rank received the same averages (the NaN step included).
    const auto out0 = read_floats(dir.file(backend, "out", 0));
    for (int r = 1; r < world; ++r)
      EXPECT_EQ(compare_steps(out0, read_floats(dir.file(backend, "out", r)), kSteps, all), "")
          << backend << ": rank " << r << " differs from rank 0";
    for (int r = 0; r < world; ++r) {
      // Restoring gave back the saved residuals (state file: per tensor v then u for DGC
      // tensors, u for dense ones).
      const std::vector<float> saved_state = read_floats(dir.file(backend, "state", r));
      std::vector<float> residuals;
      size_t at = 0;
      for (const TensorSpec& t : kTensors) {
        if (t.dgc && at + t.n <= saved_state.size())
          residuals.insert(residuals.end(), saved_state.begin() + at,
                           saved_state.begin() + at + t.n);
        at += t.dgc ? 2 * t.n : t.n;
      }
      EXPECT_EQ(at, saved_state.size()) << backend;
      EXPECT_EQ(first_difference(residuals, read_floats(dir.file(backend, "restored", r))), -1)
          << backend << ": restored residuals differ from the saved ones (rank " << r << ")";
      if (backend != "thrust-omp") {
        EXPECT_EQ(first_difference(read_floats(dir.file(backend, "resume_a", r)),
                                   read_floats(dir.file(backend, "resume_b", r))),
                  -1)
            << backend << ": a restored engine does not continue as the saving one (rank " << r
            << ")";
      }
      // thrust-omp restores no threshold history: its dense tensors still continue exactly.
      EXPECT_EQ(compare_steps(read_floats(dir.file(backend, "resume_a", r)),
                              read_floats(dir.file(backend, "resume_b", r)), 2,
                              [](int, int i) { return !kTensors[i].dgc; }),
                "")
          << backend << " rank " << r;
    }
  }
  if (backends.size() < 2) GTEST_SKIP() << "no thrust-omp backend in this build";
  // Thrust on OpenMP: dense tensors bit for bit at every step; DGC tensors in their dense warm-up
  // step (0) and the skipped NaN step.
  for (int r = 0; r < world; ++r)
    EXPECT_EQ(compare_steps(read_floats(dir.file("cpu", "out", r)),
                            read_floats(dir.file("thrust-omp", "out", r)), kSteps,
                            [](int s, int i) {
                              return !kTensors[i].dgc || s == 0 || (s == kNanStep && i == 0);
                            }),
              "")
        << "thrust-omp vs cpu, rank " << r;
}
