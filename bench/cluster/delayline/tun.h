// File descriptors the relay owns: an RAII wrapper, and TUN devices opened inside named network
// namespaces (those of `ip netns add`, under /run/netns).
#pragma once

#include <string>

namespace gradex::delayline {

class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& other) noexcept : fd_(other.release()) {}
  Fd& operator=(Fd&& other) noexcept;
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd();
  int get() const { return fd_; }
  int release();

 private:
  int fd_ = -1;
};

// Creates TUN device `dev` (IFF_TUN | IFF_NO_PI: bare IP packets; non-persistent, so it disappears
// with the returned descriptor) inside network namespace /run/netns/<netns> and returns its
// non-blocking descriptor. The calling thread enters that namespace and returns to its own before
// this returns or throws; call it while the process has a single thread. Throws std::runtime_error
// naming the namespace, the device and the failing call.
Fd open_tun_in_netns(const std::string& netns, const std::string& dev);

// A std::runtime_error "<what>: <strerror(errno)>".
[[noreturn]] void throw_errno(const std::string& what);

}  // namespace gradex::delayline
