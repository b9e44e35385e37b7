// The configuration a C API caller describes: the environment's GRADEX_* values overridden by the
// caller's name/value pairs (a name set through the API is not read from the environment at all).
// One home for what gradex_engine_create, gradex_outer_create, gradex_store_connect and
// gradex_check_config all parse.
#pragma once

#include <cstddef>

#include "base/config.h"
#include "gradex/gradex.h"

namespace gradex::capi {

// InvalidArgument naming the entry for a NULL name or value.
config::Config config_from_pairs(size_t count, const char* const* names, const char* const* values);

// VersionError when `options` was filled by a plugin built for another API version, then the
// configuration of its config_* pairs.
config::Config config_from_options(const gradex_engine_options_t& options);

}  // namespace gradex::capi
