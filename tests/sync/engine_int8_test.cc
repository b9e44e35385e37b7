// The dense quantized route through the whole engine (forked ranks, real UCX, the C API): a
// 'pattern:int8' override gives bit-identical averages on every rank close to the fp32 average at
// gradex's momentum; a restored checkpoint continues exactly as the uninterrupted run; SGD on a
// quadratic ends within a tight tolerance of fp32; the 4-bit width ('pattern:int4') is
// bit-identical at about half of 8-bit's bytes, and a tensor moving between the widths loses
// nothing.
#include <gtest/gtest.h>

#include <stdlib.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>

#include "process_ranks.h"
#include "rank_checks.h"

using namespace gradex::test;

namespace {

// Every rank's averages of every step, gathered through a file per rank.
std::string run_steps(RankContext& ctx, const std::vector<std::string>& keys,
                      const std::vector<uint64_t>& sizes, int first, int steps,
                      std::vector<float>& record) {
  for (int s = first; s < first + steps; ++s) {
    std::vector<std::vector<float>> data(keys.size());
    std::vector<gradex_handle_t> h(keys.size());
    for (size_t t = 0; t < keys.size(); ++t) {
      data[t] = test_vector(5 + t, ctx.rank, s, sizes[t]);
      RANK_OK(gradex_submit(ctx.engine, keys[t].c_str(), data[t].data(), &h[t]));
    }
    for (size_t t = 0; t < keys.size(); ++t) {
      RANK_OK(gradex_wait(ctx.engine, h[t]));
      record.insert(record.end(), data[t].begin(), data[t].end());
    }
    RANK_OK(gradex_end_step(ctx.engine, nullptr));
  }
  return "";
}

void write_file(const std::string& path, const void* data, size_t size) {
  std::ofstream f(path, std::ios::binary);
  f.write(static_cast<const char*>(data), static_cast<std::streamsize>(size));
}
std::vector<char> read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<char>(std::istreambuf_iterator<char>(f), {});
}

// The engine's state, written to `path`.
std::string save_state_to(RankContext& ctx, const std::string& path) {
  size_t length = 0;
  RANK_OK(gradex_save_state(ctx.engine, nullptr, 0, &length));
  std::vector<char> state(length);
  RANK_OK(gradex_save_state(ctx.engine, state.data(), state.size(), &length));
  write_file(path, state.data(), length);
  return "";
}

// One step of tensor "w": `g` submitted, its average added into `delivered`.
std::string exchange_w(RankContext& ctx, std::vector<float> g, std::vector<float>& delivered) {
  gradex_handle_t h;
  RANK_OK(gradex_submit(ctx.engine, "w", g.data(), &h));
  RANK_OK(gradex_wait(ctx.engine, h));
  for (size_t i = 0; i < g.size(); ++i)
    delivered[i] += g[i];
  RANK_OK(gradex_end_step(ctx.engine, nullptr));
  return "";
}

}  // namespace

