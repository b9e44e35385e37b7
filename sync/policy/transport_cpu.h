// The transport's CPU per byte, measured alone on this host: what sending a byte and
// receiving it costs the kernel and the caller (socket copies, protocol work), the part of a
// collective's time that a CPU-bound host pays whatever its link's rate. GRADEX_POLICY=auto prices
// the dense ring with it (CodecCosts::transport_s_per_byte, sync/policy/codec_choice.h).
#pragma once

#include <cstddef>

namespace gradex::sync::cost {

struct TransportSample {
  size_t bytes = 0;          // sent and received (each byte once each way)
  double seconds = 0;        // the least run's CPU time of this thread (kernel work included)
  double wall_seconds = 0;   // the least run's wall time (for comparison: contention inflates it)
  const char* via = "none";  // "tcp loopback" or "unix socket pair"
};

// One thread writes `bytes` through a TCP connection over this host's loopback and reads them
// back in `chunk`-byte pieces (non-blocking, so neither side waits for the other), `repeats`
// times; the least run is returned, timed by this thread's CPU clock (CLOCK_THREAD_CPUTIME_ID:
// the system calls' copies and the loopback's protocol work run on this thread), so that other
// programs on the host do not inflate it. Without a loopback interface (a bare network namespace) a
// Unix socket pair stands in. {0, 0, "none"} when neither can be made; never throws.
TransportSample measure_transport(size_t bytes = 8u << 20, size_t chunk = 64u << 10,
                                  int repeats = 3);

}  // namespace gradex::sync::cost
