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
#include "comm/rendezvous/launch.h"
#include "tests/comm/rank_harness.h"

namespace gradex::test {
namespace {

using comm::LaunchInfo;
using comm::Millis;
using Clock = std::chrono::steady_clock;

const char* const kVars[] = {"RANK",
                             "WORLD_SIZE",
                             "LOCAL_RANK",
                             "MASTER_ADDR",
                             "MASTER_PORT",
                             "OMPI_COMM_WORLD_RANK",
                             "OMPI_COMM_WORLD_SIZE",
                             "OMPI_COMM_WORLD_LOCAL_RANK",
                             "PMI_RANK",
                             "PMI_SIZE",
                             "MPI_LOCALRANKID",
                             "PMI_LOCAL_RANK",
                             "SLURM_PROCID",
                             "SLURM_NTASKS",
                             "SLURM_LOCALID",
                             "SLURM_JOB_NODELIST",
                             "SLURM_NODELIST",
                             "SLURM_JOB_ID",
                             "TORCHELASTIC_RESTART_COUNT",
                             "LOCAL_WORLD_SIZE",
                             "OMPI_COMM_WORLD_LOCAL_SIZE",
                             "MPI_LOCALNRANKS",
                             "PMI_LOCAL_SIZE",
                             "SLURM_NTASKS_PER_NODE",
                             "SLURM_TASKS_PER_NODE",
                             "SLURM_NODEID"};

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

TEST_F(Launch, OpenMpiIsNamed) {
  setenv("OMPI_COMM_WORLD_RANK", "0", 1);
  setenv("OMPI_COMM_WORLD_SIZE", "2", 1);
  EXPECT_EQ(comm::launch_info_from_environment().launcher, "Open MPI");
  EXPECT_TRUE(comm::launcher_present());
}

TEST_F(Launch, MpichAndIntelMpiVariables) {
  setenv("PMI_RANK", "5", 1);
  setenv("PMI_SIZE", "6", 1);
  setenv("MPI_LOCALRANKID", "1", 1);
  LaunchInfo info = comm::launch_info_from_environment();
  EXPECT_EQ(info.launcher, "MPICH/Intel MPI");
  EXPECT_EQ(info.rank, 5);
  EXPECT_EQ(info.world_size, 6);
  EXPECT_EQ(info.local_rank, 1);
  // PMI_LOCAL_RANK is the second name for the local rank.
  unsetenv("MPI_LOCALRANKID");
  setenv("PMI_LOCAL_RANK", "2", 1);
  EXPECT_EQ(comm::launch_info_from_environment().local_rank, 2);
  EXPECT_EQ(error_text({{"PMI_RANK", "6"}, {"PMI_SIZE", "6"}}),
            "PMI_RANK=6 must be in [0, PMI_SIZE) = [0, 6)");
  EXPECT_EQ(error_text({{"PMI_SIZE", "6"}}),
            "PMI_SIZE=6 is set but PMI_RANK is not: set both (or neither, for a single process)");
}

TEST_F(Launch, SlurmVariablesAndNodeList) {
  setenv("SLURM_PROCID", "7", 1);
  setenv("SLURM_NTASKS", "8", 1);
  setenv("SLURM_LOCALID", "3", 1);
  setenv("SLURM_JOB_NODELIST", "gpu[07-08,11]", 1);
  setenv("SLURM_NODELIST", "ignored[1-2]", 1);
  setenv("SLURM_JOB_ID", "123456", 1);
  LaunchInfo info = comm::launch_info_from_environment();
  EXPECT_EQ(info.launcher, "Slurm");
  EXPECT_EQ(info.rank, 7);
  EXPECT_EQ(info.world_size, 8);
  EXPECT_EQ(info.local_rank, 3);
  EXPECT_EQ(info.master_addr, "gpu07");  // the first host of the job's node list
  EXPECT_EQ(info.master_port, 20000 + 123456 % 10000);
  // Older Slurm: only SLURM_NODELIST.
  unsetenv("SLURM_JOB_NODELIST");
  EXPECT_EQ(comm::launch_info_from_environment().master_addr, "ignored1");
  // MASTER_ADDR and MASTER_PORT win over what Slurm implies.
  setenv("MASTER_ADDR", "10.1.2.3", 1);
  setenv("MASTER_PORT", "4242", 1);
  info = comm::launch_info_from_environment();
  EXPECT_EQ(info.master_addr, "10.1.2.3");
  EXPECT_EQ(info.master_port, 4242);
  EXPECT_EQ(error_text({{"SLURM_PROCID", "0"}}),
            "SLURM_PROCID=0 is set but SLURM_NTASKS is not: set both (or neither, for a single "
            "process)");
  EXPECT_EQ(error_text({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_NODELIST", "a[1-"}}),
            "SLURM_NODELIST='a[1-' is not a valid Slurm hostlist: unbalanced '['");
}

// The local size from each launcher's variable; 0 (and local_rank_given false) where it says
// nothing.
TEST_F(Launch, LocalSizeFromEveryLauncher) {
  LaunchInfo none = comm::launch_info_from_environment();
  EXPECT_EQ(none.local_size, 1);
  EXPECT_TRUE(none.local_rank_given);
  setenv("RANK", "1", 1);
  setenv("WORLD_SIZE", "4", 1);
  LaunchInfo info = comm::launch_info_from_environment();
  EXPECT_EQ(info.local_size, 0);
  EXPECT_FALSE(info.local_rank_given);
  setenv("LOCAL_RANK", "1", 1);
  setenv("LOCAL_WORLD_SIZE", "2", 1);
  info = comm::launch_info_from_environment();
  EXPECT_EQ(info.local_size, 2);
  EXPECT_TRUE(info.local_rank_given);
  EXPECT_EQ(error_text({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_WORLD_SIZE", "3"}}),
            "LOCAL_WORLD_SIZE=3 must be in [1, WORLD_SIZE]");
  for (const char* v : kVars)
    unsetenv(v);
  setenv("OMPI_COMM_WORLD_RANK", "0", 1);
  setenv("OMPI_COMM_WORLD_SIZE", "8", 1);
  setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "4", 1);
  EXPECT_EQ(comm::launch_info_from_environment().local_size, 4);
  for (const char* v : kVars)
    unsetenv(v);
  setenv("PMI_RANK", "0", 1);
  setenv("PMI_SIZE", "8", 1);
  setenv("PMI_LOCAL_SIZE", "2", 1);  // the second name
  EXPECT_EQ(comm::launch_info_from_environment().local_size, 2);
  setenv("MPI_LOCALNRANKS", "4", 1);  // the first name wins
  EXPECT_EQ(comm::launch_info_from_environment().local_size, 4);
  for (const char* v : kVars)
    unsetenv(v);
  setenv("SLURM_PROCID", "5", 1);
  setenv("SLURM_NTASKS", "9", 1);
  setenv("SLURM_LOCALID", "1", 1);
  setenv("SLURM_TASKS_PER_NODE", "3,2(x2),2", 1);
  for (auto [node, tasks] : {std::pair{"0", 3}, {"1", 2}, {"2", 2}, {"3", 2}, {"4", 0}}) {
    setenv("SLURM_NODEID", node, 1);
    EXPECT_EQ(comm::launch_info_from_environment().local_size, tasks) << "node " << node;
  }
  setenv("SLURM_NTASKS_PER_NODE", "3", 1);  // given explicitly: wins
  EXPECT_EQ(comm::launch_info_from_environment().local_size, 3);
  unsetenv("SLURM_NTASKS_PER_NODE");
  setenv("SLURM_TASKS_PER_NODE", "2(x3", 1);
  EXPECT_NE(error_text({{"SLURM_PROCID", "0"},
                        {"SLURM_NTASKS", "2"},
                        {"SLURM_NODEID", "0"},
                        {"SLURM_TASKS_PER_NODE", "2(x3"}}),
            "no error");
}

// An salloc shell sets SLURM_NTASKS for the allocation: a process started there directly is a
// single process, not one of the tasks.
TEST_F(Launch, SlurmAllocationShellIsASingleProcess) {
  setenv("SLURM_NTASKS", "8", 1);
  setenv("SLURM_JOB_NODELIST", "n[1-2]", 1);
  LaunchInfo info = comm::launch_info_from_environment();
  EXPECT_EQ(info.launcher, "none");
  EXPECT_EQ(info.world_size, 1);
  EXPECT_FALSE(comm::launcher_present());
}

// The inner launcher wins: torchrun inside an sbatch job, mpirun inside an allocation (whose
// ranks all inherit SLURM_PROCID=0).
TEST_F(Launch, InnerLauncherWins) {
  setenv("SLURM_PROCID", "0", 1);
  setenv("SLURM_NTASKS", "1", 1);
  setenv("PMI_RANK", "2", 1);
  setenv("PMI_SIZE", "4", 1);
  EXPECT_EQ(comm::launch_info_from_environment().launcher, "MPICH/Intel MPI");
  setenv("OMPI_COMM_WORLD_RANK", "1", 1);
  setenv("OMPI_COMM_WORLD_SIZE", "4", 1);
  EXPECT_EQ(comm::launch_info_from_environment().launcher, "Open MPI");
  setenv("RANK", "3", 1);
  setenv("WORLD_SIZE", "4", 1);
  LaunchInfo info = comm::launch_info_from_environment();
  EXPECT_EQ(info.launcher, "torchrun");
  EXPECT_EQ(info.rank, 3);
}

TEST_F(Launch, NoLauncherIsAClearErrorWhenOneIsRequired) {
  EXPECT_FALSE(comm::launcher_present());
  EXPECT_EQ(comm::launch_info_from_environment().launcher, "none");
  try {
    comm::require_launch_info_from_environment();
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()),
              "no launcher found: none of the rank/size variables is set (looked for torchrun: "
              "RANK/WORLD_SIZE; Open MPI: OMPI_COMM_WORLD_RANK/OMPI_COMM_WORLD_SIZE; "
              "MPICH/Intel MPI: PMI_RANK/PMI_SIZE; Slurm: SLURM_PROCID/SLURM_NTASKS); start the "
              "program with torchrun, mpirun, srun or set RANK and WORLD_SIZE");
  }
}

TEST(Hostlist, Expands) {
  using V = std::vector<std::string>;
  auto ex = [](const char* s) { return comm::expand_hostlist(s, "L"); };
  EXPECT_EQ(ex("node01"), V{"node01"});
  EXPECT_EQ(ex("node[01-04,07]"), (V{"node01", "node02", "node03", "node04", "node07"}));
  EXPECT_EQ(ex("a1,b[2-3]"), (V{"a1", "b2", "b3"}));
  EXPECT_EQ(ex("r[1-2]-n[08-10]"), (V{"r1-n08", "r1-n09", "r1-n10", "r2-n08", "r2-n09", "r2-n10"}));
  EXPECT_EQ(ex("x[9-11].cluster,y"), (V{"x9.cluster", "x10.cluster", "x11.cluster", "y"}));
}

TEST(Hostlist, RejectsMalformedLists) {
  auto err = [](const char* s) {
    try {
      comm::expand_hostlist(s, "SLURM_JOB_NODELIST");
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const std::string pre = "SLURM_JOB_NODELIST='";
  EXPECT_EQ(err(""), pre + "' is not a valid Slurm hostlist: empty host name");
  EXPECT_EQ(err("a,,b"), pre + "a,,b' is not a valid Slurm hostlist: empty host name");
  EXPECT_EQ(err("n[3-1]"), pre + "n[3-1]' is not a valid Slurm hostlist: range 3-1 is descending");
  EXPECT_EQ(err("n[a-b]"), pre + "n[a-b]' is not a valid Slurm hostlist: '[a-b]' has a bad range");
  EXPECT_EQ(err("n[[1]]"), pre + "n[[1]]' is not a valid Slurm hostlist: nested '['");
  EXPECT_EQ(err("n1]"), pre + "n1]' is not a valid Slurm hostlist: unbalanced ']'");
  EXPECT_EQ(err("n[0-99999999]"),
            pre + "n[0-99999999]' is not a valid Slurm hostlist: range 0-99999999 is too long");
  EXPECT_EQ(err("a[0-9999][0-999]"),
            pre + "a[0-9999][0-999]' is not a valid Slurm hostlist: more than 1000000 hosts");
}

TEST_F(Launch, IncarnationUnderTorchElastic) {
  EXPECT_EQ(comm::launch_incarnation(), "");
  setenv("TORCHELASTIC_RESTART_COUNT", "2", 1);
  EXPECT_EQ(comm::launch_incarnation(), "restart2");
  setenv("TORCHELASTIC_RESTART_COUNT", "x", 1);
  EXPECT_THROW(comm::launch_incarnation(), ConfigError);
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
