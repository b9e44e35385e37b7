// DiLoCo's shared outer state (gradex_outer_save/load_shared_state), the non-collective start and
// the rollback of a failed exchange, with ranks as forked processes over real UCX and a real TCP
// store:
//   - the shared state is byte-identical on every rank; a newcomer joins a running job (the
//     survivors reconfigure 2 -> 3, the newcomer creates, starts locally and loads a member's
//     shared state) and every rank then holds the same state after every later sync;
//   - round trips are bit-exact; a corrupt, truncated, other-version or mismatched blob is refused
//     (GRADEX_ERR_CORRUPT / GRADEX_ERR_STATE) and changes nothing;
//   - a peer killed during a background exchange: the survivors load the state saved before it
//     (allowed on the failed object), reconfigure, and hold exactly the shared state of before.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include "process_ranks.h"
#include "rank_checks.h"

using namespace gradex::test;

namespace {

gradex_status_t create(gradex_store_t* store, const char* prefix, int rank, int world,
                       gradex_outer_t** outer, const char* bits = nullptr) {
  gradex_engine_options_t o;
  gradex_engine_options_init(&o);
  o.rank = rank;
  o.world_size = world;
  o.store = store;
  o.store_prefix = prefix;
  const char* names[] = {"GRADEX_OUTER_BITS"};
  const char* values[] = {bits};
  if (bits != nullptr) {
    o.config_count = 1;
    o.config_names = names;
    o.config_values = values;
  }
  return gradex_outer_create(&o, outer);
}

gradex_status_t reconfigure(gradex_outer_t* outer, const char* prefix, int rank, int world) {
  gradex_engine_options_t o;
  gradex_engine_options_init(&o);
  o.rank = rank;
  o.world_size = world;
  o.store_prefix = prefix;  // the store given at creation
  return gradex_outer_reconfigure(outer, &o);
}

std::string shared_state(gradex_outer_t* outer, gradex_status_t* status) {
  size_t n = 0;
  *status = gradex_outer_save_shared_state(outer, nullptr, 0, &n);
  if (*status != GRADEX_OK) return "";
  std::string blob(n, '\0');
  *status = gradex_outer_save_shared_state(outer, blob.data(), blob.size(), &n);
  return blob;
}

#define SHARED(outer, out)                      \
  do {                                          \
    gradex_status_t shared_status_;             \
    out = shared_state(outer, &shared_status_); \
    RANK_OK(shared_status_);                    \
  } while (0)

// Two parameter tensors and a buffer; values depend on the process, so ranks drift apart.
struct Model {
  std::vector<float> a = std::vector<float>(700), b = std::vector<float>(301);
  std::vector<float> bn = std::vector<float>(3);
};

std::string add_model(gradex_outer_t* outer, Model& m, int process) {
  for (size_t i = 0; i < m.a.size(); ++i)
    m.a[i] = test_value(11, process, 0, i);
  for (size_t i = 0; i < m.b.size(); ++i)
    m.b[i] = test_value(12, process, 0, i);
  RANK_OK(gradex_outer_add_tensor(outer, "a", m.a.data(), m.a.size(), 0));
  RANK_OK(gradex_outer_add_tensor(outer, "b", m.b.data(), m.b.size(), 0));
  RANK_OK(gradex_outer_add_tensor(outer, "bn", m.bn.data(), m.bn.size(), 1));
  return "";
}

void inner_step(Model& m, int process, int step) {
  for (size_t i = 0; i < m.a.size(); ++i)
    m.a[i] -= 0.05f * (m.a[i] - 0.3f * process + test_value(13, process, step, i));
  for (size_t i = 0; i < m.b.size(); ++i)
    m.b[i] -= 0.05f * (m.b[i] + test_value(14, process, step, i));
  for (auto& x : m.bn)
    x += 1.0f;
}

// Every member's shared state equals member 0's (published under `tag`).
std::string agree(gradex_store_t* s, const std::string& tag, int process, int members,
                  const std::string& mine) {
  store_set(s, tag + "/" + std::to_string(process), mine);
  for (int p = 0; p < members; ++p)
    RANK_REQUIRE(
        store_get(s, tag + "/" + std::to_string(p)) == mine,
        tag << ": process " << p << "'s shared state differs from process " << process << "'s");
  return "";
}

}  // namespace

