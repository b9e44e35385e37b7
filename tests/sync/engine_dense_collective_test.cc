// GRADEX_DENSE_COLLECTIVE: the direct allreduce (two message latencies; between two ranks one swap)
// gives every dense bucket the ring's bits, so the engine may choose either at any step: fp32 and
// 16-bit wires, with gradex's momentum, 2, 3 and 4 ranks. Each tensor is its own bucket
// (GRADEX_FUSION_MB=0): with more than two ranks a fused bucket's segments depend on which tensors
// a round happened to hold, so only unfused results are comparable across runs (comm/'s tests cover
// any buffer). gather: dense gradients ride the round's DGC gather (sync/data/gather_rider.h): the
// average on every rank, the same bits everywhere, the DGC tensor's results unchanged, and the
// allgather's bytes.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>
#include <tuple>
#include <vector>

#include "process_ranks.h"
#include "rank_checks.h"
#include "typed_tensors.h"

using namespace gradex::test;

namespace {

// Runs 4 steps of three dense tensors; every rank writes the digest of every average it received
// to `out_prefix`<rank>.
std::string run_dense(RankContext& ctx, const std::string& out_prefix) {
  const std::vector<std::pair<const char*, size_t>> tensors = {
      {"a.weight", 5000}, {"a.bias", 37}, {"b.weight", 70001}};
  for (const auto& [key, n] : tensors)
    RANK_OK(gradex_register_tensor(ctx.engine, key, n, GRADEX_FLOAT32, GRADEX_DEVICE_CPU));
  Digest d;
  double worst = 0;
  for (int step = 0; step < 4; ++step) {
    std::vector<std::vector<float>> g;
    std::vector<gradex_handle_t> h(tensors.size());
    for (size_t i = 0; i < tensors.size(); ++i)
      g.push_back(test_vector(40 + i, ctx.rank, step, tensors[i].second));
    for (size_t i = 0; i < tensors.size(); ++i)
      RANK_OK(gradex_submit(ctx.engine, tensors[i].first, g[i].data(), &h[i]));
    for (size_t i = 0; i < tensors.size(); ++i) {
      RANK_OK(gradex_wait(ctx.engine, h[i]));
      d.add(g[i].data(), g[i].size() * 4);
    }
    RANK_OK(gradex_end_step(ctx.engine, nullptr));
    if (step == 0) {  // no momentum yet: the plain average, to the wire's rounding
      for (size_t i = 0; i < tensors.size(); ++i)
        for (size_t j = 0; j < tensors[i].second; ++j) {
          double want = 0;
          for (int r = 0; r < ctx.world; ++r)
            want += test_value(40 + i, r, 0, j);
          worst = std::max(worst, std::fabs(g[i][j] - want / ctx.world));
        }
      RANK_REQUIRE(worst < 2e-3, "step 0 differs from the average by " << worst);
    }
  }
  std::ofstream(out_prefix + std::to_string(ctx.rank)) << d.h;
  return "";
}

std::string read(const std::string& path) {
  std::ifstream in(path);
  std::string s;
  in >> s;
  return s;
}

}  // namespace

TEST(EngineDenseCollective, DirectAllreduceGivesTheRingsBits) {
  const ScratchDir scratch("dense-collective");
  const std::string& dir = scratch.path();
  for (int world : {2, 3, 4}) {
    for (const char* fp16 : {"0", "1"}) {
      std::vector<std::string> digests[2];
      int which = 0;
      for (const char* collective : {"ring", "direct"}) {
        const std::string prefix =
            dir + "/" + collective + "-" + fp16 + "-" + std::to_string(world) + "-";
        auto results = run_ranks(
            world,
            {"GRADEX_SPARSITY=0", std::string("GRADEX_FP16=") + fp16, "GRADEX_MOMENTUM=0.9",
             "GRADEX_FUSION_MB=0", std::string("GRADEX_DENSE_COLLECTIVE=") + collective},
            [&](RankContext& ctx) { return run_dense(ctx, prefix); });
        ASSERT_EQ(failures(results), "") << collective;
        for (int r = 0; r < world; ++r)
          digests[which].push_back(read(prefix + std::to_string(r)));
        ++which;
      }
      EXPECT_EQ(digests[0], digests[1]) << world << " ranks, GRADEX_FP16=" << fp16;
      for (int r = 1; r < world; ++r)  // the average is the same bits on every rank
        EXPECT_EQ(digests[1][static_cast<size_t>(r)], digests[1][0]);
    }
  }
}

