// Who am I, and where is the bootstrap server: read from the launcher's environment.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "comm/store.h"

namespace gradex::comm {

struct LaunchInfo {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  std::string master_addr = "127.0.0.1";
  uint16_t master_port = 29500;
};

// torchrun's RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT; falling back to Open MPI's
// OMPI_COMM_WORLD_RANK / _SIZE / _LOCAL_RANK. Throws ConfigError with a clear message when a rank
// is given without a size (or the reverse), when values are not integers, when rank >= world size,
// or when the port is out of range. With neither set: a single rank (rank 0 of 1).
LaunchInfo launch_info_from_environment();

// Connects to (rank 0: serves) the TCP store described by `info`. Errors are clear and bounded by
// `timeout`: unreachable MASTER_ADDR, port already in use on rank 0.
std::shared_ptr<Store> connect_tcp_store(const LaunchInfo& info, Millis timeout);

}  // namespace gradex::comm
