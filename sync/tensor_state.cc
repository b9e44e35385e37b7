#include "sync/tensor_state.h"

#include "sync/sparse_exchange.h"

namespace gradex::sync {

// Out of line because SparseCodec is incomplete in the header.
TensorState::TensorState() = default;
TensorState::~TensorState() = default;
TensorState::TensorState(TensorState&&) noexcept = default;

}  // namespace gradex::sync
