// What the engine keeps per registered tensor. Owned by the engine; touched by the progress thread
// only while a handle of that tensor is in flight (which is what makes save/restore race-free).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "base/dtype.h"
#include "sync/policy.h"

namespace gradex::sync {

class SparseCodec;    // sync/sparse_exchange.h
struct DeviceTensor;  // sync/device_tensor.h

struct TensorState {
  std::string key;
  uint64_t numel = 0;
  DType dtype = DType::kFloat32;
  TensorPolicy policy;
  std::unique_ptr<SparseCodec> codec;  // DGC state; set when policy.kind == kSparse (host path)
  // Set when the tensor's state lives in a device backend (sync/device_path.h): then codec and
  // momentum stay empty and the backend holds DGC's u and v or the dense momentum.
  std::unique_ptr<DeviceTensor> device;
  std::vector<float> scratch;  // fp32 view of a 16-bit tensor (sparse path, momentum)
  // gradex's momentum u of a dense-policy tensor (GRADEX_MOMENTUM > 0; empty until first used).
  // DGC tensors keep theirs inside the codec.
  std::vector<float> momentum;
  // The tensor's exchange counter: how many gradient exchanges of it every rank has negotiated.
  // Carried in negotiation (ranks agree on the maximum) and drives DGC's schedule.
  uint64_t step = 0;
  std::vector<float> anchor;  // LocalSGD: the last averaged parameters (empty before the first)
  uint64_t exchanges = 0;

  TensorState();
  ~TensorState();
  TensorState(TensorState&&) noexcept;
};

}  // namespace gradex::sync
