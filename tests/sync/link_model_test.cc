// The engine's one link model (sync/policy/link_model.h): every (collective, algorithm) priced
// against alpha + beta * bytes worked by hand, per tier; the flat tier's incast; the encoding that
// carries rank 0's numbers; and over real UCX (ranks as threads, each its own host) the agreed
// model: bit-identical on every rank, probed once per membership.
#include <gtest/gtest.h>

#include <mutex>

#include "base/error.h"
#include "sync/policy/agreed_link.h"
#include "sync/policy/link_model.h"
#include "tests/comm/rank_harness.h"

namespace gradex::sync {
namespace {

using cost::LinkParams;

// Three tiers with distinct numbers: a host's shared memory, a region's LAN, a WAN.
LinkModel three_tiers(int world) {
  LinkModel m;
  m.tiers = {LinkParams{2e-6, 0.1e-9, true}, LinkParams{50e-6, 1e-9, true},
             LinkParams{25e-3, 8e-9, true}};
  m.present = {true, true, true};
  m.flat = Tier::kAcross;
  m.world_size = world;
  return m;
}

TEST(LinkModel, EveryCollectiveAndAlgorithmIsAlphaPlusBetaTimesItsBytes) {
  const LinkModel m = three_tiers(4);
  const double B = 1000000;
  // By hand, for P = 4 ranks: (messages on the critical path, bytes through the busiest link).
  struct Case {
    Collective c;
    Algorithm a;
    double latency, bytes;
  };
  const Case cases[] = {
      {Collective::kAllreduce, Algorithm::kRing, 6, 1.5 * B},
      {Collective::kAllreduce, Algorithm::kDirect, 2, 1.5 * B},
      {Collective::kAllreduce, Algorithm::kOneHop, 1, 3 * B},
      {Collective::kReduceScatter, Algorithm::kRing, 3, 0.75 * B},
      {Collective::kReduceScatter, Algorithm::kDirect, 1, 0.75 * B},
      {Collective::kAllgather, Algorithm::kRing, 3, 3 * B},
      {Collective::kAllgather, Algorithm::kDirect, 2, 3 * B},
      {Collective::kAllgather, Algorithm::kDirectUnsized, 1, 3 * B},
      {Collective::kBroadcast, Algorithm::kRing, 3, B},
      {Collective::kBroadcast, Algorithm::kDirect, 1, 3 * B},
  };
  for (const Case& k : cases) {
    const cost::Terms t = collective_terms(k.c, k.a, B, 4);
    EXPECT_DOUBLE_EQ(t.latency, k.latency) << collective_name(k.c) << " " << algorithm_name(k.a);
    EXPECT_DOUBLE_EQ(t.bytes, k.bytes) << collective_name(k.c) << " " << algorithm_name(k.a);
    // Per tier: that tier's alpha and beta, nothing else.
    for (Tier tier : {Tier::kHost, Tier::kRegion, Tier::kAcross}) {
      const LinkParams& l = m.link(tier);
      EXPECT_DOUBLE_EQ(m.seconds(tier, k.c, k.a, 1000000, 4),
                       k.latency * l.alpha_s + k.bytes * l.beta_s_per_byte)
          << tier_name(tier) << " " << collective_name(k.c) << " " << algorithm_name(k.a);
    }
  }
  // The ring allreduce of 1 MB across regions: 6 * 25 ms + 1.5 MB * 8 ns.
  EXPECT_DOUBLE_EQ(m.seconds(Tier::kAcross, Collective::kAllreduce, Algorithm::kRing, 1000000, 4),
                   0.15 + 0.012);
  // Two ranks swap their buffers directly: one message, the whole buffer.
  EXPECT_DOUBLE_EQ(collective_terms(Collective::kAllreduce, Algorithm::kDirect, B, 2).latency, 1);
  EXPECT_DOUBLE_EQ(collective_terms(Collective::kAllreduce, Algorithm::kDirect, B, 2).bytes, B);
  // One rank moves nothing.
  EXPECT_DOUBLE_EQ(m.seconds(Tier::kAcross, Collective::kAllreduce, Algorithm::kRing, 1000, 1), 0);
  // Pairs the comm layer does not run are refused by name.
  EXPECT_THROW(collective_terms(Collective::kBroadcast, Algorithm::kOneHop, B, 4), InvalidArgument);
  EXPECT_THROW(collective_terms(Collective::kAllreduce, Algorithm::kDirectUnsized, B, 4),
               InvalidArgument);
}

// The codec choice's named shapes are the model's (one pricing of the ring, not two).
TEST(LinkModel, TheCostModelsTermsAreTheModels) {
  for (int P : {2, 3, 4, 8}) {
    const double B = 123456;
    const cost::Terms ring = cost::ring_allreduce_terms(B, P);
    const cost::Terms mine = collective_terms(Collective::kAllreduce, Algorithm::kRing, B, P);
    EXPECT_EQ(ring.latency, mine.latency);
    EXPECT_EQ(ring.bytes, mine.bytes);
    const cost::Terms direct = cost::dense_allreduce_terms(B, P, UINT64_MAX);
    EXPECT_EQ(direct.latency,
              collective_terms(Collective::kAllreduce, Algorithm::kDirect, B, P).latency);
    EXPECT_EQ(cost::allgatherv_terms(B, P, false, true).latency,
              collective_terms(Collective::kAllgather, Algorithm::kDirectUnsized, B, P).latency);
  }
}

// On the flat tier, across hosts, the direct phases pay the incast's price; the ring does not.
TEST(LinkModel, TheFlatTiersDirectPhasesPayTheIncast) {
  LinkModel m = three_tiers(4);
  const uint64_t B = 100u << 20;  // 75 MiB per phase into each rank: beyond a 1 ms queue
  const LinkParams& wan = m.link();
  EXPECT_DOUBLE_EQ(m.seconds(Collective::kAllreduce, Algorithm::kRing, B),
                   6 * wan.alpha_s + 1.5 * B * wan.beta_s_per_byte);
  EXPECT_DOUBLE_EQ(m.seconds(Collective::kAllreduce, Algorithm::kDirect, B),
                   2 * wan.alpha_s + 1.5 * B * wan.beta_s_per_byte + 2 * LinkModel::kIncastPenalty);
  // A burst measured up to that size that cost nothing: no incast price.
  m.bursts = {{uint64_t{128} << 20, 0, 0}};
  EXPECT_DOUBLE_EQ(m.seconds(Collective::kAllreduce, Algorithm::kDirect, B),
                   2 * wan.alpha_s + 1.5 * B * wan.beta_s_per_byte);
  // Inside a host nothing converges through a switch port.
  m.flat = Tier::kHost;
  m.bursts.clear();
  EXPECT_DOUBLE_EQ(m.seconds(Collective::kAllreduce, Algorithm::kDirect, B),
                   2 * m.link(Tier::kHost).alpha_s + 1.5 * B * m.link(Tier::kHost).beta_s_per_byte);
}

// The one direct-or-ring rule of a flat dense allreduce: direct where priced 10% faster.
TEST(LinkModel, TheDenseDirectOrRingRuleIsThePricedOne) {
  for (double alpha : {50e-6, 25e-3})
    for (uint64_t bytes : {uint64_t{4} << 10, uint64_t{400} << 10, uint64_t{100} << 20}) {
      const LinkModel m = LinkModel::single({alpha, 8e-9, true}, Tier::kHost, 4);
      const double direct = m.seconds(Collective::kAllreduce, Algorithm::kDirect, bytes);
      const double ring = m.seconds(Collective::kAllreduce, Algorithm::kRing, bytes);
      EXPECT_EQ(m.dense_direct_for(bytes), direct < LinkModel::kDenseDirectGain * ring)
          << alpha << " " << bytes;
    }
  // One rank: nothing to choose.
  EXPECT_FALSE(LinkModel::single({25e-3, 8e-9, true}, Tier::kHost, 1).dense_direct_for(1000));
}

TEST(LinkModel, EncodesBitForBit) {
  LinkModel m = three_tiers(6);
  m.port_queue_s = 2.5e-3;
  m.bursts = {{3u << 20, 0.001, 0.06}, {12u << 20, 0.02, 0.2}};
  const std::vector<uint8_t> bytes = m.encode();
  const LinkModel back = LinkModel::decode(bytes.data(), bytes.size());
  EXPECT_EQ(back, m);
  EXPECT_EQ(back.flat, Tier::kAcross);
  EXPECT_EQ(back.link(Tier::kRegion).alpha_s, 50e-6);
  EXPECT_EQ(back.bursts.size(), 2u);
  std::vector<uint8_t> bad = bytes;
  bad[0] ^= 1;
  EXPECT_THROW(LinkModel::decode(bad.data(), bad.size()), CorruptPayload);
  EXPECT_THROW(LinkModel::decode(bytes.data(), bytes.size() - 1), CorruptPayload);
  EXPECT_NE(m.describe().find("across regions"), std::string::npos) << m.describe();
}

// A rank's own host identity (comm::CommOptions::host_id), so that threads look like hosts.
class OwnHostCommunicator : public test::CountingCommunicator {
 public:
  explicit OwnHostCommunicator(comm::Communicator& inner)
      : CountingCommunicator(inner), options_(inner.options()) {
    options_.host_id = "host" + std::to_string(inner.rank());
  }
  const comm::CommOptions& options() const override { return options_; }

