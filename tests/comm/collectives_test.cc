// Every collective against a reference, ranks as threads over real UCX: world sizes 1-8, counts
// around the world size and the (shrunk) chunk size, fp32/fp16/bf16, bit-exact.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <thread>

#include "base/error.h"
#include "comm/collectives.h"
#include "tests/comm/rank_harness.h"
#include "tests/comm/reference.h"

namespace gradex::test {
namespace {

using comm::Communicator;

std::string hex_diff(const std::vector<uint8_t>& got, const std::vector<uint8_t>& want, size_t es) {
  for (size_t i = 0; i < got.size(); i += es)
    if (std::memcmp(got.data() + i, want.data() + i, es) != 0)
      return "first difference at element " + std::to_string(i / es);
  return "";
}

using AllreduceFn = void (*)(Communicator&, void*, size_t, DType);

// Runs `allreduce` (the ring, or the direct exchange that must give the ring's bits) on every rank
// for each (count, dtype) and compares with the reference.
void check_allreduce(int P, const std::vector<size_t>& counts, const comm::CommOptions& options,
                     AllreduceFn allreduce = comm::allreduce_sum) {
  const DType dtypes[] = {DType::kFloat32, DType::kFloat16, DType::kBFloat16};
  run_ranks(
      P,
      [&](Communicator& c) {
        uint32_t seed = 1;
        for (size_t count : counts) {
          for (DType dt : dtypes) {
            ++seed;
            std::vector<std::vector<uint8_t>> inputs;
            for (int r = 0; r < P; ++r)
              inputs.push_back(make_input(r, count, dt, seed));
            std::vector<uint8_t> want = reference_sum(inputs, count, dt);
            std::vector<uint8_t> buf = inputs[static_cast<size_t>(c.rank())];
            allreduce(c, buf.data(), count, dt);
            if (buf != want)
              throw std::runtime_error(
                  "allreduce " + std::string(dtype_name(dt)) + " P=" + std::to_string(P) +
                  " count=" + std::to_string(count) + ": " + hex_diff(buf, want, dtype_size(dt)));
          }
        }
      },
      options);
}

class WorldSize : public ::testing::TestWithParam<int> {};

TEST_P(WorldSize, AllreduceBitExactSmallChunks) {
  const int P = GetParam();
  // 0, 1, below P, one 64-byte chunk of fp32 (16) and of 16-bit (32), odd multi-chunk counts.
  std::vector<size_t> counts = {
      0, 1, static_cast<size_t>(P > 1 ? P - 1 : 1), 16, 17, 32, 33, 101, 1000, 2049};
  check_allreduce(P, counts, test_options());
}

TEST_P(WorldSize, DirectAllreduceGivesTheRingsBits) {
  const int P = GetParam();
  std::vector<size_t> counts = {0,    1,   static_cast<size_t>(P > 1 ? P - 1 : 1), 16, 17, 33, 101,
                                1000, 2049};
  check_allreduce(P, counts, test_options(), comm::direct_allreduce_sum);
}

// Two phases of direct messages: P-1 sends per rank and phase, whatever the world size (the ring
// sends 2(P-1) chunks' worth of steps, one after another); two ranks swap their buffers in one
// message each.
TEST(DirectAllreduce, TwoPhasesOfOneMessagePerPeer) {
  for (int P : {2, 3, 5}) {
    std::vector<uint64_t> sends(static_cast<size_t>(P));
    run_ranks(P, [&](Communicator& c) {
      CountingCommunicator counting(c);
      std::vector<float> v(1000, 1.0f);
      comm::direct_allreduce_sum(counting, v.data(), v.size(), DType::kFloat32);
      for (float x : v)
        if (x != static_cast<float>(P)) throw std::runtime_error("wrong sum");
      sends[static_cast<size_t>(c.rank())] = counting.sends;
    });
    for (uint64_t s : sends)
      EXPECT_EQ(s, P == 2 ? 1u : 2u * static_cast<uint64_t>(P - 1)) << "P=" << P;
  }
}

TEST_P(WorldSize, AllgathervAnySizes) {
  const int P = GetParam();
  run_ranks(P, [&](Communicator& c) {
    for (int round = 0; round < 4; ++round) {
      auto size_of = [&](int r) -> size_t {
        if (round == 0) return 0;                    // everyone empty
        if (round == 3) return r == 0 ? 300000 : 0;  // one large payload, rest empty
        return static_cast<size_t>((r * 37 + round * 11) % 97) * (r % 2);  // mixed, zeros
      };
      auto payload = [&](int r) {
        std::vector<uint8_t> p(size_of(r));
        for (size_t i = 0; i < p.size(); ++i)
          p[i] = static_cast<uint8_t>(r * 31 + i * 7 + round);
        return p;
      };
      std::vector<uint8_t> mine = payload(c.rank());
      auto all = comm::allgatherv(c, mine.data(), mine.size());
      if (all.size() != static_cast<size_t>(P)) throw std::runtime_error("allgatherv size");
      for (int r = 0; r < P; ++r)
        if (all[static_cast<size_t>(r)] != payload(r))
          throw std::runtime_error("allgatherv payload of rank " + std::to_string(r) + " round " +
                                   std::to_string(round));
    }
  });
}

TEST_P(WorldSize, BroadcastFromEveryRoot) {
  const int P = GetParam();
  run_ranks(P, [&](Communicator& c) {
    for (size_t bytes : {size_t{0}, size_t{1}, size_t{1000}, size_t{1} << 20}) {
      for (int root = 0; root < P; ++root) {
        std::vector<uint8_t> buf(bytes, 0);
        if (c.rank() == root)
          for (size_t i = 0; i < bytes; ++i)
            buf[i] = static_cast<uint8_t>(i * 13 + root);
        comm::broadcast(c, buf.data(), bytes, root);
        for (size_t i = 0; i < bytes; ++i)
          if (buf[i] != static_cast<uint8_t>(i * 13 + root))
            throw std::runtime_error("broadcast from root " + std::to_string(root) +
                                     " wrong at byte " + std::to_string(i));
      }
    }
  });
}

TEST_P(WorldSize, BarrierWaitsForEveryRank) {
  const int P = GetParam();
  std::atomic<int> arrived{0};
  run_ranks(P, [&](Communicator& c) {
    for (int round = 1; round <= 5; ++round) {
      // Stagger arrival so that a barrier that returns early would be caught.
      std::this_thread::sleep_for(std::chrono::milliseconds((c.rank() * 7 + round * 3) % 11));
      arrived.fetch_add(1);
      comm::barrier(c);
      if (arrived.load() < round * P)
        throw std::runtime_error("barrier returned before every rank arrived");
      comm::barrier(c);  // nobody starts the next round before everyone checked
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Comm, WorldSize, ::testing::Range(1, 9));

// Default 256 KiB chunks with multi-megabyte buffers: UCX's rendezvous path and long pipelines.
TEST(Allreduce, LargeBuffersDefaultChunks) {
  comm::CommOptions o = test_options();
  o.ring_chunk_bytes = 256 << 10;
  for (int P : {2, 3, 5})
    check_allreduce(P, {(size_t{1} << 20) + 3}, o);
}

// GRADEX_SHM=1: same-host peers over shared memory give the same bit-exact results.
TEST(Allreduce, SharedMemoryPeers) {
  comm::CommOptions o = test_options();
  o.shared_memory = true;
  for (int P : {2, 4})
    check_allreduce(P, {0, 1, 17, 4099, (size_t{1} << 18) + 5}, o);
}

TEST(Allreduce, ChunkOfOneElement) {
  comm::CommOptions o = test_options();
  o.ring_chunk_bytes = 1;  // smaller than an element: one element per chunk
  check_allreduce(3, {0, 1, 2, 7, 50}, o);
}

// Collectives of different kinds back to back never pick up each other's messages.
TEST(Collectives, InterleavedKindsKeepTheirMessagesApart) {
  const int P = 4;
  run_ranks(P, [&](Communicator& c) {
    for (int i = 0; i < 20; ++i) {
      std::vector<float> v(37, static_cast<float>(c.rank() + i));
      comm::allreduce_sum(c, v.data(), v.size(), DType::kFloat32);
      float want = static_cast<float>(P * i + P * (P - 1) / 2);
      for (float x : v)
        if (x != want) throw std::runtime_error("interleaved allreduce wrong");
      uint32_t token = c.rank() == i % P ? 1000u + static_cast<uint32_t>(i) : 0u;
      comm::broadcast(c, &token, sizeof(token), i % P);
      if (token != 1000u + static_cast<uint32_t>(i))
        throw std::runtime_error("interleaved broadcast wrong");
      auto all = comm::allgatherv(c, &token, static_cast<size_t>(c.rank()) % 2 * 4);
      for (int r = 0; r < P; ++r)
        if (all[static_cast<size_t>(r)].size() != static_cast<size_t>(r % 2 * 4))
          throw std::runtime_error("interleaved allgatherv wrong");
    }
  });
}

// Ranks that disagree on what they exchange: every rank fails (none hangs), and the rank whose
// length check sees the disagreement says so, naming the operation, both ranks and both lengths.
struct Outcome {
  std::vector<std::string> messages;
  std::vector<ErrorCode> codes;
};

Outcome run_disagreeing(int P, size_t chunk_bytes, const std::function<void(Communicator&)>& fn) {
  comm::CommOptions o = test_options();
  o.timeout = std::chrono::milliseconds(3000);
  o.ring_chunk_bytes = chunk_bytes;
  Outcome out;
  out.messages.assign(static_cast<size_t>(P), "");
  out.codes.assign(static_cast<size_t>(P), ErrorCode::kOk);
  run_ranks(
      P,
      [&](Communicator& c) {
        try {
          fn(c);
        } catch (const Error& e) {
          out.messages[static_cast<size_t>(c.rank())] = e.what();
          out.codes[static_cast<size_t>(c.rank())] = e.code();
        }
      },
      o);
  return out;
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

TEST(LengthCheck, AllreduceCountDisagreementIsCaught) {
  // P = 2: rank 1 sums 101 elements, rank 0 sums 100. P = 3: rank 2 has one more, small chunks.
  for (auto [P, chunk] : {std::pair<int, size_t>{2, 256 << 10}, {3, 64}}) {
    Outcome out = run_disagreeing(P, chunk, [&](Communicator& c) {
      size_t count = c.rank() == P - 1 ? 1001 : 1000;
      std::vector<float> v(count, 1.0f);
      comm::allreduce_sum(c, v.data(), count, DType::kFloat32);
    });
    int caught = 0;
    for (int r = 0; r < P; ++r) {
      const std::string& m = out.messages[static_cast<size_t>(r)];
      EXPECT_NE(out.codes[static_cast<size_t>(r)], ErrorCode::kOk)
          << "P=" << P << ": rank " << r << " finished a disagreeing allreduce";
      if (out.codes[static_cast<size_t>(r)] != ErrorCode::kMismatch) continue;
      ++caught;
      EXPECT_TRUE(contains(m, "allreduce: rank " + std::to_string(r) + " received") &&
                  contains(m, "expected") && contains(m, "disagree") &&
                  contains(m, "rank " + std::to_string((r + P - 1) % P)))
          << m;
    }
    EXPECT_GE(caught, 1) << "P=" << P << ": no rank's length check fired";
  }
}

TEST(LengthCheck, DirectAllreduceCountDisagreementIsCaught) {
  for (int P : {2, 3}) {
    Outcome out = run_disagreeing(P, 64, [&](Communicator& c) {
      size_t count = c.rank() == P - 1 ? 1001 : 1000;
      std::vector<float> v(count, 1.0f);
      comm::direct_allreduce_sum(c, v.data(), count, DType::kFloat32);
    });
    int caught = 0;
    for (int r = 0; r < P; ++r) {
      const std::string& m = out.messages[static_cast<size_t>(r)];
      EXPECT_NE(out.codes[static_cast<size_t>(r)], ErrorCode::kOk)
          << "P=" << P << ": rank " << r << " finished a disagreeing allreduce";
      if (out.codes[static_cast<size_t>(r)] != ErrorCode::kMismatch) continue;
      ++caught;
      EXPECT_TRUE(contains(m, "direct allreduce: rank " + std::to_string(r) + " received") &&
                  contains(m, "disagree"))
          << m;
    }
    EXPECT_GE(caught, 1) << "P=" << P << ": no rank's length check fired";
  }
}

TEST(LengthCheck, RanksInDifferentCollectivesAreCaught) {
  // Rank 1 runs an allreduce while rank 0 runs an allgatherv: with 64-byte chunks rank 1's check
  // sees rank 0's 8-byte size message; with 4-byte chunks rank 0's allgatherv check sees a 4-byte
  // chunk where a size belongs.
  for (size_t chunk : {size_t{64}, size_t{4}}) {
    Outcome out = run_disagreeing(2, chunk, [&](Communicator& c) {
      std::vector<float> v(100, 1.0f);
      if (c.rank() == 0)
        comm::allgatherv(c, v.data(), 8);
      else
        comm::allreduce_sum(c, v.data(), v.size(), DType::kFloat32);
    });
    EXPECT_NE(out.codes[0], ErrorCode::kOk);
    EXPECT_NE(out.codes[1], ErrorCode::kOk);
    // The expected checker usually fails first; when the other rank's own check fires first and
    // it leaves, the checker may see the peer go instead. Either way one rank names the mismatch.
    const int checker = chunk == 64 ? 1 : 0;
    const std::string& m = out.messages[static_cast<size_t>(checker)];
    const std::string& other = out.messages[static_cast<size_t>(1 - checker)];
    if (out.codes[static_cast<size_t>(checker)] == ErrorCode::kMismatch) {
      if (chunk == 64)
        EXPECT_TRUE(contains(m, "allreduce: rank 1 received 8 bytes from rank 0") &&
                    contains(m, "expected 64"))
            << m;
      else
        EXPECT_TRUE(contains(m, "allgatherv: rank 0 received 4 bytes of size from rank 1") &&
                    contains(m, "expected 8"))
            << m;
    } else {
      // The other rank's own check fired first, or (when a longer message arrives where a shorter
      // one was posted) UCX reports the truncation, which the communicator still surfaces as a
      // PeerError: both name the length disagreement, neither hangs.
      const bool length_check =
          out.codes[static_cast<size_t>(1 - checker)] == ErrorCode::kMismatch &&
          contains(other, "received") && contains(other, "expected");
      const bool truncation = contains(other, "Message truncated");
      EXPECT_TRUE(length_check || truncation) << other;
    }
  }
}

}  // namespace
}  // namespace gradex::test
