// The C API's launch information and the job's shared store (gradex_launch_info,
// gradex_store_connect, gradex_store_destroy): what a plugin needs to join a launcher-started job
// and bootstrap several engines through one authenticated store (comm/rendezvous/launch.h).
#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "base/config.h"
#include "base/error.h"
#include "capi/guarded.h"
#include "capi/options_config.h"
#include "comm/communicator.h"
#include "comm/rendezvous/launch.h"
#include "gradex/gradex.h"

namespace {

using gradex::capi::guarded;
using gradex::capi::require;

// A gradex_store_t whose callbacks are a comm::Store's methods; callbacks.context points back here.
struct OwnedStore {
  gradex_store_t callbacks;
  std::shared_ptr<gradex::comm::Store> store;
};

// Callbacks never throw into C: a failure is reported as non-zero (the caller names the
// operation and key) and its message kept as the thread's last error.
template <typename Fn>
int store_call(Fn&& fn) {
  try {
    fn();
    return 0;
  } catch (const std::exception& e) {
    gradex::capi::set_last_error(e.what());
  } catch (...) {
    gradex::capi::set_last_error("unknown exception in the store");
  }
  return 1;
}

gradex::comm::Store& store_of(void* context) {
  return *static_cast<OwnedStore*>(context)->store;
}

int store_set(void* context, const char* key, const void* value, size_t length) {
  return store_call([&] {
    const auto* bytes = static_cast<const uint8_t*>(value);
    store_of(context).set(key, gradex::comm::Bytes(bytes, bytes + length));
  });
}

int store_get(void* context, const char* key, int64_t timeout_ms, void** value, size_t* length) {
  return store_call([&] {
    auto bytes = store_of(context).get(key, gradex::comm::Millis(std::max<int64_t>(timeout_ms, 0)));
    auto* out = new uint8_t[std::max<size_t>(bytes.size(), 1)];
    std::copy(bytes.begin(), bytes.end(), out);
    *value = out;
    *length = bytes.size();
  });
}

void store_release(void*, void* value) {
  delete[] static_cast<uint8_t*>(value);
}

int store_add(void* context, const char* key, int64_t delta, int64_t* new_value) {
  return store_call([&] { *new_value = store_of(context).add(key, delta); });
}

void copy_text(const std::string& text, char* out, size_t capacity, const char* what) {
  if (text.size() + 1 > capacity)
    throw gradex::ConfigError(std::string(what) + " '" + text + "' is longer than " +
                              std::to_string(capacity - 1) + " characters");
  std::memcpy(out, text.c_str(), text.size() + 1);
}

}  // namespace

extern "C" {

gradex_status_t gradex_launch_info(gradex_launch_info_t* info) {
  return guarded("gradex_launch_info", [&] {
    require(info, "info");
    gradex::comm::LaunchInfo launch = gradex::comm::launch_info_from_environment();
    gradex_launch_info_t out{};
    out.rank = launch.rank;
    out.world_size = launch.world_size;
    out.local_rank = launch.local_rank_given ? launch.local_rank : -1;
    out.local_size = launch.local_size > 0 ? launch.local_size : -1;
    out.master_port = launch.master_port;
    copy_text(launch.master_addr, out.master_addr, sizeof(out.master_addr), "the store address");
    copy_text(launch.launcher, out.launcher, sizeof(out.launcher), "the launcher");
    *info = out;
  });
}

gradex_status_t gradex_store_connect(const gradex_engine_options_t* options,
                                     gradex_store_t** store) {
  return guarded("gradex_store_connect", [&] {
    require(options, "options");
    require(store, "store");
    auto config = gradex::capi::config_from_options(*options);
    if (options->store != nullptr)
      throw gradex::InvalidArgument("options->store must be NULL (this call creates the store)");
    if ((options->rank < 0) != (options->world_size < 0))
      throw gradex::InvalidArgument("rank and world_size must both be given or both be < 0");
    gradex::comm::LaunchInfo info = gradex::comm::launch_info_from_environment();
    if (options->rank >= 0) {
      if (options->rank >= options->world_size)
        throw gradex::InvalidArgument("rank " + std::to_string(options->rank) +
                                      " is not below world_size " +
                                      std::to_string(options->world_size));
      info.rank = options->rank;
      info.world_size = options->world_size;
    }
    auto owned = std::make_unique<OwnedStore>();
    owned->store =
        gradex::comm::connect_tcp_store(info, gradex::comm::comm_options_from_config(config));
    owned->callbacks = gradex_store_t{owned.get(), store_set, store_get, store_release, store_add};
    *store = &owned.release()->callbacks;
  });
}

gradex_status_t gradex_store_destroy(gradex_store_t* store) {
  if (store == nullptr) return GRADEX_OK;
  return guarded("gradex_store_destroy", [&] {
    if (store->set != store_set)
      throw gradex::InvalidArgument("the store was not created by gradex_store_connect");
    delete static_cast<OwnedStore*>(store->context);
  });
}

}  // extern "C"
