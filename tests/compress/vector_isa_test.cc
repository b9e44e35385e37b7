// The loops compiled for both the baseline ISA and AVX2 (base/vector_dispatch.h) compute the same
// bits in either form: the 8-bit and 4-bit block codecs' encode (bytes and residuals), decode and
// decode_add, and the CPU backend's momentum pass. Ranks on CPUs of either kind must agree, and the
// codecs' bytes must stay compress/quant's. On a CPU without AVX2 both runs take the baseline.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <vector>

#include "base/cpu_features.h"
#include "compress/backend/block_codec.h"
#include "compress/backend/cpu_backend.h"

namespace backend = gradex::compress::backend;

namespace {

// Gaussian values with the cases that take other paths mixed in: zeros (an all-zero block), a
// subnormal, a huge value, and (when `nonfinite`) a NaN and an Inf.
std::vector<float> inputs(size_t n, uint32_t seed, bool nonfinite) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v)
    x = d(rng);
  for (size_t i = 0; i < n && i < 256; ++i)
    v[i] = 0.0f;  // the first blocks all zero
  if (n > 300) v[300] = 1e-40f;
  if (n > 700) v[700] = 3e30f;
  if (nonfinite && n > 1000) v[1000] = std::numeric_limits<float>::quiet_NaN();
  if (nonfinite && n > 5000) v[n - 1] = std::numeric_limits<float>::infinity();
  return v;
}

// What a codec computes from the same inputs: the bytes, the residual after, the decode, and the
// decode added onto a nonzero accumulator.
struct Outputs {
  std::vector<uint8_t> bytes;
  std::vector<float> residual, decoded, accumulated;
  size_t nonfinite = 0;
};

Outputs run(const backend::BlockCodec& c, const std::vector<float>& g,
            const std::vector<float>& r0) {
  Outputs o;
  o.bytes.assign(c.encoded_size(g.size()), 0);
  o.residual = r0;
  o.nonfinite = c.encode(g.data(), o.residual.data(), g.size(), o.bytes.data());
  o.decoded.assign(g.size(), 0.0f);
  c.decode(o.bytes.data(), g.size(), o.decoded.data());
  o.accumulated = r0;
  c.decode_add(o.bytes.data(), g.size(), o.accumulated.data());
  return o;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

}  // namespace

TEST(VectorIsa, BlockCodecsComputeTheSameBitsInEitherForm) {
  for (int bits : {8, 4})
    for (size_t n : {size_t{1}, size_t{127}, size_t{128}, size_t{129}, size_t{1001}, size_t{70001}})
      for (bool nonfinite : {false, true}) {
        const std::vector<float> g = inputs(n, 7, nonfinite);
        const std::vector<float> r0 = inputs(n, 8, false);
        const backend::BlockCodec& c = backend::block_codec(bits);
        Outputs vector_form = run(c, g, r0), baseline;
        {
          gradex::BaselineIsaScope force;
          baseline = run(c, g, r0);
        }
        SCOPED_TRACE(std::to_string(bits) + "-bit, n=" + std::to_string(n));
        EXPECT_EQ(vector_form.bytes, baseline.bytes);
        EXPECT_TRUE(same_bits(vector_form.residual, baseline.residual));
        EXPECT_TRUE(same_bits(vector_form.decoded, baseline.decoded));
        EXPECT_TRUE(same_bits(vector_form.accumulated, baseline.accumulated));
        EXPECT_EQ(vector_form.nonfinite, baseline.nonfinite);
        EXPECT_EQ(vector_form.nonfinite, nonfinite ? size_t{n > 1000} + size_t{n > 5000} : 0u);
      }
}

TEST(VectorIsa, MomentumPassComputesTheSameBitsInEitherForm) {
  backend::BackendPtr b = backend::make_cpu_backend();
  backend::StreamPtr stream = b->create_stream();
  const size_t n = 70001;
  for (float m : {0.0f, 0.9f})
    for (bool nesterov : {false, true}) {
      std::vector<float> g[2], u[2];
      for (int form = 0; form < 2; ++form) {
        gradex::BaselineIsaScope force(form == 1);
        g[form] = inputs(n, 3, false);
        u[form] = inputs(n, 4, false);
        b->apply_momentum(g[form].data(), u[form].data(), n, m, nesterov, 0.37f, *stream);
        backend::EventPtr done = b->create_event();
        done->record(*stream);
        done->synchronize();
      }
      EXPECT_TRUE(same_bits(g[0], g[1])) << m << nesterov;
      EXPECT_TRUE(same_bits(u[0], u[1])) << m << nesterov;
    }
}
