// What the kernel lets one TCP flow reach on a long path, read once from /proc/sys, and the one
// line that names the limit and its fix. On a path of round trip R a flow moves at most one window
// per R: with net.ipv4.tcp_wmem's maximum of 4 MiB that is 0.67 Gbit/s at 50 ms, whatever the
// link; and with net.ipv4.tcp_slow_start_after_idle=1 every step's first flight after the compute
// phase (an idle connection) starts again from a small window.
#pragma once

#include <cstdint>
#include <string>

namespace gradex::comm {

struct TcpLimits {
  uint64_t rmem_max = 0;             // net.ipv4.tcp_rmem's maximum (receive autotuning's ceiling)
  uint64_t wmem_max = 0;             // net.ipv4.tcp_wmem's maximum
  std::string rmem_text, wmem_text;  // the three values as the kernel lists them
  bool slow_start_after_idle = false;
  std::string congestion_control;
  bool read = false;  // false: /proc/sys was not readable (nothing to advise)
};

TcpLimits read_tcp_limits();

// "" when `flows` flows' windows (connections per peer, CommOptions::stripes) are not what caps a
// `target_bits_per_s` link at round trip `rtt_s` and slow start after idle is off; else one line:
// the cap, the window the target needs per flow and the sysctl commands that lift both.
std::string tcp_limits_advice(const TcpLimits& limits, double rtt_s, double target_bits_per_s,
                              int flows = 1);

// The rate automatic striping (CommOptions::stripes = 0) sizes the connections for when the link's
// own rate is unknown (an interface's reported speed is not the path's), and its most connections.
constexpr double kStripeTargetBits = 10e9;
constexpr int kAutoStripesMax = 4;

// What one flow moves per round trip: half of the socket buffer maximum (min of tcp_rmem's and
// tcp_wmem's), the kernel keeping the rest for its own overhead (measured: 4 MiB buffers carried
// 2.6 MB in flight at 50 ms). 0 when the limits were not read.
double flow_window_bytes(const TcpLimits& limits);
// What `flows` flows to one peer carry at round trip `rtt_s` (flow_window_bytes each), bits per
// second; 0 when the limits were not read.
double windows_cap_bits(const TcpLimits& limits, double rtt_s, int flows);
// The rate tcp_limits_advice should size the windows for: `measured_bits`, a stream's rate over
// `flows` flows at `rtt_s`, where it stayed below kWindowBoundShare of windows_cap_bits (the
// windows did not hold it: it is the link's); else `fallback_bits`, since a stream at the windows'
// cap says nothing of the link beyond them (also when nothing was measured).
constexpr double kWindowBoundShare = 0.8;
double advice_target_bits(const TcpLimits& limits, double rtt_s, int flows, double measured_bits,
                          double fallback_bits);

// Connections per peer for a path of round trip `rtt_s` to carry `target_bits_per_s`: the
// bandwidth-delay product over one flow's window, rounded up, in [1, `cap`]. 1 when the limits
// are unread or the round trip unmeasured.
int stripes_for_path(const TcpLimits& limits, double rtt_s, double target_bits_per_s, int cap);

}  // namespace gradex::comm
