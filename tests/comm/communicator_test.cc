// The Communicator contract with ranks as threads: point-to-point messages, tags, lengths,
// counters, and failure handling (timeouts naming the silent rank, failed state, abort notices).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>

#include "base/error.h"
#include "comm/collectives.h"
#include "comm/rendezvous/memory_store.h"
#include "tests/comm/rank_harness.h"

namespace gradex::test {
namespace {

using comm::Communicator;
using comm::RequestPtr;
using Clock = std::chrono::steady_clock;

TEST(Communicator, TaggedMessagesMatchPeerAndTag) {
  run_ranks(3, [](Communicator& c) {
    if (c.rank() == 0) {
      // Receive tag 7 before tag 5 although both senders send 5 first; source selects too.
      char a[16] = {}, b[16] = {}, d[16] = {};
      std::vector<RequestPtr> rs;
      rs.push_back(c.irecv(1, 7, a, sizeof(a)));
      rs.push_back(c.irecv(2, 5, b, sizeof(b)));
      rs.push_back(c.irecv(1, 5, d, sizeof(d)));
      c.wait_all(rs, "test");
      EXPECT_STREQ(a, "one-seven");
      EXPECT_STREQ(b, "two-five");
      EXPECT_STREQ(d, "one-five");
      EXPECT_EQ(c.recv_length(*rs[0]), sizeof("one-seven"));
      EXPECT_EQ(c.bytes_received(), sizeof("one-seven") + sizeof("two-five") + sizeof("one-five"));
    } else {
      std::string five = c.rank() == 1 ? "one-five" : "two-five";
      std::vector<RequestPtr> rs;
      rs.push_back(c.isend(0, 5, five.c_str(), five.size() + 1));
      if (c.rank() == 1) rs.push_back(c.isend(0, 7, "one-seven", sizeof("one-seven")));
      c.wait_all(rs, "test");
      EXPECT_EQ(c.bytes_sent(), five.size() + 1 + (c.rank() == 1 ? sizeof("one-seven") : 0));
    }
  });
}

TEST(Communicator, TestPollsWithoutBlocking) {
  run_ranks(2, [](Communicator& c) {
    uint32_t v = 0;
    if (c.rank() == 0) {
      RequestPtr r = c.irecv(1, 3, &v, sizeof(v));
      EXPECT_FALSE(c.test(*r, "test"));  // rank 1 waits for our go before sending
      uint8_t go = 1;
      RequestPtr g = c.isend(1, 4, &go, 1);
      auto deadline = Clock::now() + std::chrono::seconds(10);
      while (!c.test(*r, "test") && Clock::now() < deadline)
        c.progress();
      EXPECT_EQ(v, 42u);
      std::vector<RequestPtr> rest;
      rest.push_back(std::move(g));
      c.wait_all(rest, "test");
    } else {
      uint8_t go = 0;
      std::vector<RequestPtr> rs;
      rs.push_back(c.irecv(0, 4, &go, 1));
      c.wait_all(rs, "test");
      v = 42;
      rs.clear();
      rs.push_back(c.isend(0, 3, &v, sizeof(v)));
      c.wait_all(rs, "test");
    }
  });
}

TEST(Communicator, CollectiveTagsAreFreshAndLeaveRoomForSubTags) {
  run_ranks(1, [](Communicator& c) {
    uint64_t a = c.next_collective_tag();
    uint64_t b = c.next_collective_tag();
    EXPECT_NE(a, b);
    EXPECT_EQ(a % (1u << 16), 0u);
    EXPECT_EQ(b % (1u << 16), 0u);
    EXPECT_LT(b, uint64_t{1} << 39);
    EXPECT_GT(a, 0u);  // tag 0 is reserved
  });
}

TEST(Communicator, WorldSizeMismatchIsDetectedAtConnect) {
  auto store = std::make_shared<comm::MemoryStore>();
  comm::CommOptions o = test_options();
  o.timeout = std::chrono::milliseconds(3000);
  std::string e0, e1;
  std::thread t([&] {
    try {
      comm::create_ucx_communicator(store, 1, 2, o);
    } catch (const std::exception& e) {
      e1 = e.what();
    }
  });
  try {
    comm::create_ucx_communicator(store, 0, 3, o);  // thinks there are 3 ranks
  } catch (const std::exception& e) {
    e0 = e.what();
  }
  t.join();
  EXPECT_NE(e1.find("world size 3, this rank with 2"), std::string::npos) << e1;
  EXPECT_FALSE(e0.empty());
}

// Rank 2 does not take part (it computes for longer than the timeout): ranks 0 and 1 time out
// naming rank 2, found by the liveness probe even where they were waiting on each other.
TEST(CommunicatorFailure, TimeoutNamesTheRankThatIsAway) {
  comm::CommOptions o = test_options();
  // The tcp path (what crosses hosts). Same-host shared memory with a stopped peer is covered by
  // the forked-process stall test in multiproc_test.cc.
  o.shared_memory = false;
  o.timeout = std::chrono::milliseconds(1000);
  std::atomic<int> timeouts{0};
  run_ranks(
      3,
      [&](Communicator& c) {
        if (c.rank() == 2) {
          std::this_thread::sleep_for(std::chrono::milliseconds(3000));
          return;
        }
        std::vector<float> v(4096, 1.0f);
        auto t0 = Clock::now();
        try {
          comm::allreduce_sum(c, v.data(), v.size(), DType::kFloat32);
          ADD_FAILURE() << "allreduce completed without rank 2";
        } catch (const TimeoutError& e) {
          EXPECT_EQ(e.peer(), 2) << e.what();
          EXPECT_EQ(e.operation(), "allreduce");
          EXPECT_NE(std::string(e.what()).find("rank 2"), std::string::npos) << e.what();
          ++timeouts;
        }
        EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 2.9);
        // The communicator is failed now: later calls say so at once.
        try {
          comm::barrier(c);
          ADD_FAILURE() << "barrier on a failed communicator";
        } catch (const TimeoutError& e) {
          EXPECT_NE(std::string(e.what()).find("unusable after an earlier failure"),
                    std::string::npos)
              << e.what();
        }
      },
      o);
  EXPECT_EQ(timeouts.load(), 2);
}

// A rank leaving through an exception tells the others, which fail at once instead of waiting
// for their timeout.
TEST(CommunicatorFailure, RankLeavingByExceptionAbortsThePeers) {
  comm::CommOptions o = test_options();
  o.timeout = std::chrono::milliseconds(20000);
  std::atomic<int> aborted{0};
  auto t0 = Clock::now();
  EXPECT_THROW(run_ranks(
                   4,
                   [&](Communicator& c) {
                     // Rank 3 leaves once every rank is connected (a rank still inside its
                     // constructor would fail there instead, also naming rank 3). The others then
                     // fail with PeerError naming rank 3 in whichever collective they are in: the
                     // barrier if the abort notice overtakes its last message, else the allreduce.
                     std::vector<float> v(1000, 1.0f);
                     try {
                       comm::barrier(c);
                       if (c.rank() == 3) throw std::runtime_error("framework error on rank 3");
                       comm::allreduce_sum(c, v.data(), v.size(), DType::kFloat32);
                     } catch (const PeerError& e) {
                       EXPECT_EQ(e.peer(), 3) << e.what();
                       ++aborted;
                     }
                   },
                   o),
               std::runtime_error);
  EXPECT_EQ(aborted.load(), 3);
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 10.0);
}

}  // namespace
}  // namespace gradex::test
