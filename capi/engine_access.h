// For in-tree tests and tools linked against gradex_capi_static: the C++ engine behind a C handle.
// Not part of the public API (libgradex.so does not export it).
#pragma once

#include <string>

#include "gradex/gradex.h"
#include "sync/engine.h"

namespace gradex::capi {

sync::Engine& engine_of(gradex_engine_t* engine);

// Sets the calling thread's gradex_last_error() message (for C API functions in other files).
void set_last_error(const std::string& message);

}  // namespace gradex::capi
