// The hierarchical collectives (comm/hierarchical.h) with ranks as threads over real UCX, on host
// layouts given explicitly (even, uneven, interleaved, one host, one rank per host): sums are exact
// where the inputs make them exact and bit-identical on every rank; the allgatherv returns every
// rank's payload byte for byte; the parent's tag sequence stays aligned (a flat collective after a
// hierarchical one still matches).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <mutex>

#include "base/half.h"
#include "comm/collectives.h"
#include "comm/hierarchical.h"
#include "host_layouts.h"
#include "rank_harness.h"
#include "tests/test_values.h"

using namespace gradex;
using namespace gradex::test;

namespace {

// A value in [-1, 1), or an integer in [-512, 512].
float value(int rank, size_t i, bool integer) {
  const float x = test_value(0, rank, 0, i);
  return integer ? std::round(x * 512) : x;
}

}  // namespace

TEST(Hierarchical, AllreduceSumsAndIsIdenticalOnEveryRank) {
  struct Case {
    DType dtype;
    size_t count;
    bool integer;
  };
  std::vector<Case> cases;
  for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16})
    for (size_t count : {size_t{0}, size_t{1}, size_t{2}, size_t{7}, size_t{40001}})
      for (bool integer : {true, false})
        cases.push_back({dtype, count, integer});
  for (const auto& hosts : host_layouts()) {
    const int P = static_cast<int>(hosts.size());
    const comm::HostTopology topo = comm::host_topology(hosts, P);
    std::mutex m;
    // results[case][rank]
    std::vector<std::vector<std::vector<uint8_t>>> results(
        cases.size(), std::vector<std::vector<uint8_t>>(static_cast<size_t>(P)));
    run_ranks(P, [&](comm::Communicator& c) {
      for (size_t k = 0; k < cases.size(); ++k) {
        const Case& cs = cases[k];
        const size_t elem = dtype_size(cs.dtype);
        std::vector<uint8_t> buf(cs.count * elem);
        for (size_t i = 0; i < cs.count; ++i) {
          float x = value(c.rank(), i, cs.integer);
          if (cs.dtype == DType::kFloat32) {
            std::memcpy(buf.data() + 4 * i, &x, 4);
          } else {
            uint16_t h = cs.dtype == DType::kFloat16 ? float_to_half(x) : float_to_bf16(x);
            std::memcpy(buf.data() + 2 * i, &h, 2);
          }
        }
        std::vector<uint8_t> direct = buf;
        comm::hierarchical_allreduce_sum(c, topo, buf.data(), cs.count, cs.dtype);
        // Direct across the hosts (one swap between two): the ring's bits.
        comm::hierarchical_allreduce_sum(c, topo, direct.data(), cs.count, cs.dtype, true);
        if (direct != buf)
          throw std::runtime_error("direct across the hosts differs from the ring, count " +
                                   std::to_string(cs.count));
        // The tag sequence is still aligned: a flat collective right after matches.
        float token = static_cast<float>(c.rank());
        comm::allreduce_sum(c, &token, 1, DType::kFloat32);
        if (token != static_cast<float>(P * (P - 1) / 2))
          throw std::runtime_error("tags out of step");
        std::lock_guard<std::mutex> lock(m);
        results[k][static_cast<size_t>(c.rank())] = std::move(buf);
      }
    });
    for (size_t k = 0; k < cases.size(); ++k) {
      const Case& cs = cases[k];
      for (int r = 1; r < P; ++r)
        ASSERT_EQ(results[k][static_cast<size_t>(r)], results[k][0])
            << "rank " << r << " differs, layout of " << P << " ranks, count " << cs.count;
      if (cs.dtype != DType::kFloat32 || !cs.integer) continue;
      for (size_t i = 0; i < cs.count; ++i) {
        float expected = 0, got = 0;
        for (int r = 0; r < P; ++r)
          expected += value(r, i, true);
        std::memcpy(&got, results[k][0].data() + 4 * i, 4);
        ASSERT_EQ(got, expected) << "element " << i << ", count " << cs.count;
      }
    }
  }
}

TEST(Hierarchical, AllgathervReturnsEveryPayload) {
  for (const auto& hosts : host_layouts()) {
    const int P = static_cast<int>(hosts.size());
    const comm::HostTopology topo = comm::host_topology(hosts, P);
    auto payload = [](int rank, int round) {
      // Empty for some ranks, sizes differing by rank and round.
      std::vector<uint8_t> p(
          static_cast<size_t>((rank * 37 + round * 11) % 5 == 0 ? 0 : rank * 300 + round));
      for (size_t i = 0; i < p.size(); ++i)
        p[i] = static_cast<uint8_t>(rank * 7 + i * 13 + round);
      return p;
    };
    run_ranks(P, [&](comm::Communicator& c) {
      std::vector<comm::Bytes> result;
      for (int round = 0; round < 3; ++round) {
        std::vector<uint8_t> mine = payload(c.rank(), round);
        comm::hierarchical_allgatherv(c, topo, mine.data(), mine.size(), result);
        if (static_cast<int>(result.size()) != P) throw std::runtime_error("wrong slot count");
        for (int r = 0; r < P; ++r) {
          std::vector<uint8_t> want = payload(r, round);
          if (result[static_cast<size_t>(r)] != comm::Bytes(want.begin(), want.end()))
            throw std::runtime_error("payload of rank " + std::to_string(r) + " differs, round " +
                                     std::to_string(round));
        }
      }
      float token = 1;
      comm::allreduce_sum(c, &token, 1, DType::kFloat32);
      if (token != static_cast<float>(P)) throw std::runtime_error("tags out of step");
    });
  }
}

TEST(Hierarchical, TopologyOrdersHostsByLowestRank) {
  const comm::HostTopology t = comm::host_topology({"x", "y", "x", "z", "y"}, 5);
  ASSERT_EQ(t.host_count(), 3);
  EXPECT_EQ(t.hosts[0], (std::vector<int>{0, 2}));
  EXPECT_EQ(t.hosts[1], (std::vector<int>{1, 4}));
  EXPECT_EQ(t.hosts[2], (std::vector<int>{3}));
  EXPECT_EQ(t.ranks_by_host(), (std::vector<int>{0, 2, 1, 4, 3}));
  EXPECT_EQ(t.local_index[4], 1);
  EXPECT_TRUE(comm::hierarchy_pays(t));
  EXPECT_FALSE(comm::hierarchy_pays(comm::host_topology({"x", "x"}, 2)));
  EXPECT_FALSE(comm::hierarchy_pays(comm::host_topology({}, 4)));
}
