// The Adam codec through the engine (GRADEX_OPTIMIZER=adam): real ranks, real UCX. Every rank's
// average is bit-identical, on the CPU and the thrust-omp backends, with the DCT (the default) and
// without (GRADEX_ADAM_TRANSFORM=none); each step's average is the average of what every rank's
// codec sent (sent = fl(b * m_old) + C(g) - m_new, read from the engine's buffer, C the tensor's
// chunked DCT or the identity, and the average C^-1 of the sent coefficients' average); a
// checkpoint saved mid-run restores into fresh engines that continue bit for bit, and not into
// engines of the other transform; the
// policy chain gives compressed tensors the Adam codec's sparsity; gradex momentum with
// GRADEX_OPTIMIZER=adam is refused naming both variables.
#include <gtest/gtest.h>

#include <stdlib.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "capi/engine_access.h"
#include "compress/backend/backend.h"
#include "compress/dct/chunked_dct.h"
#include "process_ranks.h"
#include "rank_checks.h"
#include "sync/policy/codec_planner.h"
#include "sync/policy/policy.h"

using namespace gradex::test;

namespace {

const uint64_t kNumel = 60000;
const uint64_t kRows = 300;  // a 300 x 200 weight: blocks of 60 x 50 at GRADEX_ADAM_DCT_CHUNK=64
const float kDecay = 0.9f;
const std::vector<std::string> kEnv = {
    "GRADEX_OPTIMIZER=adam",       "GRADEX_ADAM_SPARSITY=0.99",
    "GRADEX_ADAM_DECAY=0.9",       "GRADEX_FP16=0",
    "GRADEX_DENSE_THRESHOLD=1000", "GRADEX_SPARSITY_OVERRIDES=check:dense",
    "GRADEX_ADAM_DCT_CHUNK=64"};

std::vector<std::string> with(std::vector<std::string> env, const std::string& more) {
  env.push_back(more);
  return env;
}

void write_file(const std::string& path, const void* data, size_t size) {
  std::ofstream f(path, std::ios::binary);
  f.write(static_cast<const char*>(data), static_cast<std::streamsize>(size));
}
std::vector<char> read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<char>(std::istreambuf_iterator<char>(f), {});
}

std::string step(gradex_engine_t* engine, int rank, int s, std::vector<float>& out) {
  out = test_vector(21, rank, s, kNumel);
  gradex_handle_t h;
  RANK_OK(gradex_submit(engine, "w", out.data(), &h));
  RANK_OK(gradex_wait(engine, h));
  RANK_OK(gradex_end_step(engine, nullptr));
  return "";
}

