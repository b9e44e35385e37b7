// Communicator::wait_for_next_collective with ranks as threads over real UCX: a sleeping rank is
// woken by a peer's first message of the next collective (tcp and shared memory), by its wake fd,
// or by its time limit; it keeps answering liveness probes while it sleeps, and a peer's failure
// ends the sleep with an error.
#include <gtest/gtest.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>

#include "base/error.h"
#include "comm/collectives.h"
#include "tests/comm/rank_harness.h"

namespace gradex::test {
namespace {

using comm::Communicator;
using comm::Millis;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Each round one rank (rotating) starts an allgatherv after a pause while the others sleep in
// wait_for_next_collective; each sleeper must wake because of that rank's message (never before it
// was sent, never by the 20 s limit) and then get the right payloads. A ring allreduce that all
// ranks enter together between rounds checks that the awaited tag follows the collective sequence.
void woken_by_the_rank_that_starts(bool shared_memory, bool event_fd = true) {
  comm::CommOptions o = test_options();
  o.shared_memory = shared_memory;
  o.use_event_fd = event_fd;
  constexpr int kWorld = 3, kRounds = 6;
  std::atomic<int> started{-1};  // the last round whose starter has begun its collective
  run_ranks(
      kWorld,
      [&](Communicator& c) {
        for (int round = 0; round < kRounds; ++round) {
          const int starter = round % kWorld;
          if (c.rank() == starter) {
            std::this_thread::sleep_for(std::chrono::milliseconds(200));
            started = round;
          } else {
            auto t0 = Clock::now();
            bool joined = c.wait_for_next_collective(-1, Millis(20000));
            ASSERT_TRUE(joined) << "rank " << c.rank() << " round " << round << ": timed out after "
                                << seconds_since(t0) << " s";
            EXPECT_EQ(started.load(), round) << "woke before rank " << starter << " started";
          }
          uint32_t mine = static_cast<uint32_t>(100 * round + c.rank());
          std::vector<comm::Bytes> all = comm::allgatherv(c, &mine, sizeof(mine));
          for (int q = 0; q < kWorld; ++q) {
            uint32_t v = 0;
            ASSERT_EQ(all[q].size(), sizeof(v));
            std::memcpy(&v, all[q].data(), sizeof(v));
            EXPECT_EQ(v, static_cast<uint32_t>(100 * round + q));
          }
          std::vector<float> x(300, static_cast<float>(c.rank()));
          comm::allreduce_sum(c, x.data(), x.size(), DType::kFloat32);
          EXPECT_EQ(x[299], 3.0f);
        }
      },
      o);
}

TEST(WaitForCollective, WokenByThePeerThatStartsOverTcp) {
  woken_by_the_rank_that_starts(false);
}

TEST(WaitForCollective, WokenByThePeerThatStartsOverSharedMemory) {
  woken_by_the_rank_that_starts(true);
}

// A worker without an event fd: the wait polls (short sleeps), with the same outcome.
TEST(WaitForCollective, WokenByThePeerThatStartsWithoutAnEventFd) {
  woken_by_the_rank_that_starts(false, /*event_fd=*/false);
}

// A message that arrived before the call (the peer was quicker) is found at once.
TEST(WaitForCollective, FindsAMessageThatArrivedEarlier) {
  run_ranks(2, [&](Communicator& c) {
    if (c.rank() == 1) {
      comm::barrier(c);
      std::this_thread::sleep_for(std::chrono::milliseconds(300));  // rank 0's sizes arrive now
      EXPECT_TRUE(c.wait_for_next_collective(-1, Millis(0)));
    } else {
      comm::barrier(c);
    }
    uint8_t b = static_cast<uint8_t>(c.rank());
    auto all = comm::allgatherv(c, &b, 1);
    EXPECT_EQ(all[1 - c.rank()].at(0), 1 - c.rank());
  });
}

// The caller's fd ends the wait (false), so does the time limit; nothing is consumed meanwhile.
TEST(WaitForCollective, WakeFdAndTimeLimitEndTheWait) {
  std::atomic<bool> done{false};  // rank 1 starts no collective before rank 0's waits are over
  run_ranks(2, [&](Communicator& c) {
    if (c.rank() == 0) {
      int fd = ::eventfd(0, EFD_CLOEXEC);
      ASSERT_GE(fd, 0);
      std::thread waker([fd] {
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
        uint64_t one = 1;
        EXPECT_EQ(::write(fd, &one, sizeof(one)), static_cast<ssize_t>(sizeof(one)));
      });
      auto t0 = Clock::now();
      bool joined = c.wait_for_next_collective(fd, Millis(20000));
      double waited = seconds_since(t0);
      waker.join();
      EXPECT_FALSE(joined);
      EXPECT_GE(waited, 0.25);
      EXPECT_LT(waited, 15.0) << "the wake fd did not end the wait";
      ::close(fd);

      t0 = Clock::now();
      EXPECT_FALSE(c.wait_for_next_collective(-1, Millis(400)));
      EXPECT_GE(seconds_since(t0), 0.39);
      done = true;
    } else {
      while (!done)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    comm::barrier(c);  // both still agree on every tag
    float x = 1.0f;
    comm::allreduce_sum(c, &x, 1, DType::kFloat32);
    EXPECT_EQ(x, 2.0f);
  });
}

// Rank 1 sleeps while rank 0 waits in vain for a message from it and times out: rank 0's
// liveness probe must find rank 1 answering (it sleeps, it is not stopped), and rank 1's sleep
// must end with the failure rank 0 announces, long before its own 20 s limit.
TEST(WaitForCollective, SleeperAnswersLivenessProbesAndLearnsOfFailures) {
  comm::CommOptions o = test_options();
  o.shared_memory = false;
  o.timeout = Millis(1000);
  std::atomic<int> checks{0};
  run_ranks(
      2,
      [&](Communicator& c) {
        comm::barrier(c);
        if (c.rank() == 0) {
          uint8_t in = 0;
          std::vector<comm::RequestPtr> rs;
          rs.push_back(c.irecv(1, 9, &in, 1));  // rank 1 never sends this
          try {
            c.wait_all(rs, "test receive");
            ADD_FAILURE() << "the receive completed";
          } catch (const TimeoutError& e) {
            EXPECT_NE(std::string(e.what()).find("every rank answered a liveness probe"),
                      std::string::npos)
                << e.what();
            ++checks;
          }
        } else {
          auto t0 = Clock::now();
          try {
            c.wait_for_next_collective(-1, Millis(20000));
            ADD_FAILURE() << "the wait ended without an error";
          } catch (const TimeoutError& e) {
            EXPECT_NE(std::string(e.what()).find("rank 0 aborted"), std::string::npos) << e.what();
            EXPECT_LT(seconds_since(t0), 15.0);
            ++checks;
          }
        }
      },
      o);
  EXPECT_EQ(checks.load(), 2);
}

}  // namespace
}  // namespace gradex::test
