// What every C API entry point shares (capi/gradex.cc, capi/outer.cc): exceptions become a status
// plus the thread's gradex_last_error() message, NULL arguments are named, and serialized state is
// copied out in the documented two-call form (and in, by the same checks). Internal to libgradex.
#pragma once

#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "base/error.h"
#include "capi/engine_access.h"
#include "capi/options_config.h"
#include "gradex/gradex.h"

namespace gradex::capi {

// Runs fn, converting every exception into a status plus message. Output parameters are written by
// fn only after its work succeeded.
template <typename Fn>
gradex_status_t guarded(const char* function, Fn&& fn) {
  try {
    fn();
    return GRADEX_OK;
  } catch (const Error& e) {
    set_last_error(std::string(function) + ": " + e.what());
    return static_cast<gradex_status_t>(static_cast<int>(e.code()));
  } catch (const std::bad_alloc&) {
    set_last_error(std::string(function) + ": out of memory");
  } catch (const std::exception& e) {
    set_last_error(std::string(function) + ": " + e.what());
  } catch (...) {
    set_last_error(std::string(function) + ": unknown exception");
  }
  return GRADEX_ERR_INTERNAL;
}

inline void require(const void* p, const char* what) {
  if (p == nullptr) throw InvalidArgument(std::string(what) + " is NULL");
}

// *length = state's size; the bytes go to buffer unless it is NULL (a size query).
// InvalidArgument, with nothing written, when capacity is smaller than the state.
inline void copy_state_out(const std::vector<uint8_t>& state, void* buffer, size_t capacity,
                           size_t* length) {
  if (buffer != nullptr && capacity < state.size())
    throw InvalidArgument("buffer of " + std::to_string(capacity) + " bytes is too small (" +
                          std::to_string(state.size()) + " needed)");
  if (buffer != nullptr) std::memcpy(buffer, state.data(), state.size());
  *length = state.size();
}

// The gradex_stats_t fields that every source of statistics (sync::Stats, the outer optimizer's)
// names alike; the caller fills the rest.
template <typename Stats>
gradex_stats_t common_stats(const Stats& s) {
  gradex_stats_t out{};
  out.steps = s.steps;
  out.bytes_sent = s.bytes_sent;
  out.bytes_received = s.bytes_received;
  out.dense_bytes = s.dense_bytes;
  out.nonfinite = s.nonfinite;
  out.communicate_seconds = s.communicate_seconds;
  return out;
}

// gradex_engine_create / gradex_outer_create: a new handle whose object (member `object`, built
// from the configuration, the prefixed store, rank, world size and the API version) joins the
// first membership. `check(config)` runs first, so that settings which cannot start the object
// fail on every rank before any rank waits for another in the bootstrap (a rank that failed after
// serving the store would leave its peers waiting for it until their timeout).
// `keep(handle, store)` sees the membership's prefixed store before the object takes it.
struct KeepNothing {
  template <typename Handle>
  void operator()(Handle&, const std::shared_ptr<comm::Store>&) const {}
};
template <typename Handle, typename Object, typename Check, typename Keep = KeepNothing>
gradex_status_t create_entry(const char* function, const gradex_engine_options_t* options,
                             Handle** out, const char* out_name, const char* default_prefix,
                             std::unique_ptr<Object> Handle::*object, Check&& check,
                             Keep keep = {}) {
  return guarded(function, [&] {
    require(options, "options");
    require(out, out_name);
    auto config = config_from_options(*options);
    check(config);
    auto m = first_membership(*options, config, default_prefix);
    auto created = std::make_unique<Handle>();
    created->store = m.reusable_store;
    created->prefix = m.prefix;
    keep(*created, m.store);
    created.get()->*object = std::make_unique<Object>(std::move(config), std::move(m.store), m.rank,
                                                      m.world_size, GRADEX_API_VERSION);
    *out = created.release();
  });
}

// gradex_engine_destroy / gradex_outer_destroy: NULL is a no-op; otherwise the object (member
// `object` of the handle) is shut down, its failure reported, and the handle freed either way.
template <typename Handle, typename Object>
gradex_status_t destroy_entry(const char* function, Handle* handle,
                              std::unique_ptr<Object> Handle::*object) {
  if (handle == nullptr) return GRADEX_OK;
  gradex_status_t status = guarded(function, [&] {
    if (handle->*object) (handle->*object)->shutdown();
  });
  delete handle;
  return status;
}

// The save/load pair of a handle's serialized state (engine, outer optimizer, its shared part):
// `object_of(handle)` resolves the handle (throwing for a NULL one), then the state is copied out
// (`save`, a member returning std::vector<uint8_t>) or in (`load`, a member taking bytes and a
// size).
template <typename Handle, typename ObjectOf, typename Save>
gradex_status_t save_state_entry(const char* function, Handle* handle, ObjectOf&& object_of,
                                 Save save, void* buffer, size_t capacity, size_t* length) {
  return guarded(function, [&] {
    auto& object = object_of(handle);
    require(length, "length");
    copy_state_out(std::invoke(save, object), buffer, capacity, length);
  });
}

template <typename Handle, typename ObjectOf, typename Load>
gradex_status_t load_state_entry(const char* function, Handle* handle, ObjectOf&& object_of,
                                 Load load, const void* buffer, size_t length) {
  return guarded(function, [&] {
    auto& object = object_of(handle);
    require(buffer, "buffer");
    std::invoke(load, object, static_cast<const uint8_t*>(buffer), length);
  });
}

}  // namespace gradex::capi
