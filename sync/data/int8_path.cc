// The backends' side of the dense quantized route, 8 or 4 bits (sync/data/int8_exchange.h; the
// route objects are sync/route/int8.cc): each tensor's values reach the exchange through its
// backend (BackendPath::stage_int8 / unstage_int8 around the route's int8_allreduce: host tensors
// in place, device tensors through host memory). The
// residuals live in TensorState (host memory, saved with the engine's state).
#include "sync/data/backend_lane.h"
#include "sync/data/backend_path.h"
#include "sync/data/backend_tensor.h"
#include "sync/data/int8_exchange.h"
#include "sync/engine/pipeline.h"

namespace gradex::sync {
namespace {

// Where a rank's owner residual may be non-zero depends on the layout it was kept under: the
// rank's segments at its world size in the flat exchange, its segments among the owners of the
// local shards it owns with a layout (sync/data/int8_exchange.h). Bit 0: a layout.
uint64_t residual_layout(int world, const comm::HostTopology* hierarchy, int rank) {
  if (hierarchy == nullptr) return static_cast<uint64_t>(world) << 1;
  const size_t r = static_cast<size_t>(rank);
  const size_t host = static_cast<size_t>(hierarchy->host_of[r]);
  uint64_t key = static_cast<uint64_t>(world);
  for (uint64_t part : {static_cast<uint64_t>(hierarchy->host_count()),
                        static_cast<uint64_t>(hierarchy->max_local()),
                        static_cast<uint64_t>(hierarchy->hosts[host].size()),
                        static_cast<uint64_t>(hierarchy->local_index[r])})
    key = key * 1000003u + part;
  return (key << 1) | 1u;
}

// Sizes a tensor's residuals for the route under `layout` (residual_layout). A new flat
// membership moves the segments a rank owns, so the owner residual it kept goes into its
// contribution residual (world copies of it make up the same share of the average). Any change
// to or from a layout moves the elements whose owner residual a rank may keep: both residuals go
// into the values about to be sent (`values`, host memory), whose sums take them on.
void ready_residuals(TensorState& t, int world, int rank, uint64_t layout, float* values) {
  if (t.int8_residual.size() != t.numel) {
    t.int8_residual.assign(t.numel, 0.0f);
    t.int8_owner_residual.assign(t.numel, 0.0f);
  } else if (t.int8_owner_residual.size() != t.numel) {
    t.int8_owner_residual.assign(t.numel, 0.0f);
  }
  // A state restored from a checkpoint (int8_layout 0) does not say its layout: it was the flat
  // exchange's at int8_world when every owner residual lies in this rank's segments there, and
  // is otherwise folded as any other layout's.
  uint64_t before = t.int8_layout;
  if (before == 0 && t.int8_world != 0) {
    before = static_cast<uint64_t>(t.int8_world) << 1;
    const comm::Segment mine = int8_segment(t.numel, t.int8_world, rank);
    for (size_t i = 0; i < t.numel && before != 1; ++i)
      if (t.int8_owner_residual[i] != 0.0f && (i < mine.begin || i >= mine.begin + mine.count))
        before = 1;  // no layout's: folded below
  } else if (before == 0) {
    before = layout;
  }
  if (before != layout && ((before | layout) & 1u) == 0) {
    const float P = static_cast<float>(world);
    for (size_t i = 0; i < t.numel; ++i) {
      t.int8_residual[i] += P * t.int8_owner_residual[i];
      t.int8_owner_residual[i] = 0.0f;
    }
  } else if (before != layout) {
    int8_fold_residuals(values, t.int8_residual.data(), t.int8_owner_residual.data(), t.numel,
                        world);
  }
  t.int8_world = world;
  t.int8_layout = layout;
}

}  // namespace

Int8Staging BackendPath::stage_int8(const std::vector<TensorState*>& tensors,
                                    const std::vector<float*>& values,
                                    const std::vector<bool>& absent, int world, int rank,
                                    const comm::HostTopology* hierarchy) {
  const uint64_t layout = residual_layout(world, hierarchy, rank);
  Int8Staging staging;
  staging.items.resize(tensors.size());
  staging.host.resize(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    TensorState& t = *tensors[i];
    Lane& l = lane(*t.backend->backend);
    wait_ready(t, l);  // the prepare stage's work on it
    float* v = values[i];
    if (!t.backend->backend->host_accessible()) {
      staging.host[i] = download(t, v, t.numel);
      staged_bytes_ += t.numel * 4;
      v = staging.host[i].data();
    }
    ready_residuals(t, world, rank, layout, v);
    // With a layout a rank's residual takes part whether or not the rank is absent: on the shards
    // it owns it stands for its group's sum (an absent rank adds zeros to it), elsewhere it carries
    // the error of this rank's own encoding inside the group.
    const bool own_residual = !absent[i] || hierarchy != nullptr;
    staging.items[i] = {v, t.numel, own_residual ? t.int8_residual.data() : nullptr,
                        t.int8_owner_residual.data(), &t.key};
  }
  return staging;
}

void BackendPath::unstage_int8(Int8Staging& staging, const std::vector<TensorState*>& tensors,
                               const std::vector<float*>& values) {
  for (size_t i = 0; i < tensors.size(); ++i) {
    TensorState& t = *tensors[i];
    Lane& l = lane(*t.backend->backend);
    if (!staging.host[i].empty()) {
      upload(t, values[i], staging.host[i].data(), t.numel);
      staged_bytes_ += t.numel * 4;
    }
    t.backend->ready->record(*l.stream);  // the finish stage waits
  }
}

void BackendPath::int8_fold(TensorState& t, float* values, int world) {
  if (t.int8_residual.size() != t.numel) return;
  Lane& l = lane(*t.backend->backend);
  wait_ready(t, l);
  if (t.backend->backend->host_accessible()) {
    l.synchronize();
    int8_fold_residuals(values, t.int8_residual.data(), t.int8_owner_residual.data(), t.numel,
                        world);
  } else {
    std::vector<float> v = download(t, values, t.numel);
    int8_fold_residuals(v.data(), t.int8_residual.data(), t.int8_owner_residual.data(), t.numel,
                        world);
    upload(t, values, v.data(), t.numel);
  }
  t.int8_residual.clear();
  t.int8_owner_residual.clear();
  t.int8_world = 0;
  t.int8_layout = 0;
  t.backend->ready->record(*l.stream);
}

void BackendPath::int8_to_dgc_residual(TensorState& t, int world) {
  if (t.int8_residual.size() != t.numel) return;
  compress::wire::DecodedPayload all;
  all.header.numel = t.numel;
  const float P = static_cast<float>(world);
  for (size_t i = 0; i < t.numel; ++i) {
    const float v = t.int8_residual[i] + P * t.int8_owner_residual[i];
    if (v == 0.0f) continue;
    all.indices.push_back(static_cast<uint32_t>(i));
    all.values.push_back(v);
  }
  all.header.selected = static_cast<uint32_t>(all.indices.size());
  return_to_residual(t, all);
  t.int8_residual.clear();
  t.int8_owner_residual.clear();
  t.int8_world = 0;
  t.int8_layout = 0;
}

}  // namespace gradex::sync
