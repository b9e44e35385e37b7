// For in-tree tests and tools linked against gradex_capi_static: the C++ engine behind a C handle.
// Not part of the public API (libgradex.so does not export it).
#pragma once

#include "gradex/gradex.h"
#include "sync/engine.h"

namespace gradex::capi {

sync::Engine& engine_of(gradex_engine_t* engine);

}  // namespace gradex::capi
