// launch_info_from_environment / connect_tcp_store: the standalone (launcher-driven) bootstrap.
#include "comm/launch.h"

#include <cstdlib>

#include "base/config.h"
#include "base/error.h"
#include "comm/memory_store.h"
#include "comm/tcp_store.h"

namespace gradex::comm {
namespace {

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return (v != nullptr && *v != '\0') ? v : nullptr;
}

int64_t int_var(const char* name, const char* text) {
  return config::parse_int_strict(text, name);
}

}  // namespace

LaunchInfo launch_info_from_environment() {
  // torchrun's names take precedence; Open MPI's are the fallback when neither RANK nor
  // WORLD_SIZE is set.
  const char* rank_name = "RANK";
  const char* size_name = "WORLD_SIZE";
  const char* local_name = "LOCAL_RANK";
  if (!env("RANK") && !env("WORLD_SIZE") &&
      (env("OMPI_COMM_WORLD_RANK") || env("OMPI_COMM_WORLD_SIZE"))) {
    rank_name = "OMPI_COMM_WORLD_RANK";
    size_name = "OMPI_COMM_WORLD_SIZE";
    local_name = "OMPI_COMM_WORLD_LOCAL_RANK";
  }
  const char* rank_text = env(rank_name);
  const char* size_text = env(size_name);

  LaunchInfo info;
  if (rank_text && !size_text)
    throw ConfigError(std::string(rank_name) + "=" + rank_text + " is set but " + size_name +
                      " is not: set both (or neither, for a single process)");
  if (size_text && !rank_text)
    throw ConfigError(std::string(size_name) + "=" + size_text + " is set but " + rank_name +
                      " is not: set both (or neither, for a single process)");
  if (rank_text) {
    int64_t rank = int_var(rank_name, rank_text);
    int64_t size = int_var(size_name, size_text);
    if (size < 1 || size > (1 << 20))
      throw ConfigError(std::string(size_name) + "=" + size_text +
                        " is out of range (allowed: 1 to 1048576)");
    if (rank < 0 || rank >= size)
      throw ConfigError(std::string(rank_name) + "=" + rank_text + " must be in [0, " + size_name +
                        ") = [0, " + std::to_string(size) + ")");
    info.rank = static_cast<int>(rank);
    info.world_size = static_cast<int>(size);
    if (const char* local = env(local_name)) {
      int64_t l = int_var(local_name, local);
      if (l < 0 || l >= size)
        throw ConfigError(std::string(local_name) + "=" + local + " must be in [0, " + size_name +
                          ")");
      info.local_rank = static_cast<int>(l);
    }
  }
  if (const char* addr = env("MASTER_ADDR")) info.master_addr = addr;
  if (const char* port_text = env("MASTER_PORT")) {
    int64_t port = int_var("MASTER_PORT", port_text);
    if (port < 1 || port > 65535)
      throw ConfigError(std::string("MASTER_PORT=") + port_text +
                        " is out of range (allowed: 1 to 65535)");
    info.master_port = static_cast<uint16_t>(port);
  }
  return info;
}

std::shared_ptr<Store> connect_tcp_store(const LaunchInfo& info, Millis timeout) {
  // A single process needs no server (and must not fail because MASTER_PORT is taken).
  if (info.world_size == 1) return std::make_shared<MemoryStore>();
  std::unique_ptr<TcpStoreServer> server;
  if (info.rank == 0) server = std::make_unique<TcpStoreServer>(info.master_addr, info.master_port);
  return std::make_shared<TcpStore>(info.master_addr, info.master_port, timeout, std::move(server));
}

}  // namespace gradex::comm
