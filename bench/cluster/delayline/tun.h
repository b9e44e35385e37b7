// TUN devices opened inside named network namespaces (those of `ip netns add`, under /run/netns),
// owned by the relay as file descriptors (base/fd.h).
#pragma once

#include <string>

#include "base/fd.h"

namespace gradex::delayline {

using gradex::Fd;

// Creates TUN device `dev` (IFF_TUN | IFF_NO_PI: bare IP packets; non-persistent, so it disappears
// with the returned descriptor) inside network namespace /run/netns/<netns> and returns its
// non-blocking descriptor. The calling thread enters that namespace and returns to its own before
// this returns or throws; call it while the process has a single thread. Throws std::runtime_error
// naming the namespace, the device and the failing call.
Fd open_tun_in_netns(const std::string& netns, const std::string& dev);

// A std::runtime_error "<what>: <strerror(errno)>".
[[noreturn]] void throw_errno(const std::string& what);

}  // namespace gradex::delayline
