// allgatherv_inline (one round trip for small payloads), ranks as threads over real UCX: world
// sizes 1-8, payloads below, at and above the inline maximum, bit-identical to allgatherv and
// ring_allgatherv; the path taken and the number of messages sent (one per peer while everything
// is inline); messages that disagree with the protocol fail with a clear error on the receiver.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>

#include "base/error.h"
#include "comm/collectives.h"
#include "tests/comm/rank_harness.h"

namespace gradex::test {
namespace {

using comm::AllgathervPath;
using comm::Communicator;

constexpr size_t kMax = 100;  // the inline maximum of these tests

std::vector<uint8_t> payload(int r, size_t n, int round) {
  std::vector<uint8_t> p(n);
  for (size_t i = 0; i < n; ++i)
    p[i] = static_cast<uint8_t>(r * 29 + i * 11 + round * 5 + (i >> 8));
  return p;
}

// Rank r's payload size in a round: every rank below / at the maximum, some above (one large
// enough for UCX's rendezvous path), all above, empty.
size_t size_of(int r, int round) {
  switch (round) {
    case 0:
      return 0;
    case 1:
      return static_cast<size_t>(r * 13) % kMax;  // below (0 included)
    case 2:
      return kMax;  // at
    case 3:
      return r % 2 == 1 ? kMax + 1 : kMax;  // at and just above
    case 4:
      return r == 0 ? 300000 : static_cast<size_t>(r);  // one large
    default:
      return kMax + 1 + static_cast<size_t>(r) * 57;  // all above
  }
}

class InlineWorld : public ::testing::TestWithParam<int> {};

TEST_P(InlineWorld, BitIdenticalToTheTwoRoundCollectives) {
  const int P = GetParam();
  run_ranks(P, [&](Communicator& c) {
    CountingCommunicator counted(c);
    std::vector<comm::Bytes> got;  // reused across rounds: no stale bytes may survive
    for (int round = 0; round < 6; ++round) {
      for (bool ring : {false, true}) {
        const std::vector<uint8_t> mine = payload(c.rank(), size_of(c.rank(), round), round);
        comm::AllgathervOptions o;
        o.inline_max_bytes = kMax;
        std::vector<uint64_t> seen;
        o.ring_for = [&](const std::vector<uint64_t>& following) {
          seen = following;
          return ring;
        };
        const uint64_t sends_before = counted.sends;
        const AllgathervPath path =
            comm::allgatherv_inline(counted, mine.data(), mine.size(), got, o);
        const uint64_t sends = counted.sends - sends_before;
        auto direct = comm::allgatherv(c, mine.data(), mine.size());
        auto ringed = comm::ring_allgatherv(c, mine.data(), mine.size());
        const std::string where = "round " + std::to_string(round) + (ring ? " ring" : " direct");
        if (got.size() != static_cast<size_t>(P)) throw std::runtime_error("result size " + where);
        bool above = false;
        for (int r = 0; r < P; ++r) {
          const auto& p = got[static_cast<size_t>(r)];
          if (p != payload(r, size_of(r, round), round) || p != direct[static_cast<size_t>(r)] ||
              p != ringed[static_cast<size_t>(r)])
            throw std::runtime_error("payload of rank " + std::to_string(r) + " differs, " + where);
          above = above || size_of(r, round) > kMax;
        }
        const AllgathervPath want = P == 1   ? AllgathervPath::kLocal
                                    : !above ? AllgathervPath::kOneRound
                                    : ring   ? AllgathervPath::kRing
                                             : AllgathervPath::kDirect;
        if (path != want)
          throw std::runtime_error(std::string("path ") + comm::allgatherv_path_name(path) +
                                   ", expected " + comm::allgatherv_path_name(want) + ", " + where);
        if (path == AllgathervPath::kOneRound && sends != static_cast<uint64_t>(P - 1))
          throw std::runtime_error("one round sent " + std::to_string(sends) + " messages, " +
                                   where);
        if (above) {
          // ring_for saw exactly the sizes still to move: those above the maximum.
          for (int r = 0; r < P && P > 1; ++r) {
            const size_t s = size_of(r, round);
            if (seen.at(static_cast<size_t>(r)) != (s > kMax ? s : 0))
              throw std::runtime_error("ring_for saw a wrong size for rank " + std::to_string(r));
          }
        }
      }
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Comm, InlineWorld, ::testing::Range(1, 9));

// Per-rank errors of a world whose rank 1 misbehaves through `rogue` (with the collective's tag)
// while the others run allgatherv_inline with payloads of `size` bytes.
std::vector<std::string> run_with_rogue(
    int P, const std::function<void(Communicator&, uint64_t tag)>& rogue, size_t size = 10) {
  comm::CommOptions options = test_options();
  options.timeout = std::chrono::milliseconds(5000);
  return rank_errors(
      P,
      [&](Communicator& c) {
        if (c.rank() == 1) {
          rogue(c, c.next_collective_tag());
          return;
        }
        std::vector<uint8_t> mine(size, 3);
        std::vector<comm::Bytes> all;
        comm::AllgathervOptions o;
        o.inline_max_bytes = kMax;
        comm::allgatherv_inline(c, mine.data(), mine.size(), all, o, "test gather");
      },
      options);
}

// The rogue sends `message` to every peer and receives what they send, so nothing hangs.
void send_and_drain(Communicator& c, uint64_t tag, const std::vector<uint8_t>& message) {
  std::vector<comm::RequestPtr> requests;
  std::vector<std::vector<uint8_t>> in(static_cast<size_t>(c.size()),
                                       std::vector<uint8_t>(kMax + 8));
  for (int q = 0; q < c.size(); ++q) {
    if (q == c.rank()) continue;
    requests.push_back(c.isend(q, tag, message.data(), message.size()));
    requests.push_back(c.irecv(q, tag, in[static_cast<size_t>(q)].data(), kMax + 8));
  }
  c.wait_all(requests, "rogue");
}

std::vector<uint8_t> message_with_size(uint64_t size, size_t carried) {
  std::vector<uint8_t> m(8 + carried, 5);
  std::memcpy(m.data(), &size, 8);
  return m;
}

// Ranks 0 and 2 both received rank 1's bad message; each fails with `text`, except that the
// first to fail tells the other (abort notice), which may then fail with that notice first.
void expect_detected(const std::vector<std::string>& errors, const std::string& text) {
  int detected = 0;
  for (int r : {0, 2}) {
    const std::string& e = errors[static_cast<size_t>(r)];
    if (e.find(text) != std::string::npos)
      ++detected;
    else
      EXPECT_NE(e.find("left after an error of its own"), std::string::npos) << r << ": " << e;
  }
  EXPECT_GE(detected, 1) << errors[0] << "\n" << errors[2];
}

TEST(AllgathervInline, MessageShorterThanItsSizeHeaderIsAMismatch) {
  auto errors = run_with_rogue(3, [](Communicator& c, uint64_t tag) {
    send_and_drain(c, tag, {1, 2, 3});
  });
  expect_detected(errors,
                  "received from rank 1 a message of 3 bytes, shorter than its 8-byte size");
}

TEST(AllgathervInline, TruncatedInlinePayloadIsAMismatchNotAShortResult) {
  // Announces 50 bytes inline but carries 20.
  auto errors = run_with_rogue(
      3, [](Communicator& c, uint64_t tag) { send_and_drain(c, tag, message_with_size(50, 20)); });
  expect_detected(errors,
                  "received from rank 1 28 bytes announcing a payload of 50 bytes, expected 58");
}

TEST(AllgathervInline, InlinePayloadAboveTheMaximumIsAMismatchNotATruncation) {
  // A rank with a larger maximum sends 150 bytes inline: longer than the posted receives.
  auto errors = run_with_rogue(3, [](Communicator& c, uint64_t tag) {
    send_and_drain(c, tag, message_with_size(150, 150));
  });
  expect_detected(errors, "received a message from rank 1 longer than the " +
                              std::to_string(kMax + 8) + " bytes expected");
}

TEST(AllgathervInline, FollowingAnnouncementThatCarriesBytesIsAMismatch) {
  // Announces a payload above the maximum (it would follow) but sends bytes with the size.
  auto errors = run_with_rogue(3, [](Communicator& c, uint64_t tag) {
    send_and_drain(c, tag, message_with_size(kMax + 1, 40));
  });
  expect_detected(errors,
                  "48 bytes announcing a payload of 101 bytes, "
                  "expected 8 (inline maximum 100)");
}

TEST(AllgathervInline, SizeBeyondThisHostsMemoryIsCorruptBeforeAnyAllocation) {
  auto errors = run_with_rogue(3, [](Communicator& c, uint64_t tag) {
    send_and_drain(c, tag, message_with_size(uint64_t{1} << 62, 0));
  });
  expect_detected(errors,
                  "rank 1 announced a payload of " + std::to_string(uint64_t{1} << 62) + " bytes");
}

// The inline maximum must be agreed: ranks with different maxima fail with a mismatch (on the
// rank whose posted receive is too short), never with a truncated or misread payload.
TEST(AllgathervInline, RanksWithDifferentMaximaFailLoudly) {
  comm::CommOptions options = test_options();
  options.timeout = std::chrono::milliseconds(5000);
  const auto errs = rank_errors(
      3,
      [](Communicator& c) {
        std::vector<uint8_t> mine(c.rank() == 1 ? 150 : 10, 9);
        std::vector<comm::Bytes> all;
        comm::AllgathervOptions o;
        o.inline_max_bytes = c.rank() == 1 ? 200 : kMax;
        comm::allgatherv_inline(c, mine.data(), mine.size(), all, o, "test gather");
      },
      options);
  expect_detected(errs, "longer than the 108 bytes expected");
}

}  // namespace
}  // namespace gradex::test
