// What every C API entry point shares (capi/gradex.cc, capi/outer.cc): exceptions become a status
// plus the thread's gradex_last_error() message, NULL arguments are named, and serialized state is
// copied out in the documented two-call form. Internal to libgradex.
#pragma once

#include <cstdint>
#include <cstring>
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

}  // namespace gradex::capi
