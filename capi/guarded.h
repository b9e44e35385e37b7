// What every C API entry point shares (capi/gradex.cc, capi/outer.cc): exceptions become a status
// plus the thread's gradex_last_error() message, NULL arguments are named, and serialized state is
// copied out in the documented two-call form (and in, by the same checks). Internal to libgradex.
#pragma once

#include <cstdint>
#include <cstring>
#include <functional>
#include <new>
#include <string>
#include <vector>

#include "base/error.h"
#include "capi/engine_access.h"
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
