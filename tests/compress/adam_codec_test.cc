// compress/backend/adam_codec.h on the CPU backend (the engine test runs it on thrust-omp too):
// each step keeps the Adam codec's invariant exactly (sent + m_new == fl(b * m_old) + fl(s * g),
// sent only where m_new is 0), with b = 1 it is DGC's error feedback without momentum payload for
// payload, a checkpoint taken mid-run continues bit for bit in a fresh codec, its options are
// checked, and damaged or truncated payloads are refused naming the tensor and the rank.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "base/error.h"
#include "compress/backend/adam_codec.h"
#include "compress/backend/backend.h"
#include "compress/backend/cpu_backend.h"
#include "compress/wire/codec.h"
#include "tests/compress/damaged_payloads.h"
#include "tests/compress/test_util.h"

namespace gradex::compress {
namespace {

DgcOptions options() {
  DgcOptions o;
  o.sparsity = 0.99;
  o.momentum = 0;
  return o;
}

std::vector<float> residual(backend::AdamCodec& c) {
  const float* m = c.state().residual();  // host backends: host memory
  return std::vector<float>(m, m + c.state().numel());
}

TEST(AdamCodec, EveryStepKeepsTheDecayedBufferInvariant) {
  const size_t n = 300000;  // large enough for the pool's parallel passes
  const float decay = 0.9f, scale = 0.5f;
  {
    backend::BackendPtr be = backend::make_cpu_backend();
    backend::StreamPtr stream = be->create_stream();
    backend::AdamCodec codec(*be, "w", n, options(), WireOptions(), decay);
    for (int step = 0; step < 6; ++step) {
      const std::vector<float> m_old = residual(codec);
      std::vector<float> g = test::random_grad(n, 10 + step), g_in = g;
      std::vector<uint8_t> payload;
      codec.encode_step(g.data(), scale, *stream, payload);
      const std::vector<float> m_new = residual(codec);
      std::vector<float> sent(n, 0.0f);
      wire::accumulate(wire::decode(payload.data(), payload.size()), sent.data(), n, 1.0f);
      size_t count = 0;
      for (size_t i = 0; i < n; ++i) {
        const float want = decay * m_old[i] + scale * g_in[i];
        ASSERT_EQ(sent[i] + m_new[i], want) << "step " << step << " element " << i;
        if (sent[i] != 0.0f) {
          ++count;
          ASSERT_EQ(m_new[i], 0.0f) << "a sent element leaves the buffer";
        }
      }
      EXPECT_GE(count, n / 200) << "about 1% of the elements are sent";
      EXPECT_LE(count, n * 13 / 1000);
    }
  }
}

TEST(AdamCodec, DecayOneIsDgcErrorFeedbackPayloadForPayload) {
  const size_t n = 50000;
  backend::BackendPtr cpu = backend::make_cpu_backend();
  backend::StreamPtr stream = cpu->create_stream();
  backend::AdamCodec adam(*cpu, "w", n, options(), WireOptions(), 1.0f);
  backend::DgcCodec dgc(*cpu, "w", n, options(), WireOptions());
  for (int step = 0; step < 4; ++step) {
    std::vector<float> a = test::random_grad(n, step), b = a;
    std::vector<uint8_t> pa, pb;
    adam.encode_step(a.data(), 1.0f, *stream, pa);
    dgc.encode_step(b.data(), 1.0f, *stream, pb);
    ASSERT_EQ(pa, pb) << "step " << step;
  }
}

TEST(AdamCodec, DenseStepSendsTheDecayedBufferPlusGradientAndEmptiesIt) {
  const size_t n = 20000;
  const float decay = 0.8f;
  backend::BackendPtr cpu = backend::make_cpu_backend();
  backend::StreamPtr stream = cpu->create_stream();
  backend::AdamCodec codec(*cpu, "w", n, options(), WireOptions(), decay);
  std::vector<float> g = test::random_grad(n, 1);
  std::vector<uint8_t> payload;
  codec.encode_step(g.data(), 1.0f, *stream, payload);
  const std::vector<float> m = residual(codec);
  std::vector<float> g2 = test::random_grad(n, 2), want(n);
  for (size_t i = 0; i < n; ++i)
    want[i] = decay * m[i] + g2[i];
  codec.dense_step(g2.data(), 1.0f, *stream);
  EXPECT_EQ(std::memcmp(g2.data(), want.data(), n * 4), 0);
  for (float x : residual(codec))
    ASSERT_EQ(x, 0.0f);
}

TEST(AdamCodec, CheckpointMidRunContinuesBitForBit) {
  const size_t n = 80000;
  backend::BackendPtr cpu = backend::make_cpu_backend();
  backend::StreamPtr stream = cpu->create_stream();
  backend::AdamCodec running(*cpu, "w", n, options(), WireOptions(), 0.9f);
  std::vector<uint8_t> blob;
  for (int step = 0; step < 3; ++step) {
    std::vector<float> g = test::random_grad(n, step);
    std::vector<uint8_t> p;
    running.encode_step(g.data(), 1.0f, *stream, p);
  }
  blob = running.state().save_state(*cpu, *stream);
  backend::AdamCodec restored(*cpu, "w", n, options(), WireOptions(), 0.9f);
  restored.state().load_state(blob.data(), blob.size(), *cpu, *stream);
  EXPECT_EQ(restored.state().steps_done(), 3u);
  for (int step = 3; step < 6; ++step) {
    std::vector<float> a = test::random_grad(n, step), b = a;
    std::vector<uint8_t> pa, pb;
    running.encode_step(a.data(), 1.0f, *stream, pa);
    restored.encode_step(b.data(), 1.0f, *stream, pb);
    ASSERT_EQ(pa, pb) << "step " << step;
  }
  std::vector<uint8_t> truncated(blob.begin(), blob.begin() + blob.size() / 2);
  EXPECT_ANY_THROW(restored.state().load_state(truncated.data(), truncated.size(), *cpu, *stream));
}

TEST(AdamCodec, RefusesMomentumAndDecayOutOfRange) {
  backend::BackendPtr cpu = backend::make_cpu_backend();
  DgcOptions with_momentum = options();
  with_momentum.momentum = 0.9f;
  EXPECT_THROW(backend::AdamCodec(*cpu, "w", 1000, with_momentum, WireOptions(), 0.9f),
               InvalidArgument);
  EXPECT_THROW(backend::AdamCodec(*cpu, "w", 1000, options(), WireOptions(), 1.5f),
               InvalidArgument);
  EXPECT_THROW(backend::AdamCodec(*cpu, "w", 1000, options(), WireOptions(), -0.1f),
               InvalidArgument);
}

TEST(AdamCodec, DamagedOrTruncatedPayloadIsRefusedNamingTensorAndRank) {
  const size_t n = 40000;
  backend::BackendPtr cpu = backend::make_cpu_backend();
  backend::StreamPtr stream = cpu->create_stream();
  backend::AdamCodec r0(*cpu, "embed", n, options(), WireOptions(), 0.9f);
  backend::AdamCodec r1(*cpu, "embed", n, options(), WireOptions(), 0.9f);
  test::expect_damaged_payloads_refused(r0, r1, n, "embed", *stream);
}

}  // namespace
}  // namespace gradex::compress
