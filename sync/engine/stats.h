// Counters the engine keeps; mirrored one-to-one by gradex_stats_t in the C API.
#pragma once

#include <cstdint>
#include <string>

namespace gradex::sync {

struct Stats {
  uint64_t steps = 0;
  uint64_t tensors = 0;
  uint64_t bytes_sent = 0;  // data-plane bytes (payloads, buckets) this rank sent
  uint64_t bytes_received = 0;
  uint64_t control_bytes = 0;  // negotiation messages (not in bytes_sent)
  uint64_t dense_bytes = 0;    // a dense fp32 ring allreduce's bytes for the same exchanges
  uint64_t sparse_exchanges = 0;
  uint64_t dense_fallbacks = 0;
  uint64_t saturated = 0;
  uint64_t nonfinite = 0;
  uint64_t parameter_averages = 0;
  // Device path: bytes copied between device memory and host staging memory (DGC selections,
  // received payloads, 16-bit dense buckets; 0 on host backends, which copy nothing).
  uint64_t staged_bytes = 0;
  double compress_seconds = 0;
  double communicate_seconds = 0;
  double decode_seconds = 0;
  // What the framework waited on gradex: per step, from its last submission to its last completion
  // when that came later (the end of a backward pass waiting on its buckets, an optimizer step
  // waiting on its gradients), summed over steps (Engine::end_step).
  double exposed_seconds = 0;
  // Tensors whose codec a GRADEX_POLICY=auto plan changed, its first plan included.
  uint64_t policy_switches = 0;
  // The first tensor (key) whose values were clamped to the 16-bit range / held NaN or Inf on this
  // rank, for the one-time warning that names it (sync/engine/stats_report.h); "" until it happens.
  // Kept as they are by minus().
  std::string first_saturated_tensor;
  std::string first_nonfinite_tensor;

  double compression_ratio() const {
    return bytes_sent == 0 ? 0.0
                           : static_cast<double>(dense_bytes) / static_cast<double>(bytes_sent);
  }
  Stats minus(const Stats& earlier) const;
  // The counters of two engines together (the delayed exchange's lanes, sync/delay/delay_lanes.h):
  // sums, except `steps` (the larger: both count the same steps) and the first tensors (this one's
  // when it has one).
  Stats plus(const Stats& other) const;
};

// Bytes one rank sends in a ring allreduce of `bytes` over `world` ranks: 2 (P-1)/P * bytes.
inline uint64_t ring_allreduce_bytes(uint64_t bytes, int world) {
  return world <= 1 ? 0
                    : 2 * bytes * static_cast<uint64_t>(world - 1) / static_cast<uint64_t>(world);
}

}  // namespace gradex::sync
