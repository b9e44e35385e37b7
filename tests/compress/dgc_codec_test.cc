// compress/backend/dgc_codec.h on the CPU backend and compress/wire/message.h: the codec's sparse
// step is DgcCompressor's step and wire::encode, bit for bit, and leaves the gradient all zeros;
// its sum of every rank's payloads (validated, then added in wire type, in pieces on the pool) is
// decode + accumulate in rank order, bit for bit; a payload of another tensor is refused naming the
// tensor and the rank; the message framing round-trips and refuses damaged messages.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "base/error.h"
#include "compress/backend/cpu_backend.h"
#include "compress/backend/dgc_codec.h"
#include "compress/dgc/compressor.h"
#include "compress/wire/codec.h"
#include "compress/wire/message.h"
#include "tests/compress/test_util.h"

namespace gradex::compress {
namespace {

DgcOptions options() {
  DgcOptions o;
  o.sparsity = 0.99;
  o.momentum = 0.9;
  return o;
}

TEST(DgcCodec, CpuStepAndSumAreTheCompressorsAndDecodeAccumulate) {
  const size_t n = 600000, ranks = 3;  // large enough for the pool's parallel passes
  backend::BackendPtr cpu = backend::make_cpu_backend();
  backend::StreamPtr stream = cpu->create_stream();
  WireOptions wire;
  std::vector<std::unique_ptr<backend::DgcCodec>> codecs;
  std::vector<std::unique_ptr<DgcCompressor>> reference;
  for (size_t r = 0; r < ranks; ++r) {
    codecs.push_back(std::make_unique<backend::DgcCodec>(*cpu, "w", n, options(), wire));
    reference.push_back(std::make_unique<DgcCompressor>(n, options()));
  }
  for (int step = 0; step < 3; ++step) {
    std::vector<std::vector<uint8_t>> payloads(ranks), want_payloads(ranks);
    std::vector<float> out;
    for (size_t r = 0; r < ranks; ++r) {
      std::vector<float> g = test::random_grad(n, 100 * step + r);
      want_payloads[r] =
          wire::encode(reference[r]->step(g.data(), 0.5f), backend::tensor_key_id("w"), wire);
      codecs[r]->encode_step(g.data(), 0.5f, *stream, payloads[r]);
      ASSERT_EQ(payloads[r], want_payloads[r]) << "rank " << r << " step " << step;
      for (float x : g)
        ASSERT_EQ(x, 0.0f) << "the step leaves the gradient all zeros";
      if (r == 0) out = g;
    }
    std::vector<wire::PayloadSpan> spans;
    for (const auto& p : payloads)
      spans.push_back({p.data(), p.size()});
    codecs[0]->sum_payloads(spans, 1.0f / 3, out.data(), *stream);
    std::vector<float> want(n, 0.0f);
    for (const auto& p : payloads)
      wire::accumulate(wire::decode(p.data(), p.size()), want.data(), n, 1.0f / 3);
    ASSERT_EQ(std::memcmp(out.data(), want.data(), n * 4), 0) << "step " << step;
  }
  EXPECT_EQ(codecs[0]->staged_bytes(), 0u);
}

TEST(DgcCodec, DenseStepIsTheCompressors) {
  const size_t n = 5000;
  backend::BackendPtr cpu = backend::make_cpu_backend();
  backend::StreamPtr stream = cpu->create_stream();
  backend::DgcCodec codec(*cpu, "w", n, options(), WireOptions());
  DgcCompressor reference(n, options());
  std::vector<float> g = test::random_grad(n, 7), want(n);
  reference.step_dense(g.data(), want.data(), 1.0f);
  codec.dense_step(g.data(), 1.0f, *stream);
  EXPECT_EQ(std::memcmp(g.data(), want.data(), n * 4), 0);
}

TEST(DgcCodec, PayloadOfAnotherTensorNamesTensorAndRank) {
  const size_t n = 20000;
  backend::BackendPtr cpu = backend::make_cpu_backend();
  backend::StreamPtr stream = cpu->create_stream();
  backend::DgcCodec mine(*cpu, "weights", n, options(), WireOptions());
  backend::DgcCodec other(*cpu, "other", n, options(), WireOptions());
  std::vector<uint8_t> a, b;
  std::vector<float> g0 = test::random_grad(n, 1), g1 = test::random_grad(n, 2);
  mine.encode_step(g0.data(), 1.0f, *stream, a);
  other.encode_step(g1.data(), 1.0f, *stream, b);
  try {
    mine.sum_payloads({{a.data(), a.size()}, {b.data(), b.size()}}, 0.5f, g0.data(), *stream);
    FAIL() << "a payload of another key was accepted";
  } catch (const CorruptPayload& e) {
    EXPECT_NE(std::string(e.what()).find("tensor 'weights' from rank 1: payload for tensor"),
              std::string::npos)
        << e.what();
  }
}

TEST(WireMessage, FramesRoundTripAndDamageIsRefused) {
  std::vector<uint8_t> m;
  const std::vector<std::vector<uint8_t>> parts = {{1, 2, 3}, {}, {9, 8, 7, 6, 5}};
  wire::begin_message(m, static_cast<uint32_t>(parts.size()));
  for (const auto& p : parts) {
    const size_t at = wire::begin_payload(m);
    m.insert(m.end(), p.begin(), p.end());
    wire::end_payload(m, at);
  }
  EXPECT_EQ(wire::message_count(m.data(), m.size(), "msg"), 3u);
  std::vector<wire::PayloadSpan> spans;
  wire::split_message(m.data(), m.size(), 3, "msg", spans);
  ASSERT_EQ(spans.size(), 3u);
  for (size_t i = 0; i < parts.size(); ++i)
    EXPECT_EQ(std::vector<uint8_t>(spans[i].first, spans[i].first + spans[i].second), parts[i]);
  auto refused = [&](const std::vector<uint8_t>& msg, size_t expected, const std::string& what) {
    try {
      wire::split_message(msg.data(), msg.size(), expected, "msg", spans);
    } catch (const CorruptPayload& e) {
      return std::string(e.what()).find(what) != std::string::npos;
    }
    return false;
  };
  EXPECT_TRUE(refused(m, 2, "holds 3 payload(s), expected 2"));
  EXPECT_TRUE(refused(std::vector<uint8_t>(m.begin(), m.end() - 1), 3, "msg is truncated"));
  std::vector<uint8_t> longer = m;
  longer.push_back(0);
  EXPECT_TRUE(refused(longer, 3, "1 unexpected trailing bytes"));
  EXPECT_TRUE(refused({1, 0}, 1, "truncated"));
}

}  // namespace
}  // namespace gradex::compress