TEST(OuterShared, IdenticalEverywhereAndANewcomerJoins) {
  auto results = run_ranks(
      3,
      {"GRADEX_OUTER_PERIOD=2", "GRADEX_OUTER_FRAGMENTS=2", "GRADEX_OUTER_BITS=4",
       "GRADEX_TIMEOUT_S=60"},
      [&](RankContext& ctx) -> std::string {
        const int me = ctx.rank;
        gradex_store_t* store = connect_store(me, 3);
        RANK_REQUIRE(store != nullptr, gradex_last_error());
        gradex_outer_t* outer = nullptr;
        Model m;
        std::string blob, err;
        if (me < 2) {
          RANK_OK(create(store, "first/", me, 2, &outer));
          if (!(err = add_model(outer, m, me)).empty()) return err;
          RANK_OK(gradex_outer_start(outer));
          for (int step = 1; step <= 6; ++step) {
            inner_step(m, me, step);
            RANK_OK(gradex_outer_step(outer, nullptr));
            SHARED(outer, blob);
            if (!(err = agree(store, "two/" + std::to_string(step), me, 2, blob)).empty())
              return err;
          }
          if (me == 0) store_set(store, "blob", blob);
          RANK_OK(reconfigure(outer, "second/", me, 3));
        } else {
          RANK_OK(create(store, "second/", 2, 3, &outer));  // with the survivors' reconfiguration
          if (!(err = add_model(outer, m, me)).empty()) return err;
          RANK_OK(gradex_outer_start_local(outer, 0));
          blob = store_get(store, "blob");
          RANK_REQUIRE(!blob.empty(), "no blob");
          RANK_OK(gradex_outer_load_shared_state(outer, blob.data(), blob.size()));
          std::string again;
          SHARED(outer, again);
          RANK_REQUIRE(again == blob, "a loaded shared state does not save back bit for bit");
          // Its model: the global copy (as torchft's recovery gives a peer's parameters).
          RANK_OK(gradex_outer_global(outer, "a", m.a.data(), m.a.size()));
          RANK_OK(gradex_outer_global(outer, "b", m.b.data(), m.b.size()));
        }
        uint64_t count = 0;
        RANK_OK(gradex_outer_step_count(outer, &count));
        RANK_REQUIRE(count == 6, "step count " << count << " after joining, not 6");
        for (int step = 7; step <= 12; ++step) {
          inner_step(m, me, step);
          RANK_OK(gradex_outer_step(outer, nullptr));
          SHARED(outer, blob);
          if (!(err = agree(store, "three/" + std::to_string(step), me, 3, blob)).empty())
            return err;
        }
        RANK_OK(gradex_outer_destroy(outer));
        return "";
      },
      std::chrono::seconds(120), false);
  EXPECT_EQ(failures(results), "");
}

TEST(OuterShared, RoundTripExactAndBadBlobsRefused) {
  auto results = run_ranks(
      1, {"GRADEX_OUTER_PERIOD=2", "GRADEX_TIMEOUT_S=30"},
      [&](RankContext& ctx) -> std::string {
        gradex_store_t* store = connect_store(ctx.rank, 1);
        RANK_REQUIRE(store != nullptr, gradex_last_error());
        gradex_outer_t* outer = nullptr;
        Model m;
        std::string blob, later, now, err;
        RANK_OK(create(store, "x/", 0, 1, &outer));
        if (!(err = add_model(outer, m, 0)).empty()) return err;
        RANK_OK(gradex_outer_start(outer));
        for (int step = 1; step <= 5; ++step) {
          inner_step(m, 0, step);
          RANK_OK(gradex_outer_step(outer, nullptr));
        }
        SHARED(outer, blob);
        for (int step = 6; step <= 9; ++step) {
          inner_step(m, 0, step);
          RANK_OK(gradex_outer_step(outer, nullptr));
        }
        SHARED(outer, later);
        RANK_REQUIRE(later != blob, "the shared state did not change over two syncs");
        // Bad blobs: each is refused and the state stays what it was.
        auto refused = [&](std::string bad, gradex_status_t want, const char* what) -> std::string {
          gradex_status_t s = gradex_outer_load_shared_state(outer, bad.data(), bad.size());
          RANK_REQUIRE(s == want, what << ": status " << s << " (" << gradex_last_error() << ")");
          RANK_REQUIRE(
              std::string(gradex_last_error()).find("DiLoCo shared state") != std::string::npos,
              what << ": " << gradex_last_error());
          std::string after;
          SHARED(outer, after);
          RANK_REQUIRE(after == later, what << ": the refused blob changed the state");
          return "";
        };
        std::string bad = blob;
        bad[bad.size() - 5] ^= 0x10;  // a momentum or global value
        if (!(err = refused(bad, GRADEX_ERR_CORRUPT, "flipped bit")).empty()) return err;
        bad = blob;
        bad[4] = 9;  // format version
        if (!(err = refused(bad, GRADEX_ERR_STATE, "version 9")).empty()) return err;
        bad = blob;
        bad[0] ^= 1;  // magic
        if (!(err = refused(bad, GRADEX_ERR_STATE, "magic")).empty()) return err;
        if (!(err = refused(blob.substr(0, blob.size() - 4), GRADEX_ERR_CORRUPT, "truncated"))
                 .empty())
          return err;
        size_t n = 0;  // the rank's own state is not a shared state
        RANK_OK(gradex_outer_save_state(outer, nullptr, 0, &n));
        std::string v1(n, '\0');
        RANK_OK(gradex_outer_save_state(outer, v1.data(), v1.size(), &n));
        if (!(err = refused(v1, GRADEX_ERR_STATE, "a save_state blob")).empty()) return err;
        // Bit-exact round trip: load the earlier state, run the same steps, same state again.
        RANK_OK(gradex_outer_load_shared_state(outer, blob.data(), blob.size()));
        SHARED(outer, now);
        RANK_REQUIRE(now == blob, "round trip not bit-exact");
        // Mismatched jobs: other bits, other tensors.
        gradex_outer_t* eight = nullptr;
        RANK_OK(create(store, "y/", 0, 1, &eight, "8"));
        Model m8;
        if (!(err = add_model(eight, m8, 0)).empty()) return err;
        RANK_OK(gradex_outer_start_local(eight, 0));
        RANK_REQUIRE(
            gradex_outer_load_shared_state(eight, blob.data(), blob.size()) == GRADEX_ERR_STATE,
            "4-bit state loaded into an 8-bit job");
        RANK_REQUIRE(
            std::string(gradex_last_error()).find("GRADEX_OUTER_BITS") != std::string::npos,
            gradex_last_error());
        gradex_outer_t* other = nullptr;
        RANK_OK(create(store, "z/", 0, 1, &other));
        std::vector<float> a(700), c(302);
        RANK_OK(gradex_outer_add_tensor(other, "a", a.data(), a.size(), 0));
        RANK_OK(gradex_outer_add_tensor(other, "c", c.data(), c.size(), 0));
        RANK_OK(gradex_outer_start_local(other, 0));
        RANK_REQUIRE(
            gradex_outer_load_shared_state(other, blob.data(), blob.size()) == GRADEX_ERR_STATE,
            "state of other tensors loaded");
        RANK_REQUIRE(std::string(gradex_last_error()).find("tensor") != std::string::npos,
                     gradex_last_error());
        RANK_OK(gradex_outer_destroy(other));
        RANK_OK(gradex_outer_destroy(eight));
        RANK_OK(gradex_outer_destroy(outer));
        return "";
      },
      std::chrono::seconds(60), false);
  EXPECT_EQ(failures(results), "");
}

