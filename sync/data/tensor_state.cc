#include "sync/data/tensor_state.h"

#include "sync/data/backend_tensor.h"

namespace gradex::sync {

// Out of line because BackendTensor is incomplete in the header.
TensorState::TensorState() = default;
TensorState::~TensorState() = default;
TensorState::TensorState(TensorState&&) noexcept = default;

}  // namespace gradex::sync