// Two to four ranks, several tensors fused into 8-bit buckets beside a 16-bit one: every rank holds
// the same bits, and the averages stay within a few quantization steps of the exact mean (momentum
// 0.9: what travels is u).
TEST(EngineInt8, BitIdenticalAcrossRanksAndCloseToTheMean) {
  for (int world : {2, 3, 4}) {
    const ScratchDir scratch("int8");
    const std::string& dir = scratch.path();
    const std::vector<std::string> keys = {"q.a", "q.b", "q.c", "dense"};
    const std::vector<uint64_t> sizes = {1, 1000, 70000, 5000};
    const int steps = 4;
    auto results = run_ranks(
        world,
        {"GRADEX_FP16=1", "GRADEX_SPARSITY=0", "GRADEX_SPARSITY_OVERRIDES=q.*:int8",
         "GRADEX_MOMENTUM=0.9", "GRADEX_FUSION_MB=0.1"},
        [&](RankContext& ctx) -> std::string {
          for (size_t t = 0; t < keys.size(); ++t)
            RANK_OK(gradex_register_tensor(ctx.engine, keys[t].c_str(), sizes[t], GRADEX_FLOAT32,
                                           GRADEX_DEVICE_CPU));
          std::vector<float> record;
          if (auto e = run_steps(ctx, keys, sizes, 0, steps, record); !e.empty()) return e;
          write_file(dir + "/r" + std::to_string(ctx.rank), record.data(), record.size() * 4);
          // The exact mean of u = sum of m^k g over every rank, per step, for the 8-bit tensors.
          size_t at = 0;
          std::vector<std::vector<float>> u(keys.size());
          for (int s = 0; s < steps; ++s)
            for (size_t t = 0; t < keys.size(); ++t) {
              u[t].resize(sizes[t], 0.0f);
              double worst = 0;
              for (uint64_t i = 0; i < sizes[t]; ++i) {
                double mean = 0;
                for (int r = 0; r < world; ++r) {
                  double ur = 0;
                  for (int k = 0; k <= s; ++k)
                    ur = 0.9 * ur + test_value(5 + t, r, k, i);
                  mean += ur;
                }
                mean /= world;
                worst = std::max(worst, std::fabs(record[at + i] - mean));
              }
              at += sizes[t];
              // test_vector values are within +-1; u within +-1/(1-0.9) = 10: an 8-bit step of a
              // block is at most 10/127, two quantizations and carried residuals a few of them.
              if (t < 3)
                RANK_REQUIRE(worst < 0.5, keys[t] << " step " << s << ": off by " << worst);
            }
          gradex_stats_t st;
          RANK_OK(gradex_get_stats(ctx.engine, 0, &st));
          RANK_REQUIRE(st.sparse_exchanges == 0, "nothing goes sparse");
          // gradex_explain names the route per tensor.
          const std::string text = explain_text(ctx.engine);
          RANK_REQUIRE(text.find("8-bit") != std::string::npos &&
                           text.find("override 'q.*': int8") != std::string::npos,
                       "explain: " << text);
          return "";
        },
        std::chrono::seconds(240));
    ASSERT_EQ(failures(results), "") << "world " << world;
    const std::vector<char> rank0 = read_file(dir + "/r0");
    ASSERT_FALSE(rank0.empty());
    for (int r = 1; r < world; ++r)
      EXPECT_TRUE(read_file(dir + "/r" + std::to_string(r)) == rank0)
          << "rank " << r << " of " << world << " differs from rank 0";
  }
}

// The residuals are part of the saved state: save after 3 steps, run 3 more; a fresh engine that
// loads the state and runs the same 3 steps gets the same bits.
TEST(EngineInt8, RestoredRunMatchesUninterruptedRun) {
  const ScratchDir scratch("int8");
  const std::string& dir = scratch.path();
  const std::vector<std::string> keys = {"w"};
  const std::vector<uint64_t> sizes = {30000};
  const std::vector<std::string> env = {"GRADEX_SPARSITY_OVERRIDES=w:int8", "GRADEX_MOMENTUM=0.9"};
  auto first = run_ranks(3, env, [&](RankContext& ctx) -> std::string {
    RANK_OK(gradex_register_tensor(ctx.engine, "w", sizes[0], GRADEX_FLOAT32, GRADEX_DEVICE_CPU));
    std::vector<float> record;
    if (auto e = run_steps(ctx, keys, sizes, 0, 3, record); !e.empty()) return e;
    // A quarter of fp32's ring bytes (1.03 bytes per element in both phases), plus negotiation.
    gradex_stats_t st;
    RANK_OK(gradex_get_stats(ctx.engine, 0, &st));
    const double fp32_ring = 3 * 2.0 * 2 / 3 * sizes[0] * 4;
    RANK_REQUIRE(st.bytes_sent > 0.25 * fp32_ring && st.bytes_sent < 0.3 * fp32_ring,
                 "8-bit bytes sent " << st.bytes_sent << " vs fp32 ring " << fp32_ring);
    if (auto e = save_state_to(ctx, dir + "/state" + std::to_string(ctx.rank)); !e.empty())
      return e;
    record.clear();
    if (auto e = run_steps(ctx, keys, sizes, 3, 3, record); !e.empty()) return e;
    write_file(dir + "/a" + std::to_string(ctx.rank), record.data(), record.size() * 4);
    return "";
  });
  ASSERT_EQ(failures(first), "");
  auto second = run_ranks(3, env, [&](RankContext& ctx) -> std::string {
    RANK_OK(gradex_register_tensor(ctx.engine, "w", sizes[0], GRADEX_FLOAT32, GRADEX_DEVICE_CPU));
    std::vector<char> state = read_file(dir + "/state" + std::to_string(ctx.rank));
    // A truncated state is refused and changes nothing.
    RANK_REQUIRE(gradex_load_state(ctx.engine, state.data(), state.size() - 4) != GRADEX_OK,
                 "a truncated state loaded");
    RANK_OK(gradex_load_state(ctx.engine, state.data(), state.size()));
    std::vector<float> record;
    if (auto e = run_steps(ctx, keys, sizes, 3, 3, record); !e.empty()) return e;
    write_file(dir + "/b" + std::to_string(ctx.rank), record.data(), record.size() * 4);
    return "";
  });
  ASSERT_EQ(failures(second), "");
  for (int r = 0; r < 3; ++r)
    EXPECT_TRUE(read_file(dir + "/a" + std::to_string(r)) ==
                read_file(dir + "/b" + std::to_string(r)))
        << "rank " << r << ": the restored run differs";
}

