// Communicator::abort and the receive length check: one rank's own failure reaches every other rank
// at once, with its code, its rank and its message, whether the others are inside a collective or
// asleep in wait_for_next_collective; a message longer than the receive expects is a MismatchError,
// not a transport error.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "base/error.h"
#include "comm/collectives.h"
#include "rank_harness.h"

namespace gradex::test {
namespace {

using Clock = std::chrono::steady_clock;
using comm::Communicator;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Rank 2 aborts with a MismatchError of its own while ranks 0 and 1 wait in a collective with it
// and rank 3 sleeps in wait_for_next_collective: all three raise a MismatchError naming rank 2 and
// carrying its message, long before the 20 s timeout.
TEST(CommunicatorAbort, EveryRankRaisesTheFailingRanksErrorWithItsMessage) {
  comm::CommOptions o = test_options();
  o.timeout = std::chrono::milliseconds(20000);
  std::atomic<int> raised{0};
  std::atomic<double> slowest{0};
  run_ranks(
      4,
      [&](Communicator& c) {
        comm::barrier(c);
        const auto t0 = Clock::now();
        if (c.rank() == 2) {
          std::this_thread::sleep_for(std::chrono::milliseconds(100));
          c.abort(ErrorCode::kMismatch, "tensor 'fc.weight' holds 10 elements here, 12 there");
          // Failed from now on, with its own error.
          std::vector<float> v(4, 1.0f);
          EXPECT_THROW(comm::allreduce_sum(c, v.data(), v.size(), DType::kFloat32), Error);
          return;
        }
        try {
          if (c.rank() == 3) {
            c.wait_for_next_collective(-1, std::chrono::milliseconds(15000));
          } else {
            std::vector<float> v(1000, 1.0f);
            comm::allreduce_sum(c, v.data(), v.size(), DType::kFloat32);
          }
          ADD_FAILURE() << "rank " << c.rank() << " did not fail";
        } catch (const Error& e) {
          const std::string what = e.what();
          EXPECT_EQ(e.code(), ErrorCode::kMismatch) << what;
          EXPECT_NE(what.find("rank 2 failed"), std::string::npos) << what;
          EXPECT_NE(what.find("tensor 'fc.weight' holds 10 elements here, 12 there"),
                    std::string::npos)
              << what;
          ++raised;
          double s = seconds_since(t0), prev = slowest.load();
          while (s > prev && !slowest.compare_exchange_weak(prev, s)) {
          }
        }
      },
      o);
  EXPECT_EQ(raised.load(), 3);
  // Includes rank 2's 0.1 s pause; a generous bound (the timeout is 20 s).
  EXPECT_LT(slowest.load(), 10.0);
  std::printf(
      "slowest rank learned of the abort %.3f s after the barrier (0.1 s of it rank 2's "
      "pause)\n",
      slowest.load());
}

// Rank 2 has nothing left to do in the current exchange and aborts (a process group shut down after
// its last collective); rank 1 still waits for rank 0's message of that exchange, which rank 0 sends
// 100 ms after the notice. The notice must not overtake it: rank 1's wait completes with rank 0's
// bytes (kAbortGrace), and its next call fails with rank 2's error. A wait for a message nobody
// sends fails with the notice's error within kAbortGraceMax, not at the 20 s timeout.
TEST(CommunicatorAbort, ANoticeLetsTheCurrentWaitFinishWhatIsStillArriving) {
  comm::CommOptions o = test_options();
  o.timeout = std::chrono::milliseconds(20000);
  std::atomic<int> checked{0};
  run_ranks(
      3,
      [&](Communicator& c) {
        comm::barrier(c);
        const uint64_t tag = c.next_collective_tag();
        if (c.rank() == 2) {
          c.abort(ErrorCode::kInternal, "left after its last collective");
          return;
        }
        std::vector<float> v(16, static_cast<float>(c.rank() + 1));
        if (c.rank() == 0) {
          std::this_thread::sleep_for(std::chrono::milliseconds(100));
          std::vector<comm::RequestPtr> send;
          send.push_back(c.isend(1, tag, v.data(), v.size() * 4));
          try {
            c.wait_all(send, "late send");
          } catch (const Error&) {
            // Its own wait may have met the notice with the send already gone: rank 1 checks.
          }
          ++checked;
          return;
        }
        std::vector<float> got(16, 0.0f);
        std::vector<comm::RequestPtr> recv;
        recv.push_back(c.irecv(0, tag, got.data(), got.size() * 4));
        c.wait_all(recv, "late receive");  // throws if the notice overtook rank 0's message
        EXPECT_EQ(got, std::vector<float>(16, 1.0f));
        // What cannot arrive fails with rank 2's error, within the grace's bound.
        const auto t0 = Clock::now();
        std::vector<comm::RequestPtr> never;
        never.push_back(c.irecv(0, tag + 1, got.data(), got.size() * 4));
        try {
          c.wait_all(never, "receive nobody sends");
          ADD_FAILURE() << "a receive nobody sends completed";
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find("rank 2 failed"), std::string::npos) << e.what();
          EXPECT_LT(seconds_since(t0), 5.0);
        }
        ++checked;
      },
      o);
  EXPECT_EQ(checked.load(), 2);
}

// Only the first message travels: a second abort, or an abort after a peer's notice, sends
// nothing, and a very long message is cut to kAbortMessageMax bytes.
TEST(CommunicatorAbort, LongMessagesAreCutAndOnlyTheFirstFailureTravels) {
  comm::CommOptions o = test_options();
  o.timeout = std::chrono::milliseconds(20000);
  run_ranks(
      2,
      [&](Communicator& c) {
        comm::barrier(c);
        if (c.rank() == 0) {
          c.abort(ErrorCode::kCorrupt, "first " + std::string(5000, 'x'));
          c.abort(ErrorCode::kInternal, "second");
          return;
        }
        try {
          c.wait_for_next_collective(-1, std::chrono::milliseconds(15000));
          ADD_FAILURE() << "rank 1 did not fail";
        } catch (const Error& e) {
          const std::string what = e.what();
          EXPECT_EQ(e.code(), ErrorCode::kCorrupt) << what;
          EXPECT_NE(what.find("rank 0 failed"), std::string::npos) << what;
          EXPECT_EQ(what.find("second"), std::string::npos) << what;
          const std::string text = what.substr(what.find("first "));
          EXPECT_EQ(text, "first " + std::string(comm::kAbortMessageMax - 6, 'x'));
          // A later abort of its own, after the peer's notice, does not travel back.
          c.abort(ErrorCode::kInternal, "echo");
        }
      },
      o);
}

// A message longer than the posted receive: MismatchError naming both ranks and the expected size
// (UCX would call it a truncation), and the communicator remains usable.
TEST(CommunicatorAbort, OverLongMessageIsAMismatchNotAPeerError) {
  run_ranks(2, [&](Communicator& c) {
    const uint64_t tag = c.next_collective_tag();
    std::vector<uint8_t> out(100, 7), in(40, 0);
    std::vector<comm::RequestPtr> requests;
    if (c.rank() == 0) {
      requests.push_back(c.isend(1, tag, out.data(), out.size()));
      c.wait_all(requests, "test send");
    } else {
      requests.push_back(c.irecv(0, tag, in.data(), in.size()));
      try {
        c.wait_all(requests, "test receive");
        ADD_FAILURE() << "an over-long message was accepted";
      } catch (const MismatchError& e) {
        const std::string what = e.what();
        EXPECT_NE(what.find("test receive: rank 1 received a message from rank 0 longer than the "
                            "40 bytes expected"),
                  std::string::npos)
            << what;
      }
    }
    comm::barrier(c);  // still usable
  });
}

// A payload size a peer announces is bounded (by this host's memory) before anything is allocated
// for it: rank 1 plays an allgatherv's size exchange by hand and announces 2^62 bytes.
TEST(CommunicatorAbort, AbsurdAnnouncedPayloadSizeIsRefusedBeforeAllocation) {
  run_ranks(2, [&](Communicator& c) {
    if (c.rank() == 1) {
      const uint64_t tag = c.next_collective_tag();
      const uint64_t huge = uint64_t{1} << 62;
      uint64_t theirs = 0;
      std::vector<comm::RequestPtr> requests;
      requests.push_back(c.irecv(0, tag, &theirs, sizeof(theirs)));
      requests.push_back(c.isend(0, tag, &huge, sizeof(huge)));
      c.wait_all(requests, "sizes by hand");
      EXPECT_EQ(theirs, 3u);
      return;
    }
    const uint8_t mine[3] = {1, 2, 3};
    try {
      comm::allgatherv(c, mine, sizeof(mine));
      ADD_FAILURE() << "an absurd size was accepted";
    } catch (const CorruptPayload& e) {
      EXPECT_NE(std::string(e.what()).find("rank 1 announced a payload of 4611686018427387904 "
                                           "bytes"),
                std::string::npos)
          << e.what();
    }
  });
}

}  // namespace
}  // namespace gradex::test

