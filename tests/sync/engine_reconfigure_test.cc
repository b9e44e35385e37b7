// A reconfigurable engine, with real processes over real UCX and a real TCP
// store (gradex_store_connect), driven through the C API:
//   - 3 ranks, one dies (its process exits); the survivors' next exchange fails, they reconfigure
//     to 2 ranks under a new prefix and continue: their saved state (DGC residual and momentum,
//     dense momentum, counters) is bit-identical to what it was before the death, and their
//     results are identical across ranks;
//   - a newcomer joins (2 -> 3) with empty state, or with a state a member saved after the
//     reconfiguration;
//   - gradex_engine_abort from another thread fails the in-flight handle with the reason on this
//     rank and on its peer; a reconfiguration fails in-flight work of the old membership with
//     GRADEX_ERR_ABORTED (GRADEX_TIMEOUT_S is 300 s: a hang would fail the ctest timeout instead);
//   - bad reconfigurations: a config entry that differs, the current store and prefix again.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "process_ranks.h"
#include "rank_checks.h"

using namespace gradex::test;

namespace {

constexpr uint64_t kSparseN = 4096;  // DGC (GRADEX_DENSE_THRESHOLD below)
constexpr uint64_t kDenseN = 300;    // dense, with gradex's momentum
const std::vector<std::string> kEnv = {"GRADEX_TIMEOUT_S=300", "GRADEX_DENSE_THRESHOLD=1024",
                                       "GRADEX_SPARSITY=0.99", "GRADEX_MOMENTUM=0.9"};

gradex_status_t create(gradex_store_t* store, const char* prefix, int rank, int world,
                       gradex_engine_t** engine) {
  gradex_engine_options_t o;
  gradex_engine_options_init(&o);
  o.rank = rank;
  o.world_size = world;
  o.store = store;
  o.store_prefix = prefix;
  return gradex_engine_create(&o, engine);
}

gradex_status_t reconfigure(gradex_engine_t* engine, const char* prefix, int rank, int world) {
  gradex_engine_options_t o;
  gradex_engine_options_init(&o);
  o.rank = rank;
  o.world_size = world;
  o.store_prefix = prefix;  // store NULL: the one given at creation
  return gradex_engine_reconfigure(engine, &o);
}

// Every process of `members` has reached `name`.
void barrier(gradex_store_t* s, const std::string& name, int me, const std::vector<int>& members) {
  store_set(s, name + "/" + std::to_string(me), "1");
  for (int m : members)
    store_get(s, name + "/" + std::to_string(m));
}

std::string register_tensors(gradex_engine_t* e) {
  RANK_OK(gradex_register_tensor(e, "a", kSparseN, GRADEX_FLOAT32, GRADEX_DEVICE_CPU));
  RANK_OK(gradex_register_tensor(e, "d", kDenseN, GRADEX_FLOAT32, GRADEX_DEVICE_CPU));
  return "";
}

uint64_t fnv(const void* data, size_t n, uint64_t h = 1469598103934665603ull) {
  const auto* p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < n; ++i)
    h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

// One step of both tensors (gradients depend on the process and the step); *digest: the results.
std::string step(gradex_engine_t* e, int process, int s, uint64_t* digest) {
  std::vector<float> a = test_vector(7, process, s, kSparseN);
  std::vector<float> d = test_vector(8, process, s, kDenseN);
  gradex_handle_t ha = 0, hd = 0;
  RANK_OK(gradex_submit(e, "a", a.data(), &ha));
  RANK_OK(gradex_submit(e, "d", d.data(), &hd));
  RANK_OK(gradex_wait(e, ha));
  RANK_OK(gradex_wait(e, hd));
  RANK_OK(gradex_end_step(e, nullptr));
  *digest = fnv(d.data(), d.size() * 4, fnv(a.data(), a.size() * 4));
  return "";
}

// `steps` steps from step `first`; every member's results must equal the others' (published under
// `tag` in the store).
std::string steps_agree(gradex_engine_t* e, gradex_store_t* s, const std::string& tag, int process,
                        const std::vector<int>& members, int first, int steps) {
  for (int i = first; i < first + steps; ++i) {
    uint64_t digest = 0;
    std::string failure = step(e, process, i, &digest);
    if (!failure.empty()) return failure;
    const std::string key = tag + "/" + std::to_string(i) + "/";
    store_set(s, key + std::to_string(process), std::to_string(digest));
    for (int m : members) {
      const std::string other = store_get(s, key + std::to_string(m));
      RANK_REQUIRE(other == std::to_string(digest), "step " << i << ": process " << m
                                                            << " has result " << other
                                                            << ", this one " << digest);
    }
  }
  return "";
}

// A saved state without its membership fields (world size and rank: bytes 8..16 of the header).
std::vector<uint8_t> without_membership(std::vector<uint8_t> blob) {
  if (blob.size() >= 16) blob.erase(blob.begin() + 8, blob.begin() + 16);
  return blob;
}

uint64_t saved_steps(const std::vector<uint8_t>& blob) {
  uint64_t steps = ~0ull;
  if (blob.size() >= 24) std::memcpy(&steps, blob.data() + 16, 8);
  return steps;
}

std::string check_membership(gradex_engine_t* e, int rank, int world) {
  int32_t r = -1, w = -1;
  RANK_OK(gradex_engine_rank(e, &r, &w));
  RANK_REQUIRE(r == rank && w == world, "membership is rank " << r << " of " << w << ", expected "
                                                              << rank << " of " << world);
  return "";
}

// Runs fn with this process's store, then destroys it; process 0 serves the store and leaves after
// every other process of `members` has said it no longer needs it.
std::string with_store(int process, int processes, const std::vector<int>& members,
                       const std::function<std::string(gradex_store_t*)>& fn) {
  std::string error;
  gradex_store_t* store = connect_store(process, processes, &error);
  if (!store) return "store: " + error;
  std::string result = fn(store);
  if (process != 0) {
    store_set(store, "left/" + std::to_string(process), "1");
  } else {
    for (int m : members)
      if (m != 0) store_get(store, "left/" + std::to_string(m));
  }
  gradex_store_destroy(store);
  return result;
}

}  // namespace

