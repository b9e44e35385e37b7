// The codec choice from measured numbers (sync/policy/codec_choice.h): calibration factors, the
// first plan from start-up numbers, the collectives' CPU, the horizon rule, and the Adam codec's
// rung.
#include <gtest/gtest.h>

#include <algorithm>

#include "codec_choice_fixture.h"
#include "sync/policy/codec_choice.h"
#include "sync/policy/codec_planner.h"

namespace gradex::sync::cost {
namespace {

using namespace choice_fixture;

TEST(CodecChoice, CalibrationScalesEveryPrediction) {
  Snapshot s = numbers(1);
  double e1, c1, d1, l1, e2, c2, d2, l2;
  const TensorInput t = input("w", 1000000, 0, 0);
  rung_costs(t, {Codec::kDgc, 0.99}, s, options(), e1, c1, d1, &l1);
  s.calibration = 2;
  rung_costs(t, {Codec::kDgc, 0.99}, s, options(), e2, c2, d2, &l2);
  EXPECT_DOUBLE_EQ(e2, 2 * e1);
  EXPECT_DOUBLE_EQ(c2, 2 * c1);
  EXPECT_DOUBLE_EQ(d2, 2 * d1);
  EXPECT_DOUBLE_EQ(l2, 2 * l1);
  // A link measured slower than predicted makes the choice compress harder.
  s.calibration = 1;
  const Plan fast = choose_codecs(model(), s, options(), 100);
  s.calibration = 8;
  const Plan slow = choose_codecs(model(), s, options(), 100);
  size_t fast_dgc = 0, slow_dgc = 0;
  for (const TensorChoice& c : fast.tensors)
    fast_dgc += c.rung.codec == Codec::kDgc;
  for (const TensorChoice& c : slow.tensors)
    slow_dgc += c.rung.codec == Codec::kDgc;
  EXPECT_GE(slow_dgc, fast_dgc);
  EXPECT_GE(find(slow, "layer3").rung.sparsity, find(fast, "layer3").rung.sparsity);
}

// The first plan (step 0): no compute measured yet, every tensor ready at once; the numbers are
// the start-up probe's link and the codecs measured at start-up.
Snapshot first_plan_numbers(double gbit) {
  Snapshot s = numbers(gbit);
  s.backward_s = 0;
  s.forward_s = 0;
  s.codecs.encode_s = {0.0, 0.2e-9, 1.5e-9};
  s.codecs.decode_s = {0.0, 0.2e-9, 5e-9};
  return s;
}

std::vector<TensorInput> registered() {
  std::vector<TensorInput> in = model();
  for (TensorInput& t : in)
    t.ready_s = 0;
  return in;
}

TEST(CodecChoice, FirstPlanOnASlowLinkCompressesTheLargeTensorsHard) {
  const ChoiceOptions o = options();
  const Plan p = choose_codecs(registered(), first_plan_numbers(0.1), o, 0);
  for (const char* key : {"layer3", "layer2", "layer1"}) {
    const TensorChoice& c = find(p, key);
    EXPECT_EQ(c.rung.codec, Codec::kDgc) << key << "\n" << p.describe();
    EXPECT_EQ(c.rung.sparsity, 0.999) << key << "\n" << p.describe();
  }
  // The output layer keeps at least GRADEX_POLICY_MIN_SELECTED values: never 99.9% (20 values).
  EXPECT_NE(find(p, "fc.weight").rung, (Rung{Codec::kDgc, 0.999})) << p.describe();
  // Against keeping everything dense (fixed's 16-bit), the plan ends far sooner.
  std::vector<TensorInput> dense = registered();
  for (TensorInput& t : dense)
    t.forced = Rung{Codec::kHalf, 0};
  const Plan d = choose_codecs(dense, first_plan_numbers(0.1), o, 0);
  EXPECT_LT(p.finish_s * 20, d.finish_s) << p.describe() << d.describe();
}

TEST(CodecChoice, FirstPlanOnAFastLinkStaysDense) {
  // At 400 Gbit/s even with nothing to hide behind, DGC's encode costs more than its bytes save.
  const Plan p = choose_codecs(registered(), first_plan_numbers(400), options(), 0);
  for (const TensorChoice& c : p.tensors)
    EXPECT_NE(c.rung.codec, Codec::kDgc) << c.key << "\n" << p.describe();
}

TEST(CodecChoice, NoComputeMeansAsHardAsTheLinkRequires) {
  // Compute hides a 1 Gbit/s exchange of this model only in part; with no compute the plan
  // compresses at least as hard, tensor by tensor, and ends no later than one that hides it.
  const ChoiceOptions o = options();
  const Plan with_compute = choose_codecs(model(), numbers(1), o, 100);
  const Plan none = choose_codecs(registered(), first_plan_numbers(1), o, 100);
  size_t harder = 0;
  for (const TensorChoice& c : none.tensors)
    harder += rank_of(c.rung, o) > rank_of(find(with_compute, c.key).rung, o);
  EXPECT_GT(harder, 0u) << with_compute.describe() << none.describe();
  EXPECT_GT(none.exposed_s(), 0);
  // No single tensor raised further would end it sooner by 1% of what is exposed.
  for (size_t i = 0; i < none.tensors.size(); ++i) {
    const TensorInput t = registered()[i];
    for (const Rung& r : allowed_rungs(t, o, 100)) {
      if (rank_of(r, o) <= rank_of(none.tensors[i].rung, o)) continue;
      std::vector<TensorInput> in = registered();
      for (size_t j = 0; j < in.size(); ++j)
        in[j].forced = none.tensors[j].rung;
      in[i].forced = r;
      const Plan raised = choose_codecs(in, first_plan_numbers(1), o, 100);
      EXPECT_GE(raised.finish_s, none.finish_s - 0.01 * none.exposed_s())
          << t.key << " at " << rung_name(r) << "\n"
          << none.describe();
    }
  }
}

TEST(CodecChoice, OneLaneSerialisesEncodeTransferAndDecode) {
  ChoiceOptions o = options();
  std::vector<TensorInput> in = registered();
  for (TensorInput& t : in)
    t.forced = Rung{Codec::kDgc, 0.99};
  in[0].forced = in[1].forced = in[5].forced = in[6].forced = Rung{Codec::kHalf, 0};
  const Plan overlapped = choose_codecs(in, first_plan_numbers(1), o, 100);
  o.one_lane = true;
  const Plan serial = choose_codecs(in, first_plan_numbers(1), o, 100);
  double sum = 0;
  for (const TensorChoice& c : serial.tensors)
    sum += c.encode_s + c.comm_s + c.decode_s;
  // One lane: the step is the sum of every cost less the latencies that fused units share.
  EXPECT_LE(serial.finish_s, sum + 1e-12);
  EXPECT_GT(serial.finish_s, overlapped.finish_s);
}

// Start-up numbers read under load: a first estimate that makes the 16-bit ring look
// cheaper than DGC puts a mid-size tensor there; once its units are measured dearer than that
// estimate (and DGC's as predicted), the factors move it back to DGC.
TEST(CodecChoice, MeasuredCodecFactorsMoveATensorBackFromSixteenBit) {
  const ChoiceOptions o = options();
  Snapshot s = numbers(10);
  s.backward_s = 0;
  s.forward_s = 0;
  const std::vector<TensorInput> in{input("mid", 1000000, 0, 0)};
  const Plan first = choose_codecs(in, s, o, 100);
  ASSERT_EQ(find(first, "mid").rung.codec, Codec::kHalf) << first.describe();

  // The units measured under that plan: the ring twice what the numbers predict, DGC as predicted.
  auto predicted = [&](const Rung& r, uint64_t numel) {
    double e, m, d;
    rung_costs(input("u", numel, 0, 0), r, s, o, e, m, d);
    return e + m + d;
  };
  std::vector<UnitRecord> records;
  for (int i = 0; i < 3; ++i) {
    records.push_back(
        {Codec::kHalf, {{1000000, 0.0}}, 2.0 * predicted({Codec::kHalf, 0}, 1000000)});
    records.push_back({Codec::kDgc, {{4000000, 0.999}}, predicted({Codec::kDgc, 0.999}, 4000000)});
  }
  const std::array<double, kCodecs> f = measured_codec_factors(records, s, o);
  EXPECT_NEAR(f[static_cast<size_t>(Codec::kHalf)], 2.0, 1e-9);
  EXPECT_NEAR(f[static_cast<size_t>(Codec::kDgc)], 1.0, 1e-9);
  // Codecs without measurements: the other dense ring's factor for a ring; without stage times,
  // the mean of the measured ones for the rest (1.5), never above their own numbers (1).
  EXPECT_NEAR(f[static_cast<size_t>(Codec::kFp32)], 2.0, 1e-9);
  EXPECT_NEAR(f[static_cast<size_t>(Codec::kInt8)], 1.0, 1e-9);
  // The quantized route's widths take each other's: 4-bit measured at 1.8x prices 8-bit so too
  // (it was priced at its own numbers, tried, and measured as dear as 4-bit on the loopback).
  std::vector<UnitRecord> quantized = records;
  for (int i = 0; i < 2; ++i)
    quantized.push_back(
        {Codec::kInt4, {{1000000, 0.0}}, 1.8 * predicted({Codec::kInt4, 0}, 1000000)});
  const std::array<double, kCodecs> q = measured_codec_factors(quantized, s, o);
  EXPECT_NEAR(q[static_cast<size_t>(Codec::kInt4)], 1.8, 1e-9);
  EXPECT_NEAR(q[static_cast<size_t>(Codec::kInt8)], 1.8, 1e-9);

  s.codec_factor = f;
  const Plan refit = choose_codecs(in, s, o, 100);
  EXPECT_EQ(find(refit, "mid").rung.codec, Codec::kDgc) << refit.describe();
  // A factor scales every prediction of its codec alike.
  double e1, c1, d1, e2, c2, d2;
  Snapshot plain = s;
  plain.codec_factor.fill(1.0);
  rung_costs(in[0], {Codec::kHalf, 0}, plain, o, e1, c1, d1);
  rung_costs(in[0], {Codec::kHalf, 0}, s, o, e2, c2, d2);
  EXPECT_DOUBLE_EQ(e2, 2 * e1);
  EXPECT_DOUBLE_EQ(c2, 2 * c1);
  EXPECT_DOUBLE_EQ(d2, 2 * d1);
}

// The README demo (resnet50's gradients, 4 ranks on 2 shared cores, unshaped loopback): the first
// plan, from the start-up numbers, put every tensor on 16-bit; its rings then measured 2.4x their
// prediction, all of it in their transfers (CPU-bound loopback copies), their encode and decode
// stages as predicted. DGC, not measured, inherited the rings' 2.4x and stayed unchosen (144 ms a
// step against DGC 99.9%'s 67-70 ms). Inherited from the measured stages instead, DGC's price is
// its own CPU work's, and the large tensors move to it.
TEST(CodecChoice, UnmeasuredDgcIsNotPricedByTheRingsSlowTransfers) {
  ChoiceOptions o = options();
  o.one_lane = true;
  Snapshot s;
  for (LinkParams& l : s.link)
    l = {100e-6, 8.0 / 19e9, true};  // the probe's loopback: 19 Gbit/s
  s.cpu_share = 2.0;
  s.backward_s = 0.5e-3;
  s.forward_s = 0;
  s.codecs.encode_s[static_cast<size_t>(Codec::kFp32)] = 1.8e-9;  // momentum + gather
  s.codecs.decode_s[static_cast<size_t>(Codec::kFp32)] = 0.4e-9;
  s.codecs.reduce_s[static_cast<size_t>(Codec::kFp32)] = 0.2e-9;
  s.codecs.encode_s[static_cast<size_t>(Codec::kHalf)] = 2.0e-9;  // momentum + cast
  s.codecs.decode_s[static_cast<size_t>(Codec::kHalf)] = 0.3e-9;
  s.codecs.reduce_s[static_cast<size_t>(Codec::kHalf)] = 0.2e-9;
  s.codecs.transport_s_per_byte = 0.14e-9;
  s.codecs.encode_s[static_cast<size_t>(Codec::kDgc)] = 3.2e-9;
  s.codecs.decode_s[static_cast<size_t>(Codec::kDgc)] = 35e-9;
  const std::vector<TensorInput> in{input("fc.weight", 2048000, 1000, 0.0002),
                                    input("layer4.conv2", 2359296, 0, 0.0001)};
  o.ladder = {0.9, 0.99, 0.999};
  const Plan first = choose_codecs(in, s, o, 100);
  for (const TensorChoice& c : first.tensors)
    ASSERT_EQ(c.rung.codec, Codec::kHalf) << first.describe();
  std::vector<UnitRecord> records;
  for (const TensorInput& t : in) {
    double e, m, d;
    rung_costs(t, {Codec::kHalf, 0}, s, o, e, m, d);
    for (int i = 0; i < 3; ++i)
      records.push_back({Codec::kHalf, {{t.numel, 0.0}}, 2.4 * (e + m + d), e + d});
  }
  const std::array<double, kCodecs> f = measured_codec_factors(records, s, o);
  EXPECT_NEAR(f[static_cast<size_t>(Codec::kHalf)], 2.4, 1e-9);
  EXPECT_NEAR(f[static_cast<size_t>(Codec::kDgc)], 1.0, 1e-9);  // its stages' factor, not 2.4
  EXPECT_NEAR(f[static_cast<size_t>(Codec::kFp32)], 2.4, 1e-9);
  Snapshot refit = s;
  refit.codec_factor = f;
  const Plan second = choose_codecs(in, refit, o, 100);
  for (const TensorChoice& c : second.tensors)
    EXPECT_EQ(c.rung.codec, Codec::kDgc) << second.describe();
  EXPECT_LT(second.finish_s, first.finish_s * 2.4);
  // Measured faster than predicted the other way round (stages 0.9x, whole units 0.8x): the
  // lesser, 0.8.
  std::vector<UnitRecord> quick;
  for (const TensorInput& t : in) {
    double e, m, d;
    rung_costs(t, {Codec::kHalf, 0}, s, o, e, m, d);
    for (int i = 0; i < 3; ++i)
      quick.push_back({Codec::kHalf, {{t.numel, 0.0}}, 0.8 * (e + m + d), 0.9 * (e + d)});
  }
  EXPECT_NEAR(measured_codec_factors(quick, s, o)[static_cast<size_t>(Codec::kDgc)], 0.8, 1e-9);
  // The mean of the measured factors alone (2.4, no stage times) kept 16-bit: what this test
  // guards against. Capped at DGC's own numbers, it moves.
  Snapshot mean = s;
  mean.codec_factor.fill(2.4);
  for (const TensorChoice& c : choose_codecs(in, mean, o, 100).tensors)
    EXPECT_EQ(c.rung.codec, Codec::kHalf);
  for (UnitRecord& r : records)
    r.stages_s = -1;
  EXPECT_NEAR(measured_codec_factors(records, s, o)[static_cast<size_t>(Codec::kDgc)], 1.0, 1e-9);
}

// The README demo again, with the 4-bit rung on: the first plans put every tensor on 4-bit, whose
// route then measured 1.4x its prediction (its owner's sums and copies on 2 shared cores) with no
// stage times apart. DGC, never run, was priced from its start-up encode (1.67 ns an element
// there, ~0.5 once its units ran) times the 4-bit route's 1.4x, and every tensor stayed 4-bit at
// 170 ms a step against DGC's 80-100 ms (each tensor alone on DGC also paid a unit's latency of
// its own: RaisesAWholeRungWhenFusedUnitsShareTheLatency). Priced at its own numbers, DGC takes
// the large tensors, and is measured from then on.
TEST(CodecChoice, AnUnmeasuredCodecIsPricedAtItsOwnNumbers) {
  ChoiceOptions o = options();
  o.one_lane = true;
  o.int4_available = true;
  o.ladder = {0.9, 0.99, 0.999};
  Snapshot s;
  for (LinkParams& l : s.link)
    l = {1e-3, 8.0 / 4.7e9, true};  // as fitted there: 1 ms, 4.7 Gbit/s
  s.cpu_share = 2.0;
  s.backward_s = 0.8e-3;
  s.forward_s = 40e-3;
  s.codecs.encode_s[static_cast<size_t>(Codec::kHalf)] = 0.31e-9;
  s.codecs.encode_s[static_cast<size_t>(Codec::kDgc)] = 1.67e-9;
  s.codecs.decode_s[static_cast<size_t>(Codec::kDgc)] = 16.9e-9;
  s.codecs.encode_s[static_cast<size_t>(Codec::kInt4)] = 1.1e-9;
  s.codecs.decode_s[static_cast<size_t>(Codec::kInt4)] = 0.1e-9;
  s.codecs.reduce_s[static_cast<size_t>(Codec::kFp32)] = 0.09e-9;
  s.codecs.reduce_s[static_cast<size_t>(Codec::kHalf)] = 0.09e-9;
  s.codecs.transport_s_per_byte = 0.26e-9;
  std::vector<TensorInput> in;
  for (int i = 0; i < 12; ++i) {
    const uint64_t numel = i % 3 == 0 ? 2359296 : 1048576;
    in.push_back(input(("layer4." + std::to_string(i)).c_str(), numel, 0, 1e-5 * i));
    in.back().at_least = Rung{Codec::kInt4, 0};  // the 4-bit steps were measured exposed
  }
  std::vector<UnitRecord> records;
  for (const TensorInput& t : in) {
    double e, m, d;
    rung_costs(t, {Codec::kInt4, 0}, s, o, e, m, d);
    records.push_back({Codec::kInt4, {{t.numel, 0.0}}, 1.4 * (e + m + d)});
  }
  const std::array<double, kCodecs> f = measured_codec_factors(records, s, o);
  EXPECT_NEAR(f[static_cast<size_t>(Codec::kInt4)], 1.4, 1e-9);
  EXPECT_EQ(f[static_cast<size_t>(Codec::kDgc)], 1.0);
  Snapshot refit = s;
  refit.codec_factor = f;
  const Plan plan = choose_codecs(in, refit, o, 100);
  for (const TensorChoice& c : plan.tensors)
    EXPECT_EQ(c.rung.codec, Codec::kDgc) << plan.describe();
}

// Between plans a codec's records are remembered until an interval measures it again: a plan
// that moved every tensor off DGC keeps DGC's measured factor instead of inheriting the others'.
TEST(CodecChoice, ACodecOutOfUseKeepsItsMeasuredFactor) {
  const ChoiceOptions o = options();
  const Snapshot s = numbers(1);
  auto unit = [&](Codec c, uint64_t numel, double sparsity, double times) {
    double e, m, d;
    rung_costs(input("u", numel, 0, 0), {c, sparsity}, s, o, e, m, d);
    return UnitRecord{c, {{numel, sparsity}}, times * (e + m + d)};
  };
  UnitMemory memory;
  std::vector<UnitRecord> first{
      unit(Codec::kDgc, 1000000, 0.999, 3.0), unit(Codec::kDgc, 2000000, 0.999, 3.0),
      unit(Codec::kHalf, 100000, 0, 1.2), unit(Codec::kHalf, 200000, 0, 1.2)};
  std::array<double, kCodecs> f =
      measured_codec_factors(remember_unit_records(memory, first), s, o);
  EXPECT_NEAR(f[static_cast<size_t>(Codec::kDgc)], 3.0, 1e-9);
  // The next interval: the rings again (now 2x), one stray DGC unit (too few to count).
  std::vector<UnitRecord> second{unit(Codec::kHalf, 100000, 0, 2.0),
                                 unit(Codec::kHalf, 300000, 0, 2.0),
                                 unit(Codec::kDgc, 1000000, 0.999, 9.0)};
  f = measured_codec_factors(remember_unit_records(memory, second), s, o);
  EXPECT_NEAR(f[static_cast<size_t>(Codec::kHalf)], 2.0, 1e-9);  // replaced, not averaged
  EXPECT_NEAR(f[static_cast<size_t>(Codec::kDgc)], 3.0, 1e-9);   // remembered
  EXPECT_EQ(memory[static_cast<size_t>(Codec::kDgc)].size(), 2u);
  // Forgotten, DGC would inherit: the least of 1 and the rings' 2.
  EXPECT_EQ(measured_codec_factors(second, s, o)[static_cast<size_t>(Codec::kDgc)], 1.0);
}

// Twenty mid-size tensors on an exposed step: each one's raise to DGC saves ~1 ms, under 1% of
// the ~1.2 s exposed (a single raise is not worth its loss), but together they save ~20 ms.
TEST(CodecChoice, ManySmallSavingsAreRaisedTogether) {
  ChoiceOptions o = options();
  o.one_lane = true;  // as 4 ranks on 2 cores: every tensor's costs add up on the step
  o.int8_available = false;
  const Snapshot s = numbers(1);
  std::vector<TensorInput> in{input("huge", 50000000, 0, 0)};
  in[0].forced = Rung{Codec::kHalf, 0};
  for (int i = 0; i < 20; ++i)
    in.push_back(input(("mid" + std::to_string(i)).c_str(), 40000, 0, 0.001 * i));
  in.push_back(input("bias", 64, 0, 0.03));
  const Plan p = choose_codecs(in, s, o, 100);
  ASSERT_GT(p.exposed_s(), 0.3) << p.describe();
  double e, m, d;
  rung_costs(in[1], {Codec::kHalf, 0}, s, o, e, m, d);
  const double half = e + m + d;
  rung_costs(in[1], {Codec::kDgc, 0.99}, s, o, e, m, d);
  ASSERT_LT(half - (e + m + d), 0.01 * p.exposed_s());  // each alone: under 1% of the exposure
  for (int i = 0; i < 20; ++i)
    EXPECT_EQ(find(p, "mid" + std::to_string(i)).rung.codec, Codec::kDgc) << p.describe();
  EXPECT_NE(find(p, "bias").rung.codec, Codec::kDgc) << p.describe();  // the floors still hold
  EXPECT_EQ(find(p, "huge").rung, (Rung{Codec::kHalf, 0}));
}

TEST(CodecChoice, CodecFactorsNeedRecordsAndStayBounded) {
  const ChoiceOptions o = options();
  const Snapshot s = numbers(1);
  // Nothing measured: every factor 1.
  for (double f : measured_codec_factors({}, s, o))
    EXPECT_EQ(f, 1.0);
  // One record is not enough to set a factor; absurd measurements are clamped to [1/4, 16].
  std::vector<UnitRecord> one{{Codec::kDgc, {{1000000, 0.99}}, 1000.0}};
  for (double f : measured_codec_factors(one, s, o))
    EXPECT_EQ(f, 1.0);
  one.push_back(one.front());
  EXPECT_EQ(measured_codec_factors(one, s, o)[static_cast<size_t>(Codec::kDgc)], 16.0);
  std::vector<UnitRecord> fast(2, UnitRecord{Codec::kFp32, {{1000000, 0.0}}, 1e-12});
  EXPECT_EQ(measured_codec_factors(fast, s, o)[static_cast<size_t>(Codec::kFp32)], 0.25);
  // A unit of several tensors pays its collective's latency once.
  double e, m, d, l;
  rung_costs(input("a", 100000, 0, 0), {Codec::kHalf, 0}, s, o, e, m, d, &l);
  const double unit = 2 * (e + m + d) - l;
  const std::vector<UnitRecord> fused(
      2, UnitRecord{Codec::kHalf, {{100000, 0.0}, {100000, 0.0}}, unit});
  EXPECT_NEAR(measured_codec_factors(fused, s, o)[static_cast<size_t>(Codec::kHalf)], 1.0, 1e-9);
}

TEST(CodecChoice, AtLeastKeepsTheMeasuredCompression) {
  // On a fast link the model would keep everything dense; a floor from a step measured exposed
  // keeps each tensor at least at its rung there.
  const ChoiceOptions o = options();
  std::vector<TensorInput> in = model();
  for (TensorInput& t : in)
    if (t.numel >= 1000000) t.at_least = Rung{Codec::kDgc, 0.99};
  const Plan p = choose_codecs(in, numbers(400), o, 100);
  for (const TensorInput& t : in) {
    const Rung r = find(p, t.key).rung;
    if (t.at_least)
      EXPECT_GE(rank_of(r, o), rank_of(*t.at_least, o)) << t.key << "\n" << p.describe();
    else
      EXPECT_EQ(r.codec, Codec::kFp32) << t.key << "\n" << p.describe();
  }
}

// The collectives' own CPU: a dense ring sums (P-1)/P of its elements and sends and
// receives 2(P-1)/P of its bytes; a DGC allgatherv sends and receives P-1 payloads.
TEST(CodecChoice, CollectiveCpuPricesReductionsAndCopies) {
  Snapshot s = numbers(10);
  s.codecs.reduce_s = {0.3e-9, 1.0e-9, 0.0};
  s.codecs.transport_s_per_byte = 0.5e-9;
  s.codecs.dgc_bytes_per_selected = 6.0;
  const ChoiceOptions o = options();  // 4 ranks
  EXPECT_NEAR(collective_cpu_s(1000000, {Codec::kFp32, 0}, s, o),
              0.75e6 * 0.3e-9 + 1.5 * 4e6 * 0.5e-9, 1e-12);
  EXPECT_NEAR(collective_cpu_s(1000000, {Codec::kHalf, 0}, s, o),
              0.75e6 * 1.0e-9 + 1.5 * 2e6 * 0.5e-9, 1e-12);
  EXPECT_NEAR(collective_cpu_s(1000000, {Codec::kDgc, 0.999}, s, o), 3 * 1000 * 6.0 * 0.5e-9,
              1e-15);
  ChoiceOptions alone = o;
  alone.world_size = 1;
  EXPECT_EQ(collective_cpu_s(1000000, {Codec::kHalf, 0}, s, alone), 0.0);
  // Unmeasured (zero) costs price nothing: the wire alone, as before they were measured.
  EXPECT_EQ(collective_cpu_s(1000000, {Codec::kHalf, 0}, numbers(10), o), 0.0);
}

TEST(CodecChoice, DenseTransferTakesTheLongerOfWireAndCpuTimesTheShare) {
  Snapshot s = numbers(10);
  s.codecs.reduce_s = {0.3e-9, 1.2e-9, 0.0};
  s.codecs.transport_s_per_byte = 0.6e-9;
  const ChoiceOptions o = options();
  const TensorInput t = input("layer3", 4000000, 0, 0);
  const Rung half{Codec::kHalf, 0};
  const double cpu = collective_cpu_s(t.numel, half, s, o);
  const double wire_10g = ring_allreduce_terms(2.0 * t.numel, 4).seconds(s.link[0]);
  double e, m, d, latency;
  rung_costs(t, half, s, o, e, m, d, &latency);
  ASSERT_GT(cpu, wire_10g);  // this host's ring is CPU-bound at 10 Gbit/s
  EXPECT_NEAR(m, cpu, 1e-12);
  // Four ranks on two cores: every CPU cost takes twice as long, the wire does not.
  s.cpu_share = 2.0;
  double e2, m2, d2;
  rung_costs(t, half, s, o, e2, m2, d2, nullptr);
  EXPECT_NEAR(m2, 2 * cpu, 1e-12);
  EXPECT_NEAR(e2, 2 * e, 1e-15);
  EXPECT_NEAR(d2, 2 * d, 1e-15);
  // On a slow link the wire bounds the ring; its latency part is the wire's.
  const Snapshot slow = numbers(0.1);
  Snapshot slow_cpu = slow;
  slow_cpu.codecs = s.codecs;
  double e3, m3, d3, latency3;
  rung_costs(t, half, slow_cpu, o, e3, m3, d3, &latency3);
  EXPECT_NEAR(m3, ring_allreduce_terms(2.0 * t.numel, 4).seconds(slow.link[0]), 1e-12);
  EXPECT_NEAR(latency3, latency, 1e-15);
}

// A host like this one: the rings' reductions and socket copies cost more per element than DGC's
// encode, so a fast link does not make the dense 16-bit ring cheap.
Snapshot cpu_bound_host(double gbit, bool ring_cpu_priced) {
  Snapshot s = first_plan_numbers(gbit);
  s.codecs.encode_s = {0.3e-9, 0.4e-9, 1.5e-9};
  s.codecs.decode_s = {0.3e-9, 0.3e-9, 5e-9};
  if (ring_cpu_priced) {
    s.codecs.reduce_s = {0.3e-9, 1.2e-9, 0.0};
    s.codecs.transport_s_per_byte = 0.6e-9;
  }
  s.one_lane = true;
  return s;
}

TEST(CodecChoice, CpuBoundRingsMakeDgcTheChoiceOnAFastLink) {
  ChoiceOptions o = options();
  o.one_lane = true;
  o.int8_available = false;  // as by default (GRADEX_POLICY_INT8=0): 16-bit ring against DGC
  // Priced by the wire alone, a 40 Gbit/s link makes the 16-bit ring the cheapest rung of the
  // large tensors (what a model without the rings' CPU chooses on a CPU-bound host).
  const Plan wire_only = choose_codecs(registered(), cpu_bound_host(40, false), o, 100);
  const Plan priced = choose_codecs(registered(), cpu_bound_host(40, true), o, 100);
  for (const char* key : {"layer3", "layer2", "layer1"}) {
    EXPECT_EQ(find(wire_only, key).rung.codec, Codec::kHalf) << key << "\n" << wire_only.describe();
    EXPECT_EQ(find(priced, key).rung.codec, Codec::kDgc) << key << "\n" << priced.describe();
  }
  // The priced plan is also what the priced model predicts fastest against keeping them 16-bit.
  std::vector<TensorInput> half = registered();
  for (size_t i = 0; i < half.size(); ++i)
    half[i].forced = find(wire_only, half[i].key).rung;
  const Plan half_priced = choose_codecs(half, cpu_bound_host(40, true), o, 100);
  EXPECT_LT(priced.finish_s, half_priced.finish_s) << priced.describe() << half_priced.describe();
  // A slow link still needs the hardest rung whatever the CPU: 99.9% on the large tensors.
  const Plan slow = choose_codecs(registered(), cpu_bound_host(0.1, true), o, 100);
  EXPECT_EQ(find(slow, "layer3").rung, (Rung{Codec::kDgc, 0.999})) << slow.describe();
}

TEST(CodecChoice, CheapRingsKeepAFastLinkDense) {
  // Where the transport costs the CPU little (e.g. RDMA: no socket copies), the 16-bit ring stays
  // the cheapest rung at 40 Gbit/s: the pricing follows the measurement, not a preference.
  ChoiceOptions o = options();
  o.one_lane = true;
  Snapshot s = cpu_bound_host(40, true);
  s.codecs.reduce_s = {0.05e-9, 0.1e-9, 0.0};
  s.codecs.transport_s_per_byte = 0.01e-9;
  const Plan p = choose_codecs(registered(), s, o, 100);
  for (const char* key : {"layer3", "layer2", "layer1"})
    EXPECT_NE(find(p, key).rung.codec, Codec::kDgc) << key << "\n" << p.describe();
}

// The horizon rule: a residual must be able to drain kHorizonDrains (10) times over the steps
// that remain, so the most sparsity at step t is 1 - 10 / (horizon - t).
TEST(CodecChoice, HorizonCapsTheEndOfTraining) {
  ChoiceOptions o = options();        // 4 ranks: DGC needs a density under 1/8
  EXPECT_EQ(horizon_cap(o, 0), 1.0);  // no horizon given
  o.horizon_steps = 100;
  EXPECT_DOUBLE_EQ(horizon_cap(o, 0), 0.9);
  EXPECT_DOUBLE_EQ(horizon_cap(o, 50), 0.8);
  EXPECT_EQ(horizon_cap(o, 95), 0.0);
  EXPECT_EQ(horizon_cap(o, 100), 1.0);  // past the horizon: not capped
  EXPECT_EQ(horizon_cap(o, 500), 1.0);
  const TensorInput big = input("layer3", 4000000, 0, 0);
  // A 100-step training: 90% at most at its start, dense from where 1 - cap reaches 1/8.
  EXPECT_EQ(allowed_rungs(big, o, 0).back(), (Rung{Codec::kDgc, 0.9}));
  std::string why;
  const std::vector<Rung> late = allowed_rungs(big, o, 30, &why);
  EXPECT_NE(late.back().codec, Codec::kDgc) << why;
  EXPECT_NE(why.find("GRADEX_POLICY_HORIZON_STEPS"), std::string::npos) << why;
  // A long one is hardly touched until its end.
  o.horizon_steps = 1600;
  EXPECT_EQ(ramped_ladder(o, 100), (std::vector<double>{0.9, 0.99, 1.0 - 10.0 / 1500}));
  EXPECT_EQ(ramped_ladder(o, 0).back(), 1.0 - 10.0 / 1600);
  // The ramp's cap and the horizon's: the lower wins.
  o.ramp_steps = 100;
  EXPECT_DOUBLE_EQ(sparsity_cap(o, 30), 0.9375);
  EXPECT_DOUBLE_EQ(sparsity_cap(o, 1590), 0.0);
}

TEST(CodecChoice, HorizonStagesAreWhereARungMustDrop) {
  ChoiceOptions o = options();
  EXPECT_TRUE(horizon_stage_starts(o).empty());
  o.horizon_steps = 1000;
  // 99% lasts while 1000 - t >= 1000 (step 0 only); 90% while 1000 - t >= 100 (to step 900);
  // every rung is denser than 1/8 once 1000 - t <= 80 (from step 920); 99.9% never fits.
  EXPECT_EQ(horizon_stage_starts(o), (std::vector<uint64_t>{1, 901, 920, 1000}));
  for (uint64_t t : {900u, 901u, 919u, 920u}) {
    const std::vector<Rung> r = allowed_rungs(input("w", 4000000, 0, 0), o, t);
    const bool dgc = r.back().codec == Codec::kDgc;
    EXPECT_EQ(dgc, t < 920) << t;
    if (dgc) {
      EXPECT_EQ(r.back().sparsity == 0.9, t < 901) << t << " " << rung_name(r.back());
    }
  }
}

TEST(CodecChoice, HorizonKeepsTheLastStepsDenseOnASlowLink) {
  // Whatever the link requires, the last steps of a known horizon are dense (fidelity first).
  ChoiceOptions o = options();
  o.horizon_steps = 250;
  const Plan early = choose_codecs(registered(), first_plan_numbers(0.1), o, 0);
  const Plan late = choose_codecs(registered(), first_plan_numbers(0.1), o, 240);
  EXPECT_EQ(find(early, "layer3").rung, (Rung{Codec::kDgc, 0.96})) << early.describe();
  for (const TensorChoice& c : late.tensors)
    EXPECT_NE(c.rung.codec, Codec::kDgc) << c.key << "\n" << late.describe();
}

// GRADEX_OPTIMIZER=adam: the sparse rung is the Adam codec at GRADEX_ADAM_SPARSITY (one rung,
// CodecPlanner::adam_rungs), priced by its own costs. A race-like transformer step: ~1 s of
// compute (backward 0.6 s, the rest 0.4 s), 10.8 M parameters, 4 ranks, the Adam codec's DCT at
// 20 ns per element each way (what measure_adam_codec reads here), 3 bytes per value.
namespace adam {

std::vector<TensorInput> transformer() {
  return {input("out.weight", 16384 * 256, 16384, 0.05), input("layer2.mlp", 2 * 262144, 256, 0.15),
          input("layer2.attn", 262144, 768, 0.25),       input("layer1.mlp", 2 * 262144, 256, 0.35),
          input("layer1.attn", 262144, 768, 0.45),       input("norm", 256, 0, 0.5),
          input("embed.weight", 16384 * 256, 16384, 0.6)};
}

Snapshot adam_numbers(double gbit) {
  Snapshot s = numbers(gbit);
  s.backward_s = 0.6;
  s.forward_s = 0.4;
  s.codecs.encode_s[static_cast<size_t>(Codec::kAdam)] = 20e-9;
  s.codecs.decode_s[static_cast<size_t>(Codec::kAdam)] = 20e-9;
  s.codecs.adam_bytes_per_selected = 3.0;
  return s;
}

ChoiceOptions adam_options() {
  ChoiceOptions o = options();
  EngineOptions engine;
  engine.adam.codec = true;
  engine.adam.sparsity = 0.98;
  engine.adam.decay = 0.9f;
  o.ramp_steps = 100;
  o.horizon_steps = 500;
  CodecPlanner::adam_rungs(engine, o);
  return o;
}

}  // namespace adam

TEST(CodecChoice, AdamRungsReplaceTheDgcLadder) {
  const ChoiceOptions o = adam::adam_options();
  EXPECT_EQ(o.sparse_codec, Codec::kAdam);
  EXPECT_EQ(o.ladder, (std::vector<double>{0.98}));
  EXPECT_EQ(o.horizon_steps, 0u);  // the codec decays what it has not sent: no horizon rule
  EXPECT_EQ(o.ramp_steps, 100u);   // the fidelity ramp applies as to DGC
  EXPECT_EQ(rung_name({Codec::kAdam, 0.98}), "adam 98%");
  EngineOptions engine;
  engine.adam.codec = true;
  engine.adam.sparsity = 0.98;
  engine.adam.decay = 1.0f;  // error feedback without decay: the horizon rule stays
  ChoiceOptions undecayed = options();
  undecayed.horizon_steps = 500;
  CodecPlanner::adam_rungs(engine, undecayed);
  EXPECT_EQ(undecayed.horizon_steps, 500u);
  engine.adam.sparsity = 0;  // GRADEX_ADAM_SPARSITY=0: AdamW stays dense
  ChoiceOptions dense = options();
  CodecPlanner::adam_rungs(engine, dense);
  EXPECT_TRUE(dense.ladder.empty());
  const Plan p = choose_codecs(adam::transformer(), adam::adam_numbers(0.1), dense, 200);
  for (const TensorChoice& c : p.tensors)
    EXPECT_FALSE(is_sparse(c.rung.codec)) << c.key << "\n" << p.describe();
}

// A fast link with compute to hide behind: an Adam run stays dense (the codec's DCT costs more
// than its bytes save); a slow link: the large tensors take the Adam rung at
// GRADEX_ADAM_SPARSITY, never a DGC rung.
TEST(CodecChoice, AdamRunDenseOnAFastLinkAdamRungOnASlowOne) {
  const ChoiceOptions o = adam::adam_options();
  for (double gbit : {10.0, 1.0}) {
    const Plan fast = choose_codecs(adam::transformer(), adam::adam_numbers(gbit), o, 200);
    // The embedding's gradient is ready last: its dense exchange is the step's tail.
    if (gbit == 10.0) {
      EXPECT_EQ(fast.exposed_s(), 0) << fast.describe();
    }
    for (const TensorChoice& c : fast.tensors)
      EXPECT_FALSE(is_sparse(c.rung.codec)) << c.key << " at " << gbit << "\n" << fast.describe();
  }
  const Plan slow = choose_codecs(adam::transformer(), adam::adam_numbers(0.1), o, 200);
  for (const char* key : {"out.weight", "embed.weight"})
    EXPECT_EQ(find(slow, key).rung, (Rung{Codec::kAdam, 0.98})) << key << "\n" << slow.describe();
  for (const TensorChoice& c : slow.tensors) {
    EXPECT_NE(c.rung.codec, Codec::kDgc) << c.key;
    if (c.rung.codec == Codec::kAdam) {
      EXPECT_EQ(c.rung.sparsity, 0.98) << c.key;
    }
  }
  EXPECT_NE(slow.describe().find("adam 98%"), std::string::npos) << slow.describe();
  EXPECT_FALSE(is_sparse(find(slow, "norm").rung.codec)) << slow.describe();  // 5 < 128 values
}

// The Adam rung is priced by the Adam codec's own numbers: where a cheap codec would be chosen on
// this link, an expensive one is not; its bytes are its own bytes per value.
TEST(CodecChoice, AdamRungIsPricedByItsOwnCosts) {
  const ChoiceOptions o = adam::adam_options();
  Snapshot cheap = adam::adam_numbers(0.3);
  const Plan chosen = choose_codecs(adam::transformer(), cheap, o, 200);
  ASSERT_EQ(find(chosen, "embed.weight").rung.codec, Codec::kAdam) << chosen.describe();
  Snapshot dear = cheap;
  dear.codecs.encode_s[static_cast<size_t>(Codec::kAdam)] = 2e-6;  // 100x: 8 s per large tensor
  dear.codecs.encode_s[static_cast<size_t>(Codec::kDgc)] = 1e-12;  // DGC's numbers play no part
  dear.codecs.decode_s[static_cast<size_t>(Codec::kDgc)] = 1e-12;
  const Plan refused = choose_codecs(adam::transformer(), dear, o, 200);
  for (const TensorChoice& c : refused.tensors)
    EXPECT_FALSE(is_sparse(c.rung.codec)) << c.key << "\n" << refused.describe();
  const TensorInput big = adam::transformer().front();
  double e1, m1, d1, e2, m2, d2;
  Snapshot fat = cheap;
  fat.codecs.adam_bytes_per_selected = 6.0;
  fat.codecs.dgc_bytes_per_selected = 1.0;  // not the Adam codec's
  rung_costs(big, {Codec::kAdam, 0.98}, cheap, o, e1, m1, d1);
  rung_costs(big, {Codec::kAdam, 0.98}, fat, o, e2, m2, d2);
  EXPECT_GT(m2, 1.8 * m1);
  EXPECT_DOUBLE_EQ(e1, 20e-9 * big.numel);
  EXPECT_DOUBLE_EQ(d1, 20e-9 * big.numel);  // per element of the tensor, not per value
}

// The fidelity ramp caps the Adam rung as it caps DGC: dense while the cap is denser than
// 1/(2P), then the Adam codec at the cap, then at GRADEX_ADAM_SPARSITY.
TEST(CodecChoice, RampCapsTheAdamRung) {
  const ChoiceOptions o = adam::adam_options();
  const Plan first = choose_codecs(adam::transformer(), adam::adam_numbers(0.1), o, 0);
  for (const TensorChoice& c : first.tensors)
    EXPECT_FALSE(is_sparse(c.rung.codec)) << c.key;
  EXPECT_NE(find(first, "out.weight").reason.find("caps the Adam codec at 75%"), std::string::npos)
      << find(first, "out.weight").reason;
  const Plan second = choose_codecs(adam::transformer(), adam::adam_numbers(0.1), o, 25);
  EXPECT_EQ(find(second, "out.weight").rung, (Rung{Codec::kAdam, 0.9375})) << second.describe();
  const Plan third = choose_codecs(adam::transformer(), adam::adam_numbers(0.1), o, 50);
  EXPECT_EQ(find(third, "out.weight").rung, (Rung{Codec::kAdam, 0.98})) << third.describe();
}

}  // namespace
}  // namespace gradex::sync::cost
