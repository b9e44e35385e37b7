#include "sync/engine/stats.h"

#include <algorithm>

namespace gradex::sync {

Stats Stats::minus(const Stats& e) const {
  Stats d;
  d.steps = steps - e.steps;
  d.tensors = tensors - e.tensors;
  d.bytes_sent = bytes_sent - e.bytes_sent;
  d.bytes_received = bytes_received - e.bytes_received;
  d.control_bytes = control_bytes - e.control_bytes;
  d.dense_bytes = dense_bytes - e.dense_bytes;
  d.sparse_exchanges = sparse_exchanges - e.sparse_exchanges;
  d.dense_fallbacks = dense_fallbacks - e.dense_fallbacks;
  d.saturated = saturated - e.saturated;
  d.nonfinite = nonfinite - e.nonfinite;
  d.parameter_averages = parameter_averages - e.parameter_averages;
  d.staged_bytes = staged_bytes - e.staged_bytes;
  d.compress_seconds = compress_seconds - e.compress_seconds;
  d.communicate_seconds = communicate_seconds - e.communicate_seconds;
  d.decode_seconds = decode_seconds - e.decode_seconds;
  d.exposed_seconds = exposed_seconds - e.exposed_seconds;
  d.policy_switches = policy_switches - e.policy_switches;
  d.first_saturated_tensor = first_saturated_tensor;
  d.first_nonfinite_tensor = first_nonfinite_tensor;
  return d;
}

Stats Stats::plus(const Stats& o) const {
  Stats d;
  d.steps = std::max(steps, o.steps);
  d.tensors = tensors + o.tensors;
  d.bytes_sent = bytes_sent + o.bytes_sent;
  d.bytes_received = bytes_received + o.bytes_received;
  d.control_bytes = control_bytes + o.control_bytes;
  d.dense_bytes = dense_bytes + o.dense_bytes;
  d.sparse_exchanges = sparse_exchanges + o.sparse_exchanges;
  d.dense_fallbacks = dense_fallbacks + o.dense_fallbacks;
  d.saturated = saturated + o.saturated;
  d.nonfinite = nonfinite + o.nonfinite;
  d.parameter_averages = parameter_averages + o.parameter_averages;
  d.staged_bytes = staged_bytes + o.staged_bytes;
  d.compress_seconds = compress_seconds + o.compress_seconds;
  d.communicate_seconds = communicate_seconds + o.communicate_seconds;
  d.decode_seconds = decode_seconds + o.decode_seconds;
  d.exposed_seconds = exposed_seconds + o.exposed_seconds;
  d.policy_switches = policy_switches + o.policy_switches;
  d.first_saturated_tensor =
      first_saturated_tensor.empty() ? o.first_saturated_tensor : first_saturated_tensor;
  d.first_nonfinite_tensor =
      first_nonfinite_tensor.empty() ? o.first_nonfinite_tensor : first_nonfinite_tensor;
  return d;
}

}  // namespace gradex::sync
