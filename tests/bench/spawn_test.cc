// Local-rank spawning, driven with /bin/sh scripts standing in for benchmark ranks.
#include "bench/spawn.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <thread>

#include "base/error.h"

namespace gradex::bench {
namespace {

using std::chrono::milliseconds;

SpawnOptions shell(int ranks, const std::string& script,
                   milliseconds deadline = milliseconds(20000)) {
  SpawnOptions o;
  o.executable = "/bin/sh";
  o.argv = {"sh", "-c", script};
  o.ranks = ranks;
  o.deadline = deadline;
  o.kill_grace = milliseconds(500);
  return o;
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

TEST(Spawn, RanksGetTheLauncherEnvironment) {
  std::string dir = ::testing::TempDir();
  std::string script =
      "test \"$WORLD_SIZE\" = 3 && test \"$LOCAL_RANK\" = \"$RANK\" && "
      "test \"$LOCAL_WORLD_SIZE\" = 3 && test \"$MASTER_ADDR\" = 127.0.0.1 && "
      "test \"$MASTER_PORT\" -gt 0 && test -z \"$OMPI_COMM_WORLD_RANK\" && "
      "echo \"$MASTER_PORT\" > " +
      dir + "/gradex_spawn_rank$RANK";
  setenv("OMPI_COMM_WORLD_RANK", "5", 1);  // a parent's launcher variables must not leak
  setenv("RANK", "9", 1);
  SpawnResult r = spawn_local_ranks(shell(3, script));
  unsetenv("OMPI_COMM_WORLD_RANK");
  unsetenv("RANK");
  EXPECT_EQ(r.exit_code, 0) << r.message;
  EXPECT_EQ(r.failed_rank, -1);
  std::string first_port;
  for (int rank = 0; rank < 3; ++rank) {
    std::string path = dir + "/gradex_spawn_rank" + std::to_string(rank);
    std::ifstream in(path);
    std::string port;
    ASSERT_TRUE(in >> port) << "rank " << rank << " did not run";
    if (rank == 0) first_port = port;
    EXPECT_EQ(port, first_port);  // one MASTER_PORT for everyone
    std::remove(path.c_str());
  }
}

TEST(Spawn, AFailingRankFailsTheRunWithItsStatusAndStopsTheOthers) {
  auto start = std::chrono::steady_clock::now();
  SpawnResult r = spawn_local_ranks(
      shell(3, "if [ \"$RANK\" = 1 ]; then sleep 0.2; exit 7; fi; exec sleep 30"));
  EXPECT_EQ(r.exit_code, 7);
  EXPECT_EQ(r.failed_rank, 1);
  EXPECT_FALSE(r.deadline_expired);
  EXPECT_NE(r.message.find("rank 1"), std::string::npos) << r.message;
  EXPECT_LT(seconds_since(start), 10.0);
}

TEST(Spawn, ARankKilledByASignalReports128PlusTheSignal) {
  SpawnResult r =
      spawn_local_ranks(shell(2, "if [ \"$RANK\" = 0 ]; then kill -9 $$; fi; exec sleep 30"));
  EXPECT_EQ(r.exit_code, 128 + SIGKILL);
  EXPECT_EQ(r.failed_rank, 0);
}

TEST(Spawn, TheDeadlineStopsEvenRanksThatIgnoreSigterm) {
  auto start = std::chrono::steady_clock::now();
  SpawnResult r = spawn_local_ranks(shell(2, "trap '' TERM; exec sleep 30", milliseconds(300)));
  EXPECT_EQ(r.exit_code, 124);
  EXPECT_TRUE(r.deadline_expired);
  EXPECT_EQ(r.failed_rank, -1);
  EXPECT_LT(seconds_since(start), 5.0);
}

TEST(Spawn, SigtermToTheParentIsForwarded) {
  std::thread sender([] {
    std::this_thread::sleep_for(milliseconds(500));
    kill(getpid(), SIGTERM);
  });
  auto start = std::chrono::steady_clock::now();
  SpawnResult r = spawn_local_ranks(shell(2, "exec sleep 30"));
  sender.join();
  EXPECT_EQ(r.interrupted_by, SIGTERM);
  EXPECT_EQ(r.exit_code, 128 + SIGTERM);
  EXPECT_LT(seconds_since(start), 5.0);
}

TEST(Spawn, RejectsBadOptionsAndFindsPorts) {
  EXPECT_THROW(spawn_local_ranks(shell(0, "true")), InvalidArgument);
  EXPECT_GT(pick_free_port("127.0.0.1"), 0);
  EXPECT_THROW(pick_free_port("not-an-address"), InvalidArgument);
  SpawnResult r = spawn_local_ranks(shell(1, "exit 0"));
  EXPECT_EQ(r.exit_code, 0);
  SpawnOptions missing = shell(1, "");
  missing.executable = "/nonexistent/gradex-nothing";
  EXPECT_EQ(spawn_local_ranks(missing).exit_code, 127);
}

}  // namespace
}  // namespace gradex::bench