 private:
  comm::CommOptions options_;
};

// Every rank holds rank 0's numbers bit for bit although each measured its own; a second agree()
// does not probe again (no message sent); reset() (a new membership) does.
TEST(AgreedLink, EveryRankHoldsRankZerosModelProbedOncePerMembership) {
  constexpr int kRanks = 3;
  std::mutex m;
  std::vector<std::vector<uint8_t>> agreed(kRanks), again(kRanks);
  std::vector<uint64_t> sent_by_second(kRanks);
  test::run_ranks(kRanks, [&](comm::Communicator& inner) {
    OwnHostCommunicator comm(inner);
    AgreedLink link(1e-3, /*port_queue_explicit=*/true);
    EXPECT_EQ(link.model(), nullptr);
    // The generation tells a caller that caches what it derived from the model (the executor's
    // LinkPaths) when to derive it again: at every new model, never between.
    const uint64_t unprobed = link.generation();
    const LinkModel& first = link.agree(comm);
    const uint64_t probed = link.generation();
    EXPECT_NE(probed, unprobed);
    const std::vector<uint8_t> bytes = first.encode();
    const uint64_t before = comm.sends;
    const LinkModel& second = link.agree(comm);
    const uint64_t sent = comm.sends - before;
    EXPECT_EQ(&first, &second);
    EXPECT_EQ(link.generation(), probed);
    link.reset();
    EXPECT_EQ(link.model(), nullptr);
    const uint64_t after_reset = link.generation();
    EXPECT_NE(after_reset, probed);
    const std::vector<uint8_t> re = link.agree(comm).encode();
    EXPECT_NE(link.generation(), after_reset);
    AgreedLink copy(1e-3, /*port_queue_explicit=*/true);
    const uint64_t empty_copy = copy.generation();
    copy.adopt(link);
    EXPECT_NE(copy.generation(), empty_copy);
    std::lock_guard<std::mutex> lock(m);
    agreed[static_cast<size_t>(comm.rank())] = bytes;
    again[static_cast<size_t>(comm.rank())] = re;
    sent_by_second[static_cast<size_t>(comm.rank())] = sent;
  });
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_EQ(agreed[static_cast<size_t>(r)], agreed[0]) << r;
    EXPECT_EQ(again[static_cast<size_t>(r)], again[0]) << r;
    EXPECT_EQ(sent_by_second[static_cast<size_t>(r)], 0u) << r;
  }
  const LinkModel model = LinkModel::decode(agreed[0].data(), agreed[0].size());
  EXPECT_TRUE(model.crosses_hosts());
  EXPECT_EQ(model.world_size, kRanks);
  EXPECT_TRUE(model.link().measured);
  EXPECT_GT(model.link().beta_s_per_byte, 0);
  EXPECT_TRUE(model.bursts.empty());  // GRADEX_PORT_QUEUE_MS written: no burst measured
}

}  // namespace
}  // namespace gradex::sync
