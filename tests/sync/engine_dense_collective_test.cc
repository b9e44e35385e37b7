// GRADEX_DENSE_COLLECTIVE: the direct allreduce (two message latencies) gives every dense bucket
// the ring's bits, so the engine may choose either at any step: fp32 and 16-bit wires, with
// gradex's momentum, 3 and 4 ranks. Each tensor is its own bucket (GRADEX_FUSION_MB=0): with more
// than two ranks a fused bucket's segments depend on which tensors a round happened to hold, so
// only unfused results are comparable across runs (comm/'s tests cover any buffer).
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <string>
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
  char dir_template[] = "/tmp/gradex-dense-collective-XXXXXX";
  const std::string dir = mkdtemp(dir_template);
  for (int world : {3, 4}) {
    for (const char* fp16 : {"0", "1"}) {
      std::vector<std::string> digests[2];
      int which = 0;
      for (const char* collective : {"ring", "direct"}) {
        const std::string prefix = dir + "/" + collective + "-" + fp16 + "-" +
                                   std::to_string(world) + "-";
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
