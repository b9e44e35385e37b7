// launch_info_from_environment and connect_tcp_store: every bad input gives a clear, bounded
// error naming the variables.
#include <gtest/gtest.h>

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <thread>

#include "base/config.h"
#include "base/error.h"
#include "comm/communicator.h"
#include "comm/launch.h"
#include "tests/comm/rank_harness.h"

namespace gradex::test {
namespace {

using comm::LaunchInfo;
using comm::Millis;
using Clock = std::chrono::steady_clock;

const char* const kVars[] = {
    "RANK",        "WORLD_SIZE",           "LOCAL_RANK",           "MASTER_ADDR",
    "MASTER_PORT", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"};

// Clears the launcher variables around each test (and restores nothing: ctest runs each test in
// its own process).
class Launch : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* v : kVars)
      unsetenv(v);
  }
  void TearDown() override { SetUp(); }

  static std::string error_text(const std::vector<std::pair<const char*, const char*>>& env) {
    for (const char* v : kVars)
      unsetenv(v);
    for (auto& [k, v] : env)
      setenv(k, v, 1);
    try {
      comm::launch_info_from_environment();
    } catch (const ConfigError& e) {
      return e.what();
    }
    return "no error";
  }
};

TEST_F(Launch, NothingSetIsASingleRank) {
  LaunchInfo info = comm::launch_info_from_environment();
  EXPECT_EQ(info.rank, 0);
  EXPECT_EQ(info.world_size, 1);
  EXPECT_EQ(info.master_addr, "127.0.0.1");
  EXPECT_EQ(info.master_port, 29500);
}

TEST_F(Launch, TorchrunVariables) {
  setenv("RANK", "3", 1);
  setenv("WORLD_SIZE", "8", 1);
  setenv("LOCAL_RANK", "1", 1);
  setenv("MASTER_ADDR", "127.0.0.2", 1);
  setenv("MASTER_PORT", "12345", 1);
  LaunchInfo info = comm::launch_info_from_environment();
  EXPECT_EQ(info.rank, 3);
  EXPECT_EQ(info.world_size, 8);
  EXPECT_EQ(info.local_rank, 1);
  EXPECT_EQ(info.master_addr, "127.0.0.2");
  EXPECT_EQ(info.master_port, 12345);
}

TEST_F(Launch, OpenMpiFallback) {
  setenv("OMPI_COMM_WORLD_RANK", "2", 1);
  setenv("OMPI_COMM_WORLD_SIZE", "4", 1);
  setenv("OMPI_COMM_WORLD_LOCAL_RANK", "0", 1);
  LaunchInfo info = comm::launch_info_from_environment();
  EXPECT_EQ(info.rank, 2);
  EXPECT_EQ(info.world_size, 4);
  EXPECT_EQ(info.local_rank, 0);
}

TEST_F(Launch, RankWithoutSize) {
  EXPECT_EQ(error_text({{"RANK", "1"}}),
            "RANK=1 is set but WORLD_SIZE is not: set both (or neither, for a single process)");
}

TEST_F(Launch, SizeWithoutRank) {
  EXPECT_EQ(error_text({{"WORLD_SIZE", "4"}}),
            "WORLD_SIZE=4 is set but RANK is not: set both (or neither, for a single process)");
}

TEST_F(Launch, OpenMpiRankWithoutSize) {
  EXPECT_EQ(error_text({{"OMPI_COMM_WORLD_RANK", "0"}}),
            "OMPI_COMM_WORLD_RANK=0 is set but OMPI_COMM_WORLD_SIZE is not: set both (or "
            "neither, for a single process)");
}

TEST_F(Launch, RankNotBelowSize) {
  EXPECT_EQ(error_text({{"RANK", "4"}, {"WORLD_SIZE", "4"}}),
            "RANK=4 must be in [0, WORLD_SIZE) = [0, 4)");
  EXPECT_EQ(error_text({{"RANK", "-1"}, {"WORLD_SIZE", "4"}}),
            "RANK=-1 must be in [0, WORLD_SIZE) = [0, 4)");
}

TEST_F(Launch, NonIntegers) {
  EXPECT_EQ(error_text({{"RANK", "one"}, {"WORLD_SIZE", "4"}}), "RANK='one' is not an integer");
  EXPECT_EQ(error_text({{"RANK", "1"}, {"WORLD_SIZE", "4x"}}), "WORLD_SIZE='4x' is not an integer");
  EXPECT_EQ(error_text({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "http"}}),
            "MASTER_PORT='http' is not an integer");
}