void averages_are_what_ranks_sent_and_identical(const std::string& backend, bool dct) {
  const int world = 3, steps = 5;
  const ScratchDir scratch("adam");
  const std::string& dir = scratch.path();
  std::vector<std::string> env = kEnv;
  env.push_back("GRADEX_BACKEND=" + backend);
  env.push_back(dct ? "GRADEX_ADAM_TRANSFORM=dct" : "GRADEX_ADAM_TRANSFORM=none");
  const gradex::compress::dct::ChunkedDct transform(kNumel, kRows, 64);
  auto results = run_ranks(world, env, [&](RankContext& ctx) -> std::string {
    RANK_OK(gradex_register_tensor_rows(ctx.engine, "w", kNumel, GRADEX_FLOAT32, GRADEX_DEVICE_CPU,
                                        kRows));
    RANK_OK(gradex_register_tensor(ctx.engine, "check", kNumel, GRADEX_FLOAT32, GRADEX_DEVICE_CPU));
    gradex::sync::Engine& engine = gradex::capi::engine_of(ctx.engine);
    std::vector<float> all;
    for (int s = 0; s < steps; ++s) {
      const std::vector<float> m_old = engine.residual_of("w");
      RANK_REQUIRE(m_old.size() == kNumel, "buffer size " << m_old.size());
      const std::vector<float> g = test_vector(5, ctx.rank, s, kNumel);
      std::vector<float> cg = g;
      if (dct) transform.forward(g.data(), cg.data());
      std::vector<float> avg = g;
      gradex_handle_t h;
      RANK_OK(gradex_submit(ctx.engine, "w", avg.data(), &h));
      RANK_OK(gradex_wait(ctx.engine, h));
      const std::vector<float> m_new = engine.residual_of("w");
      std::vector<float> sent(kNumel);
      uint64_t count = 0;
      for (uint64_t i = 0; i < kNumel; ++i) {
        sent[i] = (kDecay * m_old[i] + cg[i]) - m_new[i];
        count += sent[i] != 0.0f;
      }
      if (dct) {  // what this rank's coefficients make in the elements: the average is linear
        std::vector<float> coefficients = sent;
        transform.inverse(coefficients.data(), sent.data());
      }
      RANK_REQUIRE(count >= kNumel / 200 && count <= kNumel * 13 / 1000,
                   "step " << s << ": this rank sent " << count << " of " << kNumel);
      // The dense fp32 average of what each rank sent equals the codec's average (to rounding:
      // the ring adds in another order than the sparse sum).
      RANK_OK(gradex_submit(ctx.engine, "check", sent.data(), &h));
      RANK_OK(gradex_wait(ctx.engine, h));
      double worst = 0;
      for (uint64_t i = 0; i < kNumel; ++i)
        worst = std::max(worst, static_cast<double>(std::fabs(sent[i] - avg[i])));
      RANK_REQUIRE(worst < 1e-5,
                   "step " << s << ": average != mean of what ranks sent, worst " << worst);
      all.insert(all.end(), avg.begin(), avg.end());
      RANK_OK(gradex_end_step(ctx.engine, nullptr));
    }
    gradex_stats_t stats;
    RANK_OK(gradex_get_stats(ctx.engine, 0, &stats));
    RANK_REQUIRE(stats.sparse_exchanges == steps, "sparse exchanges " << stats.sparse_exchanges);
    write_file(dir + "/avg" + std::to_string(ctx.rank), all.data(), all.size() * 4);
    return "";
  });
  ASSERT_EQ(failures(results), "");
  const std::vector<char> first = read_file(dir + "/avg0");
  ASSERT_EQ(first.size(), kNumel * steps * 4);
  for (int r = 1; r < world; ++r)
    EXPECT_TRUE(read_file(dir + "/avg" + std::to_string(r)) == first)
        << "rank " << r << "'s averages differ from rank 0's (" << backend << ")";
  for (int r = 0; r < world; ++r)
    ::unlink((dir + "/avg" + std::to_string(r)).c_str());
  ::rmdir(dir.c_str());
}

}  // namespace

TEST(EngineAdamCodec, AveragesAreWhatRanksSentAndBitIdenticalOnCpu) {
  averages_are_what_ranks_sent_and_identical("cpu", true);
}

TEST(EngineAdamCodec, WithoutTheDctAveragesAreWhatRanksSentAndBitIdenticalOnCpu) {
  averages_are_what_ranks_sent_and_identical("cpu", false);
}

TEST(EngineAdamCodec, AveragesAreWhatRanksSentAndBitIdenticalOnThrustOmp) {
  if (!gradex::compress::backend::backend_available(
          gradex::compress::backend::DeviceType::kThrustOmp))
    GTEST_SKIP() << "this build has no thrust-omp backend";
  averages_are_what_ranks_sent_and_identical("thrust-omp", true);
}

