// The engine's results pinned bit for bit: digests of what two ranks see in short training runs
// (averages, DGC residuals, momenta, the saved state), recorded from the classic host path
// (SparseCodec, sync/momentum.cc, the dense bucket) that the one host path through the CPU backend
// replaced, and required of it. Each scenario covers what the classic path
// did on its own: dense fp32/fp16/bf16 tensors on fp16, bf16 and fp32 wires, with and without
// momentum and clipping; DGC tensors (fp32 and 16-bit) in dense warm-up and sparse steps, a NaN
// step; LocalSGD's local steps, first average and later delta averages.
//
// Two ranks make every result independent of how tensors fall into rounds and fusion buckets (a
// sum of two values is the same whichever comes first), so the digests are deterministic.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "backend_runs.h"
#include "base/half.h"
#include "capi/engine_access.h"
#include "process_ranks.h"
#include "rank_checks.h"
#include "typed_tensors.h"

using namespace gradex::test;

namespace {

// A tensor's gradient for (rank, step) in its own dtype.
std::vector<uint8_t> gradient(const Spec& s, int index, int rank, int step) {
  std::vector<float> f = test_vector(300 + index, rank, step, s.n);
  for (float& x : f)
    x *= 3.0f;
  return dtype_bytes(f, s.dtype);
}

struct Scenario {
  const char* name;
  std::vector<std::string> env;
  std::vector<Spec> tensors;
  int steps;
  int nan_step;  // rank 1's first tensor holds a NaN in this step (-1: never)
  bool localsgd;
  uint64_t golden[2];  // per rank
};

std::string run_scenario(RankContext& ctx, const Scenario& sc, const std::string& out_file) {
  for (const Spec& s : sc.tensors)
    RANK_OK(gradex_register_tensor(ctx.engine, s.key, s.n, s.dtype, GRADEX_DEVICE_CPU));
  auto& engine = gradex::capi::engine_of(ctx.engine);
  Digest d;
  const size_t count = sc.tensors.size();
  std::vector<std::vector<uint8_t>> params(count);
  for (size_t i = 0; i < count; ++i)
    params[i] = gradient(sc.tensors[i], 900 + static_cast<int>(i), ctx.rank, 0);
  for (int step = 0; step < sc.steps; ++step) {
    std::vector<std::vector<uint8_t>> g(count);
    double sq = 0;
    for (size_t i = 0; i < count; ++i) {
      g[i] = gradient(sc.tensors[i], static_cast<int>(i), ctx.rank, step);
      if (sc.tensors[i].dtype == GRADEX_FLOAT32) {
        const float* f = reinterpret_cast<const float*>(g[i].data());
        for (uint64_t k = 0; k < sc.tensors[i].n; ++k)
          sq += static_cast<double>(f[k]) * f[k];
      }
    }
    if (step == sc.nan_step && ctx.rank == 1) {
      const float nan = std::numeric_limits<float>::quiet_NaN();
      if (sc.tensors[0].dtype == GRADEX_FLOAT32)
        std::memcpy(g[0].data() + 4 * 5, &nan, 4);
      else
        std::memset(g[0].data() + 2 * 5, 0xff, 2);
    }
    RANK_OK(gradex_set_gradient_norm(ctx.engine, std::sqrt(sq)));
    std::vector<gradex_handle_t> h(count);
    for (size_t k = 0; k < count; ++k) {
      const size_t i = (k + static_cast<size_t>(ctx.rank)) % count;
      RANK_OK(gradex_submit(ctx.engine, sc.tensors[i].key, g[i].data(), &h[i]));
    }
    for (size_t i = 0; i < count; ++i) {
      RANK_OK(gradex_wait(ctx.engine, h[i]));
      d.add(g[i].data(), g[i].size());
    }
    int average = 0;
    RANK_OK(gradex_end_step(ctx.engine, &average));
    if (sc.localsgd) {
      // Parameters move by the (local or averaged) gradient, in their own dtype's bits.
      for (size_t i = 0; i < count; ++i)
        for (size_t b = 0; b < params[i].size(); b += 2)
          params[i][b] ^= g[i][b] & 0x1u;
      if (average) {
        for (size_t i = 0; i < count; ++i)
          RANK_OK(gradex_average(ctx.engine, sc.tensors[i].key, params[i].data(), &h[i]));
        for (size_t i = 0; i < count; ++i) {
          RANK_OK(gradex_wait(ctx.engine, h[i]));
          d.add(params[i].data(), params[i].size());
        }
      }
    }
  }
  for (const Spec& s : sc.tensors) {
    const std::vector<float> v = engine.residual_of(s.key);
    const std::vector<float> u = engine.momentum_of(s.key);
    d.add(v.data(), v.size() * 4);
    d.add(u.data(), u.size() * 4);
  }
  size_t size = 0;
  RANK_OK(gradex_save_state(ctx.engine, nullptr, 0, &size));
  std::vector<uint8_t> saved(size);
  RANK_OK(gradex_save_state(ctx.engine, saved.data(), saved.size(), &size));
  d.add(saved.data(), saved.size());
  // A restored engine continues from the saved state.
  RANK_OK(gradex_load_state(ctx.engine, saved.data(), saved.size()));
  std::vector<uint8_t> again = gradient(sc.tensors[0], 77, ctx.rank, 0);
  gradex_handle_t h0;
  RANK_OK(gradex_submit(ctx.engine, sc.tensors[0].key, again.data(), &h0));
  RANK_OK(gradex_wait(ctx.engine, h0));
  d.add(again.data(), again.size());
  std::ofstream(out_file) << d.h;
  return "";
}

const std::vector<std::string> kBase = {"GRADEX_TIMEOUT_S=60", "GRADEX_CLIP_NORM=40"};

std::vector<std::string> with(std::vector<std::string> extra) {
  std::vector<std::string> env = kBase;
  // The digests were recorded when gradex owned momentum 0.9 by default: keep that unless a
  // scenario says otherwise.
  bool momentum_given = false;
  for (const std::string& e : extra)
    momentum_given |= e.rfind("GRADEX_MOMENTUM=", 0) == 0;
  if (!momentum_given) env.push_back("GRADEX_MOMENTUM=0.9");
  env.insert(env.end(), extra.begin(), extra.end());
  return env;
}

const std::vector<Spec> kDense = {{"a.fp32", 3000, GRADEX_FLOAT32},
                                  {"b.fp16", 2000, GRADEX_FLOAT16},
                                  {"c.bf16", 2500, GRADEX_BFLOAT16},
                                  {"d.fp32", 700, GRADEX_FLOAT32}};
// DGC tensors (DENSE_THRESHOLD=1000; one large enough for the pool's parallel passes) and one
// dense one.
const std::vector<Spec> kDgc = {{"w.fp32", 30000, GRADEX_FLOAT32},
                                {"x.fp16", 20000, GRADEX_FLOAT16},
                                {"y.bf16", 12000, GRADEX_BFLOAT16},
                                {"z.small", 500, GRADEX_FLOAT32},
                                {"big.fp32", 600000, GRADEX_FLOAT32}};

std::vector<Scenario> scenarios() {
  return {
      {"dense_fp16_wire",
       with({"GRADEX_FP16=1"}),
       kDense,
       4,
       2,
       false,
       {0x95e3aaed37655b86ull, 0x484a9474e34a426full}},
      {"dense_bf16_wire_nesterov",
       with({"GRADEX_FP16=1", "GRADEX_HALF_TYPE=bf16", "GRADEX_NESTEROV=1"}),
       kDense,
       4,
       -1,
       false,
       {0x9e6353c2aa5414b6ull, 0x0aedaf13ad11206bull}},
      {"dense_fp32_wire",
       with({"GRADEX_FP16=0"}),
       kDense,
       4,
       -1,
       false,
       {0x1358d8d3462d39b5ull, 0xf64b2200d5eb2e9cull}},
      {"dense_no_momentum",
       with({"GRADEX_FP16=1", "GRADEX_MOMENTUM=0", "GRADEX_CLIP_NORM=0"}),
       kDense,
       3,
       -1,
       false,
       {0xb04dd01a288da21dull, 0xcf572201e8c44310ull}},
      {"dgc_warmup_and_sparse",
       with({"GRADEX_DENSE_THRESHOLD=1000", "GRADEX_SPARSITY=0.99", "GRADEX_WARMUP_STEPS=3"}),
       kDgc,
       7,
       5,
       false,
       {0x36d1066856d8b92bull, 0x59b5b91d950dc090ull}},
      {"dgc_fp32_wire_zero",
       with({"GRADEX_DENSE_THRESHOLD=1000", "GRADEX_SPARSITY=0.95", "GRADEX_WARMUP_STEPS=2",
             "GRADEX_FP16=0", "GRADEX_NONFINITE=zero", "GRADEX_MOMENTUM=0"}),
       kDgc,
       5,
       3,
       false,
       {0x660458f2a2b0ce49ull, 0xdfd12448665b6e6dull}},
      {"localsgd",
       with({"GRADEX_DENSE_THRESHOLD=1000", "GRADEX_SPARSITY=0.99", "GRADEX_LOCALSGD_PERIOD=2",
             "GRADEX_LOCALSGD_WARMUP_STEPS=2"}),
       kDgc,
       7,
       -1,
       true,
       {0x367407e75380362bull, 0xacda66ed47dc84afull}},
  };
}

}  // namespace

TEST(EngineGolden, ResultsAreThoseOfTheClassicHostPath) {
  const ScratchDir dir("golden");
  std::string report;
  bool all_match = true;
  for (const Scenario& sc : scenarios()) {
    auto results = run_ranks(
        2, sc.env,
        [&](RankContext& ctx) {
          return run_scenario(ctx, sc, dir.file(sc.name, "digest", ctx.rank));
        },
        std::chrono::seconds(200));
    ASSERT_EQ(failures(results), "") << sc.name;
    report += std::string("      {\"") + sc.name + "\", ";
    for (int r = 0; r < 2; ++r) {
      std::ifstream in(dir.file(sc.name, "digest", r));
      uint64_t got = 0;
      in >> got;
      char hex[32];
      std::snprintf(hex, sizeof hex, "0x%016llxull", static_cast<unsigned long long>(got));
      report += std::string(r ? ", " : "{") + hex;
      if (got != sc.golden[r]) all_match = false;
    }
    report += "}},\n";
  }
  EXPECT_TRUE(all_match) << "digests (scenario, {rank 0, rank 1}):\n" << report;
}