TEST(EngineReconfigure, SurvivorsKeepTheirStateAfterAPeerDies) {
  auto results = run_ranks(
      3, kEnv,
      [](RankContext& ctx) -> std::string {
        const int p = ctx.rank;
        return with_store(p, 3, {0, 2}, [&](gradex_store_t* store) -> std::string {
          gradex_engine_t* e = nullptr;
          RANK_OK(create(store, "m1/", p, 3, &e));
          std::string failure = register_tensors(e);
          if (failure.empty()) failure = steps_agree(e, store, "m1", p, {0, 1, 2}, 0, 4);
          if (!failure.empty()) return failure;
          std::vector<uint8_t> before;
          failure = save_state(e, &before);
          if (!failure.empty()) return failure;
          barrier(store, "saved", p, {0, 1, 2});
          if (p == 1) ::_exit(0);  // dies without leaving: its endpoints fail under the others
          // The next exchange fails: negotiation needs the dead rank (no state is touched).
          std::vector<float> a = test_vector(7, p, 99, kSparseN);
          gradex_handle_t h = 0;
          if (gradex_submit(e, "a", a.data(), &h) == GRADEX_OK)
            RANK_REQUIRE(gradex_wait(e, h) != GRADEX_OK, "an exchange with a dead rank succeeded");
          const int rank = p == 0 ? 0 : 1;
          RANK_OK(reconfigure(e, "m2/", rank, 2));
          failure = check_membership(e, rank, 2);
          if (!failure.empty()) return failure;
          std::vector<uint8_t> after;
          failure = save_state(e, &after);  // refused while the death's error were still standing
          if (!failure.empty()) return failure;
          RANK_REQUIRE(without_membership(after) == without_membership(before),
                       "the state changed across the reconfiguration ("
                           << before.size() << " -> " << after.size() << " bytes)");
          failure = steps_agree(e, store, "m2", p, {0, 2}, 4, 4);
          if (!failure.empty()) return failure;
          RANK_OK(gradex_engine_destroy(e));
          return "";
        });
      },
      std::chrono::seconds(240), false);
  EXPECT_EQ(failures(results), "");
}