namespace gradex::test {
namespace {

// Communicator::interrupt from another thread (Engine::abort, a reconfiguration): rank 0's owner is
// blocked waiting for a message rank 1 never sends (rank 1 sleeps in wait_for_next_collective);
// rank 0's wait throws kAborted with the reason, and rank 1 wakes with the same code naming rank 0
// and carrying the reason, both long before the 60 s timeout (no timed assertion: a hang would
// fail the test's own ctest timeout). Both communicators are failed afterwards.
TEST(CommunicatorInterrupt, AnotherThreadEndsABlockedWaitAndThePeersLearnIt) {
  comm::CommOptions o = test_options();
  o.timeout = std::chrono::milliseconds(60000);
  run_ranks(
      2,
      [&](Communicator& c) {
        comm::barrier(c);
        uint64_t never = 0;
        try {
          if (c.rank() == 0) {
            std::thread interrupter([&c] {
              std::this_thread::sleep_for(std::chrono::milliseconds(200));
              c.interrupt(ErrorCode::kAborted, "quorum changed");
            });
            std::vector<comm::RequestPtr> requests;
            requests.push_back(c.irecv(1, c.next_collective_tag(), &never, sizeof never));
            try {
              c.wait_all(requests, "test receive");
            } catch (...) {
              interrupter.join();
              throw;
            }
            interrupter.join();
            ADD_FAILURE() << "the interrupted wait completed";
          } else {
            c.wait_for_next_collective(-1, std::chrono::milliseconds(50000));
            ADD_FAILURE() << "rank 1 did not learn of the interrupt";
          }
        } catch (const Error& e) {
          const std::string what = e.what();
          EXPECT_EQ(e.code(), ErrorCode::kAborted) << what;
          EXPECT_NE(what.find("quorum changed"), std::string::npos) << what;
          if (c.rank() == 1) {
            EXPECT_NE(what.find("rank 0"), std::string::npos) << what;
          }
        }
        EXPECT_THROW(c.isend(1 - c.rank(), c.next_collective_tag(), &never, sizeof never), Error);
      },
      o);
}

}  // namespace
}  // namespace gradex::test
