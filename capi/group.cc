// gradex_group_*: exact collectives over a communicator of their own (capi/group.h).
#include "capi/group.h"

#include <cstring>
#include <map>
#include <utility>
#include <vector>

#include "base/error.h"
#include "capi/guarded.h"
#include "comm/collectives.h"
#include "comm/collectives/exact.h"
#include "gradex/gradex.h"

struct gradex_group {
  std::unique_ptr<gradex::capi::Group> group;
  // As gradex_engine's (create_entry fills them; a group is never reconfigured).
  std::shared_ptr<gradex::comm::Store> store;
  std::string prefix;
};

namespace gradex::capi {
namespace {

// What every rank publishes before a collective (agree()).
struct Terms {
  uint64_t bytes = 0;
  int64_t root = 0;
  uint64_t buffers_ok = 0;
};
static_assert(sizeof(Terms) == 24, "Terms travels as 24 bytes");

std::string describe(const Terms& t, bool with_root) {
  std::string s = std::to_string(t.bytes) + " bytes";
  if (with_root) s += " from root " + std::to_string(t.root);
  return s;
}

}  // namespace

Group::Group(config::Config config, std::shared_ptr<comm::Store> store, int rank, int world_size,
             uint32_t /*api_version*/) {
  if (world_size < 1 || rank < 0 || rank >= world_size)
    throw InvalidArgument("rank " + std::to_string(rank) + " of world size " +
                          std::to_string(world_size) + " is out of range");
  comm_ = comm::create_ucx_communicator(std::move(store), rank, world_size,
                                        comm::comm_options_from_config(config));
}

void Group::agree(const char* operation, uint64_t bytes, bool has_root, int64_t root,
                  bool buffers_ok) {
  const int P = comm_->size();
  Terms mine{bytes, root, buffers_ok ? 1u : 0u};
  std::vector<comm::Bytes> all;
  comm::AllgathervOptions options;
  options.inline_max_bytes = sizeof(Terms);
  comm::allgatherv_inline(*comm_, &mine, sizeof mine, all, options, operation);
  std::vector<Terms> terms(static_cast<size_t>(P));
  for (int q = 0; q < P; ++q) {
    const auto& b = all[static_cast<size_t>(q)];
    if (b.size() != sizeof(Terms))
      throw MismatchError(std::string(operation) + ": rank " + std::to_string(q) + " sent " +
                          std::to_string(b.size()) + " bytes of arguments, not " +
                          std::to_string(sizeof(Terms)));
    std::memcpy(&terms[static_cast<size_t>(q)], b.data(), sizeof(Terms));
  }
  const bool with_root = has_root;
  std::map<std::pair<uint64_t, int64_t>, std::vector<int>> groups;
  std::string null_ranks;
  for (int q = 0; q < P; ++q) {
    const Terms& t = terms[static_cast<size_t>(q)];
    groups[{t.bytes, t.root}].push_back(q);
    if (!t.buffers_ok) null_ranks += (null_ranks.empty() ? "" : ", ") + std::to_string(q);
  }
  if (groups.size() > 1) {
    std::string detail;
    for (const auto& [key, ranks] : groups) {
      detail += detail.empty() ? "" : "; ";
      detail += "rank";
      detail += ranks.size() > 1 ? "s " : " ";
      for (size_t i = 0; i < ranks.size(); ++i)
        detail += (i ? "," : "") + std::to_string(ranks[i]);
      detail += ": " + describe(Terms{key.first, key.second, 1}, with_root);
    }
    throw MismatchError(std::string(operation) + ": ranks passed different " +
                        (with_root ? "sizes or roots" : "sizes") + " (" + detail + ")");
  }
  if (!null_ranks.empty())
    throw InvalidArgument(std::string(operation) + ": a NULL buffer for " + std::to_string(bytes) +
                          " bytes on rank(s) " + null_ranks);
  if (with_root && (root < 0 || root >= P))
    throw InvalidArgument(std::string(operation) + ": root " + std::to_string(root) +
                          " is not a rank of a world of " + std::to_string(P));
}

template <typename Fn>
void Group::run(const char* operation, uint64_t bytes, bool has_root, int64_t root, bool buffers_ok,
                Fn&& fn) {
  try {
    agree(operation, bytes, has_root, root, buffers_ok);
  } catch (const Error& e) {
    // Disagreement found before any payload moved leaves the streams in step: usable.
    if (e.code() != ErrorCode::kMismatch && e.code() != ErrorCode::kInvalidArgument) failed_ = true;
    throw;
  } catch (...) {
    failed_ = true;
    throw;
  }
  try {
    fn();
  } catch (...) {
    failed_ = true;
    throw;
  }
}

void Group::broadcast(void* data, size_t bytes, int root) {
  run("broadcast", bytes, true, root, data != nullptr || bytes == 0,
      [&] { comm::chain_broadcast(*comm_, data, bytes, root, "broadcast"); });
}

void Group::allgather(const void* data, size_t bytes, void* out) {
  run("allgather", bytes, false, 0, (data != nullptr && out != nullptr) || bytes == 0,
      [&] { comm::ring_allgather(*comm_, data, bytes, out, "allgather"); });
}

void Group::abort(const std::string& reason) {
  failed_ = true;
  comm_->interrupt(ErrorCode::kAborted, reason);
}

void Group::shutdown() {
  if (!failed_) comm::barrier(*comm_);
}

}  // namespace gradex::capi

namespace {

using gradex::capi::guarded;
using gradex::capi::require;

gradex::capi::Group& group_of(const gradex_group_t* g) {
  if (g == nullptr || !g->group) throw gradex::InvalidArgument("group is NULL");
  return *g->group;
}

}  // namespace

extern "C" {

gradex_status_t gradex_group_create(const gradex_engine_options_t* options,
                                    gradex_group_t** group) {
  return gradex::capi::create_entry("gradex_group_create", options, group, "group", "gradex/group/",
                                    &gradex_group::group, [](const gradex::config::Config&) {});
}

gradex_status_t gradex_group_destroy(gradex_group_t* group) {
  return gradex::capi::destroy_entry("gradex_group_destroy", group, &gradex_group::group);
}

gradex_status_t gradex_group_rank(const gradex_group_t* group, int32_t* rank, int32_t* world_size) {
  return guarded("gradex_group_rank", [&] {
    auto& g = group_of(group);
    require(rank, "rank");
    require(world_size, "world_size");
    *rank = g.rank();
    *world_size = g.size();
  });
}

gradex_status_t gradex_group_broadcast(gradex_group_t* group, void* data, size_t bytes,
                                       int32_t root) {
  return guarded("gradex_group_broadcast",
                 [&] { group_of(group).broadcast(data, bytes, static_cast<int>(root)); });
}

gradex_status_t gradex_group_allgather(gradex_group_t* group, const void* data, size_t bytes,
                                       void* out) {
  return guarded("gradex_group_allgather", [&] { group_of(group).allgather(data, bytes, out); });
}

gradex_status_t gradex_group_abort(gradex_group_t* group, const char* reason) {
  return guarded("gradex_group_abort",
                 [&] { group_of(group).abort(reason != nullptr ? reason : "gradex_group_abort"); });
}

}  // extern "C"
