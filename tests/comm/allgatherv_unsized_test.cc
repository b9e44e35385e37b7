// allgatherv_unsized (no size round), ranks as threads over real UCX: world sizes 1-8, empty,
// small and large payloads (the large one beyond UCX's eager limit), direct and ring, bit-identical
// to allgatherv into a reused result; P-1 messages sent either way; a payload above the maximum is
// a MismatchError on its receivers, a rank that never joins a TimeoutError naming it, and a
// communicator that cannot receive unknown lengths an InternalError.
#include <gtest/gtest.h>

#include "base/error.h"
#include "comm/collectives.h"
#include "tests/comm/rank_harness.h"

namespace gradex::test {
namespace {

using comm::Communicator;

std::vector<uint8_t> payload(int r, size_t n, int round) {
  std::vector<uint8_t> p(n);
  for (size_t i = 0; i < n; ++i)
    p[i] = static_cast<uint8_t>(r * 31 + i * 7 + round * 3 + (i >> 9));
  return p;
}

size_t size_of(int r, int round) {
  switch (round) {
    case 0:
      return 0;
    case 1:
      return static_cast<size_t>(r * 13) % 100;  // small, 0 included
    case 2:
      return r == 1 ? 300000 : static_cast<size_t>(r) * 3;  // one large
    default:
      return 5000 + static_cast<size_t>(r) * 1001;  // all different
  }
}

class UnsizedWorld : public ::testing::TestWithParam<int> {};

TEST_P(UnsizedWorld, BitIdenticalToAllgathervInOneRoundOfPayloads) {
  const int P = GetParam();
  run_ranks(P, [&](Communicator& c) {
    CountingCommunicator counted(c);
    std::vector<comm::Bytes> got;  // reused: no stale bytes may survive a smaller payload
    for (int round = 0; round < 4; ++round) {
      for (bool ring : {false, true}) {
        const std::vector<uint8_t> mine = payload(c.rank(), size_of(c.rank(), round), round);
        const uint64_t before = counted.sends;
        comm::allgatherv_unsized(counted, mine.data(), mine.size(), got, ring, 1 << 20);
        const uint64_t sends = counted.sends - before;
        const auto want = comm::allgatherv(c, mine.data(), mine.size());
        const std::string where = "round " + std::to_string(round) + (ring ? " ring" : " direct");
        if (got != want) throw std::runtime_error("result differs from allgatherv, " + where);
        for (int r = 0; r < P; ++r)
          if (got[static_cast<size_t>(r)] != payload(r, size_of(r, round), round))
            throw std::runtime_error("payload of rank " + std::to_string(r) + ", " + where);
        if (sends != static_cast<uint64_t>(P - 1))
          throw std::runtime_error(std::to_string(sends) + " messages sent, " + where);
      }
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Comm, UnsizedWorld, ::testing::Range(1, 9));

// Every rank's error (empty: none) when rank r runs fn(comm, r) with a 3 s timeout.
std::vector<std::string> errors_of(int P, const std::function<void(Communicator&, int)>& fn) {
  comm::CommOptions options = test_options();
  options.timeout = std::chrono::milliseconds(3000);
  return rank_errors(
      P, [&](Communicator& c) { fn(c, c.rank()); }, options);
}

TEST(AllgathervUnsized, PayloadAboveTheMaximumIsAMismatchNamingItsSender) {
  for (bool ring : {false, true}) {
    auto errors = errors_of(3, [ring](Communicator& c, int r) {
      std::vector<uint8_t> mine(r == 1 ? 900 : 10, 7);
      std::vector<comm::Bytes> all;
      comm::allgatherv_unsized(c, mine.data(), mine.size(), all, ring, 500, "test gather");
    });
    // Direct: ranks 0 and 2 receive rank 1's payload; ring: rank 2 does first (rank 0 gets it
    // forwarded only after rank 2 has failed, and learns of that failure instead).
    const std::string& e = errors[2];
    EXPECT_NE(e.find("test gather"), std::string::npos) << e;
    EXPECT_NE(e.find("from rank 1 longer than the 500 bytes expected"), std::string::npos) << e;
    EXPECT_FALSE(errors[0].empty()) << (ring ? "ring" : "direct");
  }
}

TEST(AllgathervUnsized, RankThatNeverJoinsIsATimeoutNamingIt) {
  auto errors = errors_of(3, [](Communicator& c, int r) {
    if (r == 2) return;  // never calls the collective (stays connected until the others fail)
    std::vector<uint8_t> mine(100, 1);
    std::vector<comm::Bytes> all;
    comm::allgatherv_unsized(c, mine.data(), mine.size(), all, false, 1000, "test gather");
  });
  for (int r : {0, 1}) {
    const std::string& e = errors[static_cast<size_t>(r)];
    EXPECT_NE(e.find("test gather"), std::string::npos) << r << ": " << e;
    EXPECT_NE(e.find("rank 2"), std::string::npos) << r << ": " << e;
  }
}

// Forwards everything but the unknown-length receive.
class WithoutAnyLength : public CountingCommunicator {
 public:
  using CountingCommunicator::CountingCommunicator;
  bool receives_any_length() const override { return false; }
};

TEST(AllgathervUnsized, CommunicatorWithoutUnknownLengthReceivesIsRefused) {
  run_ranks(2, [](Communicator& c) {
    WithoutAnyLength plain(c);
    std::vector<uint8_t> mine(4, 1);
    std::vector<comm::Bytes> all;
    try {
      comm::allgatherv_unsized(plain, mine.data(), mine.size(), all, false, 100, "test gather");
    } catch (const InternalError& e) {
      if (std::string(e.what()).find("cannot receive payloads of unknown length") !=
          std::string::npos)
        return;
    }
    throw std::runtime_error("no InternalError");
  });
}

}  // namespace
}  // namespace gradex::test
