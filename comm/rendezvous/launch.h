// Who am I, and where is the bootstrap server: read from the launcher's environment, in one place
// for every launcher gradex knows (torchrun, Open MPI, MPICH / Intel MPI, Slurm).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "comm/rendezvous/store.h"

namespace gradex::comm {

struct LaunchInfo {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  // Ranks on this host, as the launcher says (0: it does not say). local_rank_given is false when
  // the launcher names no local rank (local_rank is then 0).
  int local_size = 0;
  bool local_rank_given = false;
  std::string master_addr = "127.0.0.1";
  uint16_t master_port = 29500;
  // Which launcher's variables were used: "torchrun", "Open MPI", "MPICH/Intel MPI", "Slurm", or
  // "none" (a single process).
  std::string launcher = "none";
};

// Detection order, first match wins (the inner launcher wins: torchrun inside an sbatch job sees
// both its own and Slurm's variables, and an mpirun inside an allocation inherits SLURM_PROCID):
//   torchrun         RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE
//   Open MPI         OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_RANK,
//                    OMPI_COMM_WORLD_LOCAL_SIZE
//   MPICH/Intel MPI  PMI_RANK, PMI_SIZE, MPI_LOCALRANKID (or PMI_LOCAL_RANK), MPI_LOCALNRANKS
//                    (or PMI_LOCAL_SIZE)
//   Slurm            SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NTASKS_PER_NODE (or this
//                    node's entry of SLURM_TASKS_PER_NODE, "2(x3),1", at SLURM_NODEID)
// The rendezvous address is MASTER_ADDR, else the first host of SLURM_JOB_NODELIST (or
// SLURM_NODELIST) when present, else 127.0.0.1. The port is MASTER_PORT, else under Slurm
// 20000 + SLURM_JOB_ID mod 10000 (two jobs sharing a node do not collide), else 29500.
// Throws ConfigError with a clear message when a rank is given without a size (or the reverse),
// when values are not integers, when rank >= world size, or when the port is out of range.
// With no launcher at all: a single rank (rank 0 of 1, launcher "none").
LaunchInfo launch_info_from_environment();

// As launch_info_from_environment, but finding no launcher is a ConfigError that lists every
// variable that was looked for (for programs that must run under a launcher).
LaunchInfo require_launch_info_from_environment();

// Which incarnation of the job this process belongs to, for store keys that must not be read from
// an earlier one: "" normally, "restart<N>" under torchrun's elastic agent
// (TORCHELASTIC_RESTART_COUNT = N), whose store outlives the workers it restarts. ConfigError for a
// malformed value.
std::string launch_incarnation();

// True when any launcher's rank or size variable is set.
bool launcher_present();

// Expands a Slurm hostlist ("node[01-04,07]", "a1,b[2-3]", "r[1-2]-n[1-2]") in order. Throws
// ConfigError naming `what` on malformed input or more than 1,000,000 hosts.
std::vector<std::string> expand_hostlist(const std::string& list, const std::string& what);

// Connects to (rank 0: serves) the TCP store described by `info`. Errors are clear and bounded by
// `timeout`: unreachable MASTER_ADDR, port already in use on rank 0. With a non-empty `job_secret`
// the store and every client authenticate each other (tcp_store_core.h, docs/security.md).
std::shared_ptr<Store> connect_tcp_store(const LaunchInfo& info, Millis timeout,
                                         const std::string& job_secret = "");
// The same with the timeout and job secret of `options` (comm_options_from_config).
std::shared_ptr<Store> connect_tcp_store(const LaunchInfo& info, const CommOptions& options);

}  // namespace gradex::comm
