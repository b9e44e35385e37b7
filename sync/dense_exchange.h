// Dense averaging of many tensors at once (BackendPath::dense_average, sync/dense_exchange.cc):
// tensors are packed into fusion buckets of at most `fusion_bytes` wire bytes, each bucket is
// summed with one ring allreduce, then unpacked as averages.
//   16-bit wire: values are divided by the world size before the cast (sums cannot overflow);
//                finite values beyond the 16-bit range saturate and are counted.
//   fp32 wire:   sums in fp32, then divides by the world size (the same as an exact reference that
//                sums in ring order and divides).
// Non-finite inputs are counted; with NonFinitePolicy::kZero they are sent as 0, otherwise they
// travel (and so reach every rank, which is what lets kError fail the item consistently
// everywhere).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "base/dtype.h"
#include "comm/communicator.h"
#include "comm/topology/host_topology.h"
#include "sync/options.h"

namespace gradex::sync {

struct DenseItem {
  void* data = nullptr;  // in: this rank's values; out: the average over ranks
  DType dtype = DType::kFloat32;
  uint64_t numel = 0;
  bool nonfinite_result = false;     // out: the average holds NaN/Inf
  const std::string* key = nullptr;  // for error messages (a collective that fails names it)
};

struct DenseExchangeOptions {
  size_t fusion_bytes = 64u << 20;
  bool half_on_wire = true;
  DType half_type = DType::kFloat16;
  NonFinitePolicy nonfinite = NonFinitePolicy::kPropagate;
  // Non-null: buckets are summed by comm::hierarchical_allreduce_sum over this layout (its step
  // across the hosts direct where direct_for says so for the bucket's wire bytes).
  const comm::HostTopology* hierarchy = nullptr;
  // Otherwise by comm::direct_allreduce_sum where this says so for the bucket's wire bytes (the
  // same bits as the ring, fewer message latencies), else by the ring. Null: the ring.
  std::function<bool(uint64_t wire_bytes)> direct_for;
};

struct DenseCounters {
  uint64_t saturated = 0;
  const std::string* first_saturated = nullptr;  // the first item whose cast saturated
  uint64_t nonfinite = 0;
  uint64_t wire_bytes = 0;  // bytes this rank sent for the buckets
  double cast_seconds = 0;
  double communicate_seconds = 0;
};

// The fusion rule every packer shares (the dense exchange and the pipeline's planner), so that
// every rank cuts the same buckets: items join the open bucket in order while
// its wire bytes stay within max(fusion_bytes, one element); a larger item travels alone.
inline size_t fusion_limit(size_t fusion_bytes, size_t elem) {
  return std::max(fusion_bytes, elem);
}
// One past the last item of the bucket that starts at `begin` (items have a `numel`); `bytes`
// receives the bucket's wire bytes.
template <typename Items>
size_t fusion_bucket_end(const Items& items, size_t begin, size_t elem, size_t limit,
                         size_t& bytes) {
  size_t end = begin;
  bytes = 0;
  while (end < items.size() && (end == begin || bytes + items[end].numel * elem <= limit)) {
    bytes += items[end].numel * elem;
    ++end;
  }
  return end;
}

}  // namespace gradex::sync
