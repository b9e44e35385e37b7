// DGC's host-level re-selection (the hierarchical exchange, docs/collectives.md): the selections
// of one host's ranks are summed and the largest of the sums kept, so that one payload per host
// crosses hosts; what is not kept must return to a residual (the shard owner's) so that error
// feedback stays exact.
#pragma once

#include <cstdint>
#include <vector>

#include "base/dtype.h"
#include "compress/wire/codec.h"

namespace gradex::compress::backend {

struct HostSelection {
  std::vector<uint32_t> kept_indices;  // strictly increasing
  std::vector<float> kept_values;      // exactly representable in the value dtype
  // What the kept values do not carry, strictly increasing indices: the whole sum of every index
  // not kept, and sum - kept where rounding to the value dtype changed a kept value.
  wire::DecodedPayload dropped;
};

// local: the host's payloads of one tensor in local rank order (equal numel). The sum of index i
// is 0 + p_0[i] + p_1[i] + ... over the payloads holding i, in that order (fp32). Keeps the
// max(selected count of any payload) sums of largest magnitude (ties: the lower index), rounded
// to `value_dtype`. kept + dropped == the sum, element by element (up to the fp32 rounding of
// sum - kept).
void reselect_host_sum(const std::vector<const wire::DecodedPayload*>& local, DType value_dtype,
                       HostSelection& out);

}  // namespace gradex::compress::backend