namespace {

// The Thrust-on-OpenMP backend's run is left out of ThreadSanitizer builds (scripts/tsan.sh):
// libgomp is not instrumented, so its barriers look like races between its threads.
#if defined(__SANITIZE_THREAD__)
constexpr bool kRunThrust = false;
#else
constexpr bool kRunThrust = true;
#endif

// Steps of run_mixed. Riding needs a step whose negotiation round found the three tensors ready
// together, which the submissions race the progress thread for; under ThreadSanitizer's slowdown 3
// steps sometimes had none (a timing artefact), so enough steps that some step does.
constexpr int kMixedSteps = 10;

// One DGC tensor and two small dense ones (GRADEX_DENSE_THRESHOLD) submitted together, kMixedSteps
// steps. Writes the digest of the dense averages, of the DGC tensor's and this rank's bytes sent.
std::string run_mixed(RankContext& ctx, const std::string& out_prefix, double tolerance) {
  const std::vector<std::pair<const char*, size_t>> tensors = {
      {"big.weight", 60000}, {"a.bias", 37}, {"b.weight", 5000}};
  for (const auto& [key, n] : tensors)
    RANK_OK(gradex_register_tensor(ctx.engine, key, n, GRADEX_FLOAT32, GRADEX_DEVICE_CPU));
  Digest dense, sparse;
  for (int step = 0; step < kMixedSteps; ++step) {
    std::vector<std::vector<float>> g;
    std::vector<gradex_handle_t> h(tensors.size());
    for (size_t i = 0; i < tensors.size(); ++i)
      g.push_back(test_vector(70 + i, ctx.rank, step, tensors[i].second));
    for (size_t i = 0; i < tensors.size(); ++i)
      RANK_OK(gradex_submit(ctx.engine, tensors[i].first, g[i].data(), &h[i]));
    for (size_t i = 0; i < tensors.size(); ++i) {
      RANK_OK(gradex_wait(ctx.engine, h[i]));
      (i == 0 ? sparse : dense).add(g[i].data(), g[i].size() * 4);
    }
    RANK_OK(gradex_end_step(ctx.engine, nullptr));
    for (size_t i = 1; i < tensors.size(); ++i) {  // no momentum: the plain average
      double worst = 0;
      for (size_t j = 0; j < tensors[i].second; ++j) {
        double want = 0;
        for (int r = 0; r < ctx.world; ++r)
          want += test_value(70 + i, r, step, j);
        worst = std::max(worst, std::fabs(g[i][j] - want / ctx.world));
      }
      RANK_REQUIRE(worst < tolerance, tensors[i].first << " at step " << step
                                                       << " differs from the average by " << worst);
    }
  }
  gradex_stats_t stats;
  RANK_OK(gradex_get_stats(ctx.engine, 0, &stats));
  std::ofstream(out_prefix + std::to_string(ctx.rank))
      << dense.h << " " << sparse.h << " " << stats.bytes_sent;
  return "";
}

}  // namespace

// One case per world size and wire type (ctest runs them side by side: together, 12 runs of ranks
// took 48 s, the longest case of the suite).
class EngineDenseRiders : public ::testing::TestWithParam<std::tuple<int, const char*>> {};

