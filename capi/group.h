// The object behind gradex_group_t: one communicator for exact collectives (broadcast and allgather
// of bytes), with no engine, codec or thread. Internal to libgradex.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "base/config.h"
#include "comm/communicator.h"

namespace gradex::capi {

class Group {
 public:
  // Collective: connects every rank through `store` (comm options from `config`). `api_version` is
  // unused: a group exchanges no versioned payload (its messages are the caller's bytes).
  Group(config::Config config, std::shared_ptr<comm::Store> store, int rank, int world_size,
        uint32_t api_version);
  int rank() const { return comm_->rank(); }
  int size() const { return comm_->size(); }

  // gradex.h: gradex_group_broadcast / _allgather. Both agree on their arguments first (agree()).
  void broadcast(void* data, size_t bytes, int root);
  void allgather(const void* data, size_t bytes, void* out);
  // Any thread: the collective in progress (or the next) fails with kAborted on every rank.
  void abort(const std::string& reason);
  // Waits for every rank to leave (a barrier bounded by the timeout) unless the group failed.
  void shutdown();

 private:
  // One round trip in which every rank publishes (bytes, root, whether its buffers are usable);
  // `has_root`: the collective has a root (broadcast);
  // every rank then throws the same error when they differ (MismatchError) or some rank's buffer is
  // NULL or the root is not a rank (InvalidArgument), before any payload moves.
  void agree(const char* operation, uint64_t bytes, bool has_root, int64_t root, bool buffers_ok);
  // Runs a collective; a failure other than agree()'s leaves the group failed.
  template <typename Fn>
  void run(const char* operation, uint64_t bytes, bool has_root, int64_t root, bool buffers_ok,
           Fn&& fn);

  std::unique_ptr<comm::Communicator> comm_;
  std::atomic<bool> failed_{false};
};

}  // namespace gradex::capi
