// Parallel compression (Engine::Executor::prepare_unit spreads a unit's tensors over the worker
// pool; large tensors are split inside their DGC step as well): nothing a rank sends, receives or
// keeps depends on GRADEX_THREADS, a unit's tensors really are prepared on several threads at once,
// and a tensor whose prepare throws on a worker fails the round on every rank with a message naming
// it, without a hang.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <fstream>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "base/error.h"
#include "base/half.h"
#include "capi/engine_access.h"
#include "engine_gates.h"
#include "process_ranks.h"
#include "rank_checks.h"
#include "typed_tensors.h"

using namespace gradex::test;
using gradex::sync::route::Path;

namespace {

// A tensor's gradient for (rank, step) in its own dtype, and its fp32 sum of squares.
std::vector<uint8_t> gradient(const Spec& s, int index, int rank, int step, double* sq) {
  std::vector<float> f = test_vector(700 + index, rank, step, s.n);
  for (float x : f)
    *sq += static_cast<double>(x) * x;
  return dtype_bytes(f, s.dtype);
}

// Two jobs meet: each waits (at most 10 s) until the other has started. They meet only when they
// run at the same time on two threads; a unit prepared on one thread runs them one after the other
// and the first one's wait runs out.
class Rendezvous {
 public:
  bool arrive(int who) {
    std::unique_lock<std::mutex> lock(mutex_);
    arrived_[who] = true;
    cv_.notify_all();
    return cv_.wait_for(lock, std::chrono::seconds(10), [&] { return arrived_[1 - who]; });
  }
  void reset() {
    std::lock_guard<std::mutex> lock(mutex_);
    arrived_[0] = arrived_[1] = false;
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  bool arrived_[2] = {false, false};
};

// DGC tensors in groups (GRADEX_SPARSE_GROUP_MB=2: 524,288 elements) and alone, fp32 and 16-bit,
// some large enough to be split across threads too; dense tensors in one bucket with momentum.
const std::vector<Spec> kTensors = {
    {"k00", 700000, GRADEX_FLOAT32}, {"k01", 300000, GRADEX_FLOAT32},
    {"k02", 200000, GRADEX_FLOAT16}, {"k03", 150000, GRADEX_BFLOAT16},
    {"k04", 90000, GRADEX_FLOAT32},  {"k05", 60000, GRADEX_FLOAT32},
    {"k06", 40000, GRADEX_FLOAT16},  {"k07", 30000, GRADEX_FLOAT32},
    {"k08", 20000, GRADEX_FLOAT32},  {"d0", 3000, GRADEX_FLOAT32},
    {"d1", 2000, GRADEX_FLOAT16},    {"d2.dense", 70000, GRADEX_FLOAT32}};

const std::vector<std::string> kEnv = {"GRADEX_SPARSITY=0.99",
                                       "GRADEX_WARMUP_STEPS=3",
                                       "GRADEX_MOMENTUM=0.9",
                                       "GRADEX_CLIP_NORM=40",
                                       "GRADEX_DENSE_THRESHOLD=10000",
                                       "GRADEX_SPARSE_GROUP_MB=2",
                                       "GRADEX_SPARSITY_OVERRIDES=d2.dense:dense",
                                       "GRADEX_TIMEOUT_S=60"};

// The Adam codec in the chunked DCT's domain (GRADEX_OPTIMIZER=adam: the optimizer keeps the
// momentum): the same tensors with output rows, so that blocks are 2-D (k00 50 x 50, k01 60 x 50,
// k05 15 x 50, k08 40 x 25, ...) or one row (k07: rows unknown); tensors of 2^16 elements and more
// are transformed on the pool.
const std::vector<uint64_t> kAdamRows = {1000, 600, 400, 300, 300, 15, 200, 0, 160, 0, 0, 0};
const std::vector<std::string> kAdamEnv = {"GRADEX_OPTIMIZER=adam",
                                           "GRADEX_ADAM_SPARSITY=0.99",
                                           "GRADEX_WARMUP_STEPS=3",
                                           "GRADEX_CLIP_NORM=40",
                                           "GRADEX_DENSE_THRESHOLD=10000",
                                           "GRADEX_SPARSE_GROUP_MB=2",
                                           "GRADEX_SPARSITY_OVERRIDES=d2.dense:dense",
                                           "GRADEX_TIMEOUT_S=60"};

// One rank's run: every step's tensors in one round (held behind a gate), then the digests of
// what it received (the averages), what it sent (its DGC messages, in transfer order) and what it
// keeps (residuals, momenta, the saved state), written to `out_file`. `rows`: each tensor's
// output rows (registered with gradex_register_tensor_rows), or none.
std::string run_steps(RankContext& ctx, const std::string& out_file,
                      const std::vector<uint64_t>* rows = nullptr) {
  for (size_t i = 0; i < kTensors.size(); ++i) {
    const Spec& s = kTensors[i];
    if (rows)
      RANK_OK(gradex_register_tensor_rows(ctx.engine, s.key, s.n, s.dtype, GRADEX_DEVICE_CPU,
                                          (*rows)[i]));
    else
      RANK_OK(gradex_register_tensor(ctx.engine, s.key, s.n, s.dtype, GRADEX_DEVICE_CPU));
  }
  RANK_OK(gradex_register_tensor(ctx.engine, "gate", 10, GRADEX_FLOAT32, GRADEX_DEVICE_CPU));
  auto gates = install_gates(ctx.engine);
  Digest results, messages, state;
  const int steps = 5;
  for (int step = 0; step < steps; ++step) {
    double sq = 0;
    std::vector<std::vector<uint8_t>> g(kTensors.size());
    for (size_t i = 0; i < kTensors.size(); ++i)
      g[i] = gradient(kTensors[i], static_cast<int>(i), ctx.rank, step, &sq);
    RANK_OK(gradex_set_gradient_norm(ctx.engine, std::sqrt(sq)));  // before the step's first submit
    gates->gate("gate");
    std::vector<float> gate(10, 1.0f);
    gradex_handle_t hg;
    RANK_OK(gradex_submit(ctx.engine, "gate", gate.data(), &hg));
    RANK_REQUIRE(gates->wait_reached("gate"), "step " << step << ": no gate transfer");
    std::vector<gradex_handle_t> h(kTensors.size());
    for (size_t i = 0; i < kTensors.size(); ++i)
      RANK_OK(gradex_submit(ctx.engine, kTensors[i].key, g[i].data(), &h[i]));
    gates->release("gate");
    RANK_OK(gradex_wait(ctx.engine, hg));
    for (size_t i = 0; i < kTensors.size(); ++i) {
      RANK_OK(gradex_wait(ctx.engine, h[i]));
      results.add(g[i].data(), g[i].size());
    }
    RANK_OK(gradex_end_step(ctx.engine, nullptr));
  }
  size_t sparse_units = 0;
  for (const Gates::Sent& s : gates->sent()) {
    if (s.path != Path::kSparse) continue;
    ++sparse_units;
    for (const std::string& k : s.keys)
      messages.add(k.data(), k.size());
    messages.add(s.message.data(), s.message.size());
  }
  // Steps 1-4 are sparse (step 0 is warm-up's dense 75%): k00 alone, then groups.
  RANK_REQUIRE(sparse_units >= 4 * 3, sparse_units << " DGC units");
  auto& engine = gradex::capi::engine_of(ctx.engine);
  for (const Spec& s : kTensors) {
    const std::vector<float> v = engine.residual_of(s.key);
    const std::vector<float> u = engine.momentum_of(s.key);
    state.add(v.data(), v.size() * 4);
    state.add(u.data(), u.size() * 4);
  }
  size_t size = 0;
  RANK_OK(gradex_save_state(ctx.engine, nullptr, 0, &size));
  std::vector<uint8_t> saved(size);
  RANK_OK(gradex_save_state(ctx.engine, saved.data(), saved.size(), &size));
  state.add(saved.data(), saved.size());
  std::ofstream(out_file) << results.h << " " << messages.h << " " << state.h;
  return "";
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::string s;
  std::getline(in, s);
  return s;
}

}  // namespace

// The same exchange (2 ranks, 5 steps: a dense warm-up step, then sparse ones; DGC groups, a lone
// tensor split across threads, 16-bit tensors, momentum, clipping, a dense bucket) with 1, 2, 4
// and 7 threads: averages, payloads and state bit for bit the same. Two ranks: a dense sum of two
// values does not depend on how the ring cuts the bucket, so the runs are deterministic.
static void same_at_every_thread_count(const std::vector<std::string>& base_env,
                                       const std::vector<uint64_t>* rows, const std::string& name) {
  const int world = 2;
  const std::string dir = ::testing::TempDir();
  std::vector<std::vector<std::string>> digests;  // [thread count][rank]
  for (int threads : {1, 2, 4, 7}) {
    std::vector<std::string> env = base_env;
    env.push_back("GRADEX_THREADS=" + std::to_string(threads));
    auto file = [&](int rank) {
      return dir + "/gradex_" + name + "_" + std::to_string(threads) + "_" + std::to_string(rank);
    };
    auto results = run_ranks(
        world, env, [&](RankContext& ctx) { return run_steps(ctx, file(ctx.rank), rows); },
        std::chrono::seconds(240));
    ASSERT_EQ(failures(results), "") << threads << " threads";
    std::vector<std::string> d;
    for (int r = 0; r < world; ++r)
      d.push_back(read_file(file(r)));
    digests.push_back(d);
  }
  for (int r = 0; r < world; ++r) {
    ASSERT_FALSE(digests[0][r].empty());
    for (size_t t = 1; t < digests.size(); ++t)
      EXPECT_EQ(digests[t][r], digests[0][r]) << "rank " << r << ", run " << t;
  }
  // Both ranks received the same averages (the first of the three digests).
  EXPECT_EQ(digests[0][0].substr(0, digests[0][0].find(' ')),
            digests[0][1].substr(0, digests[0][1].find(' ')));
}

TEST(EngineThreads, ResultsPayloadsAndStateDoNotDependOnTheThreadCount) {
  same_at_every_thread_count(kEnv, nullptr, "dgc");
}

// The same with the Adam codec in the chunked DCT's domain (its transforms spread over the pool).
TEST(EngineThreads, AdamCodecResultsPayloadsAndStateDoNotDependOnTheThreadCount) {
  same_at_every_thread_count(kAdamEnv, &kAdamRows, "adam_dct");
}

// One DGC unit (every tensor in one group) prepared with 3 threads: its two largest tensors meet,
// so they were prepared at the same time on two threads. In the last step rank 1's tensor that a
// worker (not the progress thread) prepares throws: every handle of the round fails on both ranks,
// rank 1's message names that tensor, rank 0's names rank 1 and the tensor; nothing hangs.
TEST(EngineThreads, UnitIsSpreadOverThePoolAndAWorkerErrorFailsTheRoundNamingTheTensor) {
  const int world = 2;
  const std::vector<Spec> tensors = {{"a", 300000, GRADEX_FLOAT32},
                                     {"b", 250000, GRADEX_FLOAT32},
                                     {"c", 50000, GRADEX_FLOAT16},
                                     {"d", 20000, GRADEX_FLOAT32}};
  auto results = run_ranks(
      world,
      {"GRADEX_THREADS=3", "GRADEX_SPARSITY=0.99", "GRADEX_DENSE_THRESHOLD=10000",
       "GRADEX_SPARSE_GROUP_MB=64", "GRADEX_TIMEOUT_S=60"},
      [&](RankContext& ctx) -> std::string {
        for (const Spec& s : tensors)
          RANK_OK(gradex_register_tensor(ctx.engine, s.key, s.n, s.dtype, GRADEX_DEVICE_CPU));
        RANK_OK(gradex_register_tensor(ctx.engine, "gate", 10, GRADEX_FLOAT32, GRADEX_DEVICE_CPU));
        auto gates = install_gates(ctx.engine);
        Rendezvous meet;
        std::mutex mutex;
        bool met = true, fail_now = false;
        std::set<std::string> thrown;
        gradex::sync::EngineTestAccess::before_prepare(
            gradex::capi::engine_of(ctx.engine), [&](const gradex::sync::pipeline::Job& job) {
              const std::string& key = job.id.key;
              if (key != "a" && key != "b") return;
              const bool both = meet.arrive(key == "a" ? 0 : 1);
              std::lock_guard<std::mutex> lock(mutex);
              met = met && both;
              if (fail_now && std::this_thread::get_id() != gates->progress_thread()) {
                thrown.insert(key);
                throw gradex::InvalidArgument("injected failure");
              }
            });
        const int steps = 3;
        for (int step = 0; step < steps; ++step) {
          meet.reset();
          {
            std::lock_guard<std::mutex> lock(mutex);
            fail_now = step == steps - 1 && ctx.rank == 1;
          }
          gates->gate("gate");
          std::vector<float> gate(10, 1.0f);
          gradex_handle_t hg;
          RANK_OK(gradex_submit(ctx.engine, "gate", gate.data(), &hg));
          RANK_REQUIRE(gates->wait_reached("gate"), "step " << step << ": no gate transfer");
          std::vector<std::vector<uint8_t>> g(tensors.size());
          std::vector<gradex_handle_t> h(tensors.size());
          double sq = 0;
          for (size_t i = 0; i < tensors.size(); ++i) {
            g[i] = gradient(tensors[i], static_cast<int>(i), ctx.rank, step, &sq);
            RANK_OK(gradex_submit(ctx.engine, tensors[i].key, g[i].data(), &h[i]));
          }
          gates->release("gate");
          RANK_OK(gradex_wait(ctx.engine, hg));
          if (step < steps - 1) {
            for (size_t i = 0; i < tensors.size(); ++i)
              RANK_OK(gradex_wait(ctx.engine, h[i]));
            std::lock_guard<std::mutex> lock(mutex);
            RANK_REQUIRE(met, "step " << step << ": 'a' and 'b' were not prepared at once");
            continue;
          }
          for (size_t i = 0; i < tensors.size(); ++i) {
            RANK_REQUIRE(gradex_wait(ctx.engine, h[i]) != GRADEX_OK,
                         "'" << tensors[i].key << "' completed although the round failed");
            const std::string error = gradex_last_error();
            std::lock_guard<std::mutex> lock(mutex);
            if (ctx.rank == 1) {
              // The unit reports its lowest failing job: 'a' when both were on workers.
              RANK_REQUIRE(!thrown.empty(), "no worker threw");
              const std::string failed_key = *thrown.begin();
              RANK_REQUIRE(error.find("prepare of tensor '" + failed_key + "': injected failure") !=
                               std::string::npos,
                           error);
            } else {
              RANK_REQUIRE(error.find("rank 1") != std::string::npos &&
                               error.find("injected failure") != std::string::npos &&
                               error.find("prepare of tensor '") != std::string::npos,
                           error);
            }
          }
        }
        return "";
      },
      std::chrono::seconds(120));
  EXPECT_EQ(failures(results), "");
}
