// The one place a tensor's sparse codec is built. The engine's tensors (BackendPath) and the auto
// policy's start-up calibration (sync/policy/codec_calibration.h) both build through it, so the
// codec the cost model measured is, by construction, the codec the engine runs.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "base/config.h"
#include "compress/backend/backend.h"
#include "compress/backend/dgc_codec.h"
#include "compress/options.h"
#include "sync/engine/options.h"
#include "sync/policy/policy.h"

namespace gradex::sync {

// `kind` is a sparse codec of the policy vocabulary (sync/policy/policy.h): Codec::kDgc (top-k of
// momentum-corrected gradients with error feedback, SGD family) or Codec::kAdam (top-k of a
// decaying first-moment buffer, GRADEX_OPTIMIZER=adam; on the chunked DCT when
// GRADEX_ADAM_TRANSFORM=dct, blocks of at most options.adam.dct_chunk). The engine's tensors run
// sparse_codec(options).

// The options of a sparse tensor's codec at `sparsity`: no clipping inside the codec (the engine
// clips by the whole step's norm); the Adam codec takes no momentum (the optimizer keeps its
// moments) and runs on the DCT's blocks when options.adam.dct_chunk > 0.
compress::DgcOptions sparse_codec_options(Codec kind, const config::Config& config,
                                          const EngineOptions& options, int world_size,
                                          double sparsity);

// A codec for `numel` elements (`rows` output rows, 0: unknown; the DCT shapes its blocks by them)
// on `backend`. `dgc` carries the sparsity and momentum; `options` the Adam codec's decay and
// transform.
std::unique_ptr<compress::backend::DgcCodec> make_sparse_codec(
    Codec kind, compress::backend::Backend& backend, const std::string& key, uint64_t numel,
    uint64_t rows, const compress::DgcOptions& dgc, const compress::WireOptions& wire,
    const EngineOptions& options);

}  // namespace gradex::sync