TEST_P(EngineDenseRiders, DenseGradientsRideTheDgcGather) {
  const ScratchDir scratch("dense-riders");
  const std::string& dir = scratch.path();
  const int world = std::get<0>(GetParam());
  const char* fp16 = std::get<1>(GetParam());
  {
    {
      struct Run {
        std::vector<std::string> dense, sparse;
        std::vector<uint64_t> sent;
      } runs[3];
      int which = 0;
      // The last run takes the riders' staging and stream order through the CUDA backend's code
      // (Thrust on OpenMP).
      const std::pair<const char*, const char*> variants[] = {
          {"ring", "cpu"}, {"gather", "cpu"}, {"gather", "thrust-omp"}};
      for (const auto& [collective, backend] : variants) {
        if (!kRunThrust && std::string(backend) == "thrust-omp") break;  // the last variant
        const std::string prefix =
            dir + "/" + collective + "-" + backend + "-" + fp16 + "-" + std::to_string(world) + "-";
        auto results =
            run_ranks(world,
                      {"GRADEX_POLICY=fixed", "GRADEX_SPARSITY=0.99", "GRADEX_WARMUP_STEPS=0",
                       "GRADEX_DENSE_THRESHOLD=10000", "GRADEX_MOMENTUM=0",
                       std::string("GRADEX_FP16=") + fp16, std::string("GRADEX_BACKEND=") + backend,
                       std::string("GRADEX_DENSE_COLLECTIVE=") + collective},
                      [&](RankContext& ctx) {
                        return run_mixed(ctx, prefix, std::string(fp16) == "1" ? 2e-3 : 1e-6);
                      });
        ASSERT_EQ(failures(results), "") << collective;
        for (int r = 0; r < world; ++r) {
          std::ifstream in(prefix + std::to_string(r));
          std::string d, sp;
          uint64_t sent = 0;
          in >> d >> sp >> sent;
          runs[which].dense.push_back(d);
          runs[which].sparse.push_back(sp);
          runs[which].sent.push_back(sent);
        }
        ++which;
      }
      const std::string what = std::to_string(world) + " ranks, GRADEX_FP16=" + fp16;
      for (int r = 1; r < world; ++r) {  // the riders' average: the same bits on every rank
        EXPECT_EQ(runs[1].dense[static_cast<size_t>(r)], runs[1].dense[0]) << what;
        EXPECT_EQ(runs[1].sparse[static_cast<size_t>(r)], runs[1].sparse[0]) << what;
      }
      EXPECT_EQ(runs[1].sparse, runs[0].sparse) << what << ": riding changed the DGC tensor";
      for (int r = 1; r < world && kRunThrust; ++r)  // on the Thrust backend too
        EXPECT_EQ(runs[2].dense[static_cast<size_t>(r)], runs[2].dense[0]) << what << ", thrust";
      // Riding, a rank sends its dense values to each of the P-1 others (plus a bitmap and
      // framing) where the ring sends 2(P-1)/P of them, in each step whose negotiation round
      // made the three tensors ready together (the submissions race the progress thread: at
      // least one of the kMixedSteps steps, all ranks alike) of 5037 values.
      const double wire = 5037.0 * (std::string(fp16) == "1" ? 2 : 4);
      const double extra = wire * ((world - 1) - 2.0 * (world - 1) / world);
      for (int k = 1; k <= (kRunThrust ? 2 : 1); ++k)
        for (int r = 0; r < world; ++r) {
          const double got = static_cast<double>(runs[k].sent[static_cast<size_t>(r)]) -
                             static_cast<double>(runs[0].sent[static_cast<size_t>(r)]);
          EXPECT_GE(got, 0.95 * extra) << what << ", run " << k << ", rank " << r;
          EXPECT_LE(got, kMixedSteps * (1.1 * extra + 700.0 * (world - 1)))
              << what << ", run " << k << ", rank " << r;
        }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(WorldAndWire, EngineDenseRiders,
                         ::testing::Combine(::testing::Values(3, 4), ::testing::Values("0", "1")),
                         [](const ::testing::TestParamInfo<EngineDenseRiders::ParamType>& info) {
                           return std::to_string(std::get<0>(info.param)) + "ranks_" +
                                  (std::string(std::get<1>(info.param)) == "1" ? "fp16" : "fp32");
                         });
