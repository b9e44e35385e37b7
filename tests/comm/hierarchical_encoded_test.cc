// comm::hierarchical_encoded_allreduce (comm/hierarchical.h) over real UCX, ranks as threads, on
// explicit host layouts (even, interleaved, uneven, one host, one rank per host):
//   - fp32 codecs on integer inputs: the exact sum, through a transform that must see whole-buffer
//     offsets, bit-identical on every rank, several buffers fused in one call, both forms;
//   - 8-bit and 4-bit codecs with error feedback: identical on every rank, one round near the mean,
//     and the mean over rounds of a constant input converging to the exact mean (every encoding
//     site's error is fed back, whichever shard a rank owns);
//   - a piece the codec refuses, and buffers whose sizes differ across ranks: every rank fails
//     with a message naming the phase and a peer, and none hangs.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "base/error.h"
#include "comm/collectives.h"
#include "comm/hierarchical.h"
#include "outer/outer.h"
#include "tests/comm/encoded_test_support.h"
#include "tests/comm/host_layouts.h"
#include "tests/comm/rank_harness.h"

namespace gradex::test {
namespace {

using comm::Communicator;

std::string describe(const std::vector<std::string>& hosts) {
  std::string s;
  for (const std::string& h : hosts)
    s += h;
  return s;
}

// Integers, so that every summation order gives the same fp32 sum.
float integer_value(int rank, size_t buffer, size_t i) {
  return static_cast<float>((static_cast<int>(i * 7 + buffer * 13) + rank * 31) % 257 - 128);
}

// Values within +-1000 with a different magnitude per block, as gradients have.
float real_value(int rank, size_t i) {
  const float magnitude = 1000.0f / static_cast<float>(1 + (i / 64) % 5);
  return magnitude * std::sin(0.37f * static_cast<float>(i) + 1.3f * static_cast<float>(rank));
}

TEST(HierarchicalEncoded, Fp32IsTheExactSumWithWholeBufferOffsets) {
  const std::vector<size_t> counts = {0, 1, 7, 64, 1001};
  for (const auto& hosts : host_layouts()) {
    const int P = static_cast<int>(hosts.size());
    const comm::HostTopology topo = comm::host_topology(hosts, P);
    for (bool one_hop : {false, true}) {
      std::mutex m;
      std::vector<std::vector<float>> results(static_cast<size_t>(P));
      run_ranks(P, [&](Communicator& c) {
        std::vector<std::vector<float>> values(counts.size());
        std::vector<std::unique_ptr<outer::Fp32Codec>> codecs;
        std::vector<comm::EncodedBuffer> buffers;
        for (size_t b = 0; b < counts.size(); ++b) {
          values[b].resize(counts[b]);
          for (size_t i = 0; i < counts[b]; ++i)
            values[b][i] = integer_value(c.rank(), b, i);
          codecs.push_back(std::make_unique<outer::Fp32Codec>(8));
          buffers.push_back({codecs.back().get(), codecs.back().get(), values[b].data(),
                             values[b].data(), counts[b], "buffer " + std::to_string(b)});
        }
        comm::EncodedAllreduceOptions options;
        options.name = "test";
        options.one_hop = one_hop;
        // Exact on integers, and wrong unless the offset is the element's place in its buffer.
        options.transform = [&](size_t b, float* v, size_t n, size_t offset) {
          if (offset + n > counts[b]) throw std::runtime_error("transform past the buffer's end");
          for (size_t i = 0; i < n; ++i)
            v[i] = 2.0f * v[i] + static_cast<float>(offset + i);
        };
        comm::hierarchical_encoded_allreduce(c, topo, buffers, options);
        // The tag sequence is still aligned: a flat collective right after matches.
        float token = 1.0f;
        comm::allreduce_sum(c, &token, 1, DType::kFloat32);
        if (token != static_cast<float>(P)) throw std::runtime_error("tags out of step");
        std::vector<float> all;
        for (const auto& v : values)
          all.insert(all.end(), v.begin(), v.end());
        std::lock_guard<std::mutex> lock(m);
        results[static_cast<size_t>(c.rank())] = std::move(all);
      });
      size_t at = 0;
      for (size_t b = 0; b < counts.size(); ++b)
        for (size_t i = 0; i < counts[b]; ++i, ++at) {
          float sum = 0;
          for (int r = 0; r < P; ++r)
            sum += integer_value(r, b, i);
          const float want = 2.0f * sum + static_cast<float>(i);
          for (int r = 0; r < P; ++r)
            ASSERT_EQ(results[static_cast<size_t>(r)][at], want)
                << "layout " << describe(hosts) << (one_hop ? ", one hop" : "") << ", rank " << r
                << ", buffer " << b << ", element " << i;
        }
    }
  }
}

// Rounds of one constant input through 8-bit or 4-bit codecs with error feedback, averaged by the
// transform (1/P): each round's result is identical on every rank and near the mean; the mean of
// the results over the rounds approaches the exact mean as the residuals carry each round's error
// into the next.
void check_quantized(int bits, float one_round_tolerance, float converged_tolerance) {
  const size_t count = 1000;
  const int rounds = 24;
  for (const auto& hosts : host_layouts()) {
    const int P = static_cast<int>(hosts.size());
    const comm::HostTopology topo = comm::host_topology(hosts, P);
    std::vector<float> mean(count, 0.0f);
    for (size_t i = 0; i < count; ++i) {
      for (int r = 0; r < P; ++r)
        mean[i] += real_value(r, i);
      mean[i] /= static_cast<float>(P);
    }
    std::mutex m;
    std::vector<std::vector<float>> last(static_cast<size_t>(P));
    std::vector<double> worst_round(static_cast<size_t>(P), 0.0);
    std::vector<std::vector<double>> running(static_cast<size_t>(P));
    run_ranks(P, [&](Communicator& c) {
      compress::quant::QuantOptions o;
      o.bits = bits;
      o.block = 64;
      o.rounding = compress::quant::Rounding::kNearest;
      outer::QuantCodec contribution(o, true, 0, count, count);
      outer::QuantCodec result(o, true, 0, count, count);
      const float inv = 1.0f / static_cast<float>(P);
      std::vector<double> sum(count, 0.0);
      double worst = 0;
      std::vector<float> v(count);
      for (int round = 0; round < rounds; ++round) {
        for (size_t i = 0; i < count; ++i)
          v[i] = real_value(c.rank(), i);
        contribution.set_round(static_cast<uint64_t>(round));
        result.set_round(static_cast<uint64_t>(round));
        std::vector<comm::EncodedBuffer> buffers{
            {&contribution, &result, v.data(), v.data(), count, "w"}};
        comm::EncodedAllreduceOptions options;
        options.name = "test";
        options.transform = [inv](size_t, float* x, size_t n, size_t) {
          for (size_t i = 0; i < n; ++i)
            x[i] *= inv;
        };
        comm::hierarchical_encoded_allreduce(c, topo, buffers, options);
        auto all = comm::allgatherv(c, v.data(), 4 * count);
        for (const auto& other : all)
          if (other.size() != 4 * count || std::memcmp(other.data(), v.data(), 4 * count) != 0)
            throw std::runtime_error("ranks hold different results in round " +
                                     std::to_string(round));
        for (size_t i = 0; i < count; ++i) {
          sum[i] += v[i];
          worst = std::max(worst, static_cast<double>(std::fabs(v[i] - mean[i])));
        }
      }
      std::lock_guard<std::mutex> lock(m);
      last[static_cast<size_t>(c.rank())] = v;
      worst_round[static_cast<size_t>(c.rank())] = worst;
      running[static_cast<size_t>(c.rank())] = std::move(sum);
    });
    double converged = 0;
    for (size_t i = 0; i < count; ++i)
      converged = std::max(converged, std::fabs(running[0][i] / rounds - mean[i]));
    EXPECT_LE(worst_round[0], one_round_tolerance) << "layout " << describe(hosts);
    EXPECT_LE(converged, converged_tolerance)
        << "layout " << describe(hosts) << ": the error is not fed back";
  }
}

// Tolerances: a block's step is its largest magnitude (up to 1000) over the largest code (127 at 8
// bits, 7 at 4); a round's average carries a few steps, its mean over 24 rounds a sixteenth of one
// (measured: 0.12-0.19 at 8 bits, 2.1-3.8 at 4; with a shard's residual kept at the wrong elements
// 1.1-1.7 and 19-28, with none the error of one round).
TEST(HierarchicalEncoded, EightBitsWithErrorFeedback) {
  check_quantized(8, 4 * 1000.0f / 127, 1000.0f / 127 / 16);
}

TEST(HierarchicalEncoded, FourBitsWithErrorFeedback) {
  check_quantized(4, 4 * 1000.0f / 7, 1000.0f / 7 / 16);
}

TEST(HierarchicalEncoded, RefusedPiecesFailEveryRank) {
  const std::vector<std::string> hosts = {"a", "a", "b", "b"};
  const comm::HostTopology topo = comm::host_topology(hosts, 4);
  const std::vector<std::string> errors = rank_errors(4, [&](Communicator& c) {
    call_refusing([&](auto& buffers, auto& options) {
      comm::hierarchical_encoded_allreduce(c, topo, buffers, options);
    });
  });
  int refused = 0;
  for (size_t q = 0; q < errors.size(); ++q) {
    EXPECT_FALSE(errors[q].empty()) << "rank " << q << " did not fail";
    if (errors[q].find("tensor 'w': refused") != std::string::npos) {
      ++refused;
      EXPECT_NE(errors[q].find("test inside the host from rank "), std::string::npos) << errors[q];
    }
  }
  // Every rank owns a shard, so every rank receives pieces inside its host and refuses one.
  EXPECT_EQ(refused, 4);
}

TEST(HierarchicalEncoded, BuffersOfDifferentSizesAreRefused) {
  const std::vector<std::string> hosts = {"a", "a", "b", "b"};
  const comm::HostTopology topo = comm::host_topology(hosts, 4);
  const std::vector<std::string> errors = rank_errors(4, [&](Communicator& c) {
    outer::Fp32Codec codec(8);
    const size_t count = c.rank() == 1 ? 1024 : 1000;
    std::vector<float> v(count, 1.0f);
    std::vector<comm::EncodedBuffer> buffers{{&codec, &codec, v.data(), v.data(), count, "w"}};
    comm::EncodedAllreduceOptions options;
    options.name = "test";
    comm::hierarchical_encoded_allreduce(c, topo, buffers, options);
  });
  bool named = false;
  for (size_t q = 0; q < errors.size(); ++q) {
    EXPECT_FALSE(errors[q].empty()) << "rank " << q << " did not fail";
    if (errors[q].find("disagree on the buffers' sizes") != std::string::npos) named = true;
  }
  EXPECT_TRUE(named) << "no rank named the size mismatch";
}

}  // namespace
}  // namespace gradex::test
