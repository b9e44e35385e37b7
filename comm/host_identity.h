// Whether two ranks share a host, as far as shared memory is concerned.
#pragma once

#include <string>

namespace gradex::comm {

// "hostname|boot id|network namespace": equal strings mean the same kernel and the same network
// namespace. The namespace is part of it so that emulated hosts (one network namespace each, as in
// bench/cluster) count as different hosts and talk over their shaped links, not shared memory.
std::string host_identity();

}  // namespace gradex::comm
