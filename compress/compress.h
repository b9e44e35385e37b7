// compress/: the gradient compression layer (no UCX). It turns one tensor's gradient into a
// payload and back; the sync engine drives it. This is the one header the engine includes.
//
//   DgcOptions o = dgc_options_from_config(config, world_size);
//   DgcCompressor dgc(numel, o);                           // one per tensor, stateful
//   if (dgc.density() >= 1.0 / (2 * P)) {                   // a dense exchange is cheaper
//     dgc.step_dense(grad, dense);                          // send `dense`; v is zeroed, u kept
//   } else {
//     const Selection& s = dgc.step(grad);                  // sorted indices + values
//     wire::encode(wire::sparse_ref(s), key, wire_options_from_config(config), bytes);
//   }
//   wire::DecodedPayload p; wire::decode(bytes.data(), bytes.size(), p);  // validates all
//   wire::accumulate(p, sum, numel, 1.0f / P);
//   half::to_half_predivided(grad, out16, numel, DType::kFloat16, P);     // dense 16-bit path
//
// Errors: CorruptPayload for payloads and state blobs that fail validation, InvalidArgument for
// bad calls, StateError for checkpoints that do not fit. CUDA kernels (when built) are behind
// compress/cuda/dgc_cuda.h.
#pragma once

#include "base/error.h"

#include "compress/dgc/compressor.h"
#include "compress/half/cast.h"
#include "compress/options.h"
#include "compress/wire/codec.h"
