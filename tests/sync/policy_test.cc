// Policy chain and override parsing, without any networking.
#include "sync/policy/policy.h"

#include <gtest/gtest.h>

#include <optional>
#include <vector>

#include "base/error.h"
#include "sync/engine/localsgd.h"

using namespace gradex::sync;

TEST(Policy, ChainOrderOverridesThresholdSparsity) {
  EngineOptions o;
  o.dense_threshold = 16384;
  o.sparsity = 0.999;
  o.overrides = parse_policy_overrides("embed:0.99, bn:dense ,head*bias:0");
  const Rung dense{Codec::kHalf, 0};  // the default 16-bit wire
  EXPECT_EQ(choose_policy(o, "conv1.weight", 100000).rung, (Rung{Codec::kDgc, 0.999}));
  EXPECT_EQ(choose_policy(o, "conv1.bias", 64).rung, dense);
  EXPECT_EQ(choose_policy(o, "word_embed.weight", 10).rung,
            (Rung{Codec::kDgc, 0.99}));  // override wins
  EXPECT_EQ(choose_policy(o, "layer.bn.weight", 1 << 20).rung, dense);
  EXPECT_EQ(choose_policy(o, "head.x.bias", 1 << 20).rung, dense);
  o.sparsity = 0;
  EXPECT_EQ(choose_policy(o, "conv1.weight", 100000).rung, dense);
  EXPECT_EQ(choose_policy(o, "conv1.weight", 100000).reason, "GRADEX_SPARSITY=0");
  // On an fp32 wire the dense rung is fp32: that wire itself.
  o.half_on_wire = false;
  EXPECT_EQ(choose_policy(o, "conv1.bias", 64).rung, (Rung{Codec::kFp32, 0}));
}

TEST(Policy, Int8OverrideIsDenseOnTheEightBitRoute) {
  EngineOptions o;
  o.overrides = parse_policy_overrides("fc*:int8, fc.bias:dense");
  const AppliedPolicy p = choose_policy(o, "fc.weight", 1 << 20);
  EXPECT_EQ(p.rung, (Rung{Codec::kInt8, 0}));
  EXPECT_FALSE(is_sparse(p.rung.codec));
  EXPECT_EQ(p.reason, "override 'fc*': int8");
  EXPECT_EQ(choose_policy(o, "fc.bias", 10).rung.codec, Codec::kInt8);  // first match wins
  EXPECT_NE(choose_policy(o, "conv.weight", 10).rung.codec, Codec::kInt8);
  try {
    parse_policy_overrides("x:int2");
    ADD_FAILURE() << "int2 accepted";
  } catch (const gradex::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("'pattern:int4'"), std::string::npos) << e.what();
  }
}

TEST(Policy, Int4OverrideIsDenseOnTheFourBitRoute) {
  EngineOptions o;
  o.overrides = parse_policy_overrides("fc*:int4, head:int8");
  const AppliedPolicy p = choose_policy(o, "fc.weight", 1 << 20);
  EXPECT_EQ(p.rung, (Rung{Codec::kInt4, 0}));
  EXPECT_FALSE(is_sparse(p.rung.codec));
  EXPECT_TRUE(is_quantized(p.rung.codec));
  EXPECT_EQ(quantized_bits(p.rung.codec), 4);
  EXPECT_EQ(p.reason, "override 'fc*': int4");
  EXPECT_EQ(rung_name(p.rung), "4-bit");
  EXPECT_EQ(choose_policy(o, "head.weight", 1 << 20).rung, (Rung{Codec::kInt8, 0}));
  EXPECT_EQ(canonical_rung(p.rung, o), p.rung);
}

TEST(Policy, OverrideParsingRejectsBadEntries) {
  EXPECT_THROW(parse_policy_overrides("x"), gradex::ConfigError);
  EXPECT_THROW(parse_policy_overrides(":0.9"), gradex::ConfigError);
  EXPECT_THROW(parse_policy_overrides("x:1"), gradex::ConfigError);
  EXPECT_THROW(parse_policy_overrides("x:sparse"), gradex::ConfigError);
  EXPECT_EQ(parse_policy_overrides(" , ").size(), 0u);
  EXPECT_TRUE(pattern_matches("layer*weight", "layer1.conv.weight"));
  EXPECT_FALSE(pattern_matches("layer*weight", "layer1.conv.bias"));
  EXPECT_TRUE(pattern_matches("conv", "layer1.conv.bias"));
  // Shell globs (fnmatch): '?' one character, '[...]' a set; a glob matches the whole name.
  EXPECT_TRUE(pattern_matches("layer?.conv.*", "layer1.conv.bias"));
  EXPECT_FALSE(pattern_matches("layer?.conv.*", "layer12.conv.bias"));
  EXPECT_TRUE(pattern_matches("layer[13].*", "layer3.fc.weight"));
  EXPECT_FALSE(pattern_matches("layer[13].*", "layer2.fc.weight"));
  EXPECT_FALSE(pattern_matches("conv*", "layer1.conv.bias"));  // globs are anchored
}

