// Spawning and supervising local ranks: N child processes of one executable, each with the
// torchrun-style environment (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,
// MASTER_PORT) replacing whatever launcher variables the parent had. The parent never hangs: the
// first rank that fails stops the others, an overall deadline stops everyone, SIGINT/SIGTERM are
// forwarded. POSIX only; no dependency on comm/ (tests drive it with /bin/sh).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace gradex::bench {

struct SpawnOptions {
  std::string executable;         // path given to execve
  std::vector<std::string> argv;  // full argv, argv[0] included
  int ranks = 1;                  // >= 1
  std::chrono::milliseconds deadline{std::chrono::minutes(15)};
  std::string master_addr = "127.0.0.1";
  uint16_t master_port = 0;  // 0: pick a free port on master_addr
  // After asking ranks to stop (SIGTERM), how long to wait before SIGKILL.
  std::chrono::milliseconds kill_grace{2000};
};

struct SpawnResult {
  // 0 when every rank exited 0. Otherwise the exit status to relay: the first failing rank's exit
  // code, 128 + signal for a rank killed by a signal, 124 when the deadline passed, 128 + signal
  // when the parent received SIGINT/SIGTERM.
  int exit_code = 0;
  int failed_rank = -1;  // the first rank that failed; -1 for none (or deadline / signal)
  bool deadline_expired = false;
  int interrupted_by = 0;  // the signal the parent forwarded, or 0
  std::string message;     // one line for the user when exit_code != 0
};

// Forks `ranks` children that execve(executable, argv, environment + rank variables), waits for
// them and returns how the run ended. Throws InvalidArgument for bad options and TransportError
// when a fork or the port search fails (after stopping any child already started).
SpawnResult spawn_local_ranks(const SpawnOptions& options);

// A TCP port on `addr` that was free a moment ago (bind to port 0, read it back, close). Another
// process may take it before it is used; rank 0's store then fails with a clear error.
uint16_t pick_free_port(const std::string& addr);

}  // namespace gradex::bench
