#include "bench/launcher.h"

#include <cstdlib>
#include <iostream>

#include "base/error.h"
#include "base/log.h"
#include "bench/spawn.h"
#include "comm/collectives.h"

namespace gradex::bench {

namespace {

std::vector<std::string>& program_arguments() {
  static std::vector<std::string> args;
  return args;
}

int run_as_rank(const LaunchOptions& options, const std::function<int(RankContext&)>& body) {
  int rank = -1;
  try {
    comm::LaunchInfo info = comm::launch_info_from_environment();
    rank = info.rank;
    log::set_rank(rank);
    config::Config config = config::Config::from_environment();
    comm::CommOptions comm_options = comm::comm_options_from_config(config);
    auto store = comm::connect_tcp_store(info, comm_options);
    auto communicator = comm::create_ucx_communicator(
        comm::make_prefix_store(store, "gradex-bench/"), info.rank, info.world_size, comm_options);
    RankContext context{info, config, *communicator, store};
    int status = body(context);
    // Nobody leaves (and rank 0 stops serving the store) while a peer may still talk to it.
    comm::barrier(*communicator);
    return status;
  } catch (const std::exception& e) {
    std::cerr << options.command << ": rank " << (rank >= 0 ? std::to_string(rank) : "?") << ": "
              << e.what() << std::endl;
    return 1;
  }
}

}  // namespace

void set_program_arguments(int argc, char** argv) {
  program_arguments().assign(argv, argv + argc);
}

bool under_external_launcher() {
  return comm::launcher_present();
}

std::vector<FlagSpec> launch_flags(int default_ranks) {
  return {
      {"ranks", std::to_string(default_ranks),
       "local ranks to spawn (ignored under a launcher that sets RANK/WORLD_SIZE)"},
      {"deadline-s", "900", "stop every rank and fail when the whole run takes longer"},
  };
}

LaunchOptions launch_options_from_args(const Args& args, const std::string& command) {
  LaunchOptions options;
  options.command = command;
  options.ranks = static_cast<int>(args.get_int("ranks", 1, 256));
  double seconds = args.get_float("deadline-s", 0.001, 7 * 86400.0);
  options.deadline = std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
  return options;
}

int run_ranks(const LaunchOptions& options, const std::function<int(RankContext&)>& body) {
  if (under_external_launcher()) return run_as_rank(options, body);
  if (program_arguments().empty()) {
    throw InternalError("run_ranks: set_program_arguments() was not called");
  }
  SpawnOptions spawn;
  spawn.executable = "/proc/self/exe";
  spawn.argv = program_arguments();
  spawn.ranks = options.ranks;
  spawn.deadline = options.deadline;
  SpawnResult result = spawn_local_ranks(spawn);
  if (result.exit_code != 0) std::cerr << options.command << ": " << result.message << std::endl;
  return result.exit_code;
}

}  // namespace gradex::bench
