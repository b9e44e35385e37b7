// DgcOptions and WireOptions from the GRADEX_* registry.
#include <gtest/gtest.h>

#include <string>

#include "compress/compress.h"

namespace gradex::compress {
namespace {

TEST(CompressOptions, DefaultsFromTheRegistry) {
  config::Config c;
  DgcOptions o = dgc_options_from_config(c, 4);
  EXPECT_DOUBLE_EQ(o.sparsity, 0.999);
  EXPECT_FLOAT_EQ(o.momentum, 0.0f);  // gradex adds momentum only when asked (GRADEX_MOMENTUM)
  EXPECT_EQ(o.world_size, 4);
  EXPECT_EQ(o.value_dtype, DType::kFloat16);  // GRADEX_SPARSE_VALUES defaults to fp16
  WireOptions w = wire_options_from_config(c);
  EXPECT_EQ(std::string(index_coding_name(w.index_coding)), c.get_string("GRADEX_INDEX_CODING"));
  EXPECT_EQ(w.zstd_level, c.get_int("GRADEX_ZSTD_LEVEL"));
}

TEST(CompressOptions, ValuesFromStrings) {
  auto c = config::Config::from_strings(
      {"GRADEX_SPARSITY=0.99", "GRADEX_WARMUP_STEPS=100", "GRADEX_MOMENTUM=0", "GRADEX_NESTEROV=1",
       "GRADEX_CLIP_NORM=5", "GRADEX_SAMPLE_RATIO=0.05", "GRADEX_SPARSE_VALUES=bf16",
       "GRADEX_INDEX_CODING=rice", "GRADEX_ZSTD_LEVEL=3", "GRADEX_THREADS=2"},
      config::Source::kApi);
  DgcOptions o = dgc_options_from_config(c, 2);
  EXPECT_DOUBLE_EQ(o.sparsity, 0.99);
  EXPECT_EQ(o.warmup_steps, 100);
  EXPECT_EQ(o.momentum, 0.0f);
  EXPECT_TRUE(o.nesterov);
  EXPECT_FLOAT_EQ(o.clip_norm, 5.0f);
  EXPECT_DOUBLE_EQ(o.sample_ratio, 0.05);
  EXPECT_EQ(o.value_dtype, DType::kBFloat16);
  EXPECT_EQ(o.threads, 2);
  WireOptions w = wire_options_from_config(c);
  EXPECT_EQ(w.index_coding, IndexCoding::kRice);
  EXPECT_EQ(w.zstd_level, 3);
  EXPECT_THROW(dgc_options_from_config(c, 0), InvalidArgument);
}

}  // namespace
}  // namespace gradex::compress