// Convergence sanity: data-parallel SGD on f(x) = 0.5 * sum a_i (x_i - c_i)^2 with per-rank noise,
// averaged by the engine in fp32 or on the 8-bit route; after 200 steps the 8-bit run's distance
// to the optimum is within 2% of fp32's and its iterate within 1e-2 (relative) of fp32's.
TEST(EngineInt8, QuadraticConvergesLikeFp32) {
  const ScratchDir scratch("int8");
  const std::string& dir = scratch.path();
  const uint64_t n = 20000;
  const int world = 3, steps = 200;
  for (const char* mode : {"fp32", "int8"}) {
    const std::string override = std::string("GRADEX_SPARSITY_OVERRIDES=x:") +
                                 (std::string(mode) == "int8" ? "int8" : "dense");
    auto results = run_ranks(
        world, {"GRADEX_FP16=0", override, "GRADEX_MOMENTUM=0"},
        [&](RankContext& ctx) -> std::string {
          RANK_OK(gradex_register_tensor(ctx.engine, "x", n, GRADEX_FLOAT32, GRADEX_DEVICE_CPU));
          std::vector<float> x(n, 0.0f), g(n);
          for (int s = 0; s < steps; ++s) {
            const std::vector<float> noise = test_vector(77, ctx.rank, s, n);
            for (uint64_t i = 0; i < n; ++i) {
              const float a = 0.5f + static_cast<float>(i % 7) * 0.25f;
              const float c = static_cast<float>(static_cast<int>(i % 11) - 5);
              g[i] = a * (x[i] - c) + 0.1f * noise[i];
            }
            gradex_handle_t h;
            RANK_OK(gradex_submit(ctx.engine, "x", g.data(), &h));
            RANK_OK(gradex_wait(ctx.engine, h));
            for (uint64_t i = 0; i < n; ++i)
              x[i] -= 0.1f * g[i];
            RANK_OK(gradex_end_step(ctx.engine, nullptr));
          }
          if (ctx.rank == 0) write_file(dir + "/" + mode, x.data(), x.size() * 4);
          return "";
        },
        std::chrono::seconds(240));
    ASSERT_EQ(failures(results), "") << mode;
  }
  const std::vector<char> a = read_file(dir + "/fp32"), b = read_file(dir + "/int8");
  ASSERT_EQ(a.size(), n * 4);
  ASSERT_EQ(b.size(), n * 4);
  const float* xf = reinterpret_cast<const float*>(a.data());
  const float* xq = reinterpret_cast<const float*>(b.data());
  double df = 0, dq = 0, diff = 0, norm = 0;
  for (uint64_t i = 0; i < n; ++i) {
    const double c = static_cast<double>(static_cast<int>(i % 11) - 5);
    df += (xf[i] - c) * (xf[i] - c);
    dq += (xq[i] - c) * (xq[i] - c);
    diff += (xf[i] - xq[i]) * (xf[i] - xq[i]);
    norm += xf[i] * xf[i];
  }
  std::printf("distance to the optimum: fp32 %.4e, int8 %.4e; relative iterate gap %.3e\n",
              std::sqrt(df), std::sqrt(dq), std::sqrt(diff / norm));
  EXPECT_LT(std::sqrt(dq), 1.02 * std::sqrt(df) + 1e-3);
  EXPECT_LT(std::sqrt(diff / norm), 1e-2);
}

