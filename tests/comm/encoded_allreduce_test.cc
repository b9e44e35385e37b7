// comm::encoded_allreduce over real UCX (ranks as threads): world sizes 1-5, odd and multi-chunk
// counts, fp32 and 4/8-bit quantized codecs with error feedback over several rounds, one buffer or
// several fused in one call, the sign of a sum of zeros, and refusal of pieces a codec's validate()
// rejects; each in both forms, the two phases and the one hop. Every rank recomputes what every
// other rank encodes (the codecs are deterministic), so the result is checked bit for bit against
// that reference, and against the other ranks' results.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <tuple>

#include "base/error.h"
#include "comm/collectives.h"
#include "outer/outer.h"
#include "tests/comm/encoded_test_support.h"
#include "tests/comm/rank_harness.h"
#include "tests/comm/reference.h"

namespace gradex::test {
namespace {

using comm::Communicator;
using outer::Fp32Codec;
using outer::QuantCodec;

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

void check(int P, const CodecSpec& spec, const std::vector<size_t>& counts, bool one_hop) {
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
        std::vector<comm::EncodedBuffer> buffers{
            {mine.contribution.get(), mine.result.get(), buf.data(), buf.data(), count, "b"}};
        comm::EncodedAllreduceOptions options;
        options.one_hop = one_hop;
        options.transform = [&scale](size_t, float* v, size_t n, size_t offset) {
          scale(v, n, offset);
        };
        comm::encoded_allreduce(c, buffers, options);
        // Reference, two phases: every rank's encoding of every segment, summed in rank order by
        // the owner, re-encoded; one hop: every rank's encoding of the whole, summed in rank order.
        std::vector<float> want(count, 0.0f);
        for (int q = 0; one_hop && q < P; ++q) {
          set_round(ref[static_cast<size_t>(q)], static_cast<uint64_t>(round));
          auto in = input(q, count, round);
          auto& codec = *ref[static_cast<size_t>(q)].contribution;
          std::vector<uint8_t> e(codec.encoded_size(count));
          codec.encode(in.data(), count, 0, e.data());
          codec.decode_add(e.data(), count, want.data());
        }
        if (one_hop) scale(want.data(), count, 0);
        for (int k = 0; !one_hop && k < P; ++k) {
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
                                   " count=" + std::to_string(count) + (one_hop ? " one hop" : "") +
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

// (world size, one hop)
class EncodedWorld : public ::testing::TestWithParam<std::tuple<int, bool>> {
 protected:
  int world() const { return std::get<0>(GetParam()); }
  bool one_hop() const { return std::get<1>(GetParam()); }
};

const std::vector<size_t> kCounts = {0, 1, 7, 63, 64, 65, 1001};

TEST_P(EncodedWorld, Fp32MatchesRankOrderSum) {
  check(world(), {32, 1, compress::quant::Rounding::kNearest}, kCounts, one_hop());
}

TEST_P(EncodedWorld, Fp32WithGranules) {
  check(world(), {32, 6, compress::quant::Rounding::kNearest}, kCounts, one_hop());
}

TEST_P(EncodedWorld, EightBitErrorFeedback) {
  check(world(), {8, 8, compress::quant::Rounding::kNearest}, kCounts, one_hop());
}

TEST_P(EncodedWorld, FourBitStochastic) {
  check(world(), {4, 6, compress::quant::Rounding::kStochastic}, kCounts, one_hop());
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, EncodedWorld,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4, 5), ::testing::Bool()));

// The multi-buffer form: buffers of different codecs, granularities and sizes in one call give,
// bit for bit, what one single-buffer call per buffer gives, each buffer's transform receiving its
// own index.
TEST_P(EncodedWorld, FusedBuffersMatchOneCallPerBuffer) {
  const int P = world();
  const bool hop = one_hop();
  const std::vector<CodecSpec> specs = {{32, 1, compress::quant::Rounding::kNearest},
                                        {8, 8, compress::quant::Rounding::kNearest},
                                        {32, 6, compress::quant::Rounding::kNearest},
                                        {4, 6, compress::quant::Rounding::kStochastic}};
  const std::vector<size_t> counts = {1001, 7, 0, 65};
  run_ranks(P, [&](Communicator& c) {
    std::vector<RankCodecs> fused, alone;
    for (size_t b = 0; b < specs.size(); ++b) {
      fused.push_back(make_codecs(specs[b], c.rank(), P, counts[b]));
      alone.push_back(make_codecs(specs[b], c.rank(), P, counts[b]));
    }
    auto factor = [P](size_t b) { return static_cast<float>(b + 1) / static_cast<float>(P); };
    for (int round = 0; round < 3; ++round) {
      std::vector<std::vector<float>> got, want;
      std::vector<comm::EncodedBuffer> buffers;
      for (size_t b = 0; b < specs.size(); ++b) {
        set_round(fused[b], static_cast<uint64_t>(round));
        set_round(alone[b], static_cast<uint64_t>(round));
        got.push_back(input(c.rank() + 10 * static_cast<int>(b), counts[b], round));
        want.push_back(got.back());
      }
      for (size_t b = 0; b < specs.size(); ++b)
        buffers.push_back({fused[b].contribution.get(), fused[b].result.get(), got[b].data(),
                           got[b].data(), counts[b], "buffer " + std::to_string(b)});
      comm::EncodedAllreduceOptions options;
      options.one_hop = hop;
      options.transform = [&](size_t b, float* v, size_t n, size_t) {
        for (size_t i = 0; i < n; ++i)
          v[i] *= factor(b);
      };
      comm::encoded_allreduce(c, buffers, options);
      for (size_t b = 0; b < specs.size(); ++b) {
        const float f = factor(b);
        std::vector<comm::EncodedBuffer> one{{alone[b].contribution.get(), alone[b].result.get(),
                                              want[b].data(), want[b].data(), counts[b], "b"}};
        comm::EncodedAllreduceOptions single;
        single.one_hop = hop;
        single.transform = [f](size_t, float* v, size_t n, size_t) {
          for (size_t i = 0; i < n; ++i)
            v[i] *= f;
        };
        comm::encoded_allreduce(c, one, single);
        if (counts[b] && std::memcmp(got[b].data(), want[b].data(), 4 * counts[b]) != 0)
          throw std::runtime_error("P=" + std::to_string(P) + " buffer " + std::to_string(b) +
                                   " round " + std::to_string(round) +
                                   ": fused result differs from its own call");
      }
    }
  });
}

// Counts the sends a collective has posted when it first waits (wait_all or test).
class FirstWaitCommunicator : public CountingCommunicator {
 public:
  using CountingCommunicator::CountingCommunicator;
  bool test(comm::Request& r, const char* op) override {
    note();
    return CountingCommunicator::test(r, op);
  }
  void wait_all(std::vector<comm::RequestPtr>& r, const char* op) override {
    note();
    CountingCommunicator::wait_all(r, op);
  }
  uint64_t sends_at_first_wait = 0;

