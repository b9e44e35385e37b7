// How a gradex-bench command becomes a set of ranks. Under a launcher (RANK/WORLD_SIZE from
// torchrun, or OMPI_COMM_WORLD_*) the process is one rank and runs the body itself. Otherwise it
// spawns --ranks copies of its own executable with the same arguments on 127.0.0.1 (spawn.h) and
// relays how they ended; each copy then finds itself under a launcher.
//
// A rank bootstraps through the TCP store at MASTER_ADDR:MASTER_PORT (rank 0 serves it), creates
// the UCX communicator from the GRADEX_* configuration, runs the body, and leaves through a barrier
// so that no rank tears down while another still needs it. A rank that throws prints
// "<command>: rank R: <error>" on stderr and exits 1; the spawning parent then stops the others.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "base/config.h"
#include "bench/args.h"
#include "comm/communicator.h"
#include "comm/rendezvous/launch.h"

namespace gradex::bench {

// main() saves its arguments so spawned ranks re-run the same command line.
void set_program_arguments(int argc, char** argv);

// True when the environment names this process's rank (any launcher comm/rendezvous/launch.h
// knows).
bool under_external_launcher();

struct RankContext {
  comm::LaunchInfo info;
  config::Config config;
  comm::Communicator& comm;
  // The bootstrap store, for components that open their own communicator (the sync engine).
  std::shared_ptr<comm::Store> store;
  // Only rank 0 prints the report; the others stay quiet unless they fail.
  bool reporter() const { return comm.rank() == 0; }
};

struct LaunchOptions {
  std::string command;  // "gradex-bench exchange", for messages
  int ranks = 4;        // local ranks to spawn when not under a launcher
  std::chrono::milliseconds deadline{std::chrono::minutes(15)};
};

// The flags every multi-rank command accepts: --ranks (default `default_ranks`), --deadline-s.
std::vector<FlagSpec> launch_flags(int default_ranks);
LaunchOptions launch_options_from_args(const Args& args, const std::string& command);

// Runs `body` on every rank (see the file comment) and returns the process exit status: the body's
// own status under a launcher, the relayed status (0 when every rank succeeded) when spawning.
int run_ranks(const LaunchOptions& options, const std::function<int(RankContext&)>& body);

}  // namespace gradex::bench