// Accuracy at equal steps: softmax regression (10 classes, 256 features, labels from a noisy linear
// teacher) trained by data-parallel SGD (momentum 0.9, gradex's) on 3 ranks for 150 steps, the
// gradient averaged in fp32, 16-bit or 8-bit. The 8-bit run must end within 1 point of fp32's test
// accuracy.
TEST(EngineInt8, SoftmaxAccuracyMatchesDense) {
  const ScratchDir scratch("int8");
  const std::string& dir = scratch.path();
  constexpr int kClasses = 10, kFeatures = 256, kBatch = 32, kSteps = 150, kTest = 2000;
  const int world = 3;
  const uint64_t n = kClasses * (kFeatures + 1);
  auto feature = [](uint64_t seed, int sample, int f) {
    return test_value(seed, 0, sample, static_cast<uint64_t>(f));
  };
  // The teacher: class = argmax(T x + noise).
  auto label = [&](uint64_t seed, int sample) {
    int best = 0;
    float top = -1e30f;
    for (int c = 0; c < kClasses; ++c) {
      float z = 2.0f * test_value(9, 1, sample, static_cast<uint64_t>(c) + seed * 100);
      for (int f = 0; f < kFeatures; f += 1)
        z += test_value(7, 0, c, static_cast<uint64_t>(f)) * feature(seed, sample, f);
      if (z > top) top = z, best = c;
    }
    return best;
  };
  const std::vector<std::pair<std::string, std::vector<std::string>>> modes = {
      {"fp32", {"GRADEX_SPARSITY_OVERRIDES=w:dense", "GRADEX_FP16=0"}},
      {"16-bit", {"GRADEX_SPARSITY_OVERRIDES=w:dense", "GRADEX_FP16=1"}},
      {"8-bit", {"GRADEX_SPARSITY_OVERRIDES=w:int8"}}};
  for (const auto& [mode, env0] : modes) {
    std::vector<std::string> env = env0;
    env.push_back("GRADEX_MOMENTUM=0.9");
    auto results = run_ranks(
        world, env,
        [&, mode = mode](RankContext& ctx) -> std::string {
          RANK_OK(gradex_register_tensor(ctx.engine, "w", n, GRADEX_FLOAT32, GRADEX_DEVICE_CPU));
          std::vector<float> w(n, 0.0f), g(n);
          auto logits = [&](uint64_t seed, int sample, float* z) {
            for (int c = 0; c < kClasses; ++c) {
              float s = w[static_cast<size_t>(c) * (kFeatures + 1) + kFeatures];
              for (int f = 0; f < kFeatures; ++f)
                s += w[static_cast<size_t>(c) * (kFeatures + 1) + f] * feature(seed, sample, f);
              z[c] = s;
            }
          };
          for (int step = 0; step < kSteps; ++step) {
            std::fill(g.begin(), g.end(), 0.0f);
            for (int b = 0; b < kBatch; ++b) {
              const int sample = (step * world + ctx.rank) * kBatch + b;
              float z[kClasses], zmax = -1e30f, sum = 0;
              logits(1, sample, z);
              for (float v : z)
                zmax = std::max(zmax, v);
              for (float& v : z)
                sum += (v = std::exp(v - zmax));
              const int y = label(1, sample);
              for (int c = 0; c < kClasses; ++c) {
                const float d = (z[c] / sum - (c == y ? 1.0f : 0.0f)) / kBatch;
                float* row = g.data() + static_cast<size_t>(c) * (kFeatures + 1);
                for (int f = 0; f < kFeatures; ++f)
                  row[f] += d * feature(1, sample, f);
                row[kFeatures] += d;
              }
            }
            gradex_handle_t h;
            RANK_OK(gradex_submit(ctx.engine, "w", g.data(), &h));
            RANK_OK(gradex_wait(ctx.engine, h));
            for (uint64_t i = 0; i < n; ++i)
              w[i] -= 0.05f * g[i];  // gradex applied momentum 0.9 to the average
            RANK_OK(gradex_end_step(ctx.engine, nullptr));
          }
          int correct = 0;
          for (int s = 0; s < kTest; ++s) {
            float z[kClasses];
            logits(2, s, z);
            correct += std::max_element(z, z + kClasses) - z == label(2, s);
          }
          const double acc = 100.0 * correct / kTest;
          if (ctx.rank == 0) write_file(dir + "/" + mode, &acc, sizeof acc);
          return "";
        },
        std::chrono::seconds(300));
    ASSERT_EQ(failures(results), "") << mode;
  }
  auto acc = [&](const std::string& mode) {
    const std::vector<char> b = read_file(dir + "/" + mode);
    double a = -1;
    if (b.size() == sizeof a) std::memcpy(&a, b.data(), sizeof a);
    return a;
  };
  std::printf(
      "softmax regression, %d ranks, %d steps: test accuracy fp32 %.2f%%, 16-bit %.2f%%, "
      "8-bit %.2f%%\n",
      world, kSteps, acc("fp32"), acc("16-bit"), acc("8-bit"));
  EXPECT_GT(acc("fp32"), 40.0);  // it learned something (chance: 10%)
  EXPECT_GE(acc("8-bit"), acc("fp32") - 1.0);
}

