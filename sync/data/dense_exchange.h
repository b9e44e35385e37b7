// Dense averaging of many tensors at once: the items are one fusion bucket (the dense route's
// unit: the routes' packing, route::pack, sync/route/select.cc, is the only place that fuses),
// staged on their backends (BackendPath::stage_dense, sync/data/dense_exchange.cc), summed with one
// allreduce by the route (route::dense_allreduce, sync/route/dense_bucket.cc), then unstaged as
// averages (BackendPath::unstage_dense).
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
#include "sync/engine/options.h"

namespace gradex::compress::backend {
class Backend;
}  // namespace gradex::compress::backend

namespace gradex::sync {

struct DenseItem {
  void* data = nullptr;  // in: this rank's values; out: the average over ranks
  DType dtype = DType::kFloat32;
  uint64_t numel = 0;
  bool nonfinite_result = false;     // out: the average holds NaN/Inf
  const std::string* key = nullptr;  // for error messages (a collective that fails names it)
};

struct DenseExchangeOptions {
  bool half_on_wire = true;
  DType half_type = DType::kFloat16;
  NonFinitePolicy nonfinite = NonFinitePolicy::kPropagate;
  // Non-null: the bucket is summed by comm::hierarchical_allreduce_sum over this layout (its step
  // across the hosts direct when `direct`).
  const comm::HostTopology* hierarchy = nullptr;
  // Otherwise by comm::direct_allreduce_sum when set (the same bits as the ring, fewer message
  // latencies; the dense routes' rule decides), else by the ring.
  bool direct = false;
};

// One item as the staging sees it: fp32 values in `backend`'s memory.
struct DenseView {
  compress::backend::Backend* backend = nullptr;
  float* data = nullptr;
  size_t numel = 0;
};

// A bucket staged for its allreduce: `count` values of `wire` at `bytes` (host memory the
// BackendPath owns until the next bucket), and what unstaging needs.
struct DenseBucket {
  int world = 1;
  DType wire = DType::kFloat32;
  uint8_t* bytes = nullptr;
  size_t count = 0;
  std::vector<DenseView> views;
};

struct DenseCounters {
  uint64_t saturated = 0;
  const std::string* first_saturated = nullptr;  // the first item whose cast saturated
  uint64_t nonfinite = 0;
  uint64_t wire_bytes = 0;  // bytes this rank sent for the buckets
  double cast_seconds = 0;
  double communicate_seconds = 0;
};

// The fusion rule (route::pack, sync/route/select.cc), so that every rank cuts the same buckets:
// items join the open bucket in order while its wire bytes stay within max(fusion_bytes, one
// element); a larger item travels alone.
inline size_t fusion_limit(size_t fusion_bytes, size_t elem) {
  return std::max(fusion_bytes, elem);
}
}  // namespace gradex::sync
