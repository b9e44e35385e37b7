#include "sync/tensor_state.h"

#include "sync/device_tensor.h"
#include "sync/sparse_exchange.h"

namespace gradex::sync {

// Out of line because SparseCodec and DeviceTensor are incomplete in the header.
TensorState::TensorState() = default;
TensorState::~TensorState() = default;
TensorState::TensorState(TensorState&&) noexcept = default;

}  // namespace gradex::sync
