// Ranks as forked processes over a real TcpStore on 127.0.0.1: bootstrap across processes, a
// SIGKILLed rank and a SIGSTOPped rank in the middle of a multi-chunk allreduce. Every wait is
// bounded by the ProcessGroup watchdog.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>

#include "base/error.h"
#include "comm/collectives.h"
#include "comm/rendezvous/launch.h"
#include "tests/comm/rank_harness.h"
#include "tests/comm/reference.h"

namespace gradex::test {
namespace {

using comm::Millis;
using Clock = std::chrono::steady_clock;

// Exit codes of the children.
constexpr int kOk = 0;
constexpr int kExpectedFailure = 10;  // a PeerError / TimeoutError, as the test wants
constexpr int kWrongResult = 20;
constexpr int kUnexpectedError = 30;

std::unique_ptr<comm::Communicator> bootstrap(int rank, int world, uint16_t port, Millis timeout) {
  comm::LaunchInfo info;
  info.rank = rank;
  info.world_size = world;
  info.master_port = port;
  auto store = comm::connect_tcp_store(info, Millis(20000));
  comm::CommOptions o;
  o.timeout = timeout;
  o.ring_chunk_bytes = 16 << 10;
  return comm::create_ucx_communicator(store, rank, world, o);
}

std::string describe(const std::vector<ChildResult>& results) {
  std::string s;
  for (const auto& r : results)
    s += "rank " + std::to_string(r.rank) + ": exit " + std::to_string(r.exit_code) + " signal " +
         std::to_string(r.signal) + (r.watchdog_killed ? " (watchdog)" : "") + " after " +
         std::to_string(r.seconds) + " s, report: " + r.report + "\n";
  return s;
}

TEST(MultiProcess, BootstrapOverTcpStoreAndAllreduce) {
  const int P = 4;
  const uint16_t port = free_port();
  ProcessGroup group(P, [&](int rank) {
    auto comm = bootstrap(rank, P, port, Millis(20000));
    for (size_t count : {size_t{0}, size_t{3}, size_t{100003}}) {
      std::vector<std::vector<uint8_t>> inputs;
      for (int r = 0; r < P; ++r)
        inputs.push_back(make_input(r, count, DType::kFloat32, 7));
      auto want = reference_sum(inputs, count, DType::kFloat32);
      auto buf = inputs[static_cast<size_t>(rank)];
      comm::allreduce_sum(*comm, buf.data(), count, DType::kFloat32);
      if (buf != want) return kWrongResult;
    }
    auto all = comm::allgatherv(*comm, &rank, sizeof(rank));
    for (int r = 0; r < P; ++r)
      if (std::memcmp(all[static_cast<size_t>(r)].data(), &r, sizeof(r)) != 0) return kWrongResult;
    comm::barrier(*comm);
    report("bytes sent " + std::to_string(comm->bytes_sent()));
    return kOk;
  });
  auto results = group.wait(std::chrono::seconds(60));
  for (const auto& r : results) {
    EXPECT_TRUE(r.exited && r.exit_code == kOk) << describe(results);
    EXPECT_NE(r.report.find("bytes sent"), std::string::npos) << describe(results);
  }
}

// A job with a secret (store and peers authenticated) runs its collectives while two strangers, one
// with a wrong secret and one with none, are refused by rank 0's store with errors naming the
// authentication failure and the address.
TEST(MultiProcess, AuthenticatedJobRunsWhileStrangersAreRefused) {
  const int P = 3;
  const uint16_t port = free_port();
  const std::string marker = ::testing::TempDir() + "gradex_strangers_" + std::to_string(port);
  ProcessGroup group(P + 2, [&](int index) {
    comm::LaunchInfo info;
    info.master_port = port;
    info.world_size = P;
    if (index >= P) {  // a stranger: rank 1 of the job, as far as it claims
      info.rank = 1;
      const std::string secret = index == P ? "guessed" : "";
      try {
        comm::connect_tcp_store(info, Millis(20000), secret);
        report("stranger was accepted");
        return kWrongResult;
      } catch (const ConfigError& e) {
        report(std::string("refused: ") + e.what());
      }
      FILE* f = std::fopen((marker + std::to_string(index)).c_str(), "w");
      if (f) std::fclose(f);
      return kExpectedFailure;
    }
    info.rank = index;
    auto store = comm::connect_tcp_store(info, Millis(20000), "the-job-secret");
    comm::CommOptions o;
    o.timeout = Millis(20000);
    o.job_secret = "the-job-secret";
    auto comm = comm::create_ucx_communicator(store, index, P, o);
    std::vector<float> buf(1000, static_cast<float>(index + 1));
    comm::allreduce_sum(*comm, buf.data(), buf.size(), DType::kFloat32);
    if (buf[999] != 6.0f) return kWrongResult;
    // Rank 0 serves the store: it stays until both strangers have been refused (bounded).
    if (index == 0) {
      auto deadline = Clock::now() + std::chrono::seconds(20);
      auto exists = [&](int i) {
        FILE* f = std::fopen((marker + std::to_string(i)).c_str(), "r");
        if (f) std::fclose(f);
        return f != nullptr;
      };
      while (!(exists(P) && exists(P + 1)) && Clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    comm::barrier(*comm);
    report("job done");
    return kOk;
  });
  auto results = group.wait(std::chrono::seconds(60));
  for (int r = 0; r < P; ++r)
    EXPECT_TRUE(results[static_cast<size_t>(r)].exited &&
                results[static_cast<size_t>(r)].exit_code == kOk)
        << describe(results);
  const std::string where = "the gradex store at 127.0.0.1:" + std::to_string(port);
  EXPECT_EQ(results[P].exit_code, kExpectedFailure) << describe(results);
  EXPECT_NE(results[P].report.find("refused: authentication failed: " + where +
                                   " did not prove knowledge of the job secret"),
            std::string::npos)
      << describe(results);
  EXPECT_EQ(results[P + 1].exit_code, kExpectedFailure) << describe(results);
  EXPECT_NE(results[P + 1].report.find("refused: " + where +
                                       " refused this client: authentication failed: this store "
                                       "requires the job secret"),
            std::string::npos)
      << describe(results);
  std::remove((marker + std::to_string(P)).c_str());
  std::remove((marker + std::to_string(P + 1)).c_str());
}

// Children allreduce a 4 MiB buffer (256 chunks of 16 KiB per ring step) in a loop until an
// error; the parent disturbs `victim` with `sig` once every rank is inside the loop. Each
// surviving child reports the error text and how long after its last success it came.
std::vector<ChildResult> disturb_allreduce(int P, int victim, int sig, Millis timeout) {
  const uint16_t port = free_port();
  ProcessGroup group(P, [&](int rank) {
    auto comm = bootstrap(rank, P, port, timeout);
    std::vector<float> buf(size_t{1} << 20, 1.0f);
    for (int iter = 0;; ++iter) {
      auto t0 = Clock::now();
      try {
        std::fill(buf.begin(), buf.end(), 1.0f);
        comm::allreduce_sum(*comm, buf.data(), buf.size(), DType::kFloat32);
        if (buf[12345] != static_cast<float>(P)) return kWrongResult;
        if (iter == 2) report("looping");
      } catch (const PeerFailure& e) {
        double s = std::chrono::duration<double>(Clock::now() - t0).count();
        report(std::string(e.code() == ErrorCode::kTimeout ? "TimeoutError" : "PeerError") +
               " peer=" + std::to_string(e.peer()) + " after " + std::to_string(s) +
               " s: " + e.what());
        return kExpectedFailure;
      } catch (const std::exception& e) {
        report(std::string("unexpected: ") + e.what());
        return kUnexpectedError;
      }
    }
  });
  for (int r = 0; r < P; ++r)
    EXPECT_TRUE(group.wait_for_report(r, "looping", std::chrono::seconds(30))) << "rank " << r;
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  group.signal(victim, sig);
  // Survivors must finish within the timeout plus the probe grace and teardown; a stopped victim
  // never exits by itself and is killed once the others are done.
  return group.wait(timeout * 3 + std::chrono::seconds(10), victim);
}

TEST(MultiProcess, KilledRankFailsEveryOtherRankWithinTheTimeout) {
  const int P = 4, victim = 2;
  const Millis timeout(3000);
  auto results = disturb_allreduce(P, victim, SIGKILL, timeout);
  ASSERT_EQ(results.size(), static_cast<size_t>(P));
  EXPECT_EQ(results[victim].signal, SIGKILL) << describe(results);
  for (int r = 0; r < P; ++r) {
    if (r == victim) continue;
    const auto& c = results[static_cast<size_t>(r)];
    EXPECT_FALSE(c.watchdog_killed) << describe(results);
    EXPECT_TRUE(c.exited && c.exit_code == kExpectedFailure) << describe(results);
    EXPECT_NE(c.report.find("rank 2"), std::string::npos) << describe(results);
  }
}

TEST(MultiProcess, StoppedRankIsNamedInEveryTimeout) {
  const int P = 4, victim = 1;
  const Millis timeout(3000);
  auto results = disturb_allreduce(P, victim, SIGSTOP, timeout);
  ASSERT_EQ(results.size(), static_cast<size_t>(P));
  for (int r = 0; r < P; ++r) {
    if (r == victim) continue;
    const auto& c = results[static_cast<size_t>(r)];
    EXPECT_FALSE(c.watchdog_killed) << describe(results);
    EXPECT_TRUE(c.exited && c.exit_code == kExpectedFailure) << describe(results);
    EXPECT_NE(c.report.find("TimeoutError peer=1 "), std::string::npos) << describe(results);
    EXPECT_NE(c.report.find("rank 1"), std::string::npos) << describe(results);
  }
}

}  // namespace
}  // namespace gradex::test