// A tensor that leaves the 8-bit route takes its residuals along: a state saved on the route and
// restored where the tensor is plain dense fp32 flushes both residuals into the next exchange, so
// what the 8-bit steps delivered plus that flush is the exact average of everything submitted (to
// fp32 rounding), and the exchange after it sends nothing more.
TEST(EngineInt8, LeavingTheRouteFlushesTheResiduals) {
  const ScratchDir scratch("int8");
  const std::string& dir = scratch.path();
  const uint64_t n = 30000;
  const int world = 3, steps = 3;
  auto first = run_ranks(
      world, {"GRADEX_SPARSITY_OVERRIDES=w:int8", "GRADEX_MOMENTUM=0"},
      [&](RankContext& ctx) -> std::string {
        RANK_OK(gradex_register_tensor(ctx.engine, "w", n, GRADEX_FLOAT32, GRADEX_DEVICE_CPU));
        std::vector<float> delivered(n, 0.0f);
        for (int s = 0; s < steps; ++s)
          if (auto e = exchange_w(ctx, test_vector(31, ctx.rank, s, n), delivered); !e.empty())
            return e;
        if (auto e = save_state_to(ctx, dir + "/state" + std::to_string(ctx.rank)); !e.empty())
          return e;
        if (ctx.rank == 0) write_file(dir + "/delivered", delivered.data(), 4 * n);
        return "";
      });
  ASSERT_EQ(failures(first), "");
  auto second = run_ranks(
      world, {"GRADEX_SPARSITY=0", "GRADEX_FP16=0", "GRADEX_MOMENTUM=0"},
      [&](RankContext& ctx) -> std::string {
        RANK_OK(gradex_register_tensor(ctx.engine, "w", n, GRADEX_FLOAT32, GRADEX_DEVICE_CPU));
        std::vector<char> state = read_file(dir + "/state" + std::to_string(ctx.rank));
        RANK_OK(gradex_load_state(ctx.engine, state.data(), state.size()));
        std::vector<float> flush(n, 0.0f), after(n, 0.0f);
        for (std::vector<float>* v : {&flush, &after}) {
          gradex_handle_t h;
          RANK_OK(gradex_submit(ctx.engine, "w", v->data(), &h));
          RANK_OK(gradex_wait(ctx.engine, h));
          RANK_OK(gradex_end_step(ctx.engine, nullptr));
        }
        for (uint64_t i = 0; i < n; ++i)
          RANK_REQUIRE(after[i] == 0.0f, "residual sent twice at " << i << ": " << after[i]);
        std::vector<char> raw = read_file(dir + "/delivered");
        RANK_REQUIRE(raw.size() == 4 * n, "no delivered sums");
        const float* delivered = reinterpret_cast<const float*>(raw.data());
        double worst = 0, flushed = 0;
        for (uint64_t i = 0; i < n; ++i) {
          double exact = 0;
          for (int r = 0; r < world; ++r)
            for (int s = 0; s < steps; ++s)
              exact += test_value(31, r, s, i);
          exact /= world;
          worst = std::max(worst, std::fabs(delivered[i] + flush[i] - exact));
          flushed = std::max(flushed, static_cast<double>(std::fabs(flush[i])));
        }
        RANK_REQUIRE(flushed > 1e-4, "nothing was flushed (largest " << flushed << ")");
        RANK_REQUIRE(worst < 2e-6, "delivered + flushed is off the exact average by " << worst);
        return "";
      });
  ASSERT_EQ(failures(second), "");
}

