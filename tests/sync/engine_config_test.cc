// Configuration errors surface at engine creation through the C API, naming the variable and range.
#include <gtest/gtest.h>

#include "process_ranks.h"
#include "rank_checks.h"

using namespace gradex::test;

namespace {

std::string create_error(const std::vector<std::string>& env) {
  std::string message;
  auto results = run_ranks(
      1, env,
      [&](RankContext& ctx) -> std::string {
        gradex_engine_t* engine = nullptr;
        std::string error;
        gradex_status_t s = create_engine(0, 1, &engine, &error);
        if (s == GRADEX_OK) {
          gradex_engine_destroy(engine);
          return "created";
        }
        RANK_REQUIRE(s == GRADEX_ERR_CONFIG, "status " << s << ": " << error);
        RANK_REQUIRE(engine == nullptr, "output written on failure");
        return "error:" + error;
      },
      std::chrono::seconds(60), /*create_engine=*/false);
  return results[0];
}

}  // namespace

TEST(EngineConfig, InvalidValuesFailCreationWithTheirRange) {
  std::string e = create_error({"GRADEX_SPARSITY=abc"});
  EXPECT_NE(e.find("GRADEX_SPARSITY='abc'"), std::string::npos) << e;
  EXPECT_NE(e.find("[0, 1)"), std::string::npos) << e;
  e = create_error({"GRADEX_SPARSITY=1.5"});
  EXPECT_NE(e.find("out of range"), std::string::npos) << e;
  e = create_error({"GRADEX_FUSION_MB=-3"});
  EXPECT_NE(e.find("GRADEX_FUSION_MB"), std::string::npos) << e;
  e = create_error({"GRADEX_SPARSITY_OVERRIDES=embed:2"});
  EXPECT_NE(e.find("GRADEX_SPARSITY_OVERRIDES entry 'embed:2'"), std::string::npos) << e;
  e = create_error({"GRADEX_SPARSITY_OVERRIDES=embed"});
  EXPECT_NE(e.find("no ':'"), std::string::npos) << e;
  e = create_error({"GRADEX_LOCALSGD_PERIOD=four"});
  EXPECT_NE(e.find("GRADEX_LOCALSGD_PERIOD"), std::string::npos) << e;
}

TEST(EngineConfig, ApiValuesOverrideTheEnvironment) {
  auto results = run_ranks(
      1, {"GRADEX_SPARSITY=abc"},
      [&](RankContext&) -> std::string {
        gradex_engine_options_t options;
        gradex_engine_options_init(&options);
        options.rank = 0;
        options.world_size = 1;
        const char* names[] = {"GRADEX_SPARSITY"};
        const char* values[] = {"0.99"};
        options.config_count = 1;
        options.config_names = names;
        options.config_values = values;
        gradex_engine_t* engine = nullptr;
        RANK_OK(gradex_engine_create(&options, &engine));
        size_t length = 0;
        RANK_OK(gradex_describe_config(engine, nullptr, 0, &length));
        std::string text(length, '\0');
        RANK_OK(gradex_describe_config(engine, text.data(), text.size(), &length));
        RANK_REQUIRE(text.find("GRADEX_SPARSITY=0.99    [api") != std::string::npos, text);
        RANK_OK(gradex_engine_destroy(engine));
        // A bad API value is a config error too.
        values[0] = "-1";
        RANK_REQUIRE(gradex_engine_create(&options, &engine) == GRADEX_ERR_CONFIG, "accepted -1");
        options.api_version = GRADEX_API_VERSION + 1;
        RANK_REQUIRE(gradex_engine_create(&options, &engine) == GRADEX_ERR_VERSION, "version");
        RANK_REQUIRE(std::string(gradex_last_error()).find("API version") != std::string::npos,
                     gradex_last_error());
        return "";
      },
      std::chrono::seconds(60), false);
  EXPECT_EQ(failures(results), "");
}

// gradex_check_config parses like gradex_engine_create, in process, without an engine: the
// environment overridden by the given pairs, cross-variable rules included; an unknown name given
// to it is an error naming the closest declared variable.
TEST(EngineConfig, CheckConfigValidatesWithoutAnEngine) {
  auto check = [](const std::vector<std::string>& env, std::vector<const char*> names,
                  std::vector<const char*> values) {
    auto results = run_ranks(
        1, env,
        [&](RankContext&) -> std::string {
          gradex_status_t s = gradex_check_config(names.size(), names.data(), values.data());
          return std::to_string(static_cast<int>(s)) + ":" + gradex_last_error();
        },
        std::chrono::seconds(60), /*create_engine=*/false);
    const std::string prefix = "rank 0: ";  // run_ranks' prefix of a non-empty result
    return results[0].rfind(prefix, 0) == 0 ? results[0].substr(prefix.size()) : results[0];
  };
  EXPECT_EQ(check({}, {"GRADEX_SPARSITY"}, {"0.99"}).substr(0, 2), "0:");
  EXPECT_EQ(check({}, {}, {}).substr(0, 2), "0:");
  std::string e = check({}, {"GRADEX_SPARSTY"}, {"0.99"});
  EXPECT_EQ(e.substr(0, 2), "2:") << e;
  EXPECT_NE(e.find("unknown configuration variable 'GRADEX_SPARSTY'"), std::string::npos) << e;
  EXPECT_NE(e.find("did you mean GRADEX_SPARSITY, a number in [0, 1)"), std::string::npos) << e;
  e = check({}, {"GRADEX_SPARSITY"}, {"1.5"});
  EXPECT_EQ(e.substr(0, 2), "2:") << e;
  EXPECT_NE(e.find("GRADEX_SPARSITY='1.5'"), std::string::npos) << e;
  EXPECT_NE(e.find("[0, 1)"), std::string::npos) << e;
  // The environment is checked; an API value replaces an invalid environment value.
  e = check({"GRADEX_FP16=maybe"}, {}, {});
  EXPECT_NE(e.find("GRADEX_FP16='maybe'"), std::string::npos) << e;
  EXPECT_EQ(check({"GRADEX_FP16=maybe"}, {"GRADEX_FP16"}, {"0"}).substr(0, 2), "0:");
  // Rules across variables, as at creation.
  e = check({}, {"GRADEX_SPARSITY_OVERRIDES"}, {"embed"});
  EXPECT_NE(e.find("no ':'"), std::string::npos) << e;
  e = check({}, {"GRADEX_OUTER_PERIOD", "GRADEX_OUTER_DELAY"}, {"4", "4"});
  EXPECT_EQ(e.substr(0, 2), "2:") << e;
  EXPECT_NE(e.find("GRADEX_OUTER_DELAY"), std::string::npos) << e;
  // NULL entries are an argument error.
  e = check({}, {nullptr}, {"1"});
  EXPECT_EQ(e.substr(0, 2), "1:") << e;
}