TEST_F(Launch, OutOfRange) {
  EXPECT_EQ(error_text({{"RANK", "0"}, {"WORLD_SIZE", "0"}}),
            "WORLD_SIZE=0 is out of range (allowed: 1 to 1048576)");
  EXPECT_EQ(error_text({{"MASTER_PORT", "70000"}}),
            "MASTER_PORT=70000 is out of range (allowed: 1 to 65535)");
  EXPECT_EQ(error_text({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "5"}}),
            "LOCAL_RANK=5 must be in [0, WORLD_SIZE)");
}

TEST(ConnectTcpStore, UnreachableMasterIsAClearTimeout) {
  LaunchInfo info;
  info.rank = 1;
  info.world_size = 2;
  info.master_port = free_port();  // 127.0.0.1, nobody listening
  auto t0 = Clock::now();
  try {
    comm::connect_tcp_store(info, Millis(1000));
    FAIL() << "connected";
  } catch (const TimeoutError& e) {
    std::string want =
        "could not connect to the gradex store at 127.0.0.1:" + std::to_string(info.master_port) +
        " within 1 s: Connection refused";
    EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
  }
  double s = std::chrono::duration<double>(Clock::now() - t0).count();
  EXPECT_GE(s, 0.99);
  EXPECT_LT(s, 4.0);
}

TEST(ConnectTcpStore, PortInUseOnRankZero) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  ASSERT_EQ(listen(fd, 1), 0);
  socklen_t len = sizeof(a);
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  LaunchInfo info;
  info.rank = 0;
  info.world_size = 2;
  info.master_port = ntohs(a.sin_port);
  try {
    comm::connect_tcp_store(info, Millis(1000));
    FAIL() << "served on a busy port";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("MASTER_PORT " + std::to_string(info.master_port) +
                                         " is already in use on this host"),
              std::string::npos)
        << e.what();
  }
  close(fd);
}

TEST(ConnectTcpStore, MasterAddrThatIsNotLocal) {
  LaunchInfo info;
  info.rank = 0;
  info.world_size = 2;
  info.master_addr = "198.18.0.1";  // benchmarking range: never assigned to this host
  info.master_port = free_port();
  try {
    comm::connect_tcp_store(info, Millis(500));
    FAIL() << "served on a foreign address";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("MASTER_ADDR=198.18.0.1 is not an address of this host"),
              std::string::npos)
        << e.what();
  }
}

TEST(ConnectTcpStore, TwoRanksShareOneStore) {
  LaunchInfo info0;
  info0.rank = 0;
  info0.world_size = 2;
  info0.master_port = free_port();
  LaunchInfo info1 = info0;
  info1.rank = 1;
  std::shared_ptr<comm::Store> s1;
  std::thread t([&] { s1 = comm::connect_tcp_store(info1, Millis(5000)); });
  auto s0 = comm::connect_tcp_store(info0, Millis(5000));
  t.join();
  s1->set("hello", {1, 2, 3});
  EXPECT_EQ(s0->get("hello", Millis(1000)), (comm::Bytes{1, 2, 3}));
  s1.reset();
}

TEST(ConnectTcpStore, SingleRankNeedsNoPort) {
  LaunchInfo info;       // rank 0 of 1
  info.master_port = 1;  // privileged, unusable: must not matter
  auto s = comm::connect_tcp_store(info, Millis(100));
  EXPECT_EQ(s->add("n", 1), 1);
}

TEST(CommOptions, FromConfig) {
  auto c = config::Config::from_strings(
      {"GRADEX_TIMEOUT_S=2.5", "GRADEX_IFACE=lo", "GRADEX_RING_CHUNK_KB=64"},
      config::Source::kEnvironment);
  comm::CommOptions o = comm::comm_options_from_config(c);
  EXPECT_EQ(o.timeout, Millis(2500));
  EXPECT_EQ(o.iface, "lo");
  EXPECT_EQ(o.ring_chunk_bytes, 64u << 10);
}

// GRADEX_IFACE reaches UCX: an existing device works, a missing one fails clearly and promptly.
TEST(CommOptions, IfaceSelectsTheUcxDevice) {
  comm::CommOptions o = test_options();
  // Network devices only matter on tcp: same-host shared memory would ignore them.
  o.shared_memory = false;
  o.iface = "lo";
  run_ranks(
      2, [](comm::Communicator& c) { EXPECT_EQ(c.size(), 2); }, o);
  o.iface = "gradex-no-such-device0";
  o.timeout = Millis(3000);
  auto t0 = Clock::now();
  try {
    run_ranks(
        2, [](comm::Communicator&) {}, o);
    FAIL() << "connected without a device";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("GRADEX_IFACE='gradex-no-such-device0'"),
              std::string::npos)
        << e.what();
  }
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 10.0);
}

}  // namespace
}  // namespace gradex::test
