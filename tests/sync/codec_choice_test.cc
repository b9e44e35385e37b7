// The per-tensor codec choice of GRADEX_POLICY=auto (sync/policy/codec_choice.h), as a pure
// function: least compression that hides, harder as the link slows, the floors, overrides, early
// training.
#include <gtest/gtest.h>

#include <algorithm>

#include "codec_choice_fixture.h"
#include "compress/backend/block_codec.h"
#include "sync/policy/codec_choice.h"
#include "sync/policy/codec_planner.h"

namespace gradex::sync::cost {
namespace {

using namespace choice_fixture;

TEST(CodecChoice, FastLinkKeepsEverythingFp32) {
  const Plan p = choose_codecs(model(), numbers(400), options(), 100);
  for (const TensorChoice& c : p.tensors)
    EXPECT_EQ(c.rung.codec, Codec::kFp32) << c.key;
  EXPECT_EQ(p.exposed_s(), 0);
}

TEST(CodecChoice, LeastCompressionThatHides) {
  // At 3 Gbit/s fp32 is exposed; 16-bit of some tensors is enough.
  const ChoiceOptions o = options();
  const Plan p = choose_codecs(model(), numbers(3), o, 100);
  EXPECT_EQ(p.exposed_s(), 0) << p.describe();
  bool any_compressed = false;
  for (const TensorChoice& c : p.tensors) {
    EXPECT_NE(c.rung.codec, Codec::kDgc) << c.key << "\n" << p.describe();
    any_compressed |= c.rung.codec != Codec::kFp32;
  }
  EXPECT_TRUE(any_compressed) << p.describe();
  // Least: lowering any raised tensor by one rung would expose the step.
  for (size_t i = 0; i < p.tensors.size(); ++i) {
    if (p.tensors[i].rung.codec == Codec::kFp32) continue;
    std::vector<TensorInput> in = model();
    for (size_t j = 0; j < in.size(); ++j)
      in[j].forced = p.tensors[j].rung;
    in[i].forced = Rung{Codec::kFp32, 0};
    const Plan lower = choose_codecs(in, numbers(3), o, 100);
    EXPECT_GT(lower.exposed_s(), 0) << p.tensors[i].key;
  }
}

TEST(CodecChoice, HarderAsBandwidthDrops) {
  const ChoiceOptions o = options();
  std::vector<size_t> previous;
  for (double gbit : {100.0, 10.0, 1.0, 0.1, 0.01}) {
    const Plan p = choose_codecs(model(), numbers(gbit), o, 100);
    std::vector<size_t> ranks;
    for (const TensorChoice& c : p.tensors)
      ranks.push_back(rank_of(c.rung, o));
    size_t total = 0, previous_total = 0;
    for (size_t r : ranks)
      total += r;
    for (size_t r : previous)
      previous_total += r;
    EXPECT_GE(total, previous_total) << gbit << " Gbit/s\n" << p.describe();
    previous = ranks;
  }
  const Plan slow = choose_codecs(model(), numbers(0.01), o, 100);
  EXPECT_EQ(find(slow, "layer3").rung, (Rung{Codec::kDgc, 0.999})) << slow.describe();
}

TEST(CodecChoice, FloorsKeepSmallSelectionsDense) {
  ChoiceOptions o = options();
  const Plan p = choose_codecs(model(), numbers(0.01), o, 100);
  // fc.weight at 99.9% would keep 20 values (< 128): never; 99% keeps 205 (20 per row of 10).
  EXPECT_NE(find(p, "fc.weight").rung, (Rung{Codec::kDgc, 0.999})) << p.describe();
  EXPECT_NE(find(p, "fc.bias").rung.codec, Codec::kDgc);
  // With 2048 rows and one value per row required, no DGC rung up to 90% (2048 values) passes but
  // 90%.
  std::vector<TensorInput> in = model();
  in[0].rows = 2048;
  std::string why;
  const std::vector<Rung> rungs = allowed_rungs(in[0], o, 100, &why);
  ASSERT_EQ(rungs.size(), 4u);  // fp32, 16-bit, 8-bit, dgc 90%
  EXPECT_EQ(rungs.back(), (Rung{Codec::kDgc, 0.9}));
  EXPECT_NE(why.find("GRADEX_POLICY_MIN_PER_ROW"), std::string::npos) << why;
  // Only 99.9% on the ladder: the output layer stays dense whatever the link.
  o.ladder = {0.999};
  const Plan dense = choose_codecs(model(), numbers(0.001), o, 100);
  EXPECT_NE(find(dense, "fc.weight").rung.codec, Codec::kDgc);
  EXPECT_NE(find(dense, "fc.weight").reason.find("GRADEX_POLICY_MIN_SELECTED"), std::string::npos)
      << dense.describe();
}

// The 8-bit rung fills the gap between 16-bit and DGC: a link on which 16-bit is exposed and 8-bit
// (half its bytes) is hidden gets 8-bit, not DGC; without the rung the same link needs DGC.
TEST(CodecChoice, EightBitWhenSixteenIsExposedAndEightHidden) {
  const std::vector<TensorInput> in = {input("big", 4000000, 0, 0.0), input("small", 1000, 0, 0.1)};
  ChoiceOptions o = options();
  // 0.64 Gbit/s, 4 ranks: 16-bit moves 12 MB on the critical link (150 ms, past the 107.5 ms
  // deadline), 8-bit 6.2 MB (77 ms plus its codec: hidden).
  const Snapshot link = numbers(0.64);
  double e, m, d;
  rung_costs(in[0], {Codec::kHalf, 0}, link, o, e, m, d);
  ASSERT_GT(e + m + d, 0.1075);
  rung_costs(in[0], {Codec::kInt8, 0}, link, o, e, m, d);
  ASSERT_LT(e + m + d, 0.1);
  const Plan p = choose_codecs(in, link, o, 100);
  EXPECT_EQ(find(p, "big").rung, (Rung{Codec::kInt8, 0})) << p.describe();
  EXPECT_EQ(p.exposed_s(), 0.0) << p.describe();
  EXPECT_NE(p.describe().find("8-bit"), std::string::npos);
  o.int8_available = false;
  const Plan without = choose_codecs(in, link, o, 100);
  EXPECT_EQ(find(without, "big").rung.codec, Codec::kDgc) << without.describe();
  // A fast link keeps it fp32; a far slower one needs DGC even with the 8-bit rung.
  EXPECT_EQ(find(choose_codecs(in, numbers(400), options(), 100), "big").rung.codec, Codec::kFp32);
  EXPECT_EQ(find(choose_codecs(in, numbers(0.05), options(), 100), "big").rung.codec, Codec::kDgc);
}

// The 4-bit rung (GRADEX_POLICY_INT4; by default under Adam with the codec off the ladder) comes
// after 8-bit: a link on which 8-bit is exposed and 4-bit (about half its bytes) hides gets 4-bit;
// where 8-bit hides the relax step keeps 8-bit; with no sparse rung a far slower link gets 4-bit,
// the most the ladder has. Off by default.
TEST(CodecChoice, FourBitWhenEightIsExposedAndFourHidden) {
  const std::vector<TensorInput> in = {input("big", 4000000, 0, 0.0), input("small", 1000, 0, 0.1)};
  EXPECT_FALSE(ChoiceOptions{}.int4_available);
  ChoiceOptions o = options();
  o.sparse_codec = Codec::kAdam;
  o.ladder.clear();
  o.int4_available = true;
  // 0.32 Gbit/s, 4 ranks: 8-bit moves 6.2 MB on the critical link (155 ms, past the 107.5 ms
  // deadline), 4-bit 3.2 MB (80 ms plus its codec: hidden).
  const Snapshot link = numbers(0.32);
  double e, m, d;
  rung_costs(in[0], {Codec::kInt8, 0}, link, o, e, m, d);
  ASSERT_GT(e + m + d, 0.1075);
  rung_costs(in[0], {Codec::kInt4, 0}, link, o, e, m, d);
  ASSERT_LT(e + m + d, 0.1);
  const Plan p = choose_codecs(in, link, o, 100);
  EXPECT_EQ(find(p, "big").rung, (Rung{Codec::kInt4, 0})) << p.describe();
  EXPECT_EQ(p.exposed_s(), 0.0) << p.describe();
  EXPECT_NE(p.describe().find("4-bit"), std::string::npos);
  // Where 8-bit hides: 8-bit, not 4-bit.
  EXPECT_EQ(find(choose_codecs(in, numbers(0.64), o, 100), "big").rung, (Rung{Codec::kInt8, 0}));
  // Far slower: 4-bit, the top of a ladder without sparse rungs.
  EXPECT_EQ(find(choose_codecs(in, numbers(0.01), o, 100), "big").rung, (Rung{Codec::kInt4, 0}));
  // Without the rung the same link stays at 8-bit, exposed.
  o.int4_available = false;
  const Plan without = choose_codecs(in, link, o, 100);
  EXPECT_EQ(find(without, "big").rung, (Rung{Codec::kInt8, 0})) << without.describe();
  EXPECT_GT(without.exposed_s(), 0.0);
}

// The WAN race's `tfm` (4 hosts, 25 ms one way, 1.2 M parameters in 30 tensors ready together):
// on fp32 every tensor rides one ring of 6 latencies; any one of them alone on 4-bit pays a unit
// of 2 latencies of its own on top and ends the step no sooner, so no single raise (nor each
// tensor's, taken together) was worth anything, and the plan stayed fp32, 9.6 MB a step. Moved
// together, the whole step takes 4-bit's one unit.
TEST(CodecChoice, RaisesAWholeRungWhenFusedUnitsShareTheLatency) {
  ChoiceOptions o = options();
  o.int4_available = true;
  Snapshot s = numbers(0.37);
  for (LinkParams& l : s.link)
    l.alpha_s = 27e-3;
  s.backward_s = 23e-3;
  s.forward_s = 36e-3;
  std::vector<TensorInput> in;
  for (int i = 0; i < 30; ++i) {
    const uint64_t numel = i % 3 == 0 ? 262144 : i % 3 == 1 ? 65536 : 256;
    in.push_back(input(("layer" + std::to_string(i)).c_str(), numel, 0, 0.022));
  }
  const Plan p = choose_codecs(in, s, o, 100);
  for (const TensorChoice& c : p.tensors)
    EXPECT_EQ(c.rung, (Rung{Codec::kInt4, 0})) << p.describe();
  std::vector<TensorInput> fp32 = in;
  for (TensorInput& t : fp32)
    t.forced = Rung{Codec::kFp32, 0};
  const Plan dense = choose_codecs(fp32, s, o, 100);
  EXPECT_LT(p.finish_s, dense.finish_s - 0.05) << p.describe() << dense.describe();
  // What held the plan: one tensor free among 29 on the fp32 ring stays fp32.
  fp32[0].forced.reset();
  EXPECT_EQ(find(choose_codecs(fp32, s, o, 100), "layer0").rung.codec, Codec::kFp32);
}

// A delayed-exchange lane of the WAN race's `mlp` at 75 ms one way (its plan at step 100): every
// large tensor on DGC in one gather, and the 10-element output bias, which no DGC rung can take,
// on 4-bit in a unit of its own, 84 ms before the gather. A dense tensor within the riders'
// budget travels inside the gather instead (route::pack), so the plan keeps it dense and the
// step's latency is the gather's alone; without riders it pays its own unit.
TEST(CodecChoice, ASmallDenseTensorRidesTheDgcGatherInsteadOfAUnitOfItsOwn) {
  ChoiceOptions o = options();
  o.int4_available = true;
  o.sparse_unsized = true;
  o.quantized_one_hop_max_bytes = 1 << 20;
  Snapshot s = numbers(0.26);
  for (LinkParams& l : s.link)
    l.alpha_s = 84e-3;
  s.backward_s = 0.05e-3;
  s.forward_s = 47e-3;
  const std::vector<TensorInput> in = {
      input("0.bias", 2048, 0, 0), input("0.weight", 131072, 128, 0),
      input("2.bias", 2048, 0, 0), input("2.weight", 4194304, 2048, 0),
      input("4.bias", 10, 0, 0),   input("4.weight", 20480, 10, 0)};
  const Plan alone = choose_codecs(in, s, o, 100);
  ASSERT_TRUE(is_sparse(find(alone, "2.weight").rung.codec)) << alone.describe();
  EXPECT_EQ(find(alone, "4.bias").rung.codec, Codec::kInt4) << alone.describe();
  o.rider_bytes = 64 << 10;
  const Plan riding = choose_codecs(in, s, o, 100);
  ASSERT_TRUE(is_sparse(find(riding, "2.weight").rung.codec)) << riding.describe();
  // Every dense tensor rides (fp32 or 16-bit, whichever ends the exposed step sooner): none on
  // the 8-bit or 4-bit route, whose units are collectives of their own.
  for (const TensorChoice& c : riding.tensors) {
    EXPECT_TRUE(is_sparse(c.rung.codec) || c.rung.codec == Codec::kFp32 ||
                c.rung.codec == Codec::kHalf)
        << c.key << "\n"
        << riding.describe();
  }
  EXPECT_LT(riding.finish_s, alone.finish_s - 0.05) << riding.describe() << alone.describe();
}

// The same lane at 25 ms one way, with the numbers its plan at step 25 agreed (rank 0's log):
// the search that saw the riders from its first raise chose DGC for the large tensor with every
// other tensor riding its gather, 105 ms predicted here (107 in the log), while every tensor on
// 4-bit in one unit ends at 68 ms (no single raise of a rider pays once it rides). The plan is
// also searched as if nothing rode and timed with the riders; the sooner wins.
TEST(CodecChoice, RidersNeverMakeThePlanEndLater) {
  ChoiceOptions o = options();
  o.int4_available = true;
  o.sparse_unsized = true;
  o.quantized_one_hop_max_bytes = 4 << 20;
  o.ladder = {0.9375};
  Snapshot s = numbers(1.42);
  for (LinkParams& l : s.link)
    l.alpha_s = 28.3869e-3;
  s.backward_s = 0.229e-3;
  s.forward_s = 295.338e-3;
  s.one_lane = true;
  s.cpu_share = 2;
  s.codecs.encode_s = {0.0, 0.12e-9, 1.61e-9, 3e-9, 20e-9, 0.80e-9};
  s.codecs.decode_s = {0.0, 0.12e-9, 17.11e-9, 1e-9, 20e-9, 0.10e-9};
  s.codecs.dgc_bytes_per_selected = 6.0;
  s.codecs.reduce_s = {0.10e-9, 0.11e-9, 0.0, 0.0, 0.0, 0.0};
  s.codecs.transport_s_per_byte = 2.22e-9;
  const std::vector<TensorInput> in = {
      input("0.bias", 2048, 0, 0.229e-3), input("0.weight", 131072, 128, 0.229e-3),
      input("2.bias", 2048, 0, 0.229e-3), input("2.weight", 4194304, 2048, 0.229e-3),
      input("4.bias", 10, 0, 0.229e-3),   input("4.weight", 20480, 10, 0.229e-3)};
  const Plan alone = choose_codecs(in, s, o, 100);
  o.rider_bytes = 4 << 20;
  const Plan riding = choose_codecs(in, s, o, 100);
  EXPECT_LE(riding.finish_s, alone.finish_s + 1e-9) << riding.describe() << alone.describe();
  std::vector<TensorInput> forced = in;
  for (TensorInput& t : forced)
    t.forced = t.key == "2.weight" ? Rung{Codec::kDgc, 0.9375} : Rung{Codec::kHalf, 0};
  const Plan dgc_and_riders = choose_codecs(forced, s, o, 100);
  EXPECT_EQ(find(riding, "2.weight").rung, (Rung{Codec::kInt4, 0})) << riding.describe();
  EXPECT_GT(dgc_and_riders.finish_s, riding.finish_s + 0.03)
      << dgc_and_riders.describe() << riding.describe();
}

// Inside the fidelity ramp the 8-bit rung is on the ladder without GRADEX_POLICY_INT8: where the
// 16-bit ring cannot hide (and DGC at the ramp's 75% would send more than it at 4 ranks) the
// ramp's first quarter sends 8-bit with error feedback; past the ramp the policy's own ladder.
TEST(CodecChoice, RampSendsEightBitWhereSixteenCannotHide) {
  const std::vector<TensorInput> in = {input("big", 4000000, 0, 0.0), input("small", 1000, 0, 0.1)};
  ChoiceOptions o = options();
  o.ramp_steps = 100;
  o.int8_available = false;
  const Snapshot link = numbers(0.64);  // 16-bit exposed, 8-bit hidden (see the test above)
  EXPECT_TRUE(int8_allowed(o, 0));
  EXPECT_TRUE(int8_allowed(o, 24));
  EXPECT_FALSE(int8_allowed(o, 25));  // DGC 93.75% sends less than the 16-bit ring
  EXPECT_FALSE(int8_allowed(o, 100));
  const Plan early = choose_codecs(in, link, o, 0);
  EXPECT_EQ(find(early, "big").rung, (Rung{Codec::kInt8, 0})) << early.describe();
  EXPECT_EQ(early.exposed_s(), 0.0) << early.describe();
  // Later quarters leave a DGC rung cheaper than the ring: DGC no harder than the cap, no 8-bit.
  for (uint64_t step : {25u, 50u, 75u}) {
    EXPECT_FALSE(int8_allowed(o, step)) << step;
    const Rung r = find(choose_codecs(in, link, o, step), "big").rung;
    EXPECT_TRUE(r.codec == Codec::kDgc && r.sparsity <= ramp_cap(o, step))
        << rung_name(r) << " at " << step;
  }
  // Past the ramp the 8-bit rung is GRADEX_POLICY_INT8's: off, so DGC.
  EXPECT_EQ(find(choose_codecs(in, link, o, 100), "big").rung.codec, Codec::kDgc);
  // The horizon rule's last steps, dense for DGC, take the 8-bit rung the same way; past the
  // horizon nothing binds.
  ChoiceOptions end = o;
  end.horizon_steps = 1000;
  EXPECT_FALSE(int8_allowed(end, 100));  // capped at 1 - 10/900: DGC 90% still sends less
  ChoiceOptions far = o;
  far.horizon_steps = 100000;
  EXPECT_FALSE(int8_allowed(far, 100));  // 1 - 10/99900 > 99.9%: no cap binds
  const Plan last = choose_codecs(in, link, end, 990);
  EXPECT_EQ(find(last, "big").rung, (Rung{Codec::kInt8, 0})) << last.describe();
  EXPECT_FALSE(int8_allowed(end, 1000));
  // Without the ramp's 8-bit rung the first quarter pays the 16-bit ring.
  ChoiceOptions off = o;
  off.fidelity_int8 = false;
  EXPECT_FALSE(int8_allowed(off, 0));
  const Plan dense = choose_codecs(in, link, off, 0);
  EXPECT_EQ(find(dense, "big").rung, (Rung{Codec::kHalf, 0})) << dense.describe();
  EXPECT_GT(dense.exposed_s(), 0.0);
  EXPECT_LT(early.finish_s, dense.finish_s);
}

// Where the dense step hides, dense stays in the ramp; where the 8-bit route's CPU makes it no
// cheaper than the 16-bit ring, 16-bit stays.
TEST(CodecChoice, RampKeepsDenseWhereItHidesOrEightBitCostsMore) {
  const std::vector<TensorInput> in = {input("big", 4000000, 0, 0.0), input("small", 1000, 0, 0.1)};
  ChoiceOptions o = options();
  o.ramp_steps = 100;
  o.int8_available = false;
  for (double gbit : {400.0, 10.0}) {
    const Plan p = choose_codecs(in, numbers(gbit), o, 0);
    EXPECT_NE(find(p, "big").rung.codec, Codec::kInt8) << gbit << "\n" << p.describe();
    EXPECT_EQ(p.exposed_s(), 0.0) << p.describe();
  }
  Snapshot cpu_bound = numbers(0.64);
  cpu_bound.codecs.encode_s[static_cast<size_t>(Codec::kInt8)] = 60e-9;  // 240 ms for "big"
  const Plan p = choose_codecs(in, cpu_bound, o, 0);
  EXPECT_EQ(find(p, "big").rung, (Rung{Codec::kHalf, 0})) << p.describe();
}

TEST(CodecChoice, OverridesWin) {
  std::vector<TensorInput> in = model();
  in[2].forced = Rung{Codec::kFp32, 0};  // layer3 dense by override, on a slow link
  in[2].forced_reason = "override 'layer3': dense";
  in[4].forced = Rung{Codec::kDgc, 0.99};  // layer1 sparse by override, on a fast link
  const Plan slow = choose_codecs(in, numbers(0.01), options(), 100);
  EXPECT_EQ(find(slow, "layer3").rung.codec, Codec::kFp32);
  EXPECT_EQ(find(slow, "layer3").reason, "override 'layer3': dense");
  const Plan fast = choose_codecs(in, numbers(400), options(), 100);
  EXPECT_EQ(find(fast, "layer1").rung, (Rung{Codec::kDgc, 0.99}));
}

TEST(CodecChoice, EarlyTrainingPrefersDense) {
  ChoiceOptions o = options();
  o.dense_steps = 50;
  const Plan early = choose_codecs(model(), numbers(0.01), o, 20);
  for (const TensorChoice& c : early.tensors)
    EXPECT_NE(c.rung.codec, Codec::kDgc) << c.key;
  EXPECT_NE(find(early, "layer3").reason.find("early training"), std::string::npos);
  const Plan later = choose_codecs(model(), numbers(0.01), o, 50);
  EXPECT_EQ(find(later, "layer3").rung.codec, Codec::kDgc);
}

// The fidelity ramp follows DGC's own warm-up (compress/dgc/schedule.h) in quarters of
// ramp_steps, capped by the ladder's top, and ends at ramp_steps.
TEST(CodecChoice, RampFollowsDgcWarmUp) {
  ChoiceOptions o = options();
  o.ramp_steps = 100;
  EXPECT_DOUBLE_EQ(ramp_cap(o, 0), 0.75);
  EXPECT_DOUBLE_EQ(ramp_cap(o, 24), 0.75);
  EXPECT_DOUBLE_EQ(ramp_cap(o, 25), 0.9375);
  EXPECT_DOUBLE_EQ(ramp_cap(o, 50), 0.984375);
  EXPECT_DOUBLE_EQ(ramp_cap(o, 75), 0.996);
  EXPECT_DOUBLE_EQ(ramp_cap(o, 99), 0.996);
  EXPECT_DOUBLE_EQ(ramp_cap(o, 100), 1.0);
  EXPECT_EQ(ramp_stage_starts(o), (std::vector<uint64_t>{25, 50, 75, 100}));
  EXPECT_EQ(ramped_ladder(o, 0), (std::vector<double>{0.75}));
  EXPECT_EQ(ramped_ladder(o, 30), (std::vector<double>{0.9, 0.9375}));
  EXPECT_EQ(ramped_ladder(o, 80), (std::vector<double>{0.9, 0.99, 0.996}));
  EXPECT_EQ(ramped_ladder(o, 100), o.ladder);
  // Uneven quarters: the starts are where the cap changes, step by step.
  o.ramp_steps = 10;
  EXPECT_EQ(ramp_stage_starts(o), (std::vector<uint64_t>{3, 5, 8, 10}));
  for (uint64_t s = 1; s < 30; ++s) {
    const std::vector<uint64_t> starts = ramp_stage_starts(o);
    const bool changes = ramp_cap(o, s) != ramp_cap(o, s - 1);
    EXPECT_EQ(changes, std::count(starts.begin(), starts.end(), s) == 1) << s;
    EXPECT_GE(ramp_cap(o, s), ramp_cap(o, s - 1)) << s;
    ChoiceOptions ramped = o;
    ramped.ladder = ramped_ladder(o, s);
    EXPECT_EQ(ramped_ladder(ramped, s), ramped.ladder) << s;  // idempotent
  }
  // A ladder topping out under the ramp ends it early; no ramp without ramp_steps.
  o.ladder = {0.9};
  EXPECT_EQ(ramped_ladder(o, 4), (std::vector<double>{0.9}));
  o.ramp_steps = 0;
  EXPECT_TRUE(ramp_stage_starts(o).empty());
  EXPECT_DOUBLE_EQ(ramp_cap(o, 0), 1.0);
}

// On a slow link the ramp bounds the compression (dense while DGC at the cap would be sent dense
// anyway, then DGC no harder than the cap) and lets the link's choice through once it is over.
TEST(CodecChoice, RampCapsCompressionEarlyOnASlowLink) {
  ChoiceOptions o = options();
  o.ramp_steps = 100;
  const Plan first = choose_codecs(model(), numbers(0.01), o, 0);
  for (const TensorChoice& c : first.tensors)
    EXPECT_NE(c.rung.codec, Codec::kDgc) << c.key;  // 75% keeps 1/4 > 1/(2P) of 4 ranks
  EXPECT_NE(find(first, "layer3").reason.find("fidelity ramp"), std::string::npos)
      << find(first, "layer3").reason;
  for (uint64_t step : {25u, 50u, 75u}) {
    const Plan p = choose_codecs(model(), numbers(0.01), o, step);
    EXPECT_EQ(find(p, "layer3").rung, (Rung{Codec::kDgc, ramp_cap(o, step)})) << step;
    for (const TensorChoice& c : p.tensors)
      EXPECT_LE(c.rung.sparsity, ramp_cap(o, step)) << c.key << " at " << step;
  }
  const Plan after = choose_codecs(model(), numbers(0.01), o, 100);
  EXPECT_EQ(find(after, "layer3").rung, (Rung{Codec::kDgc, 0.999}));
}

// Cost-aware: where the link hides less compression than the cap, the ramp changes nothing.
TEST(CodecChoice, RampChangesNothingTheLinkHides) {
  ChoiceOptions ramped = options();
  ramped.ramp_steps = 100;
  size_t checked = 0;
  for (double gbit : {400.0, 10.0, 3.0, 1.0}) {
    const Plan without = choose_codecs(model(), numbers(gbit), options(), 60);
    if (std::any_of(without.tensors.begin(), without.tensors.end(),
                    [&](const TensorChoice& c) { return c.rung.sparsity > ramp_cap(ramped, 60); }))
      continue;  // a plan the cap does change
    const Plan with = choose_codecs(model(), numbers(gbit), ramped, 60);
    for (const TensorChoice& c : without.tensors)
      EXPECT_EQ(find(with, c.key).rung, c.rung) << c.key << " at " << gbit << " Gbit/s";
    ++checked;
  }
  EXPECT_GE(checked, 2u);
}

// A measured floor above the ramp's cap (the plan in force was exposed) takes the most the cap
// allows, not the least compression.
TEST(CodecChoice, AtLeastAboveTheRampsCapTakesTheCap) {
  ChoiceOptions o = options();
  o.ramp_steps = 100;
  std::vector<TensorInput> in = model();
  for (TensorInput& t : in)
    if (t.key == "layer3") t.at_least = Rung{Codec::kDgc, 0.999};
  const Plan p = choose_codecs(in, numbers(400), o, 30);
  EXPECT_EQ(find(p, "layer3").rung, (Rung{Codec::kDgc, 0.9375}));
}

TEST(CodecChoice, DeterministicWhateverTheInputOrder) {
  std::vector<TensorInput> in = model();
  const Plan a = choose_codecs(in, numbers(1), options(), 100);
  std::reverse(in.begin(), in.end());
  const Plan b = choose_codecs(in, numbers(1), options(), 100);
  for (const TensorChoice& c : a.tensors)
    EXPECT_EQ(find(b, c.key).rung, c.rung) << c.key;
  EXPECT_EQ(a.describe().size() > 0, true);
}

// numbers(1) on a link of 25 ms one way (every peer class).
Snapshot numbers_at_25ms() {
  Snapshot n = numbers(1);
  for (LinkParams& l : n.link)
    l.alpha_s = 25e-3;
  return n;
}

// rung_costs' communication seconds and latency of a 1M-element tensor on `rung`.
struct Priced {
  double comm_s = 0;
  double latency_s = 0;
};
Priced priced(const Rung& rung, const Snapshot& n, const ChoiceOptions& o) {
  const TensorInput t = input("w", 1000000, 0, 0.0);
  double encode = 0, decode = 0;
  Priced p;
  rung_costs(t, rung, n, o, encode, p.comm_s, decode, &p.latency_s);
  return p;
}

// On a latency-bound link the engine sums dense buckets up to dense_direct_max_bytes directly: the
// timeline prices such a tensor with the direct exchange's 2 latencies instead of the ring's
// 2(P-1), and larger ones with the ring's.
TEST(CodecChoice, DenseTensorsUpToTheDirectSizeTakeTheDirectLatencies) {
  const Snapshot n = numbers_at_25ms();
  ChoiceOptions o = options();
  const Priced ring = priced(Rung{Codec::kHalf, 0}, n, o);
  o.dense_direct_max_bytes = 2000000;  // the 16-bit tensor's 2 MB: direct
  const Priced direct = priced(Rung{Codec::kHalf, 0}, n, o);
  EXPECT_NEAR(ring.latency_s, 6 * 25e-3, 1e-12);
  EXPECT_NEAR(direct.latency_s, 2 * 25e-3, 1e-12);
  EXPECT_NEAR(ring.comm_s - direct.comm_s, 4 * 25e-3, 1e-9);  // the same bytes either way
  // 4 MB: beyond the size, the ring
  EXPECT_NEAR(priced(Rung{Codec::kFp32, 0}, n, o).latency_s, 6 * 25e-3, 1e-12);
}

// A DGC gather without its size round (receives sized on arrival) is priced with its one data
// round's latency; with the size round, two; around the ring, P - 1 either way.
TEST(CodecChoice, AnUnsizedDgcGatherTakesOneLatency) {
  const Snapshot n = numbers_at_25ms();
  ChoiceOptions o = options();
  const Rung dgc{Codec::kDgc, 0.999};
  const Priced sized = priced(dgc, n, o);
  o.sparse_unsized = true;
  const Priced unsized = priced(dgc, n, o);
  EXPECT_NEAR(sized.latency_s, 2 * 25e-3, 1e-12);
  EXPECT_NEAR(unsized.latency_s, 25e-3, 1e-12);
  EXPECT_NEAR(sized.comm_s - unsized.comm_s, 25e-3, 1e-9);  // the same bytes either way
  o.sparse_ring = true;
  EXPECT_NEAR(priced(dgc, n, o).latency_s, (o.world_size - 1) * 25e-3, 1e-12);
}

// An 8-bit or 4-bit tensor whose encoding fits quantized_one_hop_max_bytes is priced as the engine
// sums it there, in one hop: one latency instead of two, (P-1) encodings on the link instead of
// 2(P-1)/P; a larger one in the two phases.
TEST(CodecChoice, AQuantizedUnitWithinTheOneHopSizeTakesOneLatency) {
  const Snapshot n = numbers_at_25ms();
  ChoiceOptions o = options();
  const Rung four{Codec::kInt4, 0};
  const Priced two = priced(four, n, o);
  const double encoded = int8_allreduce_terms(1000000, 2, 4, true).bytes;            // as priced
  const uint64_t message = compress::backend::block_codec(4).encoded_size(1000000);  // as sent
  o.quantized_one_hop_max_bytes = message;
  const Priced one = priced(four, n, o);
  EXPECT_NEAR(two.latency_s, 2 * 25e-3, 1e-12);
  EXPECT_NEAR(one.latency_s, 25e-3, 1e-12);
  const double P = o.world_size;
  const double beta = n.link[static_cast<size_t>(o.link_class)].beta_s_per_byte;
  EXPECT_NEAR(one.comm_s - two.comm_s, -25e-3 + ((P - 1) - 2 * (P - 1) / P) * encoded * beta, 1e-9);
  o.quantized_one_hop_max_bytes = message - 1;  // just too large
  EXPECT_NEAR(priced(four, n, o).latency_s, 2 * 25e-3, 1e-12);
}

TEST(CodecChoice, NoHalfRungWithoutFp16) {
  ChoiceOptions o = options();
  o.half_available = false;
  const Plan p = choose_codecs(model(), numbers(3), o, 100);
  for (const TensorChoice& c : p.tensors)
    EXPECT_NE(c.rung.codec, Codec::kHalf);
}

}  // namespace
}  // namespace gradex::sync::cost
