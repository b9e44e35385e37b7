// Every element-wise operation of every backend this build has, against compress/'s CPU code
// (half::, wire::accumulate, plain copies): bit-identical results and counts, including odd and
// zero sizes and NaN/Inf inputs. Memory, streams and events, and the argument checks, too.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "backend_util.h"
#include "base/error.h"
#include "base/half.h"
#include "compress/backend/backend.h"
#include "compress/half/cast.h"
#include "compress/wire/codec.h"
#include "test_util.h"

namespace gradex::compress {
namespace {

using backend::DeviceType;
using test::Device;

// Random bit patterns (every class: NaN, Inf, subnormals, huge) plus the saturation edges.
std::vector<float> wild_floats(size_t n, uint64_t seed) {
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::vector<float> x(n);
  for (auto& f : x)
    f = bits_float(rng());
  const float edges[] = {65504.0f,
                         65520.0f,
                         -65519.0f,
                         3.4e38f,
                         -3.39e38f,
                         0.0f,
                         -0.0f,
                         std::numeric_limits<float>::infinity(),
                         std::numeric_limits<float>::quiet_NaN(),
                         5.96e-8f,
                         1e-45f};
  for (size_t i = 0; i < std::size(edges) && i < n; ++i)
    x[i] = edges[i];
  return x;
}

class BackendOps : public ::testing::TestWithParam<DeviceType> {
 protected:
  backend::BackendPtr b = backend::get_backend(GetParam());
  Device dev{*b};
};

TEST_P(BackendOps, CastsToHalfMatchTheCpuCastBitForBit) {
  for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{4099}, size_t{100003}}) {
    std::vector<float> x = wild_floats(n, n);
    for (DType t : {DType::kFloat16, DType::kBFloat16}) {
      for (float scale : {1.0f, 0.25f, 1.0f / 3.0f}) {
        std::vector<uint16_t> want(n);
        half::CastStats ws = half::to_half(x.data(), want.data(), n, t, scale);
        auto in = dev.upload(x);
        auto out = b->allocate(n * 2);
        backend::CastCounts got =
            b->to_half(in->as<float>(), out->as<uint16_t>(), n, t, scale, *dev.stream);
        EXPECT_EQ(got.saturated, ws.saturated) << n << " " << dtype_name(t);
        EXPECT_EQ(got.nonfinite, ws.nonfinite) << n << " " << dtype_name(t);
        std::vector<uint16_t> bits = dev.download(out->as<uint16_t>(), n);
        for (size_t i = 0; i < n; ++i) {
          const float xi = x[i] * scale;
          if (xi != xi) {  // NaN payload bits may differ; NaN must stay NaN
            const float back =
                t == DType::kFloat16 ? half_to_float(bits[i]) : bf16_to_float(bits[i]);
            ASSERT_TRUE(std::isnan(back)) << i;
            continue;
          }
          ASSERT_EQ(bits[i], want[i]) << "element " << i << " value " << xi;
        }
      }
    }
  }
}

TEST_P(BackendOps, FromHalfAndAddFromHalfMatchBitForBit) {
  std::vector<uint16_t> h(65536);
  for (size_t i = 0; i < h.size(); ++i)
    h[i] = static_cast<uint16_t>(i);
  const std::vector<float> base = test::random_grad(h.size(), 3);
  for (DType t : {DType::kFloat16, DType::kBFloat16}) {
    for (bool add : {false, true}) {
      std::vector<float> want = base;
      if (add)
        half::add_from_half(h.data(), want.data(), h.size(), t, 0.125f);
      else
        half::from_half(h.data(), want.data(), h.size(), t, 0.125f);
      auto in = dev.upload(h);
      auto out = dev.upload(base);
      b->from_half(in->as<uint16_t>(), out->as<float>(), h.size(), t, 0.125f, add, *dev.stream);
      std::vector<float> got = dev.download(out->as<float>(), h.size());
      for (size_t i = 0; i < h.size(); ++i) {
        if (std::isnan(want[i])) {
          ASSERT_TRUE(std::isnan(got[i])) << i;
          continue;
        }
        ASSERT_TRUE(test::same_bits(got[i], want[i])) << i << " " << got[i] << " " << want[i];
      }
    }
  }
}

TEST_P(BackendOps, CountsNonFiniteElements) {
  std::vector<float> x = test::random_grad(100001, 9);
  EXPECT_EQ(b->count_nonfinite(dev.upload(x)->as<float>(), x.size(), *dev.stream), 0u);
  x[0] = std::numeric_limits<float>::infinity();
  x[500] = -std::numeric_limits<float>::infinity();
  x[100000] = std::numeric_limits<float>::quiet_NaN();
  x[77] = bits_float(0x7f800001u);  // signalling NaN
  EXPECT_EQ(b->count_nonfinite(dev.upload(x)->as<float>(), x.size(), *dev.stream), 4u);
  EXPECT_EQ(b->count_nonfinite(nullptr, 0, *dev.stream), 0u);
}

