#include "tun.h"

#include <fcntl.h>
#include <linux/if.h>
#include <linux/if_tun.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

namespace gradex::delayline {

void throw_errno(const std::string& what) {
  throw std::runtime_error(what + ": " + std::strerror(errno));
}

namespace {

// Enters a network namespace for its lifetime and returns to the original one on destruction.
class NetnsGuard {
 public:
  explicit NetnsGuard(const std::string& netns)
      : home_(::open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC)) {
    if (home_.get() < 0) throw_errno("open /proc/self/ns/net");
    const std::string path = "/run/netns/" + netns;
    Fd target(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (target.get() < 0) throw_errno("open " + path + " (network namespace '" + netns + "')");
    if (::setns(target.get(), CLONE_NEWNET) != 0) throw_errno("setns into '" + netns + "'");
  }
  ~NetnsGuard() {
    // Failing to return would leave the relay in a host's namespace: nothing sane is left to do.
    if (::setns(home_.get(), CLONE_NEWNET) != 0) std::abort();
  }
  NetnsGuard(const NetnsGuard&) = delete;
  NetnsGuard& operator=(const NetnsGuard&) = delete;

 private:
  Fd home_;
};

}  // namespace

Fd open_tun_in_netns(const std::string& netns, const std::string& dev) {
  if (dev.empty() || dev.size() >= IFNAMSIZ) {
    throw std::invalid_argument("bad device name '" + dev + "' (1 to 15 characters)");
  }
  NetnsGuard inside(netns);
  Fd fd(::open("/dev/net/tun", O_RDWR | O_NONBLOCK | O_CLOEXEC));
  if (fd.get() < 0) throw_errno("open /dev/net/tun in '" + netns + "'");
  ifreq request{};
  request.ifr_flags = IFF_TUN | IFF_NO_PI;
  std::memcpy(request.ifr_name, dev.c_str(), dev.size());
  if (::ioctl(fd.get(), TUNSETIFF, &request) != 0) {
    throw_errno("TUNSETIFF " + dev + " in '" + netns + "'");
  }
  return fd;
}

}  // namespace gradex::delayline
