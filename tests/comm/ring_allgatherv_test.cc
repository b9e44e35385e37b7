// ring_allgatherv against the direct allgatherv, ranks as threads over real UCX: world sizes 1-8,
// empty, uneven and multi-chunk payloads, bit-identical results; a received length that disagrees
// with the announced size fails loudly, naming the origin rank.
#include <gtest/gtest.h>

#include <mutex>
#include <thread>

#include "base/error.h"
#include "comm/collectives.h"
#include "comm/rendezvous/memory_store.h"
#include "tests/comm/rank_harness.h"

namespace gradex::test {
namespace {

using comm::Communicator;

// Payload of rank r in a round: sizes chosen so that some are empty, some below, at and above the
// 64-byte test chunk, and one large enough for UCX's rendezvous path.
std::vector<uint8_t> payload(int r, int P, int round) {
  size_t n = 0;
  switch (round) {
    case 0:
      n = 0;
      break;  // everyone empty
    case 1:
      n = static_cast<size_t>(r * 37 + 5) % 97 * (r % 2);
      break;  // uneven, zeros
    case 2:
      n = r == P - 1 ? 300000 : 0;
      break;  // one large, rest empty
    case 3:
      n = 64 * static_cast<size_t>(r + 1);
      break;  // exact chunk multiples
    default:
      n = static_cast<size_t>(1000 + 131 * r + round);
      break;
  }
  std::vector<uint8_t> p(n);
  for (size_t i = 0; i < n; ++i)
    p[i] = static_cast<uint8_t>(r * 31 + i * 7 + round * 3 + (i >> 8));
  return p;
}

class RingWorld : public ::testing::TestWithParam<int> {};

TEST_P(RingWorld, BitIdenticalToDirectAllgatherv) {
  const int P = GetParam();
  run_ranks(P, [&](Communicator& c) {
    for (int round = 0; round < 6; ++round) {
      std::vector<uint8_t> mine = payload(c.rank(), P, round);
      auto ring = comm::ring_allgatherv(c, mine.data(), mine.size());
      auto direct = comm::allgatherv(c, mine.data(), mine.size());
      if (ring.size() != static_cast<size_t>(P)) throw std::runtime_error("ring result size");
      for (int r = 0; r < P; ++r) {
        const auto& got = ring[static_cast<size_t>(r)];
        if (got != direct[static_cast<size_t>(r)] || got != payload(r, P, round))
          throw std::runtime_error("ring payload of rank " + std::to_string(r) + " round " +
                                   std::to_string(round) + " differs (" +
                                   std::to_string(got.size()) + " bytes)");
      }
    }
  });
}

// The forms that fill a caller's result: one result kept across rounds whose sizes grow, shrink
// and drop to zero must hold exactly this round's payloads (no stale bytes from a longer one).
TEST_P(RingWorld, ReusedResultsHoldOnlyThisRound) {
  const int P = GetParam();
  run_ranks(P, [&](Communicator& c) {
    std::vector<comm::Bytes> ring, direct;
    for (int round : {4, 2, 1, 0, 5, 3, 2}) {
      std::vector<uint8_t> mine = payload(c.rank(), P, round);
      comm::ring_allgatherv(c, mine.data(), mine.size(), ring);
      comm::allgatherv(c, mine.data(), mine.size(), direct);
      if (ring.size() != static_cast<size_t>(P) || direct.size() != static_cast<size_t>(P))
        throw std::runtime_error("result size");
      for (int r = 0; r < P; ++r)
        if (ring[static_cast<size_t>(r)] != payload(r, P, round) ||
            direct[static_cast<size_t>(r)] != payload(r, P, round))
          throw std::runtime_error("reused result of rank " + std::to_string(r) + " round " +
                                   std::to_string(round) + " differs");
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Comm, RingWorld, ::testing::Range(1, 9));

// Default 256 KiB chunks, multi-megabyte payloads: long forwarding pipelines.
TEST(RingAllgatherv, LargePayloadsDefaultChunks) {
  comm::CommOptions o = test_options();
  o.ring_chunk_bytes = 256 << 10;
  run_ranks(
      4,
      [&](Communicator& c) {
        std::vector<uint8_t> mine((size_t{1} << 21) + 17 * static_cast<size_t>(c.rank()));
        for (size_t i = 0; i < mine.size(); ++i)
          mine[i] = static_cast<uint8_t>(i * 13 + c.rank());
        auto all = comm::ring_allgatherv(c, mine.data(), mine.size());
        for (int r = 0; r < 4; ++r) {
          const auto& p = all[static_cast<size_t>(r)];
          if (p.size() != (size_t{1} << 21) + 17 * static_cast<size_t>(r))
            throw std::runtime_error("length of rank " + std::to_string(r));
          for (size_t i = 0; i < p.size(); i += 4099)
            if (p[i] != static_cast<uint8_t>(i * 13 + r)) throw std::runtime_error("content");
        }
      },
      o);
}

// Rank 1 chunks its payload at 64 bytes, the others expect 128-byte chunks: rank 2 receives
// pieces shorter than announced and must say so, not assemble a wrong payload.
TEST(RingAllgatherv, ShortChunkIsAMismatchNamingTheOrigin) {
  const int P = 3;
  auto store = std::make_shared<comm::MemoryStore>();
  std::mutex mutex;
  std::vector<std::string> errors(P);
  std::vector<int> codes(P, -1);
  std::vector<std::thread> threads;
  for (int r = 0; r < P; ++r) {
    threads.emplace_back([&, r] {
      comm::CommOptions o = test_options();
      o.ring_chunk_bytes = r == 1 ? 64 : 128;
      try {
        auto c = comm::create_ucx_communicator(store, r, P, o);
        std::vector<uint8_t> mine(r == 1 ? 200 : 0, 7);
        comm::ring_allgatherv(*c, mine.data(), mine.size());
      } catch (const Error& e) {
        std::lock_guard<std::mutex> lock(mutex);
        errors[static_cast<size_t>(r)] = e.what();
        codes[static_cast<size_t>(r)] = static_cast<int>(e.code());
      }
    });
  }
  for (auto& t : threads)
    t.join();
  EXPECT_EQ(codes[2], static_cast<int>(ErrorCode::kMismatch)) << errors[2];
  EXPECT_NE(errors[2].find("rank 1's payload"), std::string::npos) << errors[2];
  EXPECT_NE(errors[2].find("has 64 bytes, expected 128"), std::string::npos) << errors[2];
}

}  // namespace
}  // namespace gradex::test