// Residuals kept under one layout and restored under another lose nothing: 3 steps on the 4-bit
// route of a hierarchical job (2 emulated hosts x 2 ranks), its state restored into a flat job
// for 2 more steps and 6 of zeros (the owner residuals lie where the flat exchange does not read
// them, so they are folded into its first exchange: after the zeros nothing is left behind), then
// into plain dense fp32, which flushes the rest: what the 4-bit steps delivered plus the flush is
// the exact average of everything submitted.
TEST(EngineInt8, ResidualsSurviveALayoutChange) {
  const ScratchDir scratch("int8");
  const std::string& dir = scratch.path();
  const uint64_t n = 30000;
  const std::vector<std::string> hosts = {"hostA", "hostA", "hostB", "hostB"};
  const int world = 4;
  struct Phase {
    std::vector<std::string> env;
    int first, steps, drain;  // steps of gradients, then `drain` steps of zeros
  };
  const std::vector<Phase> phases = {
      {{"GRADEX_SPARSITY_OVERRIDES=w:int4", "GRADEX_HIERARCHICAL=1"}, 0, 3, 0},
      {{"GRADEX_SPARSITY_OVERRIDES=w:int4", "GRADEX_HIERARCHICAL=0"}, 3, 2, 6},
      {{"GRADEX_SPARSITY=0", "GRADEX_FP16=0", "GRADEX_HIERARCHICAL=0"}, 5, 0, 1}};
  for (size_t p = 0; p < phases.size(); ++p) {
    std::vector<std::string> env = phases[p].env;
    env.push_back("GRADEX_MOMENTUM=0");
    auto results = run_ranks(
        world, env,
        [&](RankContext& ctx) -> std::string {
          ::setenv("GRADEX_HOST_ID", hosts[static_cast<size_t>(ctx.rank)].c_str(), 1);
          std::string error;
          if (create_engine(ctx.rank, ctx.world, &ctx.engine, &error) != GRADEX_OK) return error;
          RANK_OK(gradex_register_tensor(ctx.engine, "w", n, GRADEX_FLOAT32, GRADEX_DEVICE_CPU));
          const std::string mine = dir + "/state" + std::to_string(ctx.rank);
          std::vector<float> delivered(n, 0.0f);
          if (p > 0) {
            std::vector<char> state = read_file(mine);
            RANK_OK(gradex_load_state(ctx.engine, state.data(), state.size()));
            std::vector<char> raw = read_file(dir + "/delivered");
            RANK_REQUIRE(raw.size() == 4 * n, "no delivered sums");
            std::memcpy(delivered.data(), raw.data(), 4 * n);
          }
          const bool flush = p + 1 == phases.size();
          const int gradients_end = phases[p].first + phases[p].steps;
          for (int s = phases[p].first; s < gradients_end + phases[p].drain; ++s) {
            std::vector<float> g =
                s < gradients_end ? test_vector(41, ctx.rank, s, n) : std::vector<float>(n, 0.0f);
            if (auto e = exchange_w(ctx, std::move(g), delivered); !e.empty()) return e;
          }
          auto off_by = [&] {
            double worst = 0;
            for (uint64_t i = 0; i < n; ++i) {
              double exact = 0;
              for (int r = 0; r < world; ++r)
                for (int s = 0; s < gradients_end; ++s)
                  exact += test_value(41, r, s, i);
              worst = std::max(worst, std::fabs(delivered[i] - exact / world));
            }
            return worst;
          };
          if (phases[p].drain > 0 && !flush) {
            // Zeros send what the residuals hold: the restored ones drain as the flat job's own.
            const double drained = off_by();
            RANK_REQUIRE(drained < 1e-4, "after the zeros, delivered is off the exact average by "
                                             << drained
                                             << " (residuals left where none reads them)");
          }
          if (!flush) {
            if (auto e = save_state_to(ctx, mine); !e.empty()) return e;
            if (ctx.rank == 0) write_file(dir + "/delivered", delivered.data(), 4 * n);
            return "";
          }
          const double worst = off_by();
          RANK_REQUIRE(worst < 4e-6, "delivered + flushed is off the exact average by " << worst);
          return "";
        },
        std::chrono::seconds(240), /*create_engine=*/false);
    ASSERT_EQ(failures(results), "") << "phase " << p;
  }
}