TEST(Policy, SparseOnlyWhileCheaperThanDenseRing) {
  EXPECT_FALSE(sparse_is_cheaper(0.25, 4));
  EXPECT_FALSE(sparse_is_cheaper(0.125, 4));
  EXPECT_TRUE(sparse_is_cheaper(0.0625, 4));
  EXPECT_TRUE(sparse_is_cheaper(0.001, 64));
  EXPECT_FALSE(sparse_is_cheaper(0.01, 64));
}

TEST(LocalSgd, ScheduleFollowsWarmupAndPeriod) {
  LocalSgdSchedule s(4, 2);
  EXPECT_TRUE(s.exchanges_gradients(0));
  EXPECT_TRUE(s.exchanges_gradients(1));
  EXPECT_FALSE(s.exchanges_gradients(2));
  std::vector<int> averages;
  for (int c = 1; c <= 14; ++c)
    if (s.average_after(c)) averages.push_back(c);
  EXPECT_EQ(averages, (std::vector<int>{6, 10, 14}));
  LocalSgdSchedule off(0, 5);
  EXPECT_TRUE(off.exchanges_gradients(100));
  EXPECT_FALSE(off.average_after(8));
}

// Every rung a run applies has one encoding (canonical_rung), so equal rungs are the same policy:
// the dense codecs name the precision on the wire (kHalf only on a 16-bit wire, where kFp32 is
// fp32 buckets of their own; on an fp32 wire kFp32 is the wire itself), and a sparse rung takes
// the run's one sparse codec.
TEST(Policy, AppliedRungsHaveOneEncoding) {
  for (bool half : {true, false}) {
    for (bool adam : {false, true}) {
      EngineOptions o;
      o.half_on_wire = half;
      o.adam.codec = adam;
      const Codec sparse = adam ? Codec::kAdam : Codec::kDgc;
      EXPECT_EQ(sparse_codec(o), sparse);
      const Rung wire = default_dense_rung(o);
      EXPECT_EQ(wire, (Rung{half ? Codec::kHalf : Codec::kFp32, 0}));
      EXPECT_EQ(canonical_rung({Codec::kHalf, 0}, o), wire);
      EXPECT_EQ(canonical_rung({Codec::kFp32, 0}, o), (Rung{Codec::kFp32, 0}));
      EXPECT_EQ(own_fp32_buckets(canonical_rung({Codec::kFp32, 0}, o), half), half);
      EXPECT_FALSE(own_fp32_buckets(wire, half));
      EXPECT_EQ(canonical_rung({Codec::kInt8, 0.5}, o), (Rung{Codec::kInt8, 0}));
      for (Codec c : {Codec::kDgc, Codec::kAdam})
        EXPECT_EQ(canonical_rung({c, 0.999}, o), (Rung{sparse, 0.999})) << codec_name(c);
      // Canonical rungs are fixed points, and what the fixed chain applies is canonical.
      for (const Rung& r : {wire, Rung{Codec::kFp32, 0}, Rung{Codec::kInt8, 0}, Rung{sparse, 0.9}})
        EXPECT_EQ(canonical_rung(r, o), r) << rung_name(r);
      o.overrides = parse_policy_overrides("a:dense, b:int8, c:0.9, d:0");
      for (const char* key : {"a", "b", "c", "d", "e"}) {
        const Rung r = choose_policy(o, key, 1 << 20).rung;
        EXPECT_EQ(canonical_rung(r, o), r) << key;
      }
      EXPECT_EQ(choose_policy(o, "c", 1).rung, (Rung{sparse, 0.9}));
      EXPECT_EQ(choose_policy(o, "e", 1 << 20).rung.codec, sparse);
    }
  }
  EXPECT_EQ(rung_name({Codec::kDgc, 0.999}), "dgc 99.9%");
  EXPECT_EQ(rung_name({Codec::kInt8, 0}), "8-bit");
}

// Overrides are matched in one place: the fixed chain's first candidate is exactly
// override_policy, and a tensor no entry matches has none.
TEST(Policy, OverridePolicyIsTheChainsFirstCandidate) {
  EngineOptions o;
  o.dense_threshold = 16384;
  o.sparsity = 0.999;
  o.overrides = parse_policy_overrides("embed:0.99, bn:dense, fc*:int8, head*bias:0");
  for (const char* key : {"word_embed.weight", "layer.bn.weight", "fc.weight", "head.x.bias"}) {
    const std::optional<AppliedPolicy> forced = override_policy(o, key);
    ASSERT_TRUE(forced.has_value()) << key;
    const AppliedPolicy chain = choose_policy(o, key, 1 << 20);
    EXPECT_EQ(forced->rung, chain.rung) << key;
    EXPECT_EQ(forced->reason, chain.reason) << key;
  }
  EXPECT_FALSE(override_policy(o, "conv1.weight").has_value());
  EXPECT_EQ(override_policy(o, "fc.weight")->rung.codec, Codec::kInt8);
  EXPECT_EQ(override_policy(o, "head.x.bias")->rung, (Rung{Codec::kHalf, 0}));  // sparsity 0: dense
  EXPECT_EQ(override_policy(o, "head.x.bias")->reason, "override 'head*bias': dense");
  EXPECT_EQ(override_policy(o, "word_embed.weight")->reason, "override 'embed'");
}
