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

// "" when one flow's window is not what caps a `target_bits_per_s` link at round trip `rtt_s` and
// slow start after idle is off; else one line: the cap, the window the target needs and the
// sysctl commands that lift both.
std::string tcp_limits_advice(const TcpLimits& limits, double rtt_s, double target_bits_per_s);

}  // namespace gradex::comm