TEST(EngineAdamCodec, CheckpointMidRunContinuesBitForBit) {
  const ScratchDir scratch("adam");
  const std::string& dir = scratch.path();
  auto first = run_ranks(2, kEnv, [&](RankContext& ctx) -> std::string {
    RANK_OK(gradex_register_tensor_rows(ctx.engine, "w", kNumel, GRADEX_FLOAT32, GRADEX_DEVICE_CPU,
                                        kRows));
    std::vector<float> out;
    for (int s = 0; s < 3; ++s)
      if (auto e = step(ctx.engine, ctx.rank, s, out); !e.empty()) return e;
    size_t length = 0;
    RANK_OK(gradex_save_state(ctx.engine, nullptr, 0, &length));
    std::vector<char> state(length);
    RANK_OK(gradex_save_state(ctx.engine, state.data(), state.size(), &length));
    write_file(dir + "/state" + std::to_string(ctx.rank), state.data(), length);
    std::vector<float> all;
    for (int s = 3; s < 6; ++s) {
      if (auto e = step(ctx.engine, ctx.rank, s, out); !e.empty()) return e;
      all.insert(all.end(), out.begin(), out.end());
    }
    write_file(dir + "/expected" + std::to_string(ctx.rank), all.data(), all.size() * 4);
    return "";
  });
  ASSERT_EQ(failures(first), "");
  // A residual of DCT coefficients is not restored into the element codec (nor another chunk).
  for (const char* other : {"GRADEX_ADAM_TRANSFORM=none", "GRADEX_ADAM_DCT_CHUNK=32"}) {
    auto refused = run_ranks(1, with(kEnv, other), [&](RankContext& ctx) -> std::string {
      RANK_OK(gradex_register_tensor_rows(ctx.engine, "w", kNumel, GRADEX_FLOAT32,
                                          GRADEX_DEVICE_CPU, kRows));
      std::vector<char> state = read_file(dir + "/state0");
      RANK_REQUIRE(gradex_load_state(ctx.engine, state.data(), state.size()) != GRADEX_OK,
                   "state of the DCT codec accepted with " << other);
      return "";
    });
    EXPECT_EQ(failures(refused), "") << other;
  }
  auto second = run_ranks(2, kEnv, [&](RankContext& ctx) -> std::string {
    RANK_OK(gradex_register_tensor_rows(ctx.engine, "w", kNumel, GRADEX_FLOAT32, GRADEX_DEVICE_CPU,
                                        kRows));
    std::vector<char> state = read_file(dir + "/state" + std::to_string(ctx.rank));
    std::vector<char> damaged = state;
    damaged[damaged.size() / 2] ^= 0x10;  // inside the buffer's values: the CRC refuses it
    RANK_REQUIRE(gradex_load_state(ctx.engine, damaged.data(), damaged.size()) != GRADEX_OK,
                 "damaged state accepted");
    damaged = state;
    damaged.resize(damaged.size() / 2);
    RANK_REQUIRE(gradex_load_state(ctx.engine, damaged.data(), damaged.size()) != GRADEX_OK,
                 "truncated state accepted");
    RANK_OK(gradex_load_state(ctx.engine, state.data(), state.size()));
    std::vector<char> expected = read_file(dir + "/expected" + std::to_string(ctx.rank));
    std::vector<float> out;
    for (int s = 3; s < 6; ++s) {
      if (auto e = step(ctx.engine, ctx.rank, s, out); !e.empty()) return e;
      RANK_REQUIRE(std::memcmp(out.data(), expected.data() + (s - 3) * kNumel * 4, kNumel * 4) == 0,
                   "step " << s << " differs from the uninterrupted run");
    }
    return "";
  });
  EXPECT_EQ(failures(second), "");
  for (const char* f : {"state0", "state1", "expected0", "expected1"})
    ::unlink((dir + "/" + f).c_str());
  ::rmdir(dir.c_str());
}

TEST(EngineAdamCodec, GradexMomentumWithAnAdamOptimizerIsRefused) {
  auto results = run_ranks(
      1, {"GRADEX_OPTIMIZER=adam", "GRADEX_MOMENTUM=0.9"},
      [&](RankContext& ctx) -> std::string {
        gradex_engine_t* engine = nullptr;
        std::string error;
        RANK_REQUIRE(create_engine(ctx.rank, ctx.world, &engine, &error) == GRADEX_ERR_CONFIG,
                     "engine created: " << error);
        RANK_REQUIRE(
            error.find("GRADEX_MOMENTUM=0.9 with GRADEX_OPTIMIZER=adam") != std::string::npos,
            error);
        return "";
      },
      std::chrono::seconds(60), false);
  EXPECT_EQ(failures(results), "");
}

TEST(EngineAdamCodec, PolicyGivesCompressedTensorsTheAdamSparsity) {
  gradex::sync::EngineOptions o;
  o.sparsity = 0.999;
  o.adam.codec = true;
  o.adam.sparsity = 0.98;
  o.overrides = gradex::sync::parse_policy_overrides("embed:0.9,norm:dense");
  using gradex::sync::Codec;
  using gradex::sync::Rung;
  const Rung dense{Codec::kHalf, 0};
  EXPECT_EQ(choose_policy(o, "fc.weight", 100000).rung, (Rung{Codec::kAdam, 0.98}));
  EXPECT_EQ(choose_policy(o, "fc.bias", 100).rung, dense);
  // Overrides still win on sparsity; a sparse tensor's codec is the Adam codec whatever decided.
  EXPECT_EQ(choose_policy(o, "embed.weight", 100000).rung, (Rung{Codec::kAdam, 0.9}));
  EXPECT_EQ(choose_policy(o, "norm.weight", 100000).rung, dense);
  o.adam.sparsity = 0;
  EXPECT_EQ(choose_policy(o, "fc.weight", 100000).rung, dense);
  o.adam.codec = false;  // no optimizer known: DGC
  EXPECT_EQ(choose_policy(o, "fc.weight", 100000).rung, (Rung{Codec::kDgc, 0.999}));
}