// Under GRADEX_HIERARCHICAL (2 emulated hosts x 2 ranks) the 8-bit route crosses hosts once per
// host (comm::hierarchical_encoded_allreduce; a 16-bit tensor beside it goes hierarchical too):
// its averages are bit-identical on every rank, not the flat job's bits (another quantization of
// host sums), and within a few 8-bit steps of them (momentum 0.9 over values in [-1, 1)).
TEST(EngineInt8, HierarchicalJobTakesTheRouteAcrossHosts) {
  const ScratchDir scratch("int8");
  const std::string& dir = scratch.path();
  const std::vector<std::string> hosts = {"hostA", "hostA", "hostB", "hostB"};
  for (const char* mode : {"1", "0"}) {
    auto results = run_ranks(
        4,
        {"GRADEX_SPARSITY=0", "GRADEX_SPARSITY_OVERRIDES=q:int8", "GRADEX_MOMENTUM=0.9",
         std::string("GRADEX_HIERARCHICAL=") + mode, "GRADEX_TIMEOUT_S=120"},
        [&](RankContext& ctx) -> std::string {
          ::setenv("GRADEX_HOST_ID", hosts[static_cast<size_t>(ctx.rank)].c_str(), 1);
          std::string error;
          if (create_engine(ctx.rank, ctx.world, &ctx.engine, &error) != GRADEX_OK) return error;
          const std::vector<std::string> keys = {"q", "h"};
          const std::vector<uint64_t> sizes = {50000, 20000};
          for (size_t t = 0; t < keys.size(); ++t)
            RANK_OK(gradex_register_tensor(ctx.engine, keys[t].c_str(), sizes[t], GRADEX_FLOAT32,
                                           GRADEX_DEVICE_CPU));
          std::vector<float> record;
          if (auto e = run_steps(ctx, keys, sizes, 0, 3, record); !e.empty()) return e;
          record.resize(3 * (sizes[0] + sizes[1]));
          std::vector<float> q;  // the 8-bit tensor's averages of every step
          for (int s = 0; s < 3; ++s) {
            const float* at = record.data() + s * (sizes[0] + sizes[1]);
            q.insert(q.end(), at, at + sizes[0]);
          }
          write_file(dir + "/" + mode + "." + std::to_string(ctx.rank), q.data(), q.size() * 4);
          return "";
        },
        std::chrono::seconds(240), /*create_engine=*/false);
    ASSERT_EQ(failures(results), "") << "GRADEX_HIERARCHICAL=" << mode;
  }
  const std::vector<char> flat = read_file(dir + "/0.0"), hier = read_file(dir + "/1.0");
  ASSERT_FALSE(flat.empty());
  ASSERT_EQ(hier.size(), flat.size());
  for (int r = 0; r < 4; ++r) {
    EXPECT_TRUE(read_file(dir + "/1." + std::to_string(r)) == hier) << "hierarchical rank " << r;
    EXPECT_TRUE(read_file(dir + "/0." + std::to_string(r)) == flat) << "flat rank " << r;
  }
  EXPECT_FALSE(hier == flat) << "the hierarchical job ran the flat exchange";
  const auto* a = reinterpret_cast<const float*>(hier.data());
  const auto* b = reinterpret_cast<const float*>(flat.data());
  float worst = 0;
  for (size_t i = 0; i < flat.size() / 4; ++i)
    worst = std::max(worst, std::fabs(a[i] - b[i]));
  EXPECT_LT(worst, 0.1f);
}

// The 4-bit width ('pattern:int4'): bit-identical on every rank, within a few 4-bit steps of the
// exact mean, named in gradex_explain, and about half of 8-bit's bytes (0.53 bytes per element in
// both phases: 13% of an fp32 ring's).
TEST(EngineInt8, FourBitsBitIdenticalCloseToTheMeanAtHalfTheBytes) {
  const ScratchDir scratch("int8");
  const std::string& dir = scratch.path();
  const int world = 3, steps = 3;
  const uint64_t n = 30000;
  auto results = run_ranks(
      world, {"GRADEX_SPARSITY_OVERRIDES=w:int4", "GRADEX_MOMENTUM=0"},
      [&](RankContext& ctx) -> std::string {
        RANK_OK(gradex_register_tensor(ctx.engine, "w", n, GRADEX_FLOAT32, GRADEX_DEVICE_CPU));
        std::vector<float> record;
        if (auto e = run_steps(ctx, {"w"}, {n}, 0, steps, record); !e.empty()) return e;
        write_file(dir + "/r" + std::to_string(ctx.rank), record.data(), record.size() * 4);
        for (int s = 0; s < steps; ++s) {
          double worst = 0;
          for (uint64_t i = 0; i < n; ++i) {
            double mean = 0;
            for (int r = 0; r < world; ++r)
              mean += test_value(5, r, s, i);
            worst = std::max(worst, std::fabs(record[s * n + i] - mean / world));
          }
          // Values within +-1: a 4-bit step of a block is at most 1/7; two quantizations and the
          // carried residuals a few of them.
          RANK_REQUIRE(worst < 0.6, "step " << s << ": off by " << worst);
        }
        gradex_stats_t st;
        RANK_OK(gradex_get_stats(ctx.engine, 0, &st));
        const double fp32_ring = steps * 2.0 * (world - 1) / world * n * 4;
        RANK_REQUIRE(st.bytes_sent > 0.13 * fp32_ring && st.bytes_sent < 0.16 * fp32_ring,
                     "4-bit bytes sent " << st.bytes_sent << " vs fp32 ring " << fp32_ring);
        const std::string text = explain_text(ctx.engine);
        RANK_REQUIRE(text.find("4-bit") != std::string::npos &&
                         text.find("override 'w': int4") != std::string::npos,
                     "explain: " << text);
        return "";
      });
  ASSERT_EQ(failures(results), "");
  const std::vector<char> rank0 = read_file(dir + "/r0");
  ASSERT_EQ(rank0.size(), steps * n * 4);
  for (int r = 1; r < world; ++r)
    EXPECT_TRUE(read_file(dir + "/r" + std::to_string(r)) == rank0) << "rank " << r << " differs";
}

