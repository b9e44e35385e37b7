// Policy chain and override parsing, without any networking.
#include "sync/policy.h"

#include <gtest/gtest.h>

#include <optional>
#include <vector>

#include "base/error.h"
#include "sync/localsgd.h"

using namespace gradex::sync;

TEST(Policy, ChainOrderOverridesThresholdSparsity) {
  EngineOptions o;
  o.dense_threshold = 16384;
  o.sparsity = 0.999;
  o.overrides = parse_policy_overrides("embed:0.99, bn:dense ,head*bias:0");
  EXPECT_EQ(choose_policy(o, "conv1.weight", 100000).kind, ExchangeKind::kSparse);
  EXPECT_EQ(choose_policy(o, "conv1.weight", 100000).sparsity, 0.999);
  EXPECT_EQ(choose_policy(o, "conv1.bias", 64).kind, ExchangeKind::kDense);
  EXPECT_EQ(choose_policy(o, "word_embed.weight", 10).kind,
            ExchangeKind::kSparse);  // override wins
  EXPECT_EQ(choose_policy(o, "word_embed.weight", 10).sparsity, 0.99);
  EXPECT_EQ(choose_policy(o, "layer.bn.weight", 1 << 20).kind, ExchangeKind::kDense);
  EXPECT_EQ(choose_policy(o, "head.x.bias", 1 << 20).kind, ExchangeKind::kDense);
  o.sparsity = 0;
  EXPECT_EQ(choose_policy(o, "conv1.weight", 100000).kind, ExchangeKind::kDense);
}

TEST(Policy, Int8OverrideIsDenseOnTheEightBitRoute) {
  EngineOptions o;
  o.overrides = parse_policy_overrides("fc*:int8, fc.bias:dense");
  const TensorPolicy p = choose_policy(o, "fc.weight", 1 << 20);
  EXPECT_EQ(p.kind, ExchangeKind::kDense);
  EXPECT_TRUE(p.int8);
  EXPECT_EQ(p.reason, "override 'fc*': int8");
  EXPECT_TRUE(choose_policy(o, "fc.bias", 10).int8);  // first match wins
  EXPECT_FALSE(choose_policy(o, "conv.weight", 10).int8);
  try {
    parse_policy_overrides("x:int4");
    ADD_FAILURE() << "int4 accepted";
  } catch (const gradex::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("'pattern:int8'"), std::string::npos) << e.what();
  }
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

// The applied policy and the rung are two spellings of one policy: every rung the cost model can
// choose maps to a policy and back, on either dense wire.
TEST(Policy, RungsAndPoliciesConvertBothWays) {
  for (bool half : {true, false}) {
    for (Codec sparse : {Codec::kDgc, Codec::kAdam}) {
      const std::vector<Rung> rungs = {
          {Codec::kFp32, 0}, {Codec::kInt8, 0}, {sparse, 0.9}, {sparse, 0.999}};
      for (const Rung& r : rungs) {
        const TensorPolicy p = policy_of(r, half);
        EXPECT_EQ(p.kind == ExchangeKind::kSparse, is_sparse(r.codec)) << rung_name(r);
        EXPECT_EQ(rung_of(p, sparse, half), r) << rung_name(r) << (half ? " on 16-bit" : "");
      }
      // kHalf is the 16-bit wire's default; on an fp32 wire the default dense rung is fp32.
      if (half)
        EXPECT_EQ(rung_of(policy_of({Codec::kHalf, 0}, half), sparse, half).codec, Codec::kHalf);
      EXPECT_EQ(rung_of(TensorPolicy{}, sparse, half).codec, half ? Codec::kHalf : Codec::kFp32);
      EXPECT_TRUE(policy_of({Codec::kFp32, 0}, half).full_precision == half);
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
    const std::optional<TensorPolicy> forced = override_policy(o, key);
    ASSERT_TRUE(forced.has_value()) << key;
    const TensorPolicy chain = choose_policy(o, key, 1 << 20);
    EXPECT_EQ(forced->kind, chain.kind) << key;
    EXPECT_EQ(forced->sparsity, chain.sparsity) << key;
    EXPECT_EQ(forced->int8, chain.int8) << key;
    EXPECT_EQ(forced->reason, chain.reason) << key;
  }
  EXPECT_FALSE(override_policy(o, "conv1.weight").has_value());
  EXPECT_EQ(override_policy(o, "fc.weight")->int8, true);
  EXPECT_EQ(override_policy(o, "head.x.bias")->kind, ExchangeKind::kDense);  // sparsity 0: dense
}
