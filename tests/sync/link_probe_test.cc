// The link probe and the agreement on rank 0's numbers (sync/policy/link_probe.h), ranks as threads
// over real UCX: every rank ends with the same numbers, and so the same codec choices, although
// each measured its own.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <mutex>
#include <thread>

#include "sync/policy/codec_choice.h"
#include "sync/policy/link_probe.h"
#include "sync/policy/transport_cpu.h"
#include "tests/comm/rank_harness.h"

namespace gradex::sync::cost {
namespace {

// Sends of one rank wait `delay` before they leave: that rank's host is far from every other.
class FarRankCommunicator : public test::CountingCommunicator {
 public:
  FarRankCommunicator(comm::Communicator& inner, int far_rank, std::chrono::microseconds delay)
      : CountingCommunicator(inner), far_(inner.rank() == far_rank), delay_(delay) {}
  comm::RequestPtr isend(int peer, uint64_t tag, const void* data, size_t bytes) override {
    if (far_) std::this_thread::sleep_for(delay_);
    return CountingCommunicator::isend(peer, tag, data, bytes);
  }

 private:
  bool far_;
  std::chrono::microseconds delay_;
};

// probe_links on one rank per entry of `hosts` (that rank's host identity), ranks as threads: every
// rank's result, by rank. Rank `far_rank` (none: -1) sends every message `delay` late.
std::vector<ProbeResult> probe_every_rank(const std::vector<std::string>& hosts,
                                          const ProbeOptions& options, int far_rank = -1,
                                          std::chrono::microseconds delay = {}) {
  std::mutex m;
  std::vector<ProbeResult> results(hosts.size());
  test::run_ranks(static_cast<int>(hosts.size()), [&](comm::Communicator& inner) {
    FarRankCommunicator comm(inner, far_rank, delay);
    const auto rank = static_cast<size_t>(comm.rank());
    ProbeResult r = probe_links(comm, hosts[rank], options);
    std::lock_guard<std::mutex> lock(m);
    results[rank] = std::move(r);
  });
  return results;
}

TEST(LinkProbe, MeasuresEachClassAndAgrees) {
  const std::vector<std::string> hosts{"hostA", "hostA", "hostB"};
  ProbeOptions o;
  o.repeats = 2;
  const std::vector<ProbeResult> results = probe_every_rank(hosts, o);
  for (const ProbeResult& r : results) {
    EXPECT_EQ(r.hosts, hosts);
    EXPECT_EQ(collective_class(r.hosts), PeerClass::kOtherHost);
    // One other host, a loopback away: inside the region, the tier flat collectives cross.
    EXPECT_EQ(r.flat, Tier::kRegion);
    EXPECT_EQ(r.peers[static_cast<size_t>(Tier::kHost)], 1);
    EXPECT_EQ(r.peers[static_cast<size_t>(Tier::kRegion)], 2);
    EXPECT_EQ(r.peers[static_cast<size_t>(Tier::kAcross)], -1);
    // Rank 0's CPU over its dearest largest round trip with the other-host peer (256 KiB each
    // way), the same on every rank.
    EXPECT_EQ(r.transport_bytes, 2u * (256u << 10));
    EXPECT_GT(r.transport_cpu_s, 0.0);
    EXPECT_EQ(r.transport_cpu_s, results[0].transport_cpu_s);
    for (int c : {0, 1}) {
      EXPECT_TRUE(r.link[c].measured) << c;
      EXPECT_GE(r.link[c].alpha_s, 0);
      EXPECT_GT(r.link[c].beta_s_per_byte, 0);
      // Bit-identical to rank 0's.
      EXPECT_EQ(r.link[c].alpha_s, results[0].link[c].alpha_s);
      EXPECT_EQ(r.link[c].beta_s_per_byte, results[0].link[c].beta_s_per_byte);
    }
  }
}

// The other-host class is measured with the farthest host (a flat collective waits on its slowest
// link), not the lowest-ranked one: here rank 3, whose every message leaves 20 ms late, while ranks
// 1 and 2 (another host each) answer at loopback speed. Every rank learns the same peer and the
// fit's latency is the far link's (about 10 ms a message; a loopback link fits tens of us). The
// same-host class keeps the lowest rank on rank 0's host.
TEST(LinkProbe, MeasuresTheOtherHostClassWithTheFarthestHost) {
  const std::vector<std::string> hosts{"near", "hostB", "hostC", "far", "near"};
  constexpr int kFar = 3;
  ProbeOptions o;
  o.repeats = 2;
  const std::vector<ProbeResult> results =
      probe_every_rank(hosts, o, kFar, std::chrono::milliseconds(20));
  // The far host's round trips lie a gap above the others': it is across regions, the flat tier;
  // the farther of the two near hosts is the region's.
  constexpr auto kAcross = static_cast<size_t>(Tier::kAcross);
  constexpr auto kRegion = static_cast<size_t>(Tier::kRegion);
  for (const ProbeResult& r : results) {
    EXPECT_EQ(r.peers[kAcross], kFar);
    EXPECT_EQ(r.flat, Tier::kAcross);
    EXPECT_TRUE(r.peers[kRegion] == 1 || r.peers[kRegion] == 2) << r.peers[kRegion];
    EXPECT_EQ(r.peers[kRegion], results[0].peers[kRegion]);
    EXPECT_EQ(r.peers[static_cast<size_t>(Tier::kHost)], 4);
    EXPECT_GT(r.link[kAcross].alpha_s, 5e-3);
    EXPECT_LT(r.link[kRegion].alpha_s, r.link[kAcross].alpha_s);
    EXPECT_EQ(r.link[kAcross].alpha_s, results[0].link[kAcross].alpha_s);
    EXPECT_EQ(r.class_link(PeerClass::kOtherHost).alpha_s, r.link[kAcross].alpha_s);
  }
  // One other host: chosen without a round trip of its own; a loopback away, inside the region.
  const std::vector<ProbeResult> two = probe_every_rank({"a", "a", "b", "b"}, o);
  for (const ProbeResult& r : two) {
    EXPECT_EQ(r.peers[kRegion], 2);
    EXPECT_EQ(r.peers[kAcross], -1);
    EXPECT_EQ(r.peers[static_cast<size_t>(Tier::kHost)], 1);
  }
}

// The regions' round trips, given (ProbeOptions::rank0_round_trips_s), choose the peers without
// pings of the probe's own: on loopback no host is a gap away, yet the one given as 80 ms is across
// and the farther of the two given as 1 ms and 2 ms is the region's, on every rank.
TEST(LinkProbe, TakesItsPeersFromTheRegionsRoundTripsWhenGiven) {
  const std::vector<std::string> hosts{"a", "b", "c", "d"};
  ProbeOptions o;
  o.repeats = 2;
  o.rank0_round_trips_s = {{1, 1e-3}, {2, 80e-3}, {3, 2e-3}};
  const std::vector<ProbeResult> results = probe_every_rank(hosts, o);
  for (const ProbeResult& r : results) {
    EXPECT_EQ(r.peers[static_cast<size_t>(Tier::kAcross)], 2);
    EXPECT_EQ(r.peers[static_cast<size_t>(Tier::kRegion)], 3);
    EXPECT_EQ(r.flat, Tier::kAcross);
  }
  // Not every other host's: the probe pings them itself, and finds rank 1 (20 ms further here)
  // across.
  o.rank0_round_trips_s = {{1, 1e-3}, {2, 80e-3}};
  for (const ProbeResult& r : probe_every_rank(hosts, o, 1, std::chrono::milliseconds(20)))
    EXPECT_EQ(r.peers[static_cast<size_t>(Tier::kAcross)], 1);
}

// Sends of up to `window` bytes leave after bytes * slow_s_per_byte, larger ones after bytes *
// fast_s_per_byte: round trips limited by a window the way a long TCP path limits them, and a
// stream that runs at the line.
class WindowLimitedCommunicator : public test::CountingCommunicator {
 public:
  WindowLimitedCommunicator(comm::Communicator& inner, size_t window, double slow, double fast)
      : CountingCommunicator(inner), window_(window), slow_(slow), fast_(fast) {}
  comm::RequestPtr isend(int peer, uint64_t tag, const void* data, size_t bytes) override {
    const double per_byte = bytes <= window_ ? slow_ : fast_;
    std::this_thread::sleep_for(std::chrono::duration<double>(bytes * per_byte));
    return CountingCommunicator::isend(peer, tag, data, bytes);
  }

