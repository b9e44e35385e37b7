// comm::encoded_allreduce over real UCX (ranks as threads): world sizes 1-5, odd and multi-chunk
// counts, fp32 and 4/8-bit quantized codecs with error feedback over several rounds. Every rank
// recomputes what every other rank encodes (the codecs are deterministic), so the result is
// checked bit for bit against that reference, and against the other ranks' results.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>

#include "comm/collectives.h"
#include "sync/outer/codecs.h"
#include "tests/comm/rank_harness.h"
#include "tests/comm/reference.h"

namespace gradex::test {
namespace {

using comm::Communicator;
using sync::outer::Fp32Codec;
using sync::outer::QuantCodec;

struct CodecSpec {
  int bits;  // 32: fp32
  size_t block;
  compress::quant::Rounding rounding;
};

std::vector<float> input(int rank, size_t count, int round) {
  auto raw = make_input(rank, count, DType::kFloat32, 17u + static_cast<uint32_t>(round));
  std::vector<float> v(count);
  if (count) std::memcpy(v.data(), raw.data(), 4 * count);
  return v;
}

// The contribution and result codecs rank q would use.
struct RankCodecs {
  std::unique_ptr<comm::ChunkCodec> contribution, result;
};

RankCodecs make_codecs(const CodecSpec& spec, int q, int P, size_t count) {
  RankCodecs c;
  if (spec.bits == 32) {
    c.contribution = std::make_unique<Fp32Codec>(spec.block);
    c.result = std::make_unique<Fp32Codec>(spec.block);
    return c;
  }
  compress::quant::QuantOptions o;
  o.bits = spec.bits;
  o.block = spec.block;
  o.rounding = spec.rounding;
  o.seed = 1000 + static_cast<uint64_t>(q);
  auto seg = comm::encoded_segment(count, spec.block, P, q);
  c.contribution = std::make_unique<QuantCodec>(o, true, 0, count, count);
  o.seed += 500;
  c.result = std::make_unique<QuantCodec>(o, true, seg.begin, seg.count, count);
  return c;
}

void set_round(RankCodecs& c, uint64_t round) {
  if (auto* q = dynamic_cast<QuantCodec*>(c.contribution.get())) q->set_round(round);
  if (auto* q = dynamic_cast<QuantCodec*>(c.result.get())) q->set_round(round);
}

void check(int P, const CodecSpec& spec, const std::vector<size_t>& counts) {
  run_ranks(P, [&](Communicator& c) {
    for (size_t count : counts) {
      std::vector<RankCodecs> ref;
      for (int q = 0; q < P; ++q)
        ref.push_back(make_codecs(spec, q, P, count));
      RankCodecs mine = make_codecs(spec, c.rank(), P, count);
      const float inv = 1.0f / static_cast<float>(P);
      auto scale = [inv](float* v, size_t n, size_t) {
        for (size_t i = 0; i < n; ++i)
          v[i] *= inv;
      };
      for (int round = 0; round < 3; ++round) {
        set_round(mine, static_cast<uint64_t>(round));
        std::vector<float> buf = input(c.rank(), count, round);
        comm::encoded_allreduce(c, *mine.contribution, *mine.result, buf.data(), buf.data(), count,
                                scale);
        // Reference: every rank's encoding of every segment, summed in rank order by the owner.
        std::vector<float> want(count, 0.0f);
        for (int k = 0; k < P; ++k) {
          auto seg = comm::encoded_segment(count, spec.block, P, k);
          std::vector<float> sum(seg.count, 0.0f);
          for (int q = 0; q < P; ++q) {
            set_round(ref[static_cast<size_t>(q)], static_cast<uint64_t>(round));
            auto in = input(q, count, round);
            auto& codec = *ref[static_cast<size_t>(q)].contribution;
            std::vector<uint8_t> e(codec.encoded_size(seg.count));
            codec.encode(in.data() + seg.begin, seg.count, seg.begin, e.data());
            codec.decode_add(e.data(), seg.count, sum.data());
          }
          scale(sum.data(), seg.count, seg.begin);
          auto& rc = *ref[static_cast<size_t>(k)].result;
          std::vector<uint8_t> e(rc.encoded_size(seg.count));
          rc.encode(sum.data(), seg.count, seg.begin, e.data());
          rc.decode(e.data(), seg.count, want.data() + seg.begin);
        }
        if (count && std::memcmp(buf.data(), want.data(), 4 * count) != 0)
          throw std::runtime_error("P=" + std::to_string(P) + " bits=" + std::to_string(spec.bits) +
                                   " count=" + std::to_string(count) +
                                   " round=" + std::to_string(round) + ": differs from reference");
        // Same bits everywhere, and close to the true mean.
        auto all = comm::allgatherv(c, buf.data(), 4 * count);
        for (const auto& other : all)
          if (other.size() != 4 * count ||
              (count && std::memcmp(other.data(), buf.data(), 4 * count) != 0))
            throw std::runtime_error("ranks hold different results");
        for (size_t i = 0; i < count; ++i) {
          float mean = 0.0f;
          for (int q = 0; q < P; ++q)
            mean += input(q, count, round)[i];
          mean /= static_cast<float>(P);
          // Inputs are within +-1000: a quantization step is at most 1000 / max_code; the
          // contribution, its residual and the owner's requantization add a few steps.
          float step = spec.bits == 32 ? 0.0f : 1000.0f / compress::quant::max_code(spec.bits);
          if (std::fabs(buf[i] - mean) > 4.0f * step + 1e-3f)
            throw std::runtime_error("far from the mean at " + std::to_string(i));
        }
      }
    }
  });
}

class EncodedWorld : public ::testing::TestWithParam<int> {};

const std::vector<size_t> kCounts = {0, 1, 7, 63, 64, 65, 1001};

TEST_P(EncodedWorld, Fp32MatchesRankOrderSum) {
  check(GetParam(), {32, 1, compress::quant::Rounding::kNearest}, kCounts);
}

TEST_P(EncodedWorld, Fp32WithGranules) {
  check(GetParam(), {32, 6, compress::quant::Rounding::kNearest}, kCounts);
}

TEST_P(EncodedWorld, EightBitErrorFeedback) {
  check(GetParam(), {8, 8, compress::quant::Rounding::kNearest}, kCounts);
}

TEST_P(EncodedWorld, FourBitStochastic) {
  check(GetParam(), {4, 6, compress::quant::Rounding::kStochastic}, kCounts);
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, EncodedWorld, ::testing::Values(1, 2, 3, 4, 5));

TEST(EncodedSegment, CoversTheBufferInWholeGranules) {
  for (int P = 1; P <= 5; ++P)
    for (size_t count : {0, 1, 9, 10, 11, 100}) {
      size_t next = 0;
      for (int k = 0; k < P; ++k) {
        auto s = comm::encoded_segment(count, 3, P, k);
        EXPECT_EQ(s.begin, next);
        EXPECT_TRUE(s.begin % 3 == 0 || s.count == 0);
        next = s.begin + s.count;
      }
      EXPECT_EQ(next, count);
    }
}

}  // namespace
}  // namespace gradex::test
