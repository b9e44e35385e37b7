// What the engine keeps per registered tensor. Owned by the engine; touched by the progress thread
// only while a handle of that tensor is in flight (which is what makes save/restore race-free).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "base/dtype.h"
#include "sync/policy/policy.h"

namespace gradex::sync {

struct BackendTensor;  // sync/data/backend_tensor.h

struct TensorState {
  std::string key;
  uint64_t numel = 0;
  DType dtype = DType::kFloat32;
  uint64_t rows = 0;  // output rows when the plugin registered them (0: unknown)
  AppliedPolicy policy;
  // The tensor's state in its backend (sync/data/backend_path.h): DGC's u and v, or the dense
  // momentum; set at registration.
  std::unique_ptr<BackendTensor> backend;
  // The tensor's exchange counter: how many gradient exchanges of it every rank has negotiated.
  // Carried in negotiation (ranks agree on the maximum) and drives DGC's schedule.
  uint64_t step = 0;
  // The 8-bit route's error feedback (sync/data/int8_exchange.h), host memory, sized at the first
  // 8-bit exchange: this rank's contribution residual and its owner residual (non-zero only on the
  // segments it owns at world size int8_world). Empty: none (never on the route, or folded back).
  std::vector<float> int8_residual;
  std::vector<float> int8_owner_residual;
  int int8_world = 0;
  // The layout the residuals were kept under (sync/data/int8_path.cc's residual_layout; 0: not
  // known, the flat exchange at int8_world).
  uint64_t int8_layout = 0;
  std::vector<float> anchor;  // LocalSGD: the last averaged parameters (empty before the first)
  uint64_t exchanges = 0;

  TensorState();
  ~TensorState();
  TensorState(TensorState&&) noexcept;
};

}  // namespace gradex::sync
