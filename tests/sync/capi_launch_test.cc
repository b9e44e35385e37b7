// gradex_launch_info and gradex_store_connect through the C API, in forked ranks: the launcher's
// variables as the plugins see them, and one authenticated job store shared by two engines.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "gradex/gradex.h"
#include "process_ranks.h"

namespace gradex::test {
namespace {

// The C view of comm/rendezvous/launch.h (its parsing is tested in tests/comm/launch_test.cc):
// fields, the "not given" markers, and a size without a rank as GRADEX_ERR_CONFIG.
TEST(CapiLaunch, LaunchInfoFromTheEnvironment) {
  for (const char* v : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                        "MASTER_PORT", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "PMI_RANK",
                        "PMI_SIZE", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_JOB_ID"})
    ::unsetenv(v);
  gradex_launch_info_t info;
  ASSERT_EQ(gradex_launch_info(&info), GRADEX_OK) << gradex_last_error();
  EXPECT_EQ(std::string(info.launcher), "none");
  EXPECT_EQ(info.world_size, 1);
  EXPECT_EQ(info.local_rank, 0);
  EXPECT_EQ(info.local_size, 1);
  ::setenv("RANK", "1", 1);
  ::setenv("WORLD_SIZE", "3", 1);
  ::setenv("MASTER_ADDR", "10.0.0.7", 1);
  ::setenv("MASTER_PORT", "4321", 1);
  ASSERT_EQ(gradex_launch_info(&info), GRADEX_OK) << gradex_last_error();
  EXPECT_EQ(std::string(info.launcher), "torchrun");
  EXPECT_EQ(info.rank, 1);
  EXPECT_EQ(info.world_size, 3);
  EXPECT_EQ(info.local_rank, -1);  // not given
  EXPECT_EQ(info.local_size, -1);
  EXPECT_EQ(std::string(info.master_addr), "10.0.0.7");
  EXPECT_EQ(info.master_port, 4321);
  ::setenv("LOCAL_RANK", "0", 1);
  ::setenv("LOCAL_WORLD_SIZE", "2", 1);
  ASSERT_EQ(gradex_launch_info(&info), GRADEX_OK) << gradex_last_error();
  EXPECT_EQ(info.local_rank, 0);
  EXPECT_EQ(info.local_size, 2);
  ::unsetenv("RANK");
  EXPECT_EQ(gradex_launch_info(&info), GRADEX_ERR_CONFIG);
  EXPECT_NE(std::string(gradex_last_error()).find("WORLD_SIZE=3 is set but RANK is not"),
            std::string::npos)
      << gradex_last_error();
  EXPECT_EQ(gradex_launch_info(nullptr), GRADEX_ERR_INVALID_ARGUMENT);
  for (const char* v :
       {"WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"})
    ::unsetenv(v);
}

// Two engines bootstrap through one store (each under its own prefix) and average a tensor each.
std::string two_engines_one_store(RankContext& ctx) {
  gradex_engine_options_t options;
  gradex_engine_options_init(&options);
  options.rank = ctx.rank;
  options.world_size = ctx.world;
  gradex_store_t* store = nullptr;
  if (gradex_store_connect(&options, &store) != GRADEX_OK)
    return std::string("connect: ") + gradex_last_error();
  std::string error;
  std::vector<gradex_engine_t*> engines;
  const char* prefixes[] = {"first/", "second/"};
  for (const char* prefix : prefixes) {
    gradex_engine_options_t o = options;
    o.store = store;
    o.store_prefix = prefix;
    gradex_engine_t* e = nullptr;
    if (gradex_engine_create(&o, &e) != GRADEX_OK) {
      error = std::string("create: ") + gradex_last_error();
      break;
    }
    engines.push_back(e);
  }
  for (size_t i = 0; error.empty() && i < engines.size(); ++i) {
    std::vector<float> data(100, static_cast<float>(ctx.rank + 1 + i));
    gradex_handle_t h = 0;
    if (gradex_register_tensor(engines[i], "t", data.size(), GRADEX_FLOAT32, GRADEX_DEVICE_CPU) ||
        gradex_submit(engines[i], "t", data.data(), &h) || gradex_wait(engines[i], h)) {
      error = std::string("exchange: ") + gradex_last_error();
    } else if (data[0] != 1.5f + static_cast<float>(i)) {
      error = "average " + std::to_string(data[0]);
    }
  }
  for (gradex_engine_t* e : engines)
    gradex_engine_destroy(e);
  gradex_store_destroy(store);
  return error;
}

TEST(CapiLaunch, TwoEnginesShareOneAuthenticatedStore) {
  std::vector<std::string> env = {"GRADEX_JOB_SECRET=capi-secret", "GRADEX_SPARSITY=0",
                                  "GRADEX_FP16=0", "GRADEX_MOMENTUM=0", "GRADEX_TIMEOUT_S=30"};
  EXPECT_EQ(failures(run_ranks(2, env, two_engines_one_store, std::chrono::seconds(120), false)),
            "");
}

// A client with another secret is refused when it connects, naming the job secret.
std::string wrong_secret(RankContext& ctx) {
  gradex_engine_options_t options;
  gradex_engine_options_init(&options);
  options.rank = ctx.rank;
  options.world_size = ctx.world;
  const char* names[] = {"GRADEX_JOB_SECRET", "GRADEX_TIMEOUT_S"};
  const char* values[] = {ctx.rank == 0 ? "one-secret" : "another-secret", "10"};
  options.config_count = 2;
  options.config_names = names;
  options.config_values = values;
  gradex_store_t* store = nullptr;
  gradex_status_t status = gradex_store_connect(&options, &store);
  std::string message = gradex_last_error();
  if (ctx.rank == 0 && status == GRADEX_OK) {
    // Serve while rank 1 tries: a key nobody sets, waited for 3 s.
    void* value = nullptr;
    size_t length = 0;
    if (store->get(store->context, "never", 3000, &value, &length) == 0)
      return "rank 0 got a key nobody set";
  }
  gradex_store_destroy(store);
  if (ctx.rank == 0) return status == GRADEX_OK ? "" : "rank 0 (the server): " + message;
  if (status != GRADEX_ERR_CONFIG) return "status " + std::to_string(status) + ": " + message;
  if (message.find("job secret") == std::string::npos) return "message: " + message;
  return "";
}

TEST(CapiLaunch, AWrongSecretIsRefusedAtConnect) {
  EXPECT_EQ(failures(run_ranks(2, {}, wrong_secret, std::chrono::seconds(60), false)), "");
}

TEST(CapiLaunch, StoreConnectChecksItsArguments) {
  gradex_engine_options_t options;
  gradex_engine_options_init(&options);
  gradex_store_t* store = nullptr;
  EXPECT_EQ(gradex_store_connect(nullptr, &store), GRADEX_ERR_INVALID_ARGUMENT);
  options.rank = 0;
  EXPECT_EQ(gradex_store_connect(&options, &store), GRADEX_ERR_INVALID_ARGUMENT);  // no world size
  options.world_size = 1;
  ASSERT_EQ(gradex_store_connect(&options, &store), GRADEX_OK) << gradex_last_error();
  int64_t value = 0;
  EXPECT_EQ(store->add(store->context, "counter", 3, &value), 0);
  EXPECT_EQ(value, 3);
  EXPECT_EQ(gradex_store_destroy(store), GRADEX_OK);
  gradex_store_t not_ours{};
  EXPECT_EQ(gradex_store_destroy(&not_ours), GRADEX_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(gradex_store_destroy(nullptr), GRADEX_OK);
}

}  // namespace
}  // namespace gradex::test