// GRADEX_SPARSITY set explicitly (and GRADEX_ADAM_SPARSITY not) is the user's choice for the Adam
// codec too: GRADEX_SPARSITY=0 keeps an AdamW run dense.
TEST(EngineAdamCodec, AnExplicitSparsityAppliesToTheAdamCodec) {
  using gradex::config::Config;
  using gradex::config::Source;
  Config c = Config::from_strings({"GRADEX_OPTIMIZER=adam"}, Source::kEnvironment);
  EXPECT_EQ(gradex::sync::engine_options_from_config(c).adam.sparsity, 0.98);
  c.set("GRADEX_SPARSITY", "0");
  EXPECT_EQ(gradex::sync::engine_options_from_config(c).adam.sparsity, 0.0);
  EXPECT_FALSE(gradex::sync::is_sparse(
      choose_policy(gradex::sync::engine_options_from_config(c), "fc.weight", 100000).rung.codec));
  c.set("GRADEX_ADAM_SPARSITY", "0.995");
  EXPECT_EQ(gradex::sync::engine_options_from_config(c).adam.sparsity, 0.995);
}

// The 8-bit rung under the fidelity caps: on by default, off by default under an Adam-family
// optimizer, and as the user set it either way.
TEST(EngineAdamCodec, FidelityEightBitIsOffByDefaultOnlyUnderAdam) {
  using gradex::config::Config;
  using gradex::config::Source;
  using gradex::sync::engine_options_from_config;
  using gradex::sync::fidelity_int8_enabled;
  Config sgd = Config::from_strings({}, Source::kEnvironment);
  EXPECT_TRUE(fidelity_int8_enabled(sgd, engine_options_from_config(sgd)));
  Config adam = Config::from_strings({"GRADEX_OPTIMIZER=adam"}, Source::kEnvironment);
  EXPECT_FALSE(fidelity_int8_enabled(adam, engine_options_from_config(adam)));
  adam.set("GRADEX_POLICY_FIDELITY_INT8", "1");
  EXPECT_TRUE(fidelity_int8_enabled(adam, engine_options_from_config(adam)));
  sgd.set("GRADEX_POLICY_FIDELITY_INT8", "0");
  EXPECT_FALSE(fidelity_int8_enabled(sgd, engine_options_from_config(sgd)));
}

// The auto policy's rungs under an Adam-family optimizer: by default 8-bit, then 4-bit, and no
// Adam codec; the Adam codec (and no 4-bit) when the user sets its sparsity or turns the 8-bit
// rung off; an explicit GRADEX_POLICY_INT8 or GRADEX_POLICY_INT4 honoured either way.
TEST(EngineAdamCodec, AutoLadderUnderAdamIsEightBitUnlessTheCodecIsAskedFor) {
  using gradex::config::Config;
  using gradex::config::Source;
  struct Case {
    std::vector<std::string> settings;
    bool int8, int4, adam_codec;
  };
  const std::vector<Case> cases = {
      {{}, true, true, false},
      {{"GRADEX_ADAM_SPARSITY=0.98"}, true, false, true},
      {{"GRADEX_POLICY_INT8=0"}, false, false, true},
      {{"GRADEX_POLICY_INT8=1"}, true, true, false},
      {{"GRADEX_POLICY_INT4=0"}, true, false, false},
      {{"GRADEX_ADAM_SPARSITY=0.98", "GRADEX_POLICY_INT4=1"}, true, true, true},
  };
  for (const Case& k : cases) {
    std::vector<std::string> settings = k.settings;
    settings.push_back("GRADEX_OPTIMIZER=adam");
    const gradex::sync::AdamLadder a =
        gradex::sync::adam_ladder(Config::from_strings(settings, Source::kEnvironment));
    EXPECT_EQ(a.int8, k.int8) << settings.front();
    EXPECT_EQ(a.int4, k.int4) << settings.front();
    EXPECT_EQ(a.adam_codec, k.adam_codec) << settings.front();
  }
}
