// The cost model alone (sync/policy/cost_model.h): alpha and beta recovered from synthetic
// transfers, forgetting, codec costs, step timings, and the snapshot's byte form.
#include <gtest/gtest.h>

#include "base/error.h"
#include "compress/backend/block_codec.h"
#include "sync/policy/cost_model.h"

namespace gradex::sync::cost {
namespace {

TEST(LinkFit, RecoversAlphaAndBetaFromCollectiveShapes) {
  const LinkParams truth{40e-6, 1.0 / 1.25e8, true};  // 1 Gbit/s
  LinkFit fit;
  for (int p : {2, 4, 8})
    for (double bytes : {1e3, 1e5, 4e6}) {
      fit.add(ring_allreduce_terms(bytes, p).latency, ring_allreduce_terms(bytes, p).bytes,
              ring_allreduce_terms(bytes, p).seconds(truth));
      const Terms g = allgatherv_terms(bytes / 100, p, p >= 8);
      fit.add(g.latency, g.bytes, g.seconds(truth));
    }
  const LinkParams got = fit.params(LinkParams{});
  EXPECT_TRUE(got.measured);
  EXPECT_NEAR(got.alpha_s, truth.alpha_s, 1e-9);
  EXPECT_NEAR(got.beta_s_per_byte, truth.beta_s_per_byte, 1e-15);
}

TEST(LinkFit, NoisyPingPongsStayClose) {
  const LinkParams truth{100e-6, 1.0 / 1.25e7, true};  // 100 Mbit/s
  LinkFit fit;
  uint32_t x = 12345;
  for (int rep = 0; rep < 20; ++rep)
    for (double bytes : {8.0, 65536.0, 262144.0}) {
      x = x * 1664525u + 1013904223u;
      const double noise = 1.0 + ((x >> 8) % 1000) / 1000.0 * 0.04 - 0.02;  // +-2%
      fit.add(2, 2 * bytes, truth.seconds(2, 2 * bytes) * noise);
    }
  const LinkParams got = fit.params(LinkParams{});
  EXPECT_NEAR(got.beta_s_per_byte / truth.beta_s_per_byte, 1.0, 0.03);
  EXPECT_NEAR(got.alpha_s, truth.alpha_s, 30e-6);
}

TEST(LinkFit, OneShapeKeepsPriorAlphaAndFitsBeta) {
  const LinkParams truth{50e-6, 1e-9, true};
  LinkParams prior;
  prior.alpha_s = 50e-6;
  LinkFit fit;
  for (int i = 0; i < 5; ++i)
    fit.add(2, 2e6, truth.seconds(2, 2e6));  // one size only: a/b constant
  const LinkParams got = fit.params(prior);
  EXPECT_DOUBLE_EQ(got.alpha_s, prior.alpha_s);
  EXPECT_NEAR(got.beta_s_per_byte, 1e-9, 1e-15);
  EXPECT_FALSE(LinkFit().params(prior).measured);  // no samples: the prior
}

// A far link probed with small messages: 20 ms a message, and jitter that makes the largest
// round trip the fastest (a negative slope). The fit keeps the measured latency, not the prior's
// LAN figure, which would price every message of a WAN step at a LAN's cost; the bandwidth, hidden
// under the jitter, is the prior's.
TEST(LinkFit, LatencyBoundSamplesWithANegativeSlopeKeepTheirLatency) {
  LinkFit fit;
  fit.add(2, 16, 0.0402);
  fit.add(2, 2e4, 0.0401);
  fit.add(2, 2e5, 0.0399);
  const LinkParams prior;
  const LinkParams got = fit.params(prior);
  EXPECT_TRUE(got.measured);
  EXPECT_NEAR(got.alpha_s, 0.02, 1e-4);
  EXPECT_EQ(got.beta_s_per_byte, prior.beta_s_per_byte);  // unmeasured under the jitter
}

TEST(LinkFit, ForgettingFollowsAChangedLink) {
  const LinkParams fast{20e-6, 1e-10, true}, slow{20e-6, 1e-8, true};
  LinkFit fit(0.8);
  for (int i = 0; i < 50; ++i)
    for (double b : {1e3, 1e6})
      fit.add(2, b, fast.seconds(2, b));
  for (int i = 0; i < 50; ++i)
    for (double b : {1e3, 1e6})
      fit.add(2, b, slow.seconds(2, b));
  EXPECT_NEAR(fit.params(LinkParams{}).beta_s_per_byte / slow.beta_s_per_byte, 1.0, 1e-3);
}

TEST(Terms, CollectiveShapes) {
  // The direct dense exchange: 2 latencies, 1 between two ranks (a swap); beyond its size, the
  // ring.
  EXPECT_DOUBLE_EQ(dense_allreduce_terms(1000, 4, 1000).latency, 2);
  EXPECT_DOUBLE_EQ(dense_allreduce_terms(1000, 2, 1000).latency, 1);
  EXPECT_DOUBLE_EQ(dense_allreduce_terms(1000, 2, 1000).bytes, 1000);
  EXPECT_DOUBLE_EQ(dense_allreduce_terms(1001, 4, 1000).latency, 6);
  EXPECT_DOUBLE_EQ(ring_allreduce_terms(1000, 4).latency, 6);
  EXPECT_DOUBLE_EQ(ring_allreduce_terms(1000, 4).bytes, 1500);
  EXPECT_DOUBLE_EQ(allgatherv_terms(100, 4, true).latency, 3);
  EXPECT_DOUBLE_EQ(allgatherv_terms(100, 4, false).latency, 2);
  EXPECT_DOUBLE_EQ(allgatherv_terms(100, 4, false).bytes, 300);
  // Receives that learn the sizes on arrival: the direct exchange is its data round alone.
  EXPECT_DOUBLE_EQ(allgatherv_terms(100, 4, false, true).latency, 1);
  EXPECT_DOUBLE_EQ(allgatherv_terms(100, 4, true, true).latency, 3);
  EXPECT_DOUBLE_EQ(allgatherv_terms(100, 4, false, true).bytes, 300);
  EXPECT_DOUBLE_EQ(ring_allreduce_terms(1000, 1).seconds(LinkParams{}), 0);
  // The quantized route: two phases of 2(P-1)/P of the encoding, or one hop of P-1 encodings.
  const double encoded4 = 1280 * compress::backend::block_codec(4).bytes_per_element();
  EXPECT_DOUBLE_EQ(int8_allreduce_terms(1280, 4, 4).latency, 2);
  EXPECT_DOUBLE_EQ(int8_allreduce_terms(1280, 4, 4).bytes, 1.5 * encoded4);
  EXPECT_DOUBLE_EQ(int8_allreduce_terms(1280, 4, 4, true).latency, 1);
  EXPECT_DOUBLE_EQ(int8_allreduce_terms(1280, 4, 4, true).bytes, 3 * encoded4);
}

TEST(CostModel, StepTimingsAndReadyTimes) {
  CostModel m;
  m.on_register("a", 100, 0);
  m.on_register("b", 200, 10);
  // Step 0: a at 10.0, b at 10.3, end at 10.5; step 1 starts 0.2 s later.
  m.on_submit("a", 10.0);
  m.on_submit("b", 10.3);
  m.on_end_step(10.5);
  m.on_submit("a", 10.7);
  m.on_submit("b", 11.0);
  m.on_end_step(11.2);
  const Snapshot s = m.snapshot();
  EXPECT_NEAR(s.backward_s, 0.3, 1e-9);
  EXPECT_NEAR(s.forward_s, 0.2, 1e-9);
  EXPECT_EQ(s.steps_seen, 2u);
  ASSERT_EQ(s.tensors.size(), 2u);
  EXPECT_EQ(s.tensors[0].key, "a");
  EXPECT_NEAR(s.tensors[0].ready_s, 0.0, 1e-9);
  EXPECT_NEAR(s.tensors[1].ready_s, 0.3, 1e-9);
  EXPECT_EQ(s.tensors[1].rows, 10u);
}

TEST(CostModel, AResubmittedKeyStartsANewStepWithoutEndStep) {
  CostModel m;
  m.on_register("a", 100, 0);
  m.on_register("b", 100, 0);
  for (int step = 0; step < 3; ++step) {  // a caller that never calls on_end_step
    m.on_submit("a", 5.0 * step);
    m.on_submit("b", 5.0 * step + 0.25);
  }
  const Snapshot s = m.snapshot();
  EXPECT_EQ(s.steps_seen, 2u);
  EXPECT_NEAR(s.backward_s, 0.25, 1e-12);
  EXPECT_NEAR(s.tensors[1].ready_s, 0.25, 1e-12);  // not growing with every step
}

TEST(CostModel, CodecCostsAreTheLeastOfLargeSamples) {
  CostModel m(CostModelOptions{0.98, 0.5});
  m.observe_codec(Codec::kDgc, 100000, 0.4e-3, 0.1e-3);
  EXPECT_DOUBLE_EQ(m.snapshot().codecs.encode_s[2], 4e-9);  // the first replaces the default
  m.observe_codec(Codec::kDgc, 100000, 0.8e-3, 0.1e-3);     // contended: not the codec's cost
  EXPECT_DOUBLE_EQ(m.snapshot().codecs.encode_s[2], 4e-9);
  m.observe_codec(Codec::kDgc, 100000, 0.2e-3, 0.1e-3);
  EXPECT_DOUBLE_EQ(m.snapshot().codecs.encode_s[2], 2e-9);
  // A small unit (its fixed cost would read as a cost per element) does not count, either way.
  m.observe_codec(Codec::kDgc, 10, 1e-9, 1e-9);
  EXPECT_DOUBLE_EQ(m.snapshot().codecs.encode_s[2], 2e-9);
  // DGC's decode is per received value when given.
  CostModel w;
  w.observe_codec(Codec::kDgc, 1u << 20, 1e-3, 4e-6, 4000);
  EXPECT_DOUBLE_EQ(w.snapshot().codecs.decode_s[2], 1e-9);
  m.observe_dgc_payload(100, 500);
  EXPECT_DOUBLE_EQ(m.snapshot().codecs.dgc_bytes_per_selected, 5.0);
}

TEST(CostModel, CollectiveCpuIsTheLeastPerElementAndPerByte) {
  CostModel m;
  EXPECT_EQ(m.snapshot().codecs.reduce_s[0], 0.0);  // not priced until measured
  EXPECT_EQ(m.snapshot().codecs.transport_s_per_byte, 0.0);
  m.observe_reduce(Codec::kHalf, 1u << 20, 1.0e-3);
  m.observe_reduce(Codec::kHalf, 1u << 20, 2.0e-3);  // a contended run
  m.observe_reduce(Codec::kFp32, 1u << 20, 0.25e-3);
  m.observe_transport(8u << 20, 4e-3);
  m.observe_transport(8u << 20, 2e-3);
  m.observe_transport(0, 1.0);  // nothing measured (no socket could be made): ignored
  const CodecCosts c = m.snapshot().codecs;
  EXPECT_DOUBLE_EQ(c.reduce_s[1], 1.0e-3 / (1u << 20));
  EXPECT_DOUBLE_EQ(c.reduce_s[0], 0.25e-3 / (1u << 20));
  EXPECT_DOUBLE_EQ(c.transport_s_per_byte, 2e-3 / (8u << 20));
}

TEST(CostModel, TransfersRefineTheProbe) {
  CostModel m;
  LinkParams probed{30e-6, 1e-9, true};
  m.set_link(PeerClass::kOtherHost, probed);
  EXPECT_DOUBLE_EQ(m.snapshot().link[1].beta_s_per_byte, 1e-9);
  const LinkParams now{30e-6, 4e-9, true};
  for (double b : {1e4, 1e6, 4e6}) {
    const Terms t = ring_allreduce_terms(b, 4);
    m.observe_transfer(PeerClass::kOtherHost, t, t.seconds(now));
  }
  EXPECT_NEAR(m.snapshot().link[1].beta_s_per_byte, 4e-9, 1e-13);
  EXPECT_FALSE(m.snapshot().link[0].measured);
}

TEST(CostModel, TransfersPacedByTheCpuLeaveTheLinkAlone) {
  CostModel m;
  const LinkParams probed{15e-6, 0.4e-9, true};  // a fast link: 20 Gbit/s
  m.set_link(PeerClass::kSameHost, probed);
  // Transfers that took 10x the probe's time, whose predicted CPU (1 ns per byte) exceeds their
  // bytes' time at the probe's beta: the CPU paced them, and the link keeps the probe's numbers.
  // So do small ones that took 5 ms: their bytes' time is below their CPU too, whatever their
  // latencies' time.
  for (double b : {1e3, 1e6, 4e6, 16e6}) {
    const Terms t = ring_allreduce_terms(b, 4);
    m.observe_transfer(PeerClass::kSameHost, t, b < 1e4 ? 5e-3 : 10 * t.seconds(probed),
                       t.bytes * 1e-9);
  }
  EXPECT_DOUBLE_EQ(m.snapshot().link[0].beta_s_per_byte, probed.beta_s_per_byte);
  EXPECT_DOUBLE_EQ(m.snapshot().link[0].alpha_s, probed.alpha_s);
  // The same transfers with a CPU below their wire time are the link's: fitted.
  for (double b : {1e6, 4e6, 16e6}) {
    const Terms t = ring_allreduce_terms(b, 4);
    m.observe_transfer(PeerClass::kSameHost, t, 10 * t.seconds(probed), t.bytes * 0.1e-9);
  }
  EXPECT_GT(m.snapshot().link[0].beta_s_per_byte, 5 * probed.beta_s_per_byte);
}

TEST(Snapshot, RoundTripsAndRejectsGarbage) {
  Snapshot s;
  s.link[1] = {1e-4, 2e-8, true};
  s.codecs.encode_s[1] = 7e-10;
  s.backward_s = 0.25;
  s.forward_s = 0.125;
  s.steps_seen = 9;
  s.calibration = 1.5;
  s.codecs.reduce_s = {0.3e-9, 1.1e-9, 0.0};
  s.codecs.transport_s_per_byte = 0.45e-9;
  s.cpu_share = 2.0;
  s.codec_factor = {1.0, 2.5, 0.75, 1.0};
  s.tensors = {{"fc.weight", 20480, 10, 0.01}, {"conv1", 9408, 64, 0.2}};
  const std::vector<uint8_t> bytes = s.encode();
  const Snapshot back = Snapshot::decode(bytes.data(), bytes.size());
  EXPECT_TRUE(back == s);
  EXPECT_EQ(back.codecs.reduce_s[1], 1.1e-9);
  EXPECT_EQ(back.codecs.transport_s_per_byte, 0.45e-9);
  EXPECT_EQ(back.cpu_share, 2.0);
  EXPECT_EQ(back.codec_factor[1], 2.5);
  EXPECT_EQ(back.codec_factor[2], 0.75);
  EXPECT_EQ(back.tensors[0].rows, 10u);
  std::vector<uint8_t> bad = bytes;
  bad[0] ^= 1;
  EXPECT_THROW(Snapshot::decode(bad.data(), bad.size()), CorruptPayload);
  EXPECT_THROW(Snapshot::decode(bytes.data(), bytes.size() - 1), Error);
}

}  // namespace
}  // namespace gradex::sync::cost
