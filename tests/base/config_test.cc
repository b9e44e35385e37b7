#include "base/config.h"

#include <gtest/gtest.h>

#include "base/error.h"

using gradex::ConfigError;
using gradex::config::Config;
using gradex::config::Source;

namespace {

std::string error_of(const std::vector<std::string>& env) {
  try {
    Config::from_strings(env, Source::kEnvironment);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(Config, DefaultsMatchDeclarations) {
  Config c;
  EXPECT_DOUBLE_EQ(c.get_float("GRADEX_SPARSITY"), 0.999);
  EXPECT_EQ(c.get_int("GRADEX_DENSE_THRESHOLD"), 16384);
  EXPECT_TRUE(c.get_bool("GRADEX_FP16"));
  EXPECT_DOUBLE_EQ(c.get_float("GRADEX_TIMEOUT_S"), 300);
  EXPECT_EQ(c.get_string("GRADEX_HALF_TYPE"), "fp16");
  EXPECT_EQ(c.source_of("GRADEX_SPARSITY"), Source::kDefault);
}

TEST(Config, EnvironmentValuesAreParsed) {
  Config c = Config::from_strings(
      {"GRADEX_SPARSITY=0.99", "GRADEX_FP16=off", "GRADEX_HALF_TYPE=BF16", "PATH=/bin"},
      Source::kEnvironment);
  EXPECT_DOUBLE_EQ(c.get_float("GRADEX_SPARSITY"), 0.99);
  EXPECT_FALSE(c.get_bool("GRADEX_FP16"));
  EXPECT_EQ(c.get_string("GRADEX_HALF_TYPE"), "bf16");
  EXPECT_EQ(c.source_of("GRADEX_SPARSITY"), Source::kEnvironment);
}

TEST(Config, InvalidValuesNameTheVariableAndRange) {
  std::string e = error_of({"GRADEX_SPARSITY=abc"});
  EXPECT_NE(e.find("GRADEX_SPARSITY"), std::string::npos) << e;
  EXPECT_NE(e.find("[0, 1)"), std::string::npos) << e;
  e = error_of({"GRADEX_SPARSITY=1.5"});
  EXPECT_NE(e.find("GRADEX_SPARSITY='1.5'"), std::string::npos) << e;
  EXPECT_NE(e.find("out of range"), std::string::npos) << e;
  EXPECT_NE(error_of({"GRADEX_SPARSITY=1"}).find("[0, 1)"), std::string::npos);
  EXPECT_NE(error_of({"GRADEX_DENSE_THRESHOLD=12.5"}).find("not an integer"), std::string::npos);
  EXPECT_NE(error_of({"GRADEX_DENSE_THRESHOLD=-1"}).find("GRADEX_DENSE_THRESHOLD"),
            std::string::npos);
  EXPECT_NE(error_of({"GRADEX_FP16=maybe"}).find("not a boolean"), std::string::npos);
  EXPECT_NE(error_of({"GRADEX_HALF_TYPE=fp8"}).find("one of fp16|bf16"), std::string::npos);
  EXPECT_NE(error_of({"GRADEX_TIMEOUT_S=0"}).find("(0, 86400]"), std::string::npos);
  EXPECT_NE(error_of({"GRADEX_ZSTD_LEVEL=nan"}).find("GRADEX_ZSTD_LEVEL"), std::string::npos);
  EXPECT_NE(error_of({"GRADEX_MOMENTUM="}).find("empty"), std::string::npos);
}

TEST(Config, UnknownNamesAreCollectedNotFatal) {
  Config c = Config::from_strings({"GRADEX_SPARSTY=0.9", "GRADEX_FP16=0"}, Source::kEnvironment);
  ASSERT_EQ(c.unknown_names().size(), 1u);
  EXPECT_EQ(c.unknown_names()[0], "GRADEX_SPARSTY");
  EXPECT_FALSE(c.get_bool("GRADEX_FP16"));
  EXPECT_NE(c.describe().find("GRADEX_SPARSTY"), std::string::npos);
}

// The Python package's own variable (where it loads libgradex.so from) is declared like every
// other, so that the engine does not warn that a user's GRADEX_LIBRARY is unknown.
TEST(Config, ThePackagesLibraryPathIsAKnownVariable) {
  Config c = Config::from_strings({"GRADEX_LIBRARY=/opt/gradex-debug/libgradex.so"},
                                  Source::kEnvironment);
  EXPECT_TRUE(c.unknown_names().empty());
  EXPECT_EQ(c.get_string("GRADEX_LIBRARY"), "/opt/gradex-debug/libgradex.so");
}

TEST(Config, ApiOverridesEnvironment) {
  Config c = Config::from_strings({"GRADEX_SPARSITY=0.99"}, Source::kEnvironment);
  c.set("GRADEX_SPARSITY", "0.9");
  EXPECT_DOUBLE_EQ(c.get_float("GRADEX_SPARSITY"), 0.9);
  EXPECT_EQ(c.source_of("GRADEX_SPARSITY"), Source::kApi);
  EXPECT_THROW(c.set("GRADEX_NOPE", "1"), ConfigError);
  EXPECT_THROW(c.set("GRADEX_SPARSITY", "2"), ConfigError);
  // A rejected value leaves the previous one in place.
  EXPECT_DOUBLE_EQ(c.get_float("GRADEX_SPARSITY"), 0.9);
}

TEST(Config, DescribeListsEveryVariableWithHelp) {
  Config c;
  std::string d = c.describe();
  for (const auto& s : gradex::config::registry()) {
    EXPECT_NE(d.find(s.name), std::string::npos) << s.name;
    EXPECT_NE(d.find(s.help), std::string::npos) << s.name;
  }
}

TEST(Config, StrictScalarParsers) {
  using namespace gradex::config;
  EXPECT_EQ(parse_int_strict(" 42 ", "X"), 42);
  EXPECT_THROW(parse_int_strict("42x", "X"), ConfigError);
  EXPECT_THROW(parse_int_strict("99999999999999999999999", "X"), ConfigError);
  EXPECT_DOUBLE_EQ(parse_float_strict("1e-3", "X"), 1e-3);
  EXPECT_THROW(parse_float_strict("", "X"), ConfigError);
  EXPECT_TRUE(parse_bool_strict("Yes", "X"));
}