// A tensor moving between the widths keeps its residuals (both are the rounding still owed): 3
// steps at 8 bits, the state restored at 4 bits for 3 more, then restored where the tensor is
// plain dense fp32, whose first exchange flushes the residuals. Everything delivered plus that
// flush is the exact average of everything submitted, to fp32 rounding.
TEST(EngineInt8, SwitchingWidthsLosesNothing) {
  const ScratchDir scratch("int8");
  const std::string& dir = scratch.path();
  const uint64_t n = 30000;
  const int world = 3, steps = 3;
  auto stage = [&](const std::vector<std::string>& env, int first, bool load, bool flush) {
    return run_ranks(world, env, [&, first, load, flush](RankContext& ctx) -> std::string {
      RANK_OK(gradex_register_tensor(ctx.engine, "w", n, GRADEX_FLOAT32, GRADEX_DEVICE_CPU));
      const std::string state_path = dir + "/state" + std::to_string(ctx.rank);
      const std::string sums_path = dir + "/sums" + std::to_string(ctx.rank);
      std::vector<float> delivered(n, 0.0f);
      if (load) {
        std::vector<char> state = read_file(state_path);
        RANK_OK(gradex_load_state(ctx.engine, state.data(), state.size()));
        std::vector<char> raw = read_file(sums_path);
        RANK_REQUIRE(raw.size() == 4 * n, "no delivered sums");
        std::memcpy(delivered.data(), raw.data(), 4 * n);
      }
      for (int s = first; s < first + (flush ? 1 : steps); ++s) {
        std::vector<float> g =
            flush ? std::vector<float>(n, 0.0f) : test_vector(31, ctx.rank, s, n);
        gradex_handle_t h;
        RANK_OK(gradex_submit(ctx.engine, "w", g.data(), &h));
        RANK_OK(gradex_wait(ctx.engine, h));
        for (uint64_t i = 0; i < n; ++i)
          delivered[i] += g[i];
        RANK_OK(gradex_end_step(ctx.engine, nullptr));
      }
      if (flush) {
        double worst = 0;
        for (uint64_t i = 0; i < n; ++i) {
          double exact = 0;
          for (int r = 0; r < world; ++r)
            for (int s = 0; s < 2 * steps; ++s)
              exact += test_value(31, r, s, i);
          worst = std::max(worst, std::fabs(delivered[i] - exact / world));
        }
        RANK_REQUIRE(worst < 4e-6, "delivered + flushed is off the exact average by " << worst);
        return "";
      }
      if (auto e = save_state_to(ctx, state_path); !e.empty()) return e;
      write_file(sums_path, delivered.data(), 4 * n);
      return "";
    });
  };
  ASSERT_EQ(
      failures(stage({"GRADEX_SPARSITY_OVERRIDES=w:int8", "GRADEX_MOMENTUM=0"}, 0, false, false)),
      "");
  ASSERT_EQ(failures(stage({"GRADEX_SPARSITY_OVERRIDES=w:int4", "GRADEX_MOMENTUM=0"}, steps, true,
                           false)),
            "");
  ASSERT_EQ(failures(stage({"GRADEX_SPARSITY=0", "GRADEX_FP16=0", "GRADEX_MOMENTUM=0"}, 2 * steps,
                           true, true)),
            "");
}
