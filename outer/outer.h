// outer/: DiLoCo's outer optimization, a layer beside the engine (sync/). It owns a communicator
// and a background thread of its own, so its exchanges never compete with an Engine's for either.
// This is the one header capi/ and the tests include.
//
//   OuterOptimizer outer(config, store, rank, world_size, api_version);  // GRADEX_OUTER_*;
//   collective outer.add_tensor("w", w, numel, false);  // the same tensors in the same order on
//   every rank outer.start();                           // rank 0's values become every rank's
//   global copy for (...) { inner_step(); outer.step(); }  // each fragment is exchanged every H
//   steps outer.synchronize();                     // finish what is in flight; every rank holds
//   one model
//
// The pseudo-gradient theta_global - theta_local travels through the codecs of outer/codecs.h
// (exact fp32, block quantization with error feedback, or top-k); fragments.h is Streaming DiLoCo's
// schedule. Depends on base/, compress/, comm/ and sync/'s agreement and byte serialization
// (sync/negotiation/agreement.h, sync/data/byte_io.h); nothing below includes outer/.
#pragma once

#include "outer/codecs.h"
#include "outer/fragments.h"
#include "outer/outer_optimizer.h"
#include "outer/outer_options.h"
