// Argument checks shared by every backend, so that a bad call fails the same way (InvalidArgument
// naming the operation and what was wrong) whichever backend runs it. Backend's public calls run
// them (their definitions are in validate.cc); a backend runs them itself only for its own
// entries (a DGC state's step, the CUDA backend's copies). They read only host values:
// device data is validated before it reaches a backend (wire::decode validates payloads).
#pragma once

#include <cstddef>
#include <cstdint>

#include "base/dtype.h"
#include "compress/backend/backend.h"
#include "compress/options.h"

namespace gradex::compress::backend {

// "<backend> <call>" (e.g. "cpu to_half"), the operation a check names, composed without
// allocating (calls are truncated to fit).
class OpName {
 public:
  OpName(DeviceType backend, const char* call);
  operator const char*() const { return text_; }

 private:
  char text_[48];
};

// Throws unless type is kFloat16 or kBFloat16.
void require_half_type(DType type, const char* op);
// Throws when n > 0 and any pointer is null.
void require_pointers(size_t n, const char* op, const void* a,
                      const void* b = reinterpret_cast<const void*>(1));
// Throws when entries overlap in the bucket, have null data, or their offsets + numel overflow.
// Returns the bucket elements the entries span (max offset + numel).
size_t check_fusion(const FusionEntry* entries, size_t count, const void* bucket, const char* op);
// Throws when g is null, or u is null while momentum > 0 (n > 0), or momentum is outside [0, 1).
void check_momentum(const float* g, const float* u, size_t n, float momentum, const char* op);
// Throws for numel > 2^32 (uint32 indices) and invalid options.
void check_dgc(size_t numel, const DgcOptions& options, const char* op);
// Largest selected count any step of `options` can produce over numel elements (the size of a
// state's selection buffers): the count cap at the schedule's lowest sparsity.
size_t max_selected_count(size_t numel, const DgcOptions& options);

}  // namespace gradex::compress::backend
