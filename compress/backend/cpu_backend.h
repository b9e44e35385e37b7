// The CPU backend: backend memory is host memory and every operation is compress/'s CPU code
// (DgcCompressor, half::, plain copies, wire::accumulate's arithmetic). The engine's reference.
#pragma once

#include "compress/backend/backend.h"

namespace gradex::compress::backend {

BackendPtr make_cpu_backend();

}  // namespace gradex::compress::backend
