// Step transactions for torchft's commit protocol. Two ranks over real UCX and a
// real TCP store: N steps, gradex_state_snapshot, one step that does not commit,
// gradex_state_rollback, then the rest of the run; its results and its final state must equal
// bit for bit those of a run that never took the rejected step. Variants: the rejected step
// completed normally, or it was followed by gradex_engine_abort and a reconfiguration (a failed
// quorum: roll back, reconfigure, continue).
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "process_ranks.h"
#include "rank_checks.h"

using namespace gradex::test;

namespace {

constexpr uint64_t kSparseN = 4096;
constexpr uint64_t kDenseN = 300;
constexpr int kBefore = 5;  // steps before the snapshot
constexpr int kAfter = 4;   // steps after the rollback
const std::vector<std::string> kEnv = {"GRADEX_TIMEOUT_S=300", "GRADEX_DENSE_THRESHOLD=1024",
                                       "GRADEX_SPARSITY=0.99", "GRADEX_MOMENTUM=0.9",
                                       "GRADEX_WARMUP_STEPS=3"};

struct RunResult {
  std::vector<std::vector<float>> results;  // per step after the snapshot: a then d
  std::vector<uint8_t> final_state;
};

std::string create(gradex_store_t* store, const char* prefix, int rank, gradex_engine_t** e) {
  gradex_engine_options_t o;
  gradex_engine_options_init(&o);
  o.rank = rank;
  o.world_size = 2;
  o.store = store;
  o.store_prefix = prefix;
  RANK_OK(gradex_engine_create(&o, e));
  RANK_OK(gradex_register_tensor(*e, "a", kSparseN, GRADEX_FLOAT32, GRADEX_DEVICE_CPU));
  RANK_OK(gradex_register_tensor(*e, "d", kDenseN, GRADEX_FLOAT32, GRADEX_DEVICE_CPU));
  return "";
}

// One step with gradients of (seed, rank, s); the averages are appended to `out` when given.
std::string step(gradex_engine_t* e, int rank, uint64_t seed, int s,
                 std::vector<std::vector<float>>* out) {
  std::vector<float> a = test_vector(seed, rank, s, kSparseN);
  std::vector<float> d = test_vector(seed + 1, rank, s, kDenseN);
  gradex_handle_t ha = 0, hd = 0;
  RANK_OK(gradex_submit(e, "a", a.data(), &ha));
  RANK_OK(gradex_submit(e, "d", d.data(), &hd));
  RANK_OK(gradex_wait(e, ha));
  RANK_OK(gradex_wait(e, hd));
  RANK_OK(gradex_end_step(e, nullptr));
  if (out) {
    a.insert(a.end(), d.begin(), d.end());
    out->push_back(std::move(a));
  }
  return "";
}

// `transaction`: snapshot after kBefore steps, a rejected step (other gradients), rollback; with
// `abort_and_reconfigure` the rejected step is followed by an abort and the rollback by a
// reconfiguration under a new prefix.
std::string run(gradex_store_t* store, const char* prefix, int rank, bool transaction,
                bool abort_and_reconfigure, RunResult* result) {
  gradex_engine_t* e = nullptr;
  std::string failure = create(store, prefix, rank, &e);
  for (int s = 0; failure.empty() && s < kBefore; ++s)
    failure = step(e, rank, 11, s, nullptr);
  if (!failure.empty()) return failure;
  if (transaction) {
    RANK_OK(gradex_state_snapshot(e));
    RANK_OK(gradex_state_snapshot(e));  // again: the buffers are reused, the snapshot the same
    failure = step(e, rank, 99, kBefore, nullptr);  // the step that does not commit
    if (!failure.empty()) return failure;
    std::vector<uint8_t> changed;
    failure = save_state(e, &changed);
    if (!failure.empty()) return failure;
    if (abort_and_reconfigure) {
      // Both ranks have saved (an abort fails the peer's engine too), then both abort.
      const std::string mine = std::string(prefix) + "saved/" + std::to_string(rank);
      const std::string theirs = std::string(prefix) + "saved/" + std::to_string(1 - rank);
      store->set(store->context, mine.c_str(), "1", 1);
      void* value = nullptr;
      size_t length = 0;
      RANK_REQUIRE(store->get(store->context, theirs.c_str(), 120000, &value, &length) == 0,
                   "the peer did not save");
      store->release(store->context, value);
      RANK_OK(gradex_engine_abort(e, "the step did not commit"));
    }
    RANK_OK(gradex_state_rollback(e));
    if (abort_and_reconfigure) {
      gradex_engine_options_t o;
      gradex_engine_options_init(&o);
      o.rank = rank;
      o.world_size = 2;
      const std::string again = std::string(prefix) + "again/";
      o.store_prefix = again.c_str();
      RANK_OK(gradex_engine_reconfigure(e, &o));
    }
    std::vector<uint8_t> restored;
    failure = save_state(e, &restored);
    if (!failure.empty()) return failure;
    RANK_REQUIRE(restored != changed, "the rejected step changed nothing (the test cannot fail)");
  }
  for (int s = kBefore; failure.empty() && s < kBefore + kAfter; ++s)
    failure = step(e, rank, 11, s, &result->results);
  if (failure.empty()) failure = save_state(e, &result->final_state);
  if (!failure.empty()) return failure;
  RANK_OK(gradex_engine_destroy(e));
  return "";
}

class EngineTransaction : public ::testing::TestWithParam<bool> {};

TEST_P(EngineTransaction, RollbackLeavesStateAsIfTheStepNeverRan) {
  const bool abort_and_reconfigure = GetParam();
  auto results = run_ranks(
      2, kEnv,
      [abort_and_reconfigure](RankContext& ctx) -> std::string {
        gradex_engine_options_t o;
        gradex_engine_options_init(&o);
        o.rank = ctx.rank;
        o.world_size = 2;
        gradex_store_t* store = nullptr;
        RANK_OK(gradex_store_connect(&o, &store));
        RunResult reference, rolled_back;
        std::string failure = run(store, "ref/", ctx.rank, false, false, &reference);
        if (failure.empty())
          failure = run(store, "tx/", ctx.rank, true, abort_and_reconfigure, &rolled_back);
        if (failure.empty()) {
          for (size_t s = 0; s < reference.results.size() && failure.empty(); ++s)
            if (rolled_back.results.size() <= s || rolled_back.results[s] != reference.results[s])
              failure = "step " + std::to_string(kBefore + s) + " after the rollback differs";
          if (failure.empty() && rolled_back.final_state != reference.final_state)
            failure = "the final state differs from the run without the rejected step";
        }
        // Rank 0 serves the store: the other rank leaves first.
        const char* key = "done";
        if (ctx.rank == 1) {
          store->set(store->context, key, "1", 1);
        } else {
          void* value = nullptr;
          size_t length = 0;
          if (store->get(store->context, key, 120000, &value, &length) == 0)
            store->release(store->context, value);
        }
        gradex_store_destroy(store);
        return failure;
      },
      std::chrono::seconds(240), false);
  EXPECT_EQ(failures(results), "");
}

INSTANTIATE_TEST_SUITE_P(CommittedOrAborted, EngineTransaction, ::testing::Values(false, true));

TEST(EngineTransaction, RollbackWithoutSnapshotIsAStateError) {
  auto results = run_ranks(1, kEnv, [](RankContext& ctx) -> std::string {
    RANK_REQUIRE(gradex_state_rollback(ctx.engine) == GRADEX_ERR_STATE, gradex_last_error());
    return "";
  });
  EXPECT_EQ(failures(results), "");
}

}  // namespace
