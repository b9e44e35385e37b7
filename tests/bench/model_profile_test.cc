#include "bench/model_profile.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>

#include "base/error.h"

namespace gradex::bench {
namespace {

TEST(ModelProfile, BuiltinTotalsMatchTheRealArchitectures) {
  ModelProfile resnet = load_model_profile("resnet50");
  EXPECT_EQ(resnet.total_numel, 25557032);
  EXPECT_EQ(resnet.tensors.size(), 161u);
  EXPECT_EQ(resnet.tensors.front().name, "conv1.weight");
  EXPECT_EQ(resnet.tensors.back().name, "fc.bias");
  EXPECT_EQ(resnet.tensors[resnet.largest_tensor()].name, "layer4.0.conv2.weight");  // 512x512x3x3

  ModelProfile bert = load_model_profile("bert_base");
  EXPECT_EQ(bert.total_numel, 109482240);
  EXPECT_EQ(bert.tensors.front().name, "embeddings.word_embeddings.weight");
  EXPECT_EQ(bert.tensors.back().name, "pooler.dense.bias");

  ModelProfile gpt2 = load_model_profile("gpt2_small");
  EXPECT_EQ(gpt2.total_numel, 124439808);
  EXPECT_EQ(gpt2.tensors.front().name, "wte.weight");
  EXPECT_EQ(gpt2.tensors.front().shape, (std::vector<int64_t>{50257, 768}));
}

TEST(ModelProfile, BuiltinNamesAreSorted) {
  EXPECT_EQ(builtin_model_names(),
            (std::vector<std::string>{"bert_base", "gpt2_small", "resnet50"}));
}

TEST(ModelProfile, ParsesCommentsBlankLinesAndShapes) {
  ModelProfile p =
      parse_model_profile("# header\n\na.weight 4 3 2  # trailing\nb 7\n", "t.txt", "t");
  ASSERT_EQ(p.tensors.size(), 2u);
  EXPECT_EQ(p.tensors[0].shape, (std::vector<int64_t>{4, 3, 2}));
  EXPECT_EQ(p.tensors[0].numel, 24);
  EXPECT_EQ(p.tensors[1].numel, 7);
  EXPECT_EQ(p.total_numel, 31);
  EXPECT_EQ(p.largest_tensor(), 0u);
}

void expect_error(const std::string& text, const std::string& where, const std::string& what) {
  try {
    parse_model_profile(text, "m.txt", "m");
    FAIL() << "no error for: " << text;
  } catch (const InvalidArgument& e) {
    std::string message = e.what();
    EXPECT_EQ(message.rfind(where, 0), 0u) << message;
    EXPECT_NE(message.find(what), std::string::npos) << message;
  }
}

TEST(ModelProfile, MalformedLinesNameFileAndLine) {
  expect_error("a 1\nb\n", "m.txt:2:", "no dimensions");
  expect_error("a 1\n\nb 3 x\n", "m.txt:3:", "'x' is not a positive integer");
  expect_error("a 0\n", "m.txt:1:", "'0'");
  expect_error("a -4\n", "m.txt:1:", "'-4'");
  expect_error("a 07\n", "m.txt:1:", "'07'");
  expect_error("a 2\nb 2\na 3\n", "m.txt:3:", "appears twice");
  expect_error("a 4294967296 4294967296\n", "m.txt:1:", "2^53");
  expect_error("# nothing\n", "m.txt:1:", "no tensors");
}

TEST(ModelProfile, LoadsAFileAndRejectsUnknownNames) {
  std::string path = ::testing::TempDir() + "/gradex_profile_test.txt";
  {
    std::ofstream out(path);
    out << "w 5 5\nb 5\n";
  }
  ModelProfile p = load_model_profile(path);
  EXPECT_EQ(p.total_numel, 30);
  EXPECT_EQ(p.name, path);
  std::remove(path.c_str());
  EXPECT_THROW(load_model_profile(path), InvalidArgument);
  try {
    load_model_profile("resnet51");
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("resnet50"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace gradex::bench
