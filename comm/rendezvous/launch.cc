// launch_info_from_environment / connect_tcp_store: the standalone (launcher-driven) bootstrap.
#include "comm/rendezvous/launch.h"

#include <cstdlib>
#include <string>

#include "base/config.h"
#include "base/error.h"
#include "base/log.h"
#include "comm/rendezvous/memory_store.h"
#include "comm/rendezvous/tcp_store.h"

namespace gradex::comm {
namespace {

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return (v != nullptr && *v != '\0') ? v : nullptr;
}

int64_t int_var(const char* name, const char* text) {
  return config::parse_int_strict(text, name);
}

// One launcher's variable names. `local_alt` / `local_size_alt` are second names (or nullptr).
struct Launcher {
  const char* name;
  const char* rank;
  const char* size;
  const char* local;
  const char* local_alt;
  const char* local_size;
  const char* local_size_alt;
};

constexpr Launcher kLaunchers[] = {
    {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", nullptr, "LOCAL_WORLD_SIZE", nullptr},
    {"Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     nullptr, "OMPI_COMM_WORLD_LOCAL_SIZE", nullptr},
    {"MPICH/Intel MPI", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "PMI_LOCAL_RANK",
     "MPI_LOCALNRANKS", "PMI_LOCAL_SIZE"},
    {"Slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", nullptr, "SLURM_NTASKS_PER_NODE",
     nullptr},
};

// This node's entry of SLURM_TASKS_PER_NODE ("2(x3),1": two tasks on each of the first three
// nodes, one on the fourth) at SLURM_NODEID; 0 when either is absent.
int64_t slurm_tasks_on_this_node() {
  const char* list = env("SLURM_TASKS_PER_NODE");
  const char* node_text = env("SLURM_NODEID");
  if (!list || !node_text) return 0;
  int64_t node = int_var("SLURM_NODEID", node_text);
  std::string s = list;
  size_t pos = 0;
  while (pos < s.size()) {
    size_t end = s.find(',', pos);
    std::string item = s.substr(pos, end == std::string::npos ? std::string::npos : end - pos);
    int64_t repeat = 1;
    size_t paren = item.find("(x");
    if (paren != std::string::npos) {
      if (item.back() != ')')
        throw ConfigError("SLURM_TASKS_PER_NODE=" + s + " is malformed (expected e.g. 2(x3),1)");
      repeat =
          int_var("SLURM_TASKS_PER_NODE", item.substr(paren + 2, item.size() - paren - 3).c_str());
      item = item.substr(0, paren);
    }
    int64_t tasks = int_var("SLURM_TASKS_PER_NODE", item.c_str());
    if (node < repeat) return tasks;
    node -= repeat;
    if (end == std::string::npos) break;
    pos = end + 1;
  }
  return 0;
}

// Slurm is recognised by SLURM_PROCID alone: an salloc shell sets SLURM_NTASKS for the whole
// allocation, and a single process started there is not one of N tasks.
const Launcher* detect() {
  for (const Launcher& l : kLaunchers) {
    bool slurm = std::string(l.rank) == "SLURM_PROCID";
    if (env(l.rank) || (!slurm && env(l.size))) return &l;
  }
  return nullptr;
}

std::string looked_for() {
  std::string s;
  for (const Launcher& l : kLaunchers) {
    s += std::string(s.empty() ? "" : "; ") + l.name + ": " + l.rank + "/" + l.size;
  }
  return s;
}

void read_ranks(const Launcher& l, LaunchInfo* info) {
  const char* rank_text = env(l.rank);
  const char* size_text = env(l.size);
  if (rank_text && !size_text)
    throw ConfigError(std::string(l.rank) + "=" + rank_text + " is set but " + l.size +
                      " is not: set both (or neither, for a single process)");
  if (size_text && !rank_text)
    throw ConfigError(std::string(l.size) + "=" + size_text + " is set but " + l.rank +
                      " is not: set both (or neither, for a single process)");
  int64_t rank = int_var(l.rank, rank_text);
  int64_t size = int_var(l.size, size_text);
  if (size < 1 || size > (1 << 20))
    throw ConfigError(std::string(l.size) + "=" + size_text +
                      " is out of range (allowed: 1 to 1048576)");
  if (rank < 0 || rank >= size)
    throw ConfigError(std::string(l.rank) + "=" + rank_text + " must be in [0, " + l.size +
                      ") = [0, " + std::to_string(size) + ")");
  info->rank = static_cast<int>(rank);
  info->world_size = static_cast<int>(size);
  info->launcher = l.name;
  const char* local_name = l.local;
  const char* local = env(l.local);
  if (!local && l.local_alt) {
    local_name = l.local_alt;
    local = env(l.local_alt);
  }
  if (local) {
    int64_t v = int_var(local_name, local);
    if (v < 0 || v >= size)
      throw ConfigError(std::string(local_name) + "=" + local + " must be in [0, " + l.size + ")");
    info->local_rank = static_cast<int>(v);
    info->local_rank_given = true;
  }
  const char* local_size_name = l.local_size;
  const char* local_size = env(l.local_size);
  if (!local_size && l.local_size_alt) {
    local_size_name = l.local_size_alt;
    local_size = env(l.local_size_alt);
  }
  int64_t n = local_size                       ? int_var(local_size_name, local_size)
              : std::string(l.name) == "Slurm" ? slurm_tasks_on_this_node()
                                               : 0;
  if (local_size && (n < 1 || n > size))
    throw ConfigError(std::string(local_size_name) + "=" + local_size + " must be in [1, " +
                      l.size + "]");
  if (n > 0 && info->local_rank >= n) n = 0;  // inconsistent launcher variables: do not guess
  info->local_size = static_cast<int>(n);
}

void read_rendezvous(LaunchInfo* info) {
  if (const char* addr = env("MASTER_ADDR")) {
    info->master_addr = addr;
  } else {
    const char* list_name = env("SLURM_JOB_NODELIST") ? "SLURM_JOB_NODELIST" : "SLURM_NODELIST";
    if (const char* list = env(list_name)) {
      info->master_addr = expand_hostlist(list, list_name).front();
    }
  }
  if (const char* port_text = env("MASTER_PORT")) {
    int64_t port = int_var("MASTER_PORT", port_text);
    if (port < 1 || port > 65535)
      throw ConfigError(std::string("MASTER_PORT=") + port_text +
                        " is out of range (allowed: 1 to 65535)");
    info->master_port = static_cast<uint16_t>(port);
  } else if (const char* job = env("SLURM_JOB_ID")) {
    int64_t id = int_var("SLURM_JOB_ID", job);
    if (id < 0) throw ConfigError(std::string("SLURM_JOB_ID=") + job + " is negative");
    info->master_port = static_cast<uint16_t>(20000 + id % 10000);
  }
}

}  // namespace

LaunchInfo launch_info_from_environment() {
  LaunchInfo info;
  if (const Launcher* l = detect()) {
    read_ranks(*l, &info);
  } else {
    info.local_size = 1;
    info.local_rank_given = true;
  }
  read_rendezvous(&info);
  if (info.launcher != "none") {
    GX_LOG(kDebug) << "launcher: " << info.launcher << ", rank " << info.rank << " of "
                   << info.world_size << ", store at " << info.master_addr << ":"
                   << info.master_port;
  }
  return info;
}

LaunchInfo require_launch_info_from_environment() {
  if (!detect())
    throw ConfigError("no launcher found: none of the rank/size variables is set (looked for " +
                      looked_for() +
                      "); start the program with torchrun, mpirun, srun or set RANK and "
                      "WORLD_SIZE");
  return launch_info_from_environment();
}

std::string launch_incarnation() {
  const char* text = env("TORCHELASTIC_RESTART_COUNT");
  if (!text) return "";
  int64_t n = int_var("TORCHELASTIC_RESTART_COUNT", text);
  if (n < 0) throw ConfigError(std::string("TORCHELASTIC_RESTART_COUNT=") + text + " is negative");
  return "restart" + std::to_string(n);
}

bool launcher_present() {
  return detect() != nullptr;
}

std::shared_ptr<Store> connect_tcp_store(const LaunchInfo& info, Millis timeout,
                                         const std::string& job_secret) {
  // A single process needs no server (and must not fail because MASTER_PORT is taken).
  if (info.world_size == 1) return std::make_shared<MemoryStore>();
  std::unique_ptr<TcpStoreServer> server;
  if (info.rank == 0)
    server = std::make_unique<TcpStoreServer>(info.master_addr, info.master_port, job_secret);
  return std::make_shared<TcpStore>(info.master_addr, info.master_port, timeout, std::move(server),
                                    job_secret);
}

std::shared_ptr<Store> connect_tcp_store(const LaunchInfo& info, const CommOptions& options) {
  return connect_tcp_store(info, options.timeout, options.job_secret);
}

}  // namespace gradex::comm
