// The negotiator with its cache (message format 3), ranks as threads over real UCX: a steady-state
// round sends bits instead of names; a changed size on a cached key, non-finite flags, differing
// counters and a key only some ranks submit come out exactly as with the full form, identically on
// every rank; a peer speaking another format version is refused by name.
#include <gtest/gtest.h>

#include <mutex>
#include <sstream>
#include <thread>

#include "base/error.h"
#include "comm/collectives.h"
#include "sync/negotiation/negotiator.h"
#include "tests/comm/rank_harness.h"

namespace gradex::test {
namespace {

using std::chrono::milliseconds;
using sync::Announcement;
using sync::Negotiator;
using sync::RoundResult;
using sync::WorkId;
using sync::WorkKind;

// A verdict log line, equal on every rank when the ranks agree.
std::string summary(const RoundResult& r) {
  std::ostringstream s;
  for (const auto& w : r.ready) {
    s << "ready " << int(w.id.kind) << ":" << w.id.key << "@" << w.step
      << (w.steps_differed ? "~" : "") << " nf[";
    for (int q : w.nonfinite_ranks)
      s << q << ",";
    s << "]\n";
  }
  for (const auto& f : r.failed)
    s << "failed " << int(f.id.kind) << ":" << f.id.key << " " << int(f.code) << " " << f.message
      << "\n";
  return s.str();
}

std::string key_name(int i) {
  return "model.layers." + std::to_string(i) + ".mlp.weight";
}

std::vector<Announcement> all_keys(int n, uint64_t step) {
  std::vector<Announcement> a;
  for (int i = 0; i < n; ++i)
    a.push_back({{WorkKind::kGradient, key_name(i)}, 1000u + i, DType::kFloat32, step});
  return a;
}

// Runs `fn(comm, log)` on every rank and expects every rank's log to be the same, and not empty.
void expect_agreement(int world, const std::function<void(comm::Communicator&, std::string&)>& fn) {
  std::vector<std::string> logs(world);
  run_ranks(world, [&](comm::Communicator& comm) { fn(comm, logs[comm.rank()]); });
  EXPECT_FALSE(logs[0].empty());
  for (int r = 1; r < world; ++r)
    EXPECT_EQ(logs[r], logs[0]) << "rank " << r << " disagrees with rank 0";
}

// Control bytes this rank sends per peer in one round.
uint64_t round_bytes(Negotiator& n, comm::Communicator& comm,
                     const std::vector<Announcement>& announce, RoundResult* out = nullptr) {
  const uint64_t before = n.control_bytes();
  RoundResult r = n.round(announce, false);
  if (out) *out = r;
  return (n.control_bytes() - before) / static_cast<uint64_t>(comm.size() - 1);
}

TEST(Negotiator, SteadyStateSendsBitsNotNames) {
  const int N = 96;
  expect_agreement(4, [&](comm::Communicator& comm, std::string& log) {
    Negotiator n(comm, milliseconds(60000));
    RoundResult r;
    // First step: full form (what format 2 sent every step): kind, dtype, flags, numel, step and
    // the key itself, per tensor.
    const uint64_t first = round_bytes(n, comm, all_keys(N, 0), &r);
    EXPECT_GT(first, uint64_t{N} * (19 + 4 + key_name(0).size()));
    ASSERT_EQ(r.ready.size(), size_t{N});
    EXPECT_EQ(n.cached_keys(), size_t{N});
    log += summary(r);
    for (uint64_t step = 1; step <= 5; ++step) {
      const uint64_t bytes = round_bytes(n, comm, all_keys(N, step), &r);
      // 6 bytes of header and counts, the cache's fingerprint, a first id, N announced bits.
      EXPECT_LE(bytes, 6u + 4u + 1u + N / 8) << "step " << step;
      ASSERT_EQ(r.ready.size(), size_t{N});
      for (const auto& w : r.ready)
        EXPECT_TRUE(w.step == step && !w.steps_differed && w.nonfinite_ranks.empty());
      log += summary(r);
    }
    // Ranks submit in different orders: each announces a third of the keys per round, a
    // different third on each rank; every key is ready once all have, the same everywhere.
    for (int round = 0; round < 4; ++round) {
      std::vector<Announcement> some;
      for (const Announcement& a : all_keys(N, 6)) {
        const int i = std::stoi(a.id.key.substr(13));
        if ((i + comm.rank()) % 3 == round) some.push_back(a);
      }
      EXPECT_LE(round_bytes(n, comm, some, &r), 6u + 4u + 2u + N / 8);
      log += "round " + std::to_string(round) + "\n" + summary(r);
    }
    EXPECT_EQ(n.outstanding(), 0u);
    // An idle round: 6 bytes.
    EXPECT_EQ(round_bytes(n, comm, {}), 6u);
  });
}

// A round is one message to each peer (one round trip) while the messages fit the inline maximum;
// a first round larger than the maximum announces its size and follows in a second message, with
// the same verdicts.
TEST(Negotiator, RoundTakesOneMessagePerPeer) {
  const int P = 4, N = 96;
  for (size_t inline_max : {size_t{64} << 10, size_t{256}}) {
    comm::CommOptions o = test_options();
    o.allgather_inline_bytes = inline_max;
    std::vector<std::string> logs(P);
    run_ranks(
        P,
        [&](comm::Communicator& inner) {
          CountingCommunicator comm(inner);
          Negotiator n(comm, milliseconds(60000));
          uint64_t before = comm.sends;
          RoundResult r = n.round(all_keys(N, 0), false);  // full form: ~5 KB per rank
          const uint64_t first = comm.sends - before;
          EXPECT_EQ(first, uint64_t(inline_max > 256 ? P - 1 : 2 * (P - 1))) << inline_max;
          logs[inner.rank()] += summary(r);
          for (uint64_t step = 1; step <= 3; ++step) {
            before = comm.sends;
            r = n.round(all_keys(N, step), false);  // cached: ~20 bytes
            EXPECT_EQ(comm.sends - before, uint64_t(P - 1)) << inline_max << " step " << step;
            ASSERT_EQ(r.ready.size(), size_t{N});
            logs[inner.rank()] += summary(r);
          }
        },
        o);
    for (int r = 1; r < P; ++r)
      EXPECT_EQ(logs[r], logs[0]) << "rank " << r;
  }
}

TEST(Negotiator, ChangedSizeOfACachedKeyFailsAsAMismatchEverywhere) {
  expect_agreement(3, [&](comm::Communicator& comm, std::string& log) {
    Negotiator n(comm, milliseconds(60000));
    const int N = 8;
    RoundResult r = n.round(all_keys(N, 0), false);
    ASSERT_EQ(n.cached_keys(), size_t{N});
    // Rank 1 announces key 3 with another size (in full form), and key 5 one round before the
    // others with another dtype; the others announce both as cached bits.
    std::vector<Announcement> a = all_keys(N, 1);
    if (comm.rank() == 1) {
      a[3].numel += 1;
      a[5].dtype = DType::kFloat16;
      r = n.round({a[5]}, false);
      EXPECT_TRUE(r.failed.empty());
      a.erase(a.begin() + 5);
    } else {
      r = n.round({}, false);
    }
    r = n.round(a, false);
    ASSERT_EQ(r.failed.size(), 2u);
    EXPECT_EQ(r.failed[0].code, ErrorCode::kMismatch);
    EXPECT_EQ(r.failed[0].message,
              "tensor '" + key_name(3) +
                  "' differs across ranks (rank 0: 1003 x fp32, rank 1: 1004 x fp32, rank 2: "
                  "1003 x fp32)");
    EXPECT_EQ(r.failed[1].message,
              "tensor '" + key_name(5) +
                  "' differs across ranks (rank 0: 1005 x fp32, rank 1: 1005 x fp16, rank 2: "
                  "1005 x fp32)");
    EXPECT_EQ(r.ready.size(), size_t{N - 2});
    EXPECT_EQ(n.cached_keys(), size_t{N - 2});  // failed keys leave the cache
    log += summary(r);
    // The same keys announced consistently again: ready, and cached again.
    r = n.round(all_keys(N, 1), false);
    EXPECT_EQ(r.ready.size(), size_t{N});
    EXPECT_TRUE(r.failed.empty());
    EXPECT_EQ(n.cached_keys(), size_t{N});
    log += summary(r);
  });
}

TEST(Negotiator, NonFiniteFlagsAndDifferingCountersOfCachedKeys) {
  expect_agreement(3, [&](comm::Communicator& comm, std::string& log) {
    Negotiator n(comm, milliseconds(60000));
    auto announce = [&](uint64_t step) {
      std::vector<Announcement> a = all_keys(4, step);
      a.push_back({{WorkKind::kAverage, "params"}, 50, DType::kBFloat16, 0});
      return a;
    };
    n.round(announce(7), false);
    ASSERT_EQ(n.cached_keys(), 5u);
    std::vector<Announcement> a = announce(8);
    if (comm.rank() == 2) a[0].nonfinite = a[1].nonfinite = true;
    if (comm.rank() == 0) a[1].nonfinite = true;
    if (comm.rank() == 1) a[2].step = 13;  // ahead: the agreed step follows the largest
    if (comm.rank() == 0) a[3].step = 0;   // restored from an older checkpoint
    RoundResult r;
    const uint64_t bytes = round_bytes(n, comm, a, &r);
    EXPECT_LE(bytes, 6u + 4u + 1u + 2u + 2u);  // bits, non-finite bits, one exception at most
    ASSERT_EQ(r.ready.size(), 5u);
    EXPECT_EQ(r.ready[0].nonfinite_ranks, (std::vector<int>{2}));
    EXPECT_EQ(r.ready[1].nonfinite_ranks, (std::vector<int>{0, 2}));
    EXPECT_TRUE(r.ready[2].step == 13 && r.ready[2].steps_differed);
    EXPECT_TRUE(r.ready[3].step == 8 && r.ready[3].steps_differed);
    EXPECT_TRUE(r.ready[0].step == 8 && !r.ready[0].steps_differed);
    EXPECT_TRUE(r.ready[4].id.kind == WorkKind::kAverage && r.ready[4].step == 0 &&
                !r.ready[4].steps_differed);
    log += summary(r);
    // The next expected counter follows the agreed step: 14 for key 2, 9 for the others.
    a = announce(9);
    a[2].step = 14;
    r = n.round(a, false);
    for (const auto& w : r.ready)
      EXPECT_TRUE(!w.steps_differed && w.nonfinite_ranks.empty()) << w.id.key;
    EXPECT_EQ(r.ready[2].step, 14u);
    log += summary(r);
  });
}

TEST(Negotiator, CachedKeyOnlySomeRanksSubmitTimesOutByRankZerosAbort) {
  for (int missing : {2, 0}) {
    expect_agreement(3, [&](comm::Communicator& comm, std::string& log) {
      Negotiator n(comm, milliseconds(300));
      n.round(all_keys(3, 0), false);
      ASSERT_EQ(n.cached_keys(), 3u);
      std::vector<Announcement> a = all_keys(3, 1);
      if (comm.rank() == missing) a.pop_back();
      RoundResult r = n.round(a, false);
      EXPECT_EQ(r.ready.size(), 2u);
      int rounds = 0;
      while (r.failed.empty()) {
        ASSERT_LT(++rounds, 2000) << "no timeout verdict";
        std::this_thread::sleep_for(milliseconds(5));
        r = n.round({}, false);
      }
      ASSERT_EQ(r.failed.size(), 1u);
      EXPECT_EQ(r.failed[0].code, ErrorCode::kTimeout);
      const std::string others = missing == 0 ? "[1, 2]" : "[0, 1]";
      EXPECT_EQ(r.failed[0].message, "tensor '" + key_name(2) + "' was submitted by ranks " +
                                         others + " but not by ranks [" + std::to_string(missing) +
                                         "] within 0.3000 s (GRADEX_TIMEOUT_S)");
      EXPECT_EQ(n.outstanding(), 0u);
      EXPECT_EQ(n.cached_keys(), 2u);
      log += summary(r);
      // Announced by everyone again: ready (and cached) again.
      r = n.round(all_keys(3, 1), false);
      EXPECT_EQ(r.ready.size(), 3u);
      EXPECT_EQ(n.cached_keys(), 3u);
      log += summary(r);
    });
  }
}

TEST(Negotiator, FullCacheKeepsTheFullFormForTheRest) {
  expect_agreement(2, [&](comm::Communicator& comm, std::string& log) {
    Negotiator n(comm, milliseconds(60000), /*cache_capacity=*/4);
    RoundResult r;
    n.round(all_keys(10, 0), false);
    EXPECT_EQ(n.cached_keys(), 4u);
    const uint64_t bytes = round_bytes(n, comm, all_keys(10, 1), &r);
    EXPECT_GT(bytes, 6u * (19 + 4 + key_name(0).size()));
    EXPECT_LT(bytes, 7u * (19 + 4 + key_name(0).size()));
    EXPECT_EQ(r.ready.size(), 10u);
    for (const auto& w : r.ready)
      EXPECT_TRUE(w.step == 1 && !w.steps_differed);
    log += summary(r);
  });
}

TEST(Negotiator, PeerWithAnotherFormatVersionIsRefusedByName) {
  std::vector<std::string> errors(3);
  run_ranks(3, [&](comm::Communicator& comm) {
    if (comm.rank() == 1) {
      // A format-2 message (version 2, no flags, no announcements, no aborts), in the one-round
      // framing so that it reaches the version check.
      const std::vector<uint8_t> v2 = {2, 0, 0, 0, 0, 0, 0, 0, 0, 0};
      std::vector<comm::Bytes> all;
      comm::AllgathervOptions gather;
      gather.inline_max_bytes = comm.options().allgather_inline_bytes;
      comm::allgatherv_inline(comm, v2.data(), v2.size(), all, gather, "negotiation");
      return;
    }
    Negotiator n(comm, milliseconds(60000));
    try {
      n.round(all_keys(2, 0), false);
    } catch (const CorruptPayload& e) {
      errors[comm.rank()] = e.what();
    }
  });
  for (int r : {0, 2})
    EXPECT_NE(errors[r].find("negotiation message from rank 1 has version 2, expected 3"),
              std::string::npos)
        << errors[r];
}

// Ranks 0 and 1 announce a key with different sizes before rank 2 does: every rank gets the
// mismatch at once, and the entry waits for rank 2's announcement (awaits_announcement on rank 2
// alone), which completes it and leaves nothing outstanding anywhere; then every rank may leave in
// one round. (The engine announces such a key although the verdict already answered its handle:
// an entry left waiting kept every rank's shutdown waiting for rank 0's timeout abort.)
TEST(Negotiator, MismatchBeforeARankAnnouncedWaitsForItsAnnouncementThenLeavesNothing) {
  expect_agreement(3, [&](comm::Communicator& comm, std::string& log) {
    Negotiator n(comm, milliseconds(60000));
    const WorkId id{WorkKind::kGradient, "w"};
    const Announcement a{id, comm.rank() == 1 ? 101u : 100u, DType::kFloat32, 0};
    RoundResult r = n.round(comm.rank() == 2 ? std::vector<Announcement>{} : std::vector{a}, false);
    ASSERT_EQ(r.failed.size(), 1u);
    EXPECT_EQ(r.failed[0].code, ErrorCode::kMismatch);
    EXPECT_EQ(n.outstanding(), 1u);
    EXPECT_EQ(n.awaits_announcement(id), comm.rank() == 2);
    log += summary(r);
    r = n.round(comm.rank() == 2 ? std::vector{a} : std::vector<Announcement>{}, true);
    log += summary(r);
    EXPECT_EQ(n.outstanding(), 0u);
    EXPECT_FALSE(n.awaits_announcement(id));
    EXPECT_TRUE(r.all_leaving);
  });
}

}  // namespace
}  // namespace gradex::test
