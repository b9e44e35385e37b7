// Regions from measured round trips (comm/topology/regions.h): the clustering as a pure function,
// and the collective over forked ranks (measured across declared hosts on loopback: one region;
// declared regions; a partial declaration refused on every rank).
#include "comm/topology/regions.h"

#include <gtest/gtest.h>

#include "base/error.h"
#include "comm/rendezvous/launch.h"
#include "tests/comm/rank_harness.h"

namespace gradex::test {
namespace {

using comm::Millis;
using comm::regions_from_rtts;
using Matrix = std::vector<std::vector<double>>;

// Hosts in `region_of` with round trips `inside` within a region and `between[a][b]` between
// regions a and b.
Matrix layout(const std::vector<int>& region_of, double inside, const Matrix& between) {
  const size_t n = region_of.size();
  Matrix m(n, std::vector<double>(n, 0.0));
  for (size_t a = 0; a < n; ++a)
    for (size_t b = 0; b < n; ++b)
      if (a != b) {
        const auto ra = static_cast<size_t>(region_of[a]), rb = static_cast<size_t>(region_of[b]);
        // A little asymmetric noise, as measured round trips have.
        m[a][b] =
            (ra == rb ? inside : between[ra][rb]) * (1.0 + 0.05 * static_cast<double>((a + b) % 3));
      }
  return m;
}

TEST(Regions, TwoRegionsOfTwoHosts) {
  const Matrix m = layout({0, 0, 1, 1}, 0.5, {{0, 50}, {50, 0}});
  EXPECT_EQ(regions_from_rtts(m), (std::vector<int>{0, 0, 1, 1}));
}

TEST(Regions, InterleavedHostsAreNumberedByTheirFirstHost) {
  const Matrix m = layout({1, 0, 1, 0, 2}, 0.3, {{0, 40, 150}, {40, 0, 300}, {150, 300, 0}});
  EXPECT_EQ(regions_from_rtts(m), (std::vector<int>{0, 1, 0, 1, 2}));
}

TEST(Regions, NoGapIsOneRegion) {
  // Every pair 25 ms one way (the flat WAN), every pair on a LAN, jitter within 2x: one region.
  EXPECT_EQ(
      regions_from_rtts(layout(
          {0, 1, 2, 3}, 0, {{0, 50, 50, 50}, {50, 0, 50, 50}, {50, 50, 0, 50}, {50, 50, 50, 0}})),
      (std::vector<int>{0, 0, 0, 0}));
  EXPECT_EQ(regions_from_rtts(layout({0, 0, 0}, 0.2, {{0}})), (std::vector<int>{0, 0, 0}));
  Matrix jitter{{0, 0.1, 0.18}, {0.1, 0, 0.12}, {0.18, 0.12, 0}};
  EXPECT_EQ(regions_from_rtts(jitter), (std::vector<int>{0, 0, 0}));
  // A loaded host's loopback: 5x apart, but every round trip a LAN's (below
  // kRegionMinFarRoundTripMs), so no gap.
  Matrix loopback{{0, 0.03, 0.15}, {0.03, 0, 0.15}, {0.15, 0.15, 0}};
  EXPECT_EQ(regions_from_rtts(loopback), (std::vector<int>{0, 0, 0}));
  Matrix lan{{0, 0.1, 1.5}, {0.1, 0, 1.5}, {1.5, 1.5, 0}};
  EXPECT_EQ(regions_from_rtts(lan), (std::vector<int>{0, 0, 0}));
}

TEST(Regions, TheWidestGapCuts) {
  // LAN 0.5 ms, a metro pair 5 ms apart (10x) and an ocean 100 ms away (20x): the ocean cuts.
  const Matrix m = layout({0, 0, 1, 2}, 0.5, {{0, 5, 100}, {5, 0, 100}, {100, 100, 0}});
  EXPECT_EQ(regions_from_rtts(m), (std::vector<int>{0, 0, 0, 1}));
}

TEST(Regions, TheLargerDirectionCounts) {
  Matrix m{{0, 0.5, 50}, {0.5, 0, 50}, {0.5, 50, 0}};  // host 2 measured 0.5 to host 0, host 0 50
  EXPECT_EQ(regions_from_rtts(m), (std::vector<int>{0, 0, 1}));
  EXPECT_EQ(regions_from_rtts(Matrix{{0}}), (std::vector<int>{0}));
  EXPECT_TRUE(regions_from_rtts(Matrix{}).empty());
}

constexpr int kOk = 0;
constexpr int kExpectedFailure = 10;
constexpr int kWrongResult = 20;

std::unique_ptr<comm::Communicator> bootstrap(int rank, int world, uint16_t port,
                                              const std::string& host_id) {
  comm::LaunchInfo info;
  info.rank = rank;
  info.world_size = world;
  info.master_port = port;
  auto store = comm::connect_tcp_store(info, Millis(20000));
  comm::CommOptions o;
  o.timeout = Millis(20000);
  o.host_id = host_id;
  return comm::create_ucx_communicator(store, rank, world, o);
}

std::string describe(const std::vector<ChildResult>& results) {
  std::string s;
  for (const auto& r : results)
    s += "rank " + std::to_string(r.rank) + ": exit " + std::to_string(r.exit_code) +
         ", report: " + r.report + "\n";
  return s;
}

std::string joined(const std::vector<int>& v) {
  std::string s;
  for (int x : v)
    s += std::to_string(x) + ",";
  return s;
}

// 4 ranks on 3 declared hosts (ranks 1 and 2 share one), over loopback: every host is a LAN apart,
// so one region, measured, with a 3 x 3 matrix of sub-10 ms round trips on every rank.
TEST(Regions, MeasuredOverLoopbackIsOneRegion) {
  const int P = 4;
  const uint16_t port = free_port();
  ProcessGroup group(P, [&](int rank) {
    const char* hosts[] = {"ra", "rb", "rb", "rc"};
    auto comm = bootstrap(rank, P, port, hosts[rank]);
    const comm::RegionMap map = comm::discover_regions(*comm, "");
    report("regions " + joined(map.region_of_rank));
    if (map.declared || map.host_rtt_ms.size() != 3) return kWrongResult;
    for (size_t a = 0; a < 3; ++a)
      for (size_t b = 0; b < 3; ++b)
        if (a != b && !(map.host_rtt_ms[a][b] > 0 && map.host_rtt_ms[a][b] < 10)) {
          report("rtt " + std::to_string(map.host_rtt_ms[a][b]));
          return kWrongResult;
        }
    return map.region_of_rank == std::vector<int>{0, 0, 0, 0} ? kOk : kWrongResult;
  });
  auto results = group.wait(std::chrono::seconds(60));
  for (const auto& r : results)
    EXPECT_TRUE(r.exited && r.exit_code == kOk) << describe(results);
}

// A long path (its threshold 0 here, so that loopback is one): after the untimed round trip the
// lower host of each pair sends one last ping, which says the higher host times it (from its pong
// to that ping's arrival) and gets no pong; the regions are those of the usual count, with fewer
// messages from every host's leader.
TEST(Regions, OnALongPathEachPairTakesTwoRoundTrips) {
  const int P = 4;
  const uint16_t port = free_port();
  ProcessGroup group(P, [&](int rank) {
    const char* hosts[] = {"ra", "rb", "rc", "rd"};
    auto comm = bootstrap(rank, P, port, hosts[rank]);
    uint64_t before = comm->bytes_sent();
    const comm::RegionMap usual = comm::discover_regions(*comm, "", 4, 1e9);
    const uint64_t usual_bytes = comm->bytes_sent() - before;
    before = comm->bytes_sent();
    const comm::RegionMap long_path = comm::discover_regions(*comm, "", 4, 0.0);
    const uint64_t long_bytes = comm->bytes_sent() - before;
    report("regions " + joined(long_path.region_of_rank) + " bytes " + std::to_string(usual_bytes) +
           " then " + std::to_string(long_bytes));
    // Each of the 3 pairs a leader meets: 4 one-byte pings or pongs against 2 pings (the lower
    // host, in its 3 - rank pairs) or 1 pong (the higher, in `rank` pairs).
    if (long_bytes + 3 * 2 + static_cast<uint64_t>(rank) != usual_bytes) return kWrongResult;
    for (size_t a = 0; a < 4; ++a)
      for (size_t b = 0; b < 4; ++b)
        if (a != b && !(long_path.host_rtt_ms[a][b] > 0)) return kWrongResult;
    return long_path.region_of_rank == usual.region_of_rank ? kOk : kWrongResult;
  });
  auto results = group.wait(std::chrono::seconds(60));
  for (const auto& r : results)
    EXPECT_TRUE(r.exited && r.exit_code == kOk) << describe(results);
}

TEST(Regions, DeclaredRegionsWin) {
  const int P = 4;
  const uint16_t port = free_port();
  ProcessGroup group(P, [&](int rank) {
    const char* regions[] = {"us-east", "eu-west", "us-east", "eu-west"};
    auto comm = bootstrap(rank, P, port, "");
    const comm::RegionMap map = comm::discover_regions(*comm, regions[rank]);
    report("regions " + joined(map.region_of_rank));
    return map.declared && map.region_of_rank == std::vector<int>{0, 1, 0, 1} ? kOk : kWrongResult;
  });
  auto results = group.wait(std::chrono::seconds(60));
  for (const auto& r : results)
    EXPECT_TRUE(r.exited && r.exit_code == kOk) << describe(results);
}

TEST(Regions, APartialDeclarationFailsEveryRankNamingBoth) {
  const int P = 3;
  const uint16_t port = free_port();
  ProcessGroup group(P, [&](int rank) {
    auto comm = bootstrap(rank, P, port, "");
    try {
      comm::discover_regions(*comm, rank == 1 ? "" : "r" + std::to_string(rank));
    } catch (const MismatchError& e) {
      report(e.what());
      return kExpectedFailure;
    }
    return kWrongResult;
  });
  auto results = group.wait(std::chrono::seconds(60));
  for (const auto& r : results) {
    EXPECT_TRUE(r.exited && r.exit_code == kExpectedFailure) << describe(results);
    EXPECT_NE(r.report.find("declared region 'r2' and rank 1 none"), std::string::npos)
        << describe(results);
  }
}

}  // namespace
}  // namespace gradex::test