 private:
  size_t window_;
  double slow_, fast_;
};

// Beta at line rate: round trips of at most 128 KiB read 1000 ns per byte (the window), a stream
// above it 10; the probe takes the stream's (within what sleeping threads on a loaded machine
// keep: a factor of 5 either way, far from the window's), and every rank holds the same number.
TEST(LinkProbe, BetaIsTheStreamsWhereTheRoundTripsAreWindowLimited) {
  const std::vector<std::string> hosts{"a", "b"};
  ProbeOptions o;
  o.repeats = 1;
  o.sizes = {8, 32u << 10, 128u << 10};
  o.short_path_stream_seconds = 5;  // 5 MB at the window's rate: 50 ms at the line's
  auto probe = [&](const ProbeOptions& options) {
    std::mutex m;
    std::vector<ProbeResult> results(hosts.size());
    test::run_ranks(2, [&](comm::Communicator& inner) {
      WindowLimitedCommunicator comm(inner, 128u << 10, 1000e-9, 10e-9);
      const auto rank = static_cast<size_t>(comm.rank());
      ProbeResult r = probe_links(comm, hosts[rank], options);
      std::lock_guard<std::mutex> lock(m);
      results[rank] = std::move(r);
    });
    return results;
  };
  const std::vector<ProbeResult> results = probe(o);
  for (const ProbeResult& r : results) {
    const LinkParams& l = r.link[static_cast<size_t>(r.flat)];
    EXPECT_LT(l.beta_s_per_byte, 50e-9);
    EXPECT_GT(l.beta_s_per_byte, 2e-9);
    EXPECT_EQ(l.beta_s_per_byte, results[0].link[static_cast<size_t>(r.flat)].beta_s_per_byte);
  }
  // Without the stream the window's rate stands.
  ProbeOptions no_stream = o;
  no_stream.stream_bytes_max = 0;
  const std::vector<ProbeResult> window = probe(no_stream);
  EXPECT_GT(window[1].link[static_cast<size_t>(window[1].flat)].beta_s_per_byte, 500e-9);
}

// On a short path the stream moves what the fit moves in short_path_stream_seconds, not in
// stream_max_seconds (a long path's): a LAN's probe spends 30 ms of the line on each stream.
TEST(LinkProbe, AShortPathsStreamLastsShortPathStreamSeconds) {
  const std::vector<std::string> hosts{"a", "b"};
  auto streamed = [&](double short_seconds) {
    ProbeOptions o;
    o.repeats = 1;
    o.sizes = {8, 32u << 10, 128u << 10};
    o.short_path_stream_seconds = short_seconds;
    uint64_t sent = 0;
    test::run_ranks(2, [&](comm::Communicator& inner) {
      WindowLimitedCommunicator comm(inner, 0, 0, 20e-9);  // every send at 20 ns a byte
      probe_links(comm, hosts[static_cast<size_t>(comm.rank())], o);
      if (comm.rank() == 1) sent = comm.bytes_sent();
    });
    return sent;
  };
  const uint64_t short_stream = streamed(0.03), long_stream = streamed(0.12);
  // Three streams of what 20 ns a byte moves in the time (fewer where the fit reads the loopback
  // slower), beside the round trips' few hundred kB.
  EXPECT_LT(short_stream, 3 * 1.5e6 + 1e6) << short_stream;
  EXPECT_GT(long_stream, 2 * short_stream) << long_stream << " against " << short_stream;
}

TEST(LinkProbe, OneHostLeavesTheOtherClassUnmeasured) {
  const std::vector<ProbeResult> results = probe_every_rank({"same", "same"}, ProbeOptions{});
  EXPECT_TRUE(results[1].link[0].measured);
  EXPECT_FALSE(results[1].link[1].measured);
  EXPECT_FALSE(results[1].link[2].measured);
  EXPECT_FALSE(results[1].class_link(PeerClass::kOtherHost).measured);
  EXPECT_EQ(results[1].flat, Tier::kHost);
  EXPECT_EQ(results[1].peers[static_cast<size_t>(Tier::kRegion)], -1);
  EXPECT_EQ(results[1].peers[static_cast<size_t>(Tier::kAcross)], -1);
  EXPECT_EQ(collective_class(results[1].hosts), PeerClass::kSameHost);
}

// The incast bursts: every rank on another host than rank 0 sends at once (here ranks 1-3; rank 1
// shares no host with rank 0 although ranks 1 and 2 share one), each its share of the total
// maximum, once per size; a size that the caps bring down to a smaller one's is measured once;
// every rank returns rank 0's numbers. A job on one host measures none.
TEST(LinkProbe, TimesTheIncastBurstsFromEveryOtherHostRank) {
  const std::vector<std::string> hosts{"hostA", "hostB", "hostB", "hostC"};
  ProbeOptions o;
  o.repeats = 1;
  o.burst_bytes_per_sender = {16u << 10, 64u << 10};
  o.burst_total_max_bytes = 150000;
  const std::vector<ProbeResult> results = probe_every_rank(hosts, o);
  for (const ProbeResult& r : results) {
    ASSERT_EQ(r.bursts.size(), 2u);
    EXPECT_EQ(r.bursts[0].bytes, 3u * (16u << 10));
    EXPECT_EQ(r.bursts[1].bytes, 150000u);  // 3 senders of min(64 KiB, 150000 / 3)
    for (size_t i = 0; i < 2; ++i) {
      EXPECT_GE(r.bursts[i].extra_s, 0.0);
      EXPECT_LT(r.bursts[i].extra_s, 10.0);
      EXPECT_EQ(r.bursts[i].extra_s, results[0].bursts[i].extra_s);
      // The whole time, agreed too, covers the extra.
      EXPECT_GT(r.bursts[i].seconds, 0.0);
      EXPECT_GE(r.bursts[i].seconds, r.bursts[i].extra_s);
      EXPECT_EQ(r.bursts[i].seconds, results[0].bursts[i].seconds);
    }
  }
  // A link whose fit moves little in burst_max_seconds gets smaller bursts: here 0.1 us at the
  // loopback's rate, far below either size, so both sizes come down to one burst, still one
  // equal share from every sender.
  ProbeOptions short_options = o;
  short_options.burst_max_seconds = 1e-7;
  const std::vector<ProbeResult> short_burst = probe_every_rank(hosts, short_options);
  for (const ProbeResult& r : short_burst) {
    ASSERT_EQ(r.bursts.size(), 1u);
    EXPECT_LT(r.bursts[0].bytes, 3u * (16u << 10));
    EXPECT_EQ(r.bursts[0].bytes % 3, 0u);
    EXPECT_EQ(r.bursts[0].bytes, short_burst[0].bursts[0].bytes);
  }
  // Bursts wanted only from a latency this link does not have: none timed, on every rank.
  ProbeOptions far_only = o;
  far_only.burst_min_alpha_s = 10.0;
  for (const ProbeResult& r : probe_every_rank(hosts, far_only))
    EXPECT_TRUE(r.bursts.empty());
  ProbeOptions one_host_options;
  one_host_options.repeats = 1;
  one_host_options.burst_bytes_per_sender = {64u << 10};
  const std::vector<ProbeResult> one_host =
      probe_every_rank({"same", "same", "same"}, one_host_options);
  for (const ProbeResult& r : one_host)
    EXPECT_TRUE(r.bursts.empty());
}

// A long path (ProbeOptions::long_path_round_trip_s; 0 here, so that loopback counts as one): rank
// 0 alone decides after its first round trip to take fewer timed round trips, streams and bursts,
// and its peers follow the flags its messages carry, so the probe ends on every rank with the same
// numbers, having sent less.
TEST(LinkProbe, OnALongPathRankZeroTakesFewerRoundTripsAndThePeersFollow) {
  // One other host: with two, a loaded machine's loopback round trips to them could differ by a
  // region's gap in one probe and not in the other (a tier more or less to compare).
  const std::vector<std::string> hosts{"hostA", "hostA", "hostB", "hostB"};
  ProbeOptions o;
  o.repeats = 7;
  o.burst_bytes_per_sender = {16u << 10, 64u << 10};
  // Never a long path for the usual probe: with the default 10 ms, a loaded host's loopback round
  // trips (ctest -j3 beside it) made the usual probe take the economy too, and the two sent alike.
  o.long_path_round_trip_s = 1e9;
  auto sent_by_rank_zero = [&](const ProbeOptions& options, std::vector<ProbeResult>* out) {
    std::mutex m;
    uint64_t sent = 0;
    out->assign(hosts.size(), ProbeResult{});
    test::run_ranks(static_cast<int>(hosts.size()), [&](comm::Communicator& comm) {
      const uint64_t before = comm.bytes_sent();
      ProbeResult r = probe_links(comm, hosts[static_cast<size_t>(comm.rank())], options);
      std::lock_guard<std::mutex> lock(m);
      if (comm.rank() == 0) sent = comm.bytes_sent() - before;
      (*out)[static_cast<size_t>(comm.rank())] = std::move(r);
    });
    return sent;
  };
  std::vector<ProbeResult> usual, long_path;
  const uint64_t usual_bytes = sent_by_rank_zero(o, &usual);
  ProbeOptions long_options = o;
  long_options.long_path_round_trip_s = 0;
  const uint64_t long_bytes = sent_by_rank_zero(long_options, &long_path);
  // 8 round trips a size against 3 for every tier measured: rank 0's pings are most of what it
  // sends.
  auto tiers = [](const ProbeResult& r) {
    return static_cast<uint64_t>(
        std::count_if(r.peers.begin(), r.peers.end(), [](int peer) { return peer >= 0; }));
  };
  ASSERT_EQ(tiers(usual[0]), tiers(long_path[0]));
  EXPECT_LT(long_bytes, usual_bytes / 2) << long_bytes << " against " << usual_bytes;
  // ... and of the sizes only the first (8 B) and the largest (256 KiB), 3 round trips each: less
  // than one round trip of the middle size (64 KiB) more would send.
  EXPECT_LT(long_bytes, tiers(long_path[0]) * (3 * ((256u << 10) + 8) + (64u << 10))) << long_bytes;
  for (const ProbeResult& r : long_path) {
    EXPECT_TRUE(r.link[static_cast<size_t>(Tier::kHost)].measured);
    // Measured (a loaded machine's loopback fit can put alpha at 0), and rank 0's on every rank.
    EXPECT_TRUE(r.link[static_cast<size_t>(r.flat)].measured);
    EXPECT_EQ(r.link[static_cast<size_t>(r.flat)].alpha_s,
              long_path[0].link[static_cast<size_t>(long_path[0].flat)].alpha_s);
    ASSERT_EQ(r.bursts.size(), 2u);
    EXPECT_EQ(r.bursts[1].seconds, long_path[0].bursts[1].seconds);
  }
}

// A long path the regions' discovery timed already (ProbeOptions::rank0_round_trips_s at or above
// long_path_round_trip_s): no ping-pong runs on it. Its latency is half the known round trip, beta
// and the transport's CPU come from the stream (an untimed one of the largest ping size, then one
// sized from it), and every rank holds rank 0's numbers. Rank 0 sends the far host nothing but the
// streams' 8-byte start messages.
TEST(LinkProbe, OnAKnownLongPathTheStreamMeasuresWithoutPings) {
  const std::vector<std::string> hosts{"a", "b"};
  ProbeOptions o;
  o.rank0_round_trips_s = {{1, 0.06}};
  o.long_path_round_trip_s = 0.01;
  std::mutex m;
  std::vector<ProbeResult> results(hosts.size());
  std::vector<uint64_t> sent(hosts.size()), received(hosts.size());
  test::run_ranks(2, [&](comm::Communicator& inner) {
    test::CountingCommunicator comm(inner);
    const auto rank = static_cast<size_t>(comm.rank());
    const uint64_t sent_before = comm.bytes_sent(), received_before = comm.bytes_received();
    ProbeResult r = probe_links(comm, hosts[rank], o);
    std::lock_guard<std::mutex> lock(m);
    sent[rank] = comm.bytes_sent() - sent_before;
    received[rank] = comm.bytes_received() - received_before;
    results[rank] = std::move(r);
  });
  for (const ProbeResult& r : results) {
    const LinkParams& l = r.link[static_cast<size_t>(r.flat)];
    EXPECT_EQ(r.peers[static_cast<size_t>(r.flat)], 1);
    EXPECT_TRUE(l.measured);
    EXPECT_EQ(l.alpha_s, 0.03);
    EXPECT_GT(l.beta_s_per_byte, 0.0);
    EXPECT_EQ(l.beta_s_per_byte, results[0].link[static_cast<size_t>(r.flat)].beta_s_per_byte);
    // The transport's CPU over the timed stream, which is at least the largest ping size.
    EXPECT_GE(r.transport_bytes, 256u << 10);
    EXPECT_EQ(r.transport_bytes, results[0].transport_bytes);
    EXPECT_TRUE(r.bursts.empty());  // none asked for
  }
  // Rank 0 sent the hosts' names, two start messages and the agreed numbers: far below one
  // 256 KiB ping. Rank 1 sent the two streams.
  EXPECT_LT(sent[0], 4096u) << sent[0];
  EXPECT_GE(sent[1], (256u << 10) + results[0].transport_bytes);
  // Without the known round trip the same link is pinged.
  o.rank0_round_trips_s.clear();
  uint64_t pinged = 0;
  test::run_ranks(2, [&](comm::Communicator& comm) {
    const uint64_t before = comm.bytes_sent();
    probe_links(comm, hosts[static_cast<size_t>(comm.rank())], o);
    if (comm.rank() == 0) pinged = comm.bytes_sent() - before;
  });
  EXPECT_GT(pinged, 256u << 10);
}

// Every rank passing the host identity its UCX communicator published: the probe takes the hosts
// the connection learnt, and measures as with gathered ones.
TEST(LinkProbe, TakesTheConnectionsHostsWhenEveryRankPassesItsPublishedOne) {
  std::mutex m;
  std::vector<ProbeResult> results(3);
  std::vector<std::vector<std::string>> published(3);
  test::run_ranks(3, [&](comm::Communicator& comm) {
    const auto rank = static_cast<size_t>(comm.rank());
    const std::vector<std::string> hosts = comm.rank_hosts();
    ASSERT_EQ(hosts.size(), 3u);
    ProbeOptions o;
    o.repeats = 1;
    ProbeResult r = probe_links(comm, hosts[rank], o);
    std::lock_guard<std::mutex> lock(m);
    published[rank] = hosts;
    results[rank] = std::move(r);
  });
  for (size_t r = 0; r < 3; ++r) {
    EXPECT_EQ(results[r].hosts, published[r]);
    EXPECT_EQ(results[r].flat, Tier::kHost);  // one machine: every rank on rank 0's host
    EXPECT_TRUE(results[r].link[static_cast<size_t>(Tier::kHost)].measured);
  }
}

TEST(AgreeSnapshot, RanksWithDifferentTimingsDecideAlike) {
  constexpr int kRanks = 3;
  std::vector<std::string> local_plans(kRanks), agreed_plans(kRanks);
  std::vector<std::vector<uint8_t>> agreed(kRanks);
  test::run_ranks(kRanks, [&](comm::Communicator& comm) {
    const int r = comm.rank();
    // Each rank measured its own link, codec and step times.
    CostModel model;
    model.set_link(PeerClass::kSameHost, {50e-6 * (r + 1), 1e-8 * (r + 1), true});
    model.observe_codec(Codec::kDgc, 1000, 3e-6 * (r + 1), 1e-6);
    // ... and its own rings' CPU (reductions, socket copies).
    model.observe_reduce(Codec::kHalf, 1u << 20, 1e-3 * (r + 1));
    model.observe_transport(8u << 20, 4e-3 * (r + 1));
    const double base = 100.0 * r;
    for (const char* key : {"a", "b", "c"})
      model.on_register(key, 3000000, 0);
    model.on_submit("a", base);
    model.on_submit("b", base + 0.01 * (r + 1));
    model.on_submit("c", base + 0.02 * (r + 1));
    model.on_end_step(base + 0.03 * (r + 1));
    Snapshot local = model.snapshot();
    // ... and its own units' measured-over-predicted factors (the step-4 refit's).
    local.codec_factor[static_cast<size_t>(Codec::kHalf)] = 1.0 + r;
    const Snapshot shared = agree_snapshot(comm, local);
    ChoiceOptions o;
    o.world_size = kRanks;
    auto plan_of = [&](const Snapshot& s) {
      std::vector<TensorInput> in;
      for (const TensorTiming& t : s.tensors) {
        TensorInput i;
        i.key = t.key;
        i.numel = t.numel;
        i.ready_s = t.ready_s;
        in.push_back(i);
      }
      return choose_codecs(in, s, o, 100).describe();
    };
    local_plans[static_cast<size_t>(r)] = plan_of(local);
    agreed_plans[static_cast<size_t>(r)] = plan_of(shared);
    agreed[static_cast<size_t>(r)] = shared.encode();
    EXPECT_EQ(shared.codecs.transport_s_per_byte, 4e-3 / (8u << 20));  // rank 0's
    EXPECT_EQ(shared.codecs.reduce_s[1], 1e-3 / (1u << 20));
    EXPECT_EQ(shared.codec_factor[static_cast<size_t>(Codec::kHalf)], 1.0);
  });
  EXPECT_NE(local_plans[0], local_plans[2]);  // the ranks' own numbers would disagree
  for (int r = 1; r < kRanks; ++r) {
    EXPECT_EQ(agreed[static_cast<size_t>(r)], agreed[0]);
    EXPECT_EQ(agreed_plans[static_cast<size_t>(r)], agreed_plans[0]);
  }
  EXPECT_EQ(agreed_plans[0], local_plans[0]);  // rank 0's numbers are the ones used
}

TEST(TransportCpu, MeasuresThisHostsSocketCost) {
  const TransportSample t = measure_transport(1u << 20, 64u << 10, 2);
  EXPECT_EQ(t.bytes, 1u << 20) << t.via;
  EXPECT_GT(t.seconds, 0.0);
  EXPECT_NE(std::string(t.via), "none");
  EXPECT_EQ(measure_transport(0).bytes, 0u);
}

}  // namespace
}  // namespace gradex::sync::cost
