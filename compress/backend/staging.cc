#include "compress/backend/staging.h"

#include <cstring>
#include <string>

#include "base/error.h"

namespace gradex::compress::backend {
namespace {

// Grows `buf` (allocated by `make`) to at least `bytes`; contents are not kept.
template <class Make>
void reserve(BufferPtr& buf, size_t bytes, Make make) {
  if (!buf || buf->bytes() < bytes) {
    buf.reset();
    buf = make(bytes);
  }
}

}  // namespace

SelectionStager::SelectionStager(Backend& backend)
    : backend_(backend), done_(backend.create_event()) {}

wire::SparseRef SelectionStager::stage(DgcState& state, const DgcStepInfo& info, Stream& stream) {
  wire::SparseRef ref;
  ref.numel = state.numel();
  ref.count = info.count;
  ref.value_dtype = state.options().value_dtype;
  if (info.count > state.capacity())
    throw InvalidArgument("SelectionStager: " + std::to_string(info.count) +
                          " selected elements exceed the state's capacity " +
                          std::to_string(state.capacity()));
  if (backend_.host_accessible() || info.count == 0) {
    ref.indices = state.selected_indices();
    ref.values = state.selected_values();
    return ref;
  }
  const size_t half = info.count * 4;
  reserve(host_, 2 * half, [&](size_t b) { return backend_.allocate_staging(b); });
  auto* idx = host_->as<uint32_t>();
  auto* val = reinterpret_cast<float*>(host_->as<char>() + half);
  backend_.copy(idx, state.selected_indices(), half, stream);
  backend_.copy(val, state.selected_values(), half, stream);
  done_->record(stream);
  done_->synchronize();
  bytes_ += 2 * half;
  ref.indices = idx;
  ref.values = val;
  return ref;
}

PayloadApplier::PayloadApplier(Backend& backend)
    : backend_(backend), copied_(backend.create_event()) {}

void PayloadApplier::apply(const wire::DecodedPayload& p, float* out, size_t numel, float scale,
                           Stream& stream) {
  if (numel != p.header.numel)
    throw InvalidArgument("PayloadApplier: buffer of " + std::to_string(numel) +
                          " elements for a payload of " + std::to_string(p.header.numel));
  if (p.indices.size() != p.values.size())
    throw InvalidArgument("PayloadApplier: payload has mismatched index and value counts");
  const size_t count = p.indices.size();
  if (count == 0) return;
  if (backend_.host_accessible()) {
    backend_.scatter_add(p.indices.data(), p.values.data(), count, out, numel, scale, stream);
    return;
  }
  const size_t half = count * 4;
  copied_->synchronize();  // the previous apply's upload has left the staging buffer
  reserve(host_, 2 * half, [&](size_t b) { return backend_.allocate_staging(b); });
  reserve(device_, 2 * half, [&](size_t b) { return backend_.allocate(b); });
  std::memcpy(host_->data(), p.indices.data(), half);
  std::memcpy(host_->as<char>() + half, p.values.data(), half);
  backend_.copy(device_->data(), host_->data(), 2 * half, stream);
  copied_->record(stream);
  bytes_ += 2 * half;
  backend_.scatter_add(device_->as<uint32_t>(),
                       reinterpret_cast<const float*>(device_->as<char>() + half), count, out,
                       numel, scale, stream);
}

}  // namespace gradex::compress::backend