class EngineReconfigureGrow : public ::testing::TestWithParam<bool> {};

TEST_P(EngineReconfigureGrow, ANewcomerJoins) {
  const bool loaded = GetParam();
  auto results = run_ranks(
      3, kEnv,
      [loaded](RankContext& ctx) -> std::string {
        const int p = ctx.rank;
        return with_store(p, 3, {0, 1, 2}, [&](gradex_store_t* store) -> std::string {
          gradex_engine_t* e = nullptr;
          std::string failure;
          std::vector<uint8_t> before;
          if (p < 2) {
            RANK_OK(create(store, "n1/", p, 2, &e));
            failure = register_tensors(e);
            if (failure.empty()) failure = steps_agree(e, store, "n1", p, {0, 1}, 0, 4);
            if (failure.empty()) failure = save_state(e, &before);
            if (!failure.empty()) return failure;
          }
          barrier(store, "grow", p, {0, 1, 2});
          if (p < 2) {
            RANK_OK(reconfigure(e, "n2/", p, 3));
            std::vector<uint8_t> after;
            failure = save_state(e, &after);
            if (!failure.empty()) return failure;
            RANK_REQUIRE(without_membership(after) == without_membership(before),
                         "a survivor's state changed when the newcomer joined");
            if (loaded && p == 0)
              store_set(store, "state0", std::string(after.begin(), after.end()));
          } else {
            RANK_OK(create(store, "n2/", 2, 3, &e));  // the newcomer: created into the membership
            failure = register_tensors(e);
            std::vector<uint8_t> fresh;
            if (failure.empty()) failure = save_state(e, &fresh);
            if (!failure.empty()) return failure;
            RANK_REQUIRE(saved_steps(fresh) == 0, "a newcomer starts at step 0");
            if (loaded) {
              const std::string peer = store_get(store, "state0");
              RANK_REQUIRE(!peer.empty(), "rank 0's state did not arrive");
              RANK_OK(gradex_load_state(e, peer.data(), peer.size()));
              std::vector<uint8_t> mine;
              failure = save_state(e, &mine);
              if (!failure.empty()) return failure;
              RANK_REQUIRE(without_membership(mine) ==
                               without_membership(std::vector<uint8_t>(peer.begin(), peer.end())),
                           "the loaded state differs from rank 0's");
            }
          }
          failure = check_membership(e, p, 3);
          if (failure.empty()) failure = steps_agree(e, store, "n2", p, {0, 1, 2}, 4, 4);
          if (!failure.empty()) return failure;
          RANK_OK(gradex_engine_destroy(e));
          return "";
        });
      },
      std::chrono::seconds(240), false);
  EXPECT_EQ(failures(results), "");
}

INSTANTIATE_TEST_SUITE_P(EmptyOrLoadedState, EngineReconfigureGrow, ::testing::Values(false, true));