TEST_P(BackendOps, SumOfSquaresAgreesToRoundingAndFlagsNonFinite) {
  for (size_t n : {size_t{0}, size_t{1}, size_t{4099}, size_t{1000003}}) {
    std::vector<float> x = test::random_grad(n, 31 + n, 3.0f);
    double want = 0;
    for (float f : x)
      want += double(f) * double(f);
    const double got = b->sum_squares(dev.upload(x)->as<float>(), n, *dev.stream);
    EXPECT_NEAR(got, want, 1e-6 * want) << n;
    if (n > 0) {
      x[n / 2] = std::numeric_limits<float>::infinity();
      EXPECT_FALSE(std::isfinite(b->sum_squares(dev.upload(x)->as<float>(), n, *dev.stream)));
      x[n / 2] = std::numeric_limits<float>::quiet_NaN();
      EXPECT_TRUE(std::isnan(b->sum_squares(dev.upload(x)->as<float>(), n, *dev.stream)));
    }
  }
}

TEST_P(BackendOps, ZeroesNonFiniteElementsOnly) {
  std::vector<float> x = wild_floats(50001, 12);
  std::vector<float> want = x;
  for (float& f : want)
    if (!std::isfinite(f)) f = 0.0f;
  auto d = dev.upload(x);
  b->zero_nonfinite(d->as<float>(), x.size(), *dev.stream);
  std::vector<float> got = dev.download(d->as<float>(), x.size());
  ASSERT_EQ(0, std::memcmp(got.data(), want.data(), x.size() * 4));
  EXPECT_EQ(b->count_nonfinite(d->as<float>(), x.size(), *dev.stream), 0u);
}

// The engine's momentum outside DGC (sync/momentum.cc), recomputed here in its operation order.
TEST_P(BackendOps, ApplyMomentumMatchesTheEngineArithmetic) {
  const size_t n = 70001;
  for (float m : {0.0f, 0.9f}) {
    for (bool nesterov : {false, true}) {
      for (float s : {1.0f, 0.37f}) {
        std::vector<float> g = test::random_grad(n, 21), u = test::random_grad(n, 22, 0.5f);
        std::vector<float> wg = g, wu = u;
        for (size_t i = 0; i < n; ++i) {
          if (m == 0.0f) {
            wg[i] = s == 1.0f ? g[i] : g[i] * s;
            continue;
          }
          const float gi = g[i] * s;
          const float ui = m * u[i] + gi;
          wu[i] = ui;
          wg[i] = nesterov ? gi + m * ui : ui;
        }
        auto dg = dev.upload(g);
        auto du = dev.upload(u);
        b->apply_momentum(dg->as<float>(), du->as<float>(), n, m, nesterov, s, *dev.stream);
        std::vector<float> gg = dev.download(dg->as<float>(), n);
        std::vector<float> gu = dev.download(du->as<float>(), n);
        ASSERT_EQ(0, std::memcmp(gg.data(), wg.data(), n * 4)) << m << nesterov << s;
        ASSERT_EQ(0, std::memcmp(gu.data(), wu.data(), n * 4)) << m << nesterov << s;
      }
    }
  }
  auto g = b->allocate(16);
  EXPECT_THROW(b->apply_momentum(g->as<float>(), nullptr, 4, 0.9f, false, 1, *dev.stream),
               InvalidArgument);
  EXPECT_THROW(b->apply_momentum(g->as<float>(), g->as<float>(), 4, 1.5f, false, 1, *dev.stream),
               InvalidArgument);
  b->apply_momentum(g->as<float>(), nullptr, 4, 0.0f, false, 2.0f, *dev.stream);  // m = 0: no u
}

TEST_P(BackendOps, GatherAndScatterMoveEveryTensorExactly) {
  const std::vector<size_t> sizes = {1, 0, 7, 4099, 65, 100003, 3};
  std::vector<std::vector<float>> host;
  std::vector<backend::BufferPtr> bufs;
  std::vector<backend::FusionEntry> entries;
  size_t offset = 5;  // a gap before the first tensor and between tensors: left untouched
  for (size_t i = 0; i < sizes.size(); ++i) {
    host.push_back(test::random_grad(sizes[i], 100 + i));
    host.back().resize(sizes[i]);
    if (sizes[i] > 0) host.back()[0] = std::numeric_limits<float>::quiet_NaN();
    bufs.push_back(dev.upload(host.back()));
    entries.push_back({bufs.back()->as<float>(), sizes[i], offset});
    offset += sizes[i] + (i % 2);
  }
  std::vector<float> fill(offset, -1.0f);
  auto bucket = dev.upload(fill);
  b->gather(entries.data(), entries.size(), bucket->as<float>(), *dev.stream);
  std::vector<float> got = dev.download(bucket->as<float>(), offset);
  std::vector<float> want = fill;
  for (size_t i = 0; i < sizes.size(); ++i)
    std::copy(host[i].begin(), host[i].end(), want.begin() + entries[i].offset);
  ASSERT_EQ(0, std::memcmp(got.data(), want.data(), offset * 4));

  // Scatter a different bucket back: every tensor receives exactly its span.
  std::vector<float> back = test::random_grad(offset, 77);
  auto bucket2 = dev.upload(back);
  b->scatter(bucket2->as<float>(), entries.data(), entries.size(), *dev.stream);
  for (size_t i = 0; i < sizes.size(); ++i) {
    std::vector<float> t = dev.download(entries[i].data, sizes[i]);
    ASSERT_EQ(0, std::memcmp(t.data(), back.data() + entries[i].offset, sizes[i] * 4)) << i;
  }
}

