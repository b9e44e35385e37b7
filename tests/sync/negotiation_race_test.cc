// Negotiation verdicts, ranks as threads over real UCX: a rank whose first
// announcement of a key lands in the very round of rank 0's timeout abort of it is answered by the
// abort and leaves no entry behind; parameter averages announced by ranks with and without a
// LocalSGD anchor fail as a mismatch naming both groups (full and cached form alike).
#include <gtest/gtest.h>

#include <thread>

#include "base/error.h"
#include "sync/negotiation/negotiator.h"
#include "tests/comm/rank_harness.h"

namespace gradex::test {
namespace {

using std::chrono::milliseconds;
using sync::Announcement;
using sync::Negotiator;
using sync::RoundResult;
using sync::WorkKind;

Announcement gradient(const std::string& key) {
  return {{WorkKind::kGradient, key}, 100, DType::kFloat32, 0};
}

Announcement average(const std::string& key, bool has_anchor) {
  return {{WorkKind::kAverage, key}, 100, DType::kFloat32, has_anchor ? 1u : 0u};
}

TEST(NegotiationRace, AnnouncementInTheRoundOfRankZerosAbortIsAnsweredByIt) {
  run_ranks(2, [&](comm::Communicator& comm) {
    Negotiator n(comm, milliseconds(200));
    // Round 1: rank 0 alone announces "k".
    RoundResult r = n.round(
        comm.rank() == 0 ? std::vector<Announcement>{gradient("k")} : std::vector<Announcement>{},
        false);
    EXPECT_TRUE(r.ready.empty() && r.failed.empty());
    std::this_thread::sleep_for(milliseconds(300));
    // Round 2: rank 0's clock aborts "k"; rank 1 announces it in the same round.
    r = n.round(
        comm.rank() == 1 ? std::vector<Announcement>{gradient("k")} : std::vector<Announcement>{},
        false);
    ASSERT_EQ(r.failed.size(), 1u);
    EXPECT_EQ(r.failed[0].id.key, "k");
    EXPECT_EQ(r.failed[0].code, ErrorCode::kTimeout);
    EXPECT_TRUE(r.ready.empty());
    EXPECT_EQ(n.outstanding(), 0u) << "rank " << comm.rank() << " kept an entry for 'k'";
    // Round 3: rank 0 submits "k" again; rank 1 has not yet: nothing is ready (a stale entry of
    // rank 1's would make it ready while rank 1 holds no handle for it).
    r = n.round(
        comm.rank() == 0 ? std::vector<Announcement>{gradient("k")} : std::vector<Announcement>{},
        false);
    EXPECT_TRUE(r.ready.empty() && r.failed.empty());
    EXPECT_EQ(n.outstanding(), 1u);
    // Round 4: rank 1 too: ready.
    r = n.round(
        comm.rank() == 1 ? std::vector<Announcement>{gradient("k")} : std::vector<Announcement>{},
        false);
    ASSERT_EQ(r.ready.size(), 1u);
    EXPECT_EQ(n.outstanding(), 0u);
  });
}

TEST(NegotiationRace, AverageAnnouncedWithAndWithoutAnAnchorIsAMismatch) {
  run_ranks(3, [&](comm::Communicator& comm) {
    Negotiator n(comm, milliseconds(60000));
    // First average: nobody holds an anchor. Then everybody does (the cached form carries the
    // change once). Then rank 1 restored a state without one.
    RoundResult r = n.round({average("p", false)}, false);
    ASSERT_EQ(r.ready.size(), 1u);
    EXPECT_EQ(r.ready[0].step, 0u);
    r = n.round({average("p", true)}, false);
    ASSERT_EQ(r.ready.size(), 1u);
    EXPECT_EQ(r.ready[0].step, 1u);
    r = n.round({average("p", true)}, false);
    ASSERT_EQ(r.ready.size(), 1u);
    r = n.round({average("p", comm.rank() != 1)}, false);
    EXPECT_TRUE(r.ready.empty());
    ASSERT_EQ(r.failed.size(), 1u);
    EXPECT_EQ(r.failed[0].code, ErrorCode::kMismatch);
    EXPECT_EQ(r.failed[0].message,
              "parameter 'p' differs across ranks: ranks [0, 2] hold a LocalSGD anchor (they "
              "averaged before), ranks [1] do not (restored from checkpoints of different "
              "steps?)");
    EXPECT_EQ(n.outstanding(), 0u);
  });
}

}  // namespace
}  // namespace gradex::test