TEST(EngineReconfigure, AbortAndReconfigureFailInFlightWork) {
  auto results = run_ranks(
      2, kEnv,
      [](RankContext& ctx) -> std::string {
        const int p = ctx.rank;
        return with_store(p, 2, {0, 1}, [&](gradex_store_t* store) -> std::string {
          gradex_engine_t* e = nullptr;
          RANK_OK(create(store, "x1/", p, 2, &e));
          std::string failure = register_tensors(e);
          if (failure.empty()) failure = steps_agree(e, store, "x1", p, {0, 1}, 0, 2);
          if (!failure.empty()) return failure;
          RANK_OK(gradex_register_tensor(e, "only0", 64, GRADEX_FLOAT32, GRADEX_DEVICE_CPU));
          std::vector<float> only0(64, 1.0f);
          std::vector<float> d(kDenseN, 1.0f);
          gradex_handle_t h = 0;
          // 1. gradex_engine_abort from another thread while this rank waits for a key its peer
          //    never submits: both ranks fail with the reason, the engine is usable afterwards.
          if (p == 0) {
            RANK_OK(gradex_submit(e, "only0", only0.data(), &h));
            barrier(store, "submitted", p, {0, 1});
            std::thread aborter([e] {
              std::this_thread::sleep_for(std::chrono::milliseconds(200));
              gradex_engine_abort(e, "quorum lost in test");
            });
            const gradex_status_t s = gradex_wait(e, h);
            const std::string message = gradex_last_error();
            aborter.join();
            RANK_REQUIRE(s == GRADEX_ERR_ABORTED, "wait returned " << s << ": " << message);
            RANK_REQUIRE(message.find("quorum lost in test") != std::string::npos, message);
            RANK_REQUIRE(gradex_submit(e, "d", d.data(), &h) == GRADEX_ERR_ABORTED,
                         "a submission after abort was accepted");
          } else {
            barrier(store, "submitted", p, {0, 1});
            // The peer's notice fails this rank's next exchange with the same reason.
            gradex_status_t s = gradex_submit(e, "d", d.data(), &h);
            if (s == GRADEX_OK) s = gradex_wait(e, h);
            const std::string message = gradex_last_error();
            RANK_REQUIRE(s == GRADEX_ERR_ABORTED, "status " << s << ": " << message);
            RANK_REQUIRE(message.find("quorum lost in test") != std::string::npos, message);
          }
          RANK_OK(reconfigure(e, "x2/", p, 2));
          failure = steps_agree(e, store, "x2", p, {0, 1}, 2, 2);
          if (!failure.empty()) return failure;
          // 2. A reconfiguration fails the old membership's in-flight work with ABORTED.
          if (p == 0) RANK_OK(gradex_submit(e, "only0", only0.data(), &h));
          barrier(store, "submitted2", p, {0, 1});
          RANK_OK(reconfigure(e, "x3/", 1 - p, 2));  // ranks swap
          if (p == 0) {
            const gradex_status_t s = gradex_wait(e, h);
            RANK_REQUIRE(s == GRADEX_ERR_ABORTED,
                         "wait returned " << s << ": " << gradex_last_error());
          }
          failure = check_membership(e, 1 - p, 2);
          if (failure.empty()) failure = steps_agree(e, store, "x3", p, {0, 1}, 4, 2);
          if (!failure.empty()) return failure;
          RANK_OK(gradex_engine_destroy(e));
          return "";
        });
      },
      std::chrono::seconds(240), false);
  EXPECT_EQ(failures(results), "");
}

TEST(EngineReconfigure, RejectsAChangedConfigurationAndTheCurrentPrefix) {
  auto results = run_ranks(
      1, kEnv,
      [](RankContext&) -> std::string {
        return with_store(0, 1, {0}, [&](gradex_store_t* store) -> std::string {
          gradex_engine_t* e = nullptr;
          RANK_OK(create(store, "c1/", 0, 1, &e));
          gradex_engine_options_t o;
          gradex_engine_options_init(&o);
          o.rank = 0;
          o.world_size = 1;
          o.store_prefix = "c2/";
          const char* names[] = {"GRADEX_SPARSITY"};
          const char* other[] = {"0.9"};
          o.config_count = 1;
          o.config_names = names;
          o.config_values = other;
          gradex_status_t s = gradex_engine_reconfigure(e, &o);
          std::string message = gradex_last_error();
          RANK_REQUIRE(s == GRADEX_ERR_CONFIG, "status " << s << ": " << message);
          RANK_REQUIRE(message.find("GRADEX_SPARSITY") != std::string::npos, message);
          const char* same[] = {"0.990"};  // equal once parsed
          o.config_values = same;
          o.store_prefix = "c1/";
          s = gradex_engine_reconfigure(e, &o);
          message = gradex_last_error();
          RANK_REQUIRE(s == GRADEX_ERR_INVALID_ARGUMENT, "status " << s << ": " << message);
          RANK_REQUIRE(message.find("c1/") != std::string::npos, message);
          o.store_prefix = "c2/";
          RANK_OK(gradex_engine_reconfigure(e, &o));
          std::string failure = register_tensors(e);
          if (failure.empty()) failure = steps_agree(e, store, "c2", 0, {0}, 0, 2);
          if (!failure.empty()) return failure;
          RANK_OK(gradex_engine_destroy(e));
          return "";
        });
      },
      std::chrono::seconds(120), false);
  EXPECT_EQ(failures(results), "");
}
