// Pacing of this process's TCP flows to other hosts. TCP without pacing sends a window in one
// burst at the sender's own speed: on a path whose queues hold less than a window (shallow cloud
// and switch buffers, a hypervisor's shaper), the bursts of several flows at once (an exchange
// with every peer, D lanes of a delayed exchange) overflow them and each drop costs a round trip.
// With SO_MAX_PACING_RATE set, the kernel paces the flow itself (no fq qdisc needed since Linux
// 4.20) at min(cap, ~1.2 windows per round trip): the same bytes, spread over the round trip.
#pragma once

#include <cstdint>
#include <set>

namespace gradex::comm {

// The inodes of this process's sockets now (a snapshot taken before connections are made, so that
// pace_new_tcp_flows touches only the ones made since).
std::set<uint64_t> tcp_socket_inodes();

// A cap far above any NIC: the kernel paces at its own rate (~1.2 windows per round trip, 2 in slow
// start) and the cap never binds. (~0 would mean "no pacing" to the kernel.)
constexpr double kPacingNoCapBytesPerS = 125e9;  // 1 Tbit/s

// Sets SO_MAX_PACING_RATE = `bytes_per_s` on every TCP socket of this process to a non-loopback
// peer that is not in `before`. Returns how many it paced, and adds their inodes to `paced` when
// given; sockets it cannot set are skipped (pacing is an optimisation: the exchange is correct
// without it), and so are sockets still connecting (no peer yet): a later call paces those.
int pace_new_tcp_flows(const std::set<uint64_t>& before, double bytes_per_s,
                       std::set<uint64_t>* paced = nullptr);

}  // namespace gradex::comm