TEST_P(BackendOps, FusionRejectsOverlappingEntries) {
  auto a = b->allocate(64 * 4);
  auto bucket = b->allocate(128 * 4);
  backend::FusionEntry e[2] = {{a->as<float>(), 64, 0}, {a->as<float>(), 64, 63}};
  EXPECT_THROW(b->gather(e, 2, bucket->as<float>(), *dev.stream), InvalidArgument);
  EXPECT_THROW(b->scatter(bucket->as<float>(), e, 2, *dev.stream), InvalidArgument);
  backend::FusionEntry null_data[1] = {{nullptr, 4, 0}};
  EXPECT_THROW(b->gather(null_data, 1, bucket->as<float>(), *dev.stream), InvalidArgument);
}

TEST_P(BackendOps, ScatterAddOfPayloadsInRankOrderMatchesWireAccumulate) {
  const size_t n = 250007;
  std::vector<float> want = test::random_grad(n, 1);
  auto out = dev.upload(want);
  for (int rank = 0; rank < 4; ++rank) {
    wire::DecodedPayload p;
    p.header.numel = n;
    p.indices = test::random_support(n, 1000 + 997 * rank, 40 + rank);
    p.values = test::random_grad(p.indices.size(), 60 + rank, 3.0f);
    if (rank == 2) p.values[5] = std::numeric_limits<float>::infinity();
    wire::accumulate(p, want.data(), n, 0.25f);
    auto idx = dev.upload(p.indices);
    auto val = dev.upload(p.values);
    b->scatter_add(idx->as<uint32_t>(), val->as<float>(), p.indices.size(), out->as<float>(), n,
                   0.25f, *dev.stream);
  }
  std::vector<float> got = dev.download(out->as<float>(), n);
  ASSERT_EQ(0, std::memcmp(got.data(), want.data(), n * 4));
  b->scatter_add(nullptr, nullptr, 0, out->as<float>(), n, 1.0f, *dev.stream);  // no-op
}

TEST_P(BackendOps, ArgumentErrorsNameTheOperation) {
  auto buf = b->allocate(16);
  try {
    b->to_half(buf->as<float>(), buf->as<uint16_t>(), 2, DType::kFloat32, 1.0f, *dev.stream);
    FAIL() << "fp32 accepted as a 16-bit type";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("to_half"), std::string::npos) << e.what();
  }
  EXPECT_THROW(b->from_half(nullptr, buf->as<float>(), 4, DType::kFloat16, 1, false, *dev.stream),
               InvalidArgument);
  EXPECT_THROW(b->create_dgc((uint64_t{1} << 32) + 1, DgcOptions{}), InvalidArgument);
  DgcOptions bad;
  bad.sparsity = 1.5;
  EXPECT_THROW(b->create_dgc(10, bad), InvalidArgument);
}

TEST_P(BackendOps, CopiesStreamsAndEventsOrderWork) {
  std::vector<float> x = test::random_grad(10007, 4);
  auto a = dev.upload(x);
  auto c = b->allocate(x.size() * 4);
  auto staging = b->allocate_staging(x.size() * 4);
  backend::StreamPtr other = b->create_stream();
  backend::EventPtr e = b->create_event();
  EXPECT_TRUE(e->ready());  // never recorded
  b->copy(c->data(), a->data(), x.size() * 4, *dev.stream);
  e->record(*dev.stream);
  other->wait(*e);  // `other` continues only after the copy
  b->copy(staging->data(), c->data(), x.size() * 4, *other);
  backend::EventPtr done = b->create_event();
  done->record(*other);
  done->synchronize();
  EXPECT_TRUE(done->ready());
  ASSERT_EQ(0, std::memcmp(staging->data(), x.data(), x.size() * 4));
  b->fill_zero(c->data(), x.size() * 4, *dev.stream);
  std::vector<float> z = dev.download(c->as<float>(), x.size());
  for (float f : z)
    ASSERT_TRUE(test::same_bits(f, 0.0f));
  EXPECT_EQ(b->allocate(0)->bytes(), 0u);
  b->copy(nullptr, nullptr, 0, *dev.stream);  // zero bytes: nothing to check
}

INSTANTIATE_TEST_SUITE_P(All, BackendOps, ::testing::ValuesIn(test::test_backends()),
                         test::backend_param_name);

}  // namespace
}  // namespace gradex::compress
