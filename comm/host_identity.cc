#include "comm/host_identity.h"

#include <unistd.h>

#include <fstream>

namespace gradex::comm {

std::string host_identity() {
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  std::string boot_id;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> boot_id;
  char netns[128] = {};
  ssize_t n = ::readlink("/proc/self/ns/net", netns, sizeof(netns) - 1);
  if (n < 0) netns[0] = '\0';
  return std::string(host) + "|" + boot_id + "|" + netns;
}

}  // namespace gradex::comm
