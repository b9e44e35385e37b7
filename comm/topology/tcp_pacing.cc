#include "comm/topology/tcp_pacing.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>

namespace gradex::comm {
namespace {

// Calls `visit(fd, inode)` for every socket descriptor of this process, read from the links in
// /proc/self/fd ("socket:[inode]"): no call on a descriptor that is not a socket, so other
// libraries' files are never touched.
template <typename Visit>
void for_each_socket(Visit&& visit) {
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return;
  constexpr char kPrefix[] = "socket:[";
  while (const dirent* entry = readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(entry->d_name, &end, 10);
    if (end == entry->d_name || *end != '\0') continue;
    char target[64];
    const std::string link = std::string("/proc/self/fd/") + entry->d_name;
    const ssize_t n = readlink(link.c_str(), target, sizeof(target) - 1);
    if (n <= static_cast<ssize_t>(sizeof(kPrefix) - 1)) continue;
    target[n] = '\0';
    if (std::strncmp(target, kPrefix, sizeof(kPrefix) - 1) != 0) continue;
    const uint64_t inode = std::strtoull(target + sizeof(kPrefix) - 1, nullptr, 10);
    visit(static_cast<int>(fd), inode);
  }
  closedir(dir);
}

bool is_tcp(int fd) {
  int type = 0, protocol = 0;
  socklen_t len = sizeof(type);
  if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) != 0 || type != SOCK_STREAM) return false;
  len = sizeof(protocol);
  return getsockopt(fd, SOL_SOCKET, SO_PROTOCOL, &protocol, &len) == 0 && protocol == IPPROTO_TCP;
}

// Whether the socket is connected to another host (not loopback, not listening).
bool to_other_host(int fd) {
  sockaddr_storage peer{};
  socklen_t len = sizeof(peer);
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &len) != 0) return false;
  if (peer.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&peer);
    return (ntohl(a->sin_addr.s_addr) >> 24) != 127;
  }
  if (peer.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&peer);
    if (IN6_IS_ADDR_LOOPBACK(&a->sin6_addr)) return false;
    if (IN6_IS_ADDR_V4MAPPED(&a->sin6_addr)) return a->sin6_addr.s6_addr[12] != 127;
    return true;
  }
  return false;
}

}  // namespace

std::set<uint64_t> tcp_socket_inodes() {
  // Every socket (a superset of the TCP ones): the snapshot only says what is not new.
  std::set<uint64_t> inodes;
  for_each_socket([&](int, uint64_t inode) { inodes.insert(inode); });
  return inodes;
}

int pace_new_tcp_flows(const std::set<uint64_t>& before, double bytes_per_s,
                       std::set<uint64_t>* paced) {
#ifndef SO_MAX_PACING_RATE
  (void)before;
  (void)bytes_per_s;
  (void)paced;
  return 0;  // a kernel without the option: the flows stay as the kernel sends them
#else
  if (!(bytes_per_s > 0)) return 0;
  // The option takes an unsigned long on 64-bit kernels (an unsigned int is accepted too).
  const unsigned long rate = static_cast<unsigned long>(bytes_per_s);
  int count = 0;
  for_each_socket([&](int fd, uint64_t inode) {
    if (before.count(inode) != 0 || !is_tcp(fd) || !to_other_host(fd)) return;
    if (setsockopt(fd, SOL_SOCKET, SO_MAX_PACING_RATE, &rate, sizeof(rate)) != 0) return;
    ++count;
    if (paced != nullptr) paced->insert(inode);
  });
  return count;
#endif
}

}  // namespace gradex::comm
