// Pacing of gradex's TCP flows (comm/topology/tcp_pacing.h, GRADEX_TCP_PACING): only the sockets a
// communicator made, only to other hosts (not loopback), and the kernel keeps the rate it was
// given; a communicator over a real interface paces its connections or, with pacing off, leaves
// the kernel's default.
#include "comm/topology/tcp_pacing.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "comm/collectives.h"
#include "tests/comm/rank_harness.h"

namespace gradex::test {
namespace {

// An up, non-loopback IPv4 interface of this machine and its address, if any.
struct Interface {
  std::string name;
  in_addr address{};
};
std::optional<Interface> non_loopback_interface() {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return std::nullopt;
  std::optional<Interface> found;
  for (ifaddrs* i = list; i != nullptr && !found; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET) continue;
    if ((i->ifa_flags & IFF_UP) == 0 || (i->ifa_flags & IFF_LOOPBACK) != 0) continue;
    found = Interface{i->ifa_name, reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr};
  }
  freeifaddrs(list);
  return found;
}

// A connected pair of TCP sockets (client, accepted) to `address`; closes them on destruction.
struct Connection {
  int client = -1, accepted = -1;
  explicit Connection(in_addr address) {
    const int listener = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr = address;
    socklen_t len = sizeof(a);
    EXPECT_EQ(bind(listener, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0) << strerror(errno);
    EXPECT_EQ(listen(listener, 1), 0);
    EXPECT_EQ(getsockname(listener, reinterpret_cast<sockaddr*>(&a), &len), 0);
    client = socket(AF_INET, SOCK_STREAM, 0);
    EXPECT_EQ(connect(client, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0) << strerror(errno);
    accepted = accept(listener, nullptr, nullptr);
    EXPECT_GE(accepted, 0);
    close(listener);
  }
  ~Connection() {
    close(client);
    close(accepted);
  }
};

// The socket's SO_MAX_PACING_RATE (~0: the kernel's default, no pacing asked for).
unsigned long pacing_rate(int fd) {
  unsigned long rate = 0;
  socklen_t len = sizeof(rate);
  EXPECT_EQ(getsockopt(fd, SOL_SOCKET, SO_MAX_PACING_RATE, &rate, &len), 0) << strerror(errno);
  return rate;
}

constexpr unsigned long kNotPaced = ~0UL;

TEST(TcpPacing, PacesOnlyNewConnectionsToOtherHosts) {
  const std::optional<Interface> iface = non_loopback_interface();
  if (!iface) GTEST_SKIP() << "this machine has no up, non-loopback IPv4 interface";
  in_addr loopback{};
  loopback.s_addr = htonl(INADDR_LOOPBACK);
  const Connection old_one(iface->address);
  const std::set<uint64_t> before = comm::tcp_socket_inodes();
  const Connection fresh(iface->address);
  const Connection local(loopback);
  const double rate = 1.25e8;                            // 1 Gbit/s
  EXPECT_EQ(comm::pace_new_tcp_flows(before, rate), 2);  // both ends of `fresh`
  EXPECT_EQ(pacing_rate(fresh.client), static_cast<unsigned long>(rate));
  EXPECT_EQ(pacing_rate(fresh.accepted), static_cast<unsigned long>(rate));
  EXPECT_EQ(pacing_rate(old_one.client), kNotPaced);
  EXPECT_EQ(pacing_rate(local.client), kNotPaced);
  EXPECT_EQ(pacing_rate(local.accepted), kNotPaced);
  EXPECT_EQ(comm::pace_new_tcp_flows(before, 0), 0);  // no rate: nothing touched
}

// Every TCP socket of this process to a non-loopback peer, with its pacing rate.
std::vector<unsigned long> rates_of_remote_sockets() {
  std::vector<unsigned long> rates;
  for (int fd = 0; fd < 4096; ++fd) {
    sockaddr_storage peer{};
    socklen_t len = sizeof(peer);
    int type = 0;
    socklen_t tlen = sizeof(type);
    if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &tlen) != 0 || type != SOCK_STREAM) continue;
    if (getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &len) != 0) continue;
    if (peer.ss_family != AF_INET) continue;
    const auto* a = reinterpret_cast<const sockaddr_in*>(&peer);
    if ((ntohl(a->sin_addr.s_addr) >> 24) == 127) continue;
    rates.push_back(pacing_rate(fd));
  }
  return rates;
}

void expect_communicator_pacing(bool pacing) {
  const std::optional<Interface> iface = non_loopback_interface();
  if (!iface) GTEST_SKIP() << "this machine has no up, non-loopback IPv4 interface";
  comm::CommOptions options = test_options();
  options.iface = iface->name;  // UCX's tcp over it: connections whose peer is not loopback
  options.tcp_pacing = pacing;
  const unsigned long expected =
      pacing ? static_cast<unsigned long>(comm::kPacingNoCapBytesPerS) : kNotPaced;
  run_ranks(
      2,
      [&](comm::Communicator& c) {
        std::vector<float> values(1000, static_cast<float>(c.rank() + 1));
        comm::allreduce_sum(c, values.data(), values.size(),
                            DType::kFloat32);  // both ranks connected and working
        EXPECT_EQ(values[0], 3.0f);
        const std::vector<unsigned long> rates = rates_of_remote_sockets();
        ASSERT_FALSE(rates.empty()) << "no TCP connection over " << iface->name;
        for (unsigned long r : rates)
          EXPECT_EQ(r, expected);
      },
      options);
}

TEST(TcpPacing, ACommunicatorPacesItsConnections) {
  expect_communicator_pacing(true);
}
TEST(TcpPacing, OffLeavesTheKernelDefault) {
  expect_communicator_pacing(false);
}

}  // namespace
}  // namespace gradex::test
