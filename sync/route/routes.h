// The route objects, one per file of sync/route/; select.cc maps a path to its object.
#pragma once

#include "sync/route/route.h"

namespace gradex::sync::route {

const Transfer& dense_route();                // dense.cc
const Transfer& dense_fp32_route();           // dense_fp32.cc
const Transfer& first_average_route();        // first_average.cc
const Transfer& int8_route();                 // int8.cc (8-bit codes)
const Transfer& int4_route();                 // int8.cc (the same route at 4 bits)
const Transfer& sparse_route();               // sparse.cc
const Transfer& sparse_hierarchical_route();  // sparse_hierarchical.cc

// The DGC routes' plan step: the link probe before the first gather (sparse.cc).
void plan_sparse(Context& ctx);
// The DGC routes' message (sparse.cc): the jobs' payloads framed in job order, riders last;
// and every rank's (or host's) message split back into each job's payloads.
void pack_sparse(pipeline::Unit& unit, const JobWork& work);
Payloads unpack_sparse(const pipeline::Unit& unit, const Context& ctx);
// The codec a DGC unit's stages ran: its first non-rider job's (DGC or the Adam codec).
Codec sparse_codec_of(const pipeline::Unit& unit);

}  // namespace gradex::sync::route
