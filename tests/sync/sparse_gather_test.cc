// How the engine gathers DGC units (sync/data/sparse_gather.h): the alpha-beta model's choice as a
// pure function; over forked processes and real UCX, every rank takes the same path for every unit
// (the choice is made from rank 0's link numbers and sizes every rank knows), the path is the
// model's, the payloads are exact; a rank killed in the middle fails the others within the timeout.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <cstring>

#include "base/config.h"
#include "base/error.h"
#include "comm/rendezvous/launch.h"
#include "sync/data/sparse_gather.h"
#include "sync/policy/agreed_link.h"
#include "tests/comm/rank_harness.h"

namespace gradex::test {
namespace {

using comm::AllgathervPath;
using comm::Millis;
using sync::Algorithm;
using sync::Collective;
using sync::LinkModel;
using sync::SparseGather;
using sync::Tier;
using Mode = sync::EngineOptions::SparseCollective;

// One link: the flat tier inside a region when it crosses hosts, else inside a host.
LinkModel model(double alpha, double beta, bool crosses, int P, double queue = 1e-3) {
  LinkModel m = LinkModel::single({alpha, beta, true}, crosses ? Tier::kRegion : Tier::kHost, P);
  m.port_queue_s = queue;
  return m;
}

TEST(LinkModelGather, EqualPayloadsGoDirectOnOneHostWhateverTheirSize) {
  // The same bytes on the busiest link either way; the ring adds P-2 hops of latency.
  for (int P : {2, 4, 8, 16})
    for (uint64_t s : {uint64_t{100}, uint64_t{1} << 20, uint64_t{1} << 28}) {
      const LinkModel m = model(50e-6, 1e-9, false, P);
      EXPECT_FALSE(m.gather_ring_for(std::vector<uint64_t>(static_cast<size_t>(P), s)))
          << P << " " << s;
    }
}

TEST(LinkModelGather, OneLargePayloadGoesAroundTheRingOnceItOutweighsTheHops) {
  // Direct: the large payload leaves its rank P-1 times; the ring: once per link, P-1 hops.
  // With P = 8, alpha = 50 us, beta = 1 ns/B the ring wins once S > alpha/beta = 50 KB (plus the
  // small payloads' share).
  const LinkModel m = model(50e-6, 1e-9, false, 8);
  std::vector<uint64_t> sizes(8, 2000);
  sizes[3] = 40000;
  EXPECT_FALSE(m.gather_ring_for(sizes));
  sizes[3] = 80000;
  EXPECT_TRUE(m.gather_ring_for(sizes));
  // A slower hop (alpha 1 ms) keeps the same payload direct.
  EXPECT_FALSE(model(1e-3, 1e-9, false, 8).gather_ring_for(sizes));
}

TEST(LinkModelGather, IncastAcrossHostsBeyondThePortQueueGoesAroundTheRing) {
  // 1 Gbit/s (8 ns/B), a 1 ms queue holds 125 kB: 7 x 16 KiB fits, 7 x 32 KiB does not.
  const LinkModel m = model(50e-6, 8e-9, true, 8);
  EXPECT_FALSE(m.gather_ring_for(std::vector<uint64_t>(8, 16 << 10)));
  EXPECT_TRUE(m.gather_ring_for(std::vector<uint64_t>(8, 32 << 10)));
  EXPECT_GT(m.gather_direct_seconds(std::vector<uint64_t>(8, 32 << 10)), LinkModel::kIncastPenalty);
  // The same burst on one host (no switch port) stays direct; a deeper queue (5 ms) keeps it too.
  EXPECT_FALSE(model(50e-6, 8e-9, false, 8).gather_ring_for(std::vector<uint64_t>(8, 32 << 10)));
  EXPECT_FALSE(
      model(50e-6, 8e-9, true, 8, 5e-3).gather_ring_for(std::vector<uint64_t>(8, 32 << 10)));
}

// The probe's incast bursts: up to a burst's size, what the smallest burst at least as large cost
// beyond its transfer caps the port-queue rule's price; beyond the largest the rule alone applies.
TEST(LinkModelGather, AMeasuredBurstPricesTheIncastUpToItsSize) {
  // The emulated WAN's numbers: 25 ms, the probe's 45 ns/B, 4 ranks sending 240 KB each.
  const std::vector<uint64_t> dgc999(4, 240000);
  LinkModel m = model(25e-3, 45e-9, true, 4);
  // Unmeasured: 720 KB arriving outlast 1 ms at 45 ns/B: a retransmission timeout, so the ring.
  EXPECT_NEAR(m.incast_seconds(720000), LinkModel::kIncastPenalty, 1e-12);
  EXPECT_TRUE(m.gather_ring_for(dgc999));
  // A 3 MiB burst that arrived as fast as one sender's transfer: no incast cost, direct.
  m.bursts = {{3u << 20, 0}};
  EXPECT_EQ(m.incast_seconds(720000), 0.0);
  EXPECT_FALSE(m.gather_ring_for(dgc999));
  EXPECT_NEAR(m.gather_direct_seconds(dgc999), 25e-3 + 720000 * 45e-9, 1e-12);
  // One that waited 50 ms: arrivals up to its size that the queue does not hold pay that; those
  // it holds (20 KB at 45 ns/B: 0.9 ms) nothing.
  m.bursts[0].extra_s = 0.05;
  EXPECT_EQ(m.incast_seconds(720000), 0.05);
  EXPECT_EQ(m.incast_seconds(20000), 0.0);
  // A dearer burst than the rule's timeout never raises the price: the rule's, and the ring.
  m.bursts[0].extra_s = 0.3;
  EXPECT_EQ(m.incast_seconds(720000), LinkModel::kIncastPenalty);
  EXPECT_TRUE(m.gather_ring_for(dgc999));
  // Beyond the burst's size the port-queue rule: 10 MB at 45 ns/B outlast 1 ms.
  m.bursts[0].extra_s = 0;
  EXPECT_EQ(m.incast_seconds(10e6), LinkModel::kIncastPenalty);
  // A second, larger burst prices what lies between the two sizes; the smaller one still prices
  // what it covers, and beyond the larger the rule applies again.
  m.bursts = {{3u << 20, 0}, {12u << 20, 0.02}};
  EXPECT_EQ(m.incast_seconds(720000), 0.0);
  EXPECT_EQ(m.incast_seconds(10e6), 0.02);
  EXPECT_EQ(m.incast_seconds(20e6), LinkModel::kIncastPenalty);
  // On one host no port is crossed, measured or not.
  m = LinkModel::single(m.link(), Tier::kHost, m.world_size);
  m.bursts = {{3u << 20, 0.3}};
  EXPECT_EQ(m.incast_seconds(720000), 0.0);
}

TEST(LinkModelGather, AnAbsorbedBurstRaisesTheInlineMaximumAndTheDenseDirectChoice) {
  // 4 ranks, 25 ms, 8 ns/B: the 1 ms queue holds 125 kB, a third of it per sender.
  LinkModel m = model(25e-3, 8e-9, true, 4);
  EXPECT_EQ(m.inline_max(4 << 10), size_t{125000 / 3});
  EXPECT_FALSE(m.dense_direct_for(100u << 20));
  // A 3 MiB burst that cost nothing: the latency's 1 MiB ceiling fits (3 x 1 MiB arriving).
  m.bursts = {{3u << 20, 0}};
  EXPECT_EQ(m.inline_max(4 << 10), size_t{1} << 20);
  // A dense bucket whose segments (3/4 of 4 MiB per phase) fit the burst goes direct; one of
  // 100 MB exceeds it (the rule: timeouts) and stays on the ring.
  EXPECT_TRUE(m.dense_direct_for(4u << 20));
  EXPECT_FALSE(m.dense_direct_for(100u << 20));
  // A burst that cost more than a latency is not absorbed: the queue's cap again.
  m.bursts[0].extra_s = 0.05;
  EXPECT_EQ(m.inline_max(4 << 10), size_t{125000 / 3});
  EXPECT_NEAR(m.seconds(Collective::kAllreduce, Algorithm::kDirect, 4u << 20),
              2 * 25e-3 + 2 * 3.0 * (1 << 20) * 8e-9 + 2 * 0.05, 1e-9);
  // A larger burst absorbed beside it does not lift the inline maximum past the smaller one that
  // was not (arrivals up to 3 MiB are priced by the smaller), but brings a bucket whose phases
  // lie between the two sizes (3/4 of 12 MB: 9 MB) direct: the WAN's dense early steps.
  m.bursts = {{3u << 20, 0.05}, {12u << 20, 0}};
  EXPECT_EQ(m.inline_max(4 << 10), size_t{125000 / 3});
  EXPECT_TRUE(m.dense_direct_for(12000000));
  m.bursts = {{3u << 20, 0}};
  EXPECT_FALSE(m.dense_direct_for(12000000));
}

// A GRADEX_PORT_QUEUE_MS the user wrote is taken as written (SparseGatherProcesses.
// AnExplicitPortQueueMeasuresNoBurst: the gather then measures no burst).
TEST(LinkModelGather, AnExplicitPortQueueIsTakenAsWritten) {
  using config::Config;
  using config::Source;
  EXPECT_FALSE(sync::engine_options_from_config(Config::from_strings({}, Source::kEnvironment))
                   .collectives.port_queue_explicit);
  const sync::EngineOptions o = sync::engine_options_from_config(
      Config::from_strings({"GRADEX_PORT_QUEUE_MS=1"}, Source::kEnvironment));
  EXPECT_TRUE(o.collectives.port_queue_explicit);
  EXPECT_EQ(o.collectives.port_queue_s, 1e-3);
}

TEST(LinkModelGather, InlineMaximumIsCappedAcrossHostsToFitThePortQueue) {
  EXPECT_EQ(model(50e-6, 8e-9, false, 8).inline_max(64 << 10), size_t{64} << 10);
  // 1 ms at 8 ns/B = 125000 B over 7 senders.
  EXPECT_EQ(model(50e-6, 8e-9, true, 8).inline_max(64 << 10), size_t{125000 / 7});
  EXPECT_EQ(model(50e-6, 8e-10, true, 8).inline_max(64 << 10), size_t{64} << 10);
  EXPECT_EQ(model(50e-6, 8e-9, true, 8, 0).inline_max(64 << 10), 0u);
}

TEST(LinkModelGather, LatencyBoundLinksTakeLargerPayloadsInOneRound) {
  // A LAN (50 us): the configured maximum. 25 ms at 1 Gbit/s moves 3.1 MB in one latency: the
  // 1 MiB ceiling on one host; across hosts the port queue still caps the burst.
  EXPECT_EQ(model(50e-6, 8e-9, false, 4).inline_max(4 << 10), size_t{4} << 10);
  EXPECT_EQ(model(25e-3, 8e-9, false, 4).inline_max(4 << 10), size_t{1} << 20);
  EXPECT_EQ(model(6e-3, 8e-9, false, 4).inline_max(4 << 10), size_t{750000});
  EXPECT_EQ(model(2e-3, 8e-9, false, 4).inline_max(4 << 10), size_t{4} << 10);
  EXPECT_EQ(model(25e-3, 8e-9, true, 4, 100).inline_max(4 << 10), size_t{1} << 20);
  EXPECT_EQ(model(25e-3, 8e-9, true, 4).inline_max(4 << 10), size_t{125000 / 3});
  EXPECT_FALSE(model(50e-6, 8e-9, false, 4).latency_bound());
  EXPECT_TRUE(model(25e-3, 8e-9, false, 4).latency_bound());
}

TEST(LinkModelGather, DenseBucketsGoDirectWhereLatencyOutweighsTheirBytes) {
  const uint64_t small = 400 << 10, large = 100u << 20;
  // 4 ranks on a 25 ms link: the ring's 6 latencies against the direct exchange's 2.
  const LinkModel wan = model(25e-3, 8e-9, false, 4);
  EXPECT_NEAR(wan.seconds(Collective::kAllreduce, Algorithm::kRing, small),
              6 * 25e-3 + 1.5 * small * 8e-9, 1e-9);
  EXPECT_NEAR(wan.seconds(Collective::kAllreduce, Algorithm::kDirect, small),
              2 * 25e-3 + 1.5 * small * 8e-9, 1e-9);
  EXPECT_TRUE(wan.dense_direct_for(small));
  EXPECT_TRUE(wan.dense_direct_for(4u << 20));
  // 100 MB take 1.26 s on the wire either way: 4 latencies fewer are not 10%.
  EXPECT_FALSE(wan.dense_direct_for(large));
  // A LAN: a large bucket's bytes dominate (no 10% gain); a small one still goes direct.
  const LinkModel lan = model(50e-6, 1e-9, false, 4);
  EXPECT_FALSE(lan.dense_direct_for(large));
  EXPECT_TRUE(lan.dense_direct_for(4 << 10));
  // Across hosts a segment burst beyond the port queue pays the retransmission timeouts.
  EXPECT_FALSE(model(25e-3, 8e-9, true, 4).dense_direct_for(large));
  // Two ranks: the ring's two messages against one swap of the whole buffer (the same bytes).
  const LinkModel pair = model(25e-3, 8e-9, false, 2);
  EXPECT_NEAR(pair.seconds(Collective::kAllreduce, Algorithm::kRing, small),
              2 * 25e-3 + small * 8e-9, 1e-9);
  EXPECT_NEAR(pair.seconds(Collective::kAllreduce, Algorithm::kDirect, small), 25e-3 + small * 8e-9,
              1e-9);
  EXPECT_TRUE(pair.dense_direct_for(small));
  EXPECT_FALSE(pair.dense_direct_for(large));
}

// The largest direct bucket, what the auto policy prices dense tensors by: on one host at 25 ms
// where the direct exchange stops being 10% faster than the ring (2a + 1.5 b B < 0.9 (6a + 1.5 b
// B): B < 3.4 a / (0.15 b) = 70.8 MB at 8 ns/B); across hosts up to the bucket whose phase fits
// the largest absorbed burst (4/3 of 12 MiB); for two ranks where one latency saved is still 10%
// (a + b B < 0.9 (2a + b B): B < 8 a / b = 25 MB).
TEST(LinkModelGather, TheLargestDirectBucketIsWhereTheChoiceTurns) {
  const LinkModel wan = model(25e-3, 8e-9, false, 4);
  const uint64_t turn = wan.dense_direct_max_bytes();
  EXPECT_NEAR(static_cast<double>(turn), 3.4 * 25e-3 / (0.15 * 8e-9), 2.0);
  EXPECT_TRUE(wan.dense_direct_for(turn));
  EXPECT_FALSE(wan.dense_direct_for(turn + 1));
  LinkModel hosts = model(25e-3, 8e-9, true, 4);
  hosts.bursts = {{3u << 20, 0}, {12u << 20, 0}};
  EXPECT_EQ(hosts.dense_direct_max_bytes(), uint64_t{16} << 20);  // 3/4 of it: 12 MiB at once
  EXPECT_NEAR(static_cast<double>(model(25e-3, 8e-9, false, 2).dense_direct_max_bytes()),
              8 * 25e-3 / 8e-9, 2.0);
}

// Riders: a dense byte riding the gather costs (P-1)(P-2)/P bytes more received than in an
// allreduce; they ride while that costs at most the 2 latencies a collective of their own needs.
TEST(LinkModelGather, RidersFitWhatTheSavedLatenciesPayFor) {
  // 4 ranks, 25 ms, 45 ns per byte (the probe's fit on the emulated WAN): 2 * 25 ms / (1.5 * 45
  // ns).
  EXPECT_NEAR(static_cast<double>(model(25e-3, 45e-9, true, 4).rider_bytes()),
              2 * 25e-3 / (1.5 * 45e-9), 1.0);
  // More ranks, fewer bytes: 16 ranks pay 13.125 times a byte's time per byte.
  EXPECT_NEAR(static_cast<double>(model(25e-3, 45e-9, true, 16).rider_bytes()),
              2 * 25e-3 / (13.125 * 45e-9), 1.0);
  // Two ranks receive the same bytes either way; an infinitely fast link has no limit: the cap.
  EXPECT_EQ(model(25e-3, 45e-9, true, 2).rider_bytes(), LinkModel::kRiderMaxBytes);
  EXPECT_EQ(model(25e-3, 0, true, 4).rider_bytes(), LinkModel::kRiderMaxBytes);
}

// The 8-bit/4-bit one hop: each rank's link carries (P-1)(P-2)/P encodings more than the two
// phases; it is taken while that costs at most half of the latency it saves, on a latency-bound
// link only.
TEST(LinkModelGather, TheQuantizedOneHopFitsHalfTheSavedLatency) {
  EXPECT_NEAR(static_cast<double>(model(25e-3, 8e-9, true, 4).quantized_one_hop_max_bytes()),
              0.5 * 25e-3 / (1.5 * 8e-9), 1.0);
  EXPECT_NEAR(static_cast<double>(model(25e-3, 8e-9, true, 16).quantized_one_hop_max_bytes()),
              0.5 * 25e-3 / (13.125 * 8e-9), 1.0);
  // Two ranks send the same bytes either way.
  EXPECT_EQ(model(25e-3, 8e-9, true, 2).quantized_one_hop_max_bytes(), UINT64_MAX);
  // The extra bytes at the bulk rate the bursts measured (8 ns per byte where the ping-pongs' fit
  // read 80), never above the fit's.
  LinkModel wan = model(25e-3, 80e-9, true, 4);
  wan.bursts = {{3u << 20, 0, 2 * 25e-3 + (3u << 20) * 8e-9}, {12u << 20, 0.01, 0.3}};
  EXPECT_NEAR(wan.bulk_beta_s_per_byte(), 8e-9, 1e-15);
  EXPECT_NEAR(static_cast<double>(wan.quantized_one_hop_max_bytes()), 0.5 * 25e-3 / (1.5 * 8e-9),
              1.0);
  wan.bursts = {{3u << 20, 0, 2}};  // slower than the fit: the fit's
  EXPECT_DOUBLE_EQ(wan.bulk_beta_s_per_byte(), 80e-9);
  wan.bursts = {{3u << 20, 0, 0}};  // not known
  EXPECT_DOUBLE_EQ(wan.bulk_beta_s_per_byte(), 80e-9);
  // Not latency-bound (a LAN), or alone: never.
  EXPECT_EQ(model(1e-4, 8e-9, true, 4).quantized_one_hop_max_bytes(), 0u);
  EXPECT_EQ(model(1e-4, 8e-9, true, 2).quantized_one_hop_max_bytes(), 0u);
  EXPECT_EQ(model(25e-3, 8e-9, true, 1).quantized_one_hop_max_bytes(), 0u);
}

// --- forked ranks ---

constexpr int kOk = 0;
constexpr int kExpectedFailure = 10;
constexpr int kWrong = 20;

// `host_id`: the rank's host identity ("": derived; every forked rank then shares this host).
std::unique_ptr<comm::Communicator> bootstrap(int rank, int world, uint16_t port, Millis timeout,
                                              const std::string& host_id = "") {
  comm::LaunchInfo info;
  info.rank = rank;
  info.world_size = world;
  info.master_port = port;
  auto store = comm::connect_tcp_store(info, Millis(20000));
  comm::CommOptions o;
  o.timeout = timeout;
  o.ring_chunk_bytes = 16 << 10;
  o.allgather_inline_bytes = 4 << 10;
  o.host_id = host_id;
  return comm::create_ucx_communicator(store, rank, world, o);
}

std::vector<uint8_t> payload(int rank, size_t n, int round) {
  std::vector<uint8_t> p(n);
  for (size_t i = 0; i < n; ++i)
    p[i] = static_cast<uint8_t>(rank * 17 + round * 3 + i * 5 + (i >> 10));
  return p;
}

std::string describe(const std::vector<ChildResult>& results) {
  std::string s;
  for (const auto& r : results)
    s += "rank " + std::to_string(r.rank) + ": exit " + std::to_string(r.exit_code) + " signal " +
         std::to_string(r.signal) + (r.watchdog_killed ? " (watchdog)" : "") +
         ", report: " + r.report + "\n";
  return s;
}

// What follows "paths:" in a child's report.
std::string paths_of(const std::string& report) {
  const size_t at = report.find("paths:");
  return at == std::string::npos ? "" : report.substr(at, report.find('\n', at) - at);
}

// Every one of the P ranks exits cleanly within a minute with a report that begins with `text`.
void expect_every_rank_reports(ProcessGroup& group, int P, const std::string& text) {
  auto results = group.wait(std::chrono::seconds(60));
  ASSERT_EQ(results.size(), static_cast<size_t>(P));
  for (const auto& c : results) {
    ASSERT_TRUE(c.exited && c.exit_code == kOk) << describe(results);
    EXPECT_EQ(c.report.find(text), 0u) << describe(results);
  }
}

// Every rank a host of its own (GRADEX_HOST_ID), so that the probe measures the incast burst and
// the model prices the crossing of hosts.
TEST(SparseGatherProcesses, EveryRankTakesTheModelsPathForEveryUnit) {
  const int P = 4;
  const uint16_t port = free_port();
  ProcessGroup group(P, [&](int rank) {
    auto comm = bootstrap(rank, P, port, Millis(20000), "host" + std::to_string(rank));
    SparseGather gather(Mode::kAuto);
    sync::AgreedLink link(1e-3, false);
    link.agree(*comm);  // the probe: rank 0's numbers for every rank
    const LinkModel& m = *link.model();
    // The sizes of every rank in every round are known to every rank (a function of both), so
    // each rank can check the path against the model itself. Round kinds: all inline; all above
    // the 4 KiB maximum and equal; above and uneven; one payload large enough that the ring
    // carries it more cheaply than P-1 direct copies (beyond alpha/beta), the rest above.
    const double bdp = m.link().alpha_s / m.link().beta_s_per_byte;
    const uint64_t large =
        static_cast<uint64_t>(std::min(64.0 * (1 << 20), 2 * bdp + double(1 << 20)));
    auto size_of = [&](int r, int round) -> uint64_t {
      switch (round % 4) {
        case 0:
          return 100 + static_cast<uint64_t>(r) * 300;
        case 1:
          return 20000;
        case 2:
          return 5000 + static_cast<uint64_t>(r) * 7000;
        default:
          return r == 2 ? large : 6000;
      }
    };
    std::string paths = "paths:";
    // The bursts: every sender's share at each size (3 senders: 3 and 12 MiB).
    if (!m.crosses_hosts() || m.bursts.size() != 2 ||
        m.bursts[0].bytes != 3 * sync::AgreedLink::kBurstBytesPerSender[0] ||
        m.bursts[1].bytes != 3 * sync::AgreedLink::kBurstBytesPerSender[1]) {
      report("the model does not cross hosts or measured no bursts of 3 and 12 MiB");
      return kWrong;
    }
    char numbers[200];
    std::snprintf(numbers, sizeof numbers, "alpha=%a beta=%a extra=%a,%a ", m.link().alpha_s,
                  m.link().beta_s_per_byte, m.bursts[0].extra_s, m.bursts[1].extra_s);
    report(numbers);
    for (int round = 0; round < 8; ++round) {
      std::vector<uint8_t> mine = payload(rank, size_of(rank, round), round);
      std::vector<comm::Bytes> all;
      const AllgathervPath path = gather.gather(*comm, link.model(), mine, all);
      std::vector<uint64_t> following(static_cast<size_t>(P));
      bool any = false;
      for (int r = 0; r < P; ++r) {
        const uint64_t s = size_of(r, round);
        following[static_cast<size_t>(r)] = s > comm->options().allgather_inline_bytes ? s : 0;
        any = any || following[static_cast<size_t>(r)] > 0;
        if (all[static_cast<size_t>(r)] != payload(r, s, round)) {
          report("payload of rank " + std::to_string(r) + " differs in round " +
                 std::to_string(round));
          return kWrong;
        }
      }
      const AllgathervPath want = !any                           ? AllgathervPath::kOneRound
                                  : m.gather_ring_for(following) ? AllgathervPath::kRing
                                                                 : AllgathervPath::kDirect;
      if (path != want) {
        report(std::string("round ") + std::to_string(round) + ": path " +
               comm::allgatherv_path_name(path) + ", the model says " +
               comm::allgatherv_path_name(want));
        return kWrong;
      }
      paths += std::string(comm::allgatherv_path_name(path)) + ",";
    }
    report(paths);
    return kOk;
  });
  auto results = group.wait(std::chrono::seconds(120));
  ASSERT_EQ(results.size(), static_cast<size_t>(P));
  for (const auto& c : results)
    ASSERT_TRUE(c.exited && c.exit_code == kOk) << describe(results);
  const std::string first = paths_of(results[0].report);
  EXPECT_NE(first.find("one-round"), std::string::npos) << describe(results);
  EXPECT_NE(first.find("direct"), std::string::npos) << describe(results);
  for (const auto& c : results) {
    EXPECT_EQ(paths_of(c.report), first) << describe(results);
    // Every rank decided from rank 0's numbers.
    EXPECT_EQ(c.report.substr(0, c.report.find("paths:")),
              results[0].report.substr(0, results[0].report.find("paths:")))
        << describe(results);
  }
}

// GRADEX_PORT_QUEUE_MS set: ranks on distinct hosts agree a model that crosses hosts without the
// burst (EveryRankTakesTheModelsPathForEveryUnit measures it when the setting is left unset).
TEST(SparseGatherProcesses, AnExplicitPortQueueMeasuresNoBurst) {
  const int P = 3;
  const uint16_t port = free_port();
  ProcessGroup group(P, [&](int rank) {
    auto comm = bootstrap(rank, P, port, Millis(20000), "host" + std::to_string(rank));
    const sync::EngineOptions o = sync::engine_options_from_config(
        config::Config::from_strings({"GRADEX_PORT_QUEUE_MS=1"}, config::Source::kEnvironment));
    SparseGather gather(Mode::kAuto);
    sync::AgreedLink link(o.collectives.port_queue_s, o.collectives.port_queue_explicit);
    link.agree(*comm);
    const LinkModel& m = *link.model();
    report(m.crosses_hosts() && m.bursts.empty() && m.port_queue_s == 1e-3 ? "as written"
                                                                           : "burst measured");
    return kOk;
  });
  expect_every_rank_reports(group, P, "as written");
}

// The 8-bit and 4-bit routes agree the model without the incast bursts (AgreedLink::agree(comm,
// false)) where the link is not latency-bound, as loopback is not; a later route that prices
// incast (a DGC gather, a dense bucket) probes again and gets them.
TEST(SparseGatherProcesses, TheBurstsWaitForARouteThatPricesIncast) {
  const int P = 3;
  const uint16_t port = free_port();
  ProcessGroup group(P, [&](int rank) {
    auto comm = bootstrap(rank, P, port, Millis(20000), "host" + std::to_string(rank));
    SparseGather gather(Mode::kAuto);
    sync::AgreedLink link(1e-3, false);
    link.agree(*comm, /*incast=*/false);
    const LinkModel* first = link.model();
    const bool without = first != nullptr && first->crosses_hosts() && !first->latency_bound() &&
                         first->bursts.empty();
    link.agree(*comm, /*incast=*/false);  // nothing more to measure for this caller
    const bool kept = link.model() == first;
    link.agree(*comm);
    const bool with = link.model() != nullptr && !link.model()->bursts.empty();
    report(std::string(without ? "without" : "first had bursts") + (kept ? " kept" : " probed") +
           (with ? " with" : " still none"));
    return kOk;
  });
  expect_every_rank_reports(group, P, "without kept with");
}

// Ranks loop over one-round and two-round gathers; rank 2 is SIGKILLed in the middle: every other
// rank fails within the timeout (never a hang) with an error naming a peer. A survivor whose
// exchange with rank 2 had already completed may first see another survivor leave after its own
// failure, so every report names a failed peer and at least one names rank 2 (this layer has no
// abort broadcast; the engine's test of one failure reaching every rank is EngineAbort's).
TEST(SparseGatherProcesses, KilledRankFailsTheOthersWithinTheTimeout) {
  const int P = 4, victim = 2;
  const Millis timeout(3000);
  const uint16_t port = free_port();
  ProcessGroup group(P, [&](int rank) {
    auto comm = bootstrap(rank, P, port, timeout);
    SparseGather gather(Mode::kAuto);
    sync::AgreedLink link(1e-3, false);
    for (int round = 0;; ++round) {
      try {
        std::vector<uint8_t> mine =
            payload(rank, round % 2 == 0 ? 1000 : 300000 + static_cast<size_t>(rank), round);
        std::vector<comm::Bytes> all;
        link.agree(*comm);
        gather.gather(*comm, link.model(), mine, all);
        if (round == 4) report("looping");
      } catch (const PeerFailure& e) {
        report("failed: peer=" + std::to_string(e.peer()) + " " + e.what());
        return kExpectedFailure;
      }
    }
  });
  for (int r = 0; r < P; ++r)
    ASSERT_TRUE(group.wait_for_report(r, "looping", std::chrono::seconds(60))) << "rank " << r;
  group.signal(victim, SIGKILL);
  auto results = group.wait(timeout * 3 + std::chrono::seconds(10), victim);
  int naming_victim = 0;
  for (int r = 0; r < P; ++r) {
    if (r == victim) continue;
    const auto& c = results[static_cast<size_t>(r)];
    EXPECT_FALSE(c.watchdog_killed) << describe(results);
    EXPECT_TRUE(c.exited && c.exit_code == kExpectedFailure) << describe(results);
    EXPECT_EQ(c.report.find("failed: peer=-1"), std::string::npos) << describe(results);
    if (c.report.find("failed: peer=2 ") != std::string::npos) ++naming_victim;
  }
  EXPECT_GE(naming_victim, 1) << describe(results);
}

}  // namespace
}  // namespace gradex::test
