// What the three fused dense routes (kDense, kDenseFp32, kFirstAverage) share: one fusion bucket
// (the unit, route::pack) averaged by sync/data/dense_exchange.h through the tensors' backends, by
// the direct exchange or the ring as the one rule says (route.h: dense_direct_max_bytes). They
// differ only in the wire type, which each route's file fixes.
#pragma once

#include "sync/route/route.h"

namespace gradex::sync::route {

// GRADEX_DENSE_COLLECTIVE=auto needs the agreed link model (the probe) to choose direct or ring
// per bucket: agreed here, before the unit's bytes are counted, when the choice exists (more than
// two ranks, flat exchange).
void plan_dense(Context& ctx);

// A tensor leaving the 8-bit route takes its residuals along (error feedback stays exact).
void fold_int8_residuals(pipeline::Unit& unit, Context& ctx);

// The bucket's average: on the dense wire type (GRADEX_FP16/BF16), or fp32 when `fp32_wire`.
// Sets each job's nonfinite_result, the unit's cast, saturation and transfer counters, and its
// sample (what it ran).
void exchange_dense(pipeline::Unit& unit, Context& ctx, bool fp32_wire);

}  // namespace gradex::sync::route
