// DgcCompressor checkpoints: a restored compressor continues bit for bit; mismatches and damage
// are rejected with the right error.
#include <gtest/gtest.h>

#include "compress/compress.h"
#include "test_util.h"

namespace gradex::compress {
namespace {

TEST(DgcState, RestoredCompressorContinuesIdentically) {
  DgcOptions o;
  o.warmup_steps = 6;
  DgcCompressor a(20000, o);
  for (int s = 0; s < 5; ++s)
    a.step(test::random_grad(20000, s).data());
  std::vector<uint8_t> blob = a.save_state();
  DgcCompressor b(20000, o);
  b.load_state(blob.data(), blob.size());
  EXPECT_EQ(b.steps_done(), 5u);
  for (int s = 5; s < 10; ++s) {
    auto g = test::random_grad(20000, s);
    Selection sa = a.step(g.data());
    const Selection& sb = b.step(g.data());
    ASSERT_EQ(sa.indices, sb.indices);
    ASSERT_EQ(sa.values, sb.values);
    ASSERT_EQ(sa.sparsity, sb.sparsity);
  }
}

TEST(DgcState, MismatchesAreStateErrorsAndDamageIsCorrupt) {
  DgcOptions o;
  DgcCompressor a(1000, o);
  a.step(test::random_grad(1000, 1).data());
  std::vector<uint8_t> blob = a.save_state();

  DgcCompressor other_size(999, o);
  EXPECT_THROW(other_size.load_state(blob.data(), blob.size()), StateError);
  DgcOptions plain = o;
  plain.momentum = 0;
  DgcCompressor no_momentum(1000, plain);
  EXPECT_THROW(no_momentum.load_state(blob.data(), blob.size()), StateError);

  DgcCompressor b(1000, o);
  auto version = blob;
  version[4] = 9;
  EXPECT_THROW(b.load_state(version.data(), version.size()), StateError);
  auto flipped = blob;
  flipped[100] ^= 0x10;
  EXPECT_THROW(b.load_state(flipped.data(), flipped.size()), CorruptPayload);
  EXPECT_THROW(b.load_state(blob.data(), blob.size() - 1), CorruptPayload);
  EXPECT_THROW(b.load_state(blob.data(), 10), CorruptPayload);
  EXPECT_EQ(b.steps_done(), 0u);  // nothing was applied by the failed loads
}

TEST(DgcState, ResetRestartsTheSchedule) {
  DgcOptions o;
  o.warmup_steps = 4;
  DgcCompressor a(1000, o);
  a.step(test::random_grad(1000, 1).data());
  a.step(test::random_grad(1000, 2).data());
  a.reset();
  EXPECT_EQ(a.steps_done(), 0u);
  EXPECT_EQ(a.sparsity(), 0.75);
  for (size_t i = 0; i < 1000; ++i)
    ASSERT_EQ(a.residual()[i], 0.0f);
}

}  // namespace
}  // namespace gradex::compress
