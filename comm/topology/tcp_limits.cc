#include "comm/topology/tcp_limits.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <vector>

namespace gradex::comm {
namespace {

std::string read_line(const char* path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

// The third of "min default max".
uint64_t third_value(const std::string& text, bool& ok) {
  std::istringstream in(text);
  uint64_t a = 0, b = 0, c = 0;
  ok = static_cast<bool>(in >> a >> b >> c);
  return c;
}

std::string first_two(const std::string& text) {
  std::istringstream in(text);
  std::string a, b;
  in >> a >> b;
  return a + " " + b;
}

std::string fixed(double v, int digits) {
  char b[32];
  std::snprintf(b, sizeof b, "%.*f", digits, v);
  return b;
}

}  // namespace

TcpLimits read_tcp_limits() {
  TcpLimits l;
  l.rmem_text = read_line("/proc/sys/net/ipv4/tcp_rmem");
  l.wmem_text = read_line("/proc/sys/net/ipv4/tcp_wmem");
  bool r = false, w = false;
  l.rmem_max = third_value(l.rmem_text, r);
  l.wmem_max = third_value(l.wmem_text, w);
  l.slow_start_after_idle = read_line("/proc/sys/net/ipv4/tcp_slow_start_after_idle") == "1";
  l.congestion_control = read_line("/proc/sys/net/ipv4/tcp_congestion_control");
  l.read = r && w;
  return l;
}

double flow_window_bytes(const TcpLimits& l) {
  if (!l.read) return 0;
  return static_cast<double>(std::min(l.rmem_max, l.wmem_max)) / 2;
}

double windows_cap_bits(const TcpLimits& l, double rtt_s, int flows) {
  if (!(rtt_s > 0)) return 0;
  return flow_window_bytes(l) * 8.0 / rtt_s * std::max(flows, 1);
}

double advice_target_bits(const TcpLimits& l, double rtt_s, int flows, double measured_bits,
                          double fallback_bits) {
  const double cap = windows_cap_bits(l, rtt_s, flows);
  return measured_bits > 0 && measured_bits < kWindowBoundShare * cap ? measured_bits
                                                                      : fallback_bits;
}

int stripes_for_path(const TcpLimits& l, double rtt_s, double target_bits_per_s, int cap) {
  const double window = flow_window_bytes(l);
  if (!(window > 0) || !(rtt_s > 0) || !(target_bits_per_s > 0) || cap < 1) return 1;
  const double bdp = target_bits_per_s / 8.0 * rtt_s;
  const double want = std::ceil(bdp / window);
  return want >= cap ? cap : std::max(1, static_cast<int>(want));
}

std::string tcp_limits_advice(const TcpLimits& l, double rtt_s, double target_bits_per_s,
                              int flows) {
  if (!l.read || !(rtt_s > 0) || !(target_bits_per_s > 0)) return "";
  flows = std::max(flows, 1);
  const uint64_t window = std::min(l.rmem_max, l.wmem_max);
  const double cap_bits = static_cast<double>(window) * 8.0 / rtt_s * flows;
  const auto need = static_cast<uint64_t>(target_bits_per_s / 8.0 * rtt_s / flows);
  std::vector<std::string> fixes;
  std::string what;
  if (cap_bits < target_bits_per_s) {
    what = "at the measured " + fixed(rtt_s * 1e3, 1) + " ms round trip " +
           (flows == 1 ? std::string("one TCP flow") : std::to_string(flows) + " TCP flows") +
           " per peer " + (flows == 1 ? "is" : "are") + " capped at " + fixed(cap_bits / 1e9, 2) +
           " Gbit/s by the kernel's socket buffer maximum (" + std::to_string(window >> 20) +
           " MiB; " + fixed(target_bits_per_s / 1e9, target_bits_per_s < 9.95e9 ? 1 : 0) +
           " Gbit/s needs " + std::to_string(need >> 20) + " MiB" +
           (flows == 1 ? "" : " per flow") + ")";
    if (l.rmem_max < need)
      fixes.push_back("sysctl -w net.ipv4.tcp_rmem='" + first_two(l.rmem_text) + " " +
                      std::to_string(need) + "'");
    if (l.wmem_max < need)
      fixes.push_back("sysctl -w net.ipv4.tcp_wmem='" + first_two(l.wmem_text) + " " +
                      std::to_string(need) + "'");
  }
  if (l.slow_start_after_idle) {
    what += std::string(what.empty() ? "" : "; ") +
            "net.ipv4.tcp_slow_start_after_idle=1 restarts each step's first flight after the "
            "compute phase from a small window";
    fixes.push_back("sysctl -w net.ipv4.tcp_slow_start_after_idle=0");
  }
  if (what.empty()) return "";
  std::string line = what + "; fix (as root, on every host): ";
  for (size_t i = 0; i < fixes.size(); ++i)
    line += (i ? " && " : "") + fixes[i];
  return line;
}

}  // namespace gradex::comm
