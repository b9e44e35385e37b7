#include "sync/engine/tensor_table.h"

namespace gradex::sync {

std::string work_name(const WorkId& id) {
  return (id.kind == WorkKind::kGradient ? "tensor '" : "parameters '") + id.key + "'";
}

TensorState& TensorTable::at(const std::string& key) {
  auto it = tensors.find(key);
  if (it == tensors.end()) throw InvalidArgument("tensor '" + key + "' was never registered");
  return it->second;
}

const TensorState& TensorTable::at(const std::string& key) const {
  return const_cast<TensorTable*>(this)->at(key);
}

uint64_t TensorTable::open(const WorkId& id, void* data, float clip_scale, bool absent) {
  const uint64_t h = next_handle++;
  Handle& handle = handles[h];
  handle.id = id;
  handle.data = data;
  handle.clip_scale = clip_scale;
  handle.absent = absent;
  return h;
}

void TensorTable::complete(const WorkId& id, ErrorCode code, const std::string& message) {
  auto it = in_flight.find(id);
  if (it == in_flight.end()) return;
  Handle& h = handles[it->second];
  h.done = true;
  h.code = code;
  h.message = message;
  in_flight.erase(it);
}

void TensorTable::fail_in_flight(ErrorCode code, const std::string& message, bool prefix_name) {
  for (auto& [id, h] : in_flight) {
    Handle& handle = handles[h];
    handle.done = true;
    handle.code = code;
    handle.message = prefix_name ? work_name(id) + message : message;
  }
  in_flight.clear();
}

std::string TensorTable::with_own_size(const NegotiationFailure& f, int rank) const {
  const std::string own = "rank " + std::to_string(rank) + ": ";
  auto t = tensors.find(f.id.key);
  if (t == tensors.end() || f.message.find(own) != std::string::npos || f.message.empty() ||
      f.message.back() != ')')
    return f.message;
  return f.message.substr(0, f.message.size() - 1) + ", " + own + std::to_string(t->second.numel) +
         " x " + dtype_name(t->second.dtype) + " (not yet announced))";
}

}  // namespace gradex::sync
