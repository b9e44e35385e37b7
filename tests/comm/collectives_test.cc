// Every collective against a reference, ranks as threads over real UCX: world sizes 1-8, counts
// around the world size and the (shrunk) chunk size, fp32/fp16/bf16, bit-exact.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <thread>

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

// Runs allreduce_sum on every rank for each (count, dtype) and compares with the reference.
void check_allreduce(int P, const std::vector<size_t>& counts, const comm::CommOptions& options) {
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
            comm::allreduce_sum(c, buf.data(), count, dt);
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

}  // namespace
}  // namespace gradex::test