TEST(OuterShared, RollbackAfterPeerKilledMidExchange) {
  auto results = run_ranks(
      3,
      {"GRADEX_OUTER_PERIOD=4", "GRADEX_OUTER_DELAY=3", "GRADEX_OUTER_BITS=8",
       "GRADEX_TIMEOUT_S=10"},
      [&](RankContext& ctx) -> std::string {
        const int me = ctx.rank;
        gradex_store_t* store = connect_store(me, 3);
        RANK_REQUIRE(store != nullptr, gradex_last_error());
        gradex_outer_t* outer = nullptr;
        RANK_OK(create(store, "k/", me, 3, &outer));
        std::vector<float> w(4 << 20);
        for (size_t i = 0; i < w.size(); ++i)
          w[i] = 1.0f + 0.001f * static_cast<float>(i % 97);
        RANK_OK(gradex_outer_add_tensor(outer, "w", w.data(), w.size(), 0));
        RANK_OK(gradex_outer_start(outer));
        std::string before, own, after, err;
        for (int step = 1; step <= 40; ++step) {
          for (auto& x : w)
            x -= 0.001f * static_cast<float>(me + 1);
          if (step == 8) {  // the exchange launched by this step is the one that fails
            SHARED(outer, before);
            size_t n = 0;
            RANK_OK(gradex_outer_save_state(outer, nullptr, 0, &n));
            own.resize(n);
            RANK_OK(gradex_outer_save_state(outer, own.data(), own.size(), &n));
          }
          gradex_status_t s = gradex_outer_step(outer, nullptr);
          if (me == 2 && step == 8) ::kill(::getpid(), SIGKILL);
          if (s == GRADEX_OK) continue;
          RANK_REQUIRE(step > 8 && step <= 11, "failure at step " << step);
          RANK_OK(gradex_outer_load_state(outer, own.data(), own.size()));  // on the failed object
          RANK_REQUIRE(gradex_outer_step(outer, nullptr) == s, "the failure did not stay");
          RANK_OK(reconfigure(outer, "k2/", me, 2));
          SHARED(outer, after);
          RANK_REQUIRE(after == before,
                       "the rolled back state differs from the state before the "
                       "failed exchange");
          // The survivors go on together.
          for (int more = 0; more < 4; ++more)
            RANK_OK(gradex_outer_step(outer, nullptr));
          RANK_OK(gradex_outer_synchronize(outer));
          SHARED(outer, after);
          if (!(err = agree(store, "survivors", me, 2, after)).empty()) return err;
          RANK_OK(gradex_outer_destroy(outer));
          return "";
        }
        return "no failure reported";
      },
      std::chrono::seconds(120), false);
  EXPECT_EQ(results[0], "");
  EXPECT_EQ(results[1], "");
  EXPECT_NE(results[2], "");  // killed
}
