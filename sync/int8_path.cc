// The backends' side of the dense quantized route, 8 or 4 bits (sync/int8_exchange.h; the route
// objects are sync/route/int8.cc): each tensor's values reach the exchange through its backend
// (BackendPath::int8_average: host tensors in place, device tensors through host memory). The
// residuals live in TensorState (host memory, saved with the engine's state).
#include "sync/backend_lane.h"
#include "sync/backend_path.h"
#include "sync/backend_tensor.h"
#include "sync/int8_exchange.h"
#include "sync/pipeline.h"

namespace gradex::sync {
namespace {

// Sizes a tensor's residuals for the route at `world` ranks. A new membership moves the segments
// a rank owns, so the owner residual it kept goes into its contribution residual (world copies of
// it make up the same share of the average).
void ready_residuals(TensorState& t, int world) {
  if (t.int8_residual.size() != t.numel) {
    t.int8_residual.assign(t.numel, 0.0f);
    t.int8_owner_residual.assign(t.numel, 0.0f);
  } else if (t.int8_world != world && t.int8_world != 0) {
    const float P = static_cast<float>(world);
    for (size_t i = 0; i < t.numel; ++i) {
      t.int8_residual[i] += P * t.int8_owner_residual[i];
      t.int8_owner_residual[i] = 0.0f;
    }
  }
  if (t.int8_owner_residual.size() != t.numel) t.int8_owner_residual.assign(t.numel, 0.0f);
  t.int8_world = world;
}

}  // namespace

void BackendPath::int8_average(comm::Communicator& comm, const std::vector<TensorState*>& tensors,
                               const std::vector<float*>& values, const std::vector<bool>& absent,
                               int bits, bool one_hop, Int8Counters& counters) {
  const int world = comm.size();
  std::vector<Int8Item> items(tensors.size());
  std::vector<std::vector<float>> host(tensors.size());  // device tensors' values
  for (size_t i = 0; i < tensors.size(); ++i) {
    TensorState& t = *tensors[i];
    Lane& l = lane(*t.backend->backend);
    wait_ready(t, l);  // the prepare stage's work on it
    ready_residuals(t, world);
    float* v = values[i];
    if (!t.backend->backend->host_accessible()) {
      host[i] = download(t, v, t.numel);
      staged_bytes_ += t.numel * 4;
      v = host[i].data();
    }
    items[i] = {v, t.numel, absent[i] ? nullptr : t.int8_residual.data(),
                t.int8_owner_residual.data(), &t.key};
  }
  int8_allreduce(comm, items, bits, counters, one_hop);
  for (size_t i = 0; i < tensors.size(); ++i) {
    TensorState& t = *tensors[i];
    Lane& l = lane(*t.backend->backend);
    if (!host[i].empty()) {
      upload(t, values[i], host[i].data(), t.numel);
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
}

}  // namespace gradex::sync