 private:
  void note() {
    if (!waited_) sends_at_first_wait = sends;
    waited_ = true;
  }
  bool waited_ = false;
};

// The one hop posts its encoding to every peer before it waits for anything: a send completes only
// once the kernel holds its bytes, so waiting for one before posting the next made the peers'
// TCP slow starts take turns on cold connections (a delay lane's first exchange across a WAN).
TEST(EncodedAllreduce, OneHopPostsEverySendBeforeItWaits) {
  const int P = 4;
  const size_t count = 1001;
  run_ranks(P, [&](Communicator& c) {
    FirstWaitCommunicator counted(c);
    RankCodecs codecs =
        make_codecs({4, 6, compress::quant::Rounding::kStochastic}, c.rank(), P, count);
    std::vector<float> buf = input(c.rank(), count, 0);
    std::vector<comm::EncodedBuffer> buffers{
        {codecs.contribution.get(), codecs.result.get(), buf.data(), buf.data(), count, "b"}};
    comm::EncodedAllreduceOptions options;
    options.one_hop = true;
    comm::encoded_allreduce(counted, buffers, options);
    if (counted.sends != static_cast<uint64_t>(P - 1) ||
        counted.sends_at_first_wait != static_cast<uint64_t>(P - 1))
      throw std::runtime_error(std::to_string(counted.sends_at_first_wait) + " of " +
                               std::to_string(counted.sends) + " sends posted at the first wait");
  });
}

// Every rank fails in the reduce-scatter (or the one hop's gather), naming the phase, the sender
// and the buffer, before anything is summed.
TEST(EncodedAllreduce, ValidateRefusesReceivedPieces) {
  for (bool one_hop : {false, true}) {
    const int P = 3;
    std::vector<std::string> errors(P);
    try {
      run_ranks(P, [&](Communicator& c) {
        try {
          call_refusing([&](auto& buffers, auto& options) {
            options.one_hop = one_hop;
            comm::encoded_allreduce(c, buffers, options);
          });
        } catch (const Error& e) {
          errors[static_cast<size_t>(c.rank())] = e.what();
          throw;
        }
      });
      FAIL() << "refused pieces were summed";
    } catch (const std::exception&) {
    }
    // The two phases receive every piece before validating any, so every rank refuses one. In the
    // one hop a rank validates each piece as it arrives, and the first to refuse one stops sending:
    // the others may learn of its failure before they refuse a piece of their own.
    int refused = 0;
    for (int q = 0; q < P; ++q) {
      const std::string& e = errors[static_cast<size_t>(q)];
      EXPECT_FALSE(e.empty()) << "rank " << q << " did not fail";
      if (e.find("tensor 'w': refused") == std::string::npos) {
        EXPECT_TRUE(one_hop) << e;
        EXPECT_NE(e.find("test gather with peer rank "), std::string::npos) << e;
        continue;
      }
      ++refused;
      EXPECT_NE(e.find(one_hop ? "test gather from rank " : "test reduce-scatter from rank "),
                std::string::npos)
          << e;
    }
    EXPECT_GE(refused, 1);
  }
}

// The sum starts from rank 0's term (collectives.h), so a sum of -0 terms is -0 on every rank, as
// in the rings, and +0 wherever one term is +0; with a zeroed start the first would have been +0.
TEST(EncodedAllreduce, SumOfNegativeZerosStaysNegativeZero) {
  for (bool one_hop : {false, true}) {
    const int P = 3;
    run_ranks(P, [&](Communicator& c) {
      // Element 0: -0 everywhere; 1: -0 on rank 0 only; 2: -0 on the last rank only; 3: a value.
      std::vector<float> buf = {-0.0f, c.rank() == 0 ? -0.0f : 0.0f,
                                c.rank() == P - 1 ? -0.0f : 0.0f, 1.5f};
      Fp32Codec contribution, result;
      std::vector<comm::EncodedBuffer> buffers{
          {&contribution, &result, buf.data(), buf.data(), buf.size(), "zeros"}};
      comm::EncodedAllreduceOptions options;
      options.one_hop = one_hop;
      comm::encoded_allreduce(c, buffers, options);
      const std::string where =
          std::string(one_hop ? "one hop" : "two phases") + ", rank " + std::to_string(c.rank());
      if (!std::signbit(buf[0]) || buf[0] != 0.0f)
        throw std::runtime_error(where + ": a sum of -0 terms is not -0");
      if (std::signbit(buf[1]) || std::signbit(buf[2]))
        throw std::runtime_error(where + ": a sum with +0 terms is not +0");
      if (buf[3] != 4.5f)
        throw std::runtime_error(where + ": 3 x 1.5 is " + std::to_string(buf[3]));
    });
  }
}

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
