// Whether two ranks share a host, as far as shared memory is concerned, and whether a same-host
// peer process is still alive (UCX's shared-memory transports do not report a dead peer).
#pragma once

#include <string>

namespace gradex::comm {

// "hostname|boot id|network namespace": equal strings mean the same kernel and the same network
// namespace. The namespace is part of it so that emulated hosts (one network namespace each, as in
// bench/cluster) count as different hosts and talk over their shaped links, not shared memory.
// A non-empty `override_id` (GRADEX_HOST_ID, for tests that emulate several hosts with processes
// of one machine) replaces the derived string: ranks with equal overrides are one host.
std::string host_identity(const std::string& override_id = "");

// "pid namespace|pid|start time" of this process: enough for a process of the same kernel to tell
// whether this one still exists (a recycled pid has another start time).
std::string process_identity();

// False when `identity` (another process's process_identity()) names a process of this kernel's
// pid namespace that no longer exists (exited, or its pid now belongs to another process, or a
// zombie). True when it exists or cannot be checked from here (another pid namespace, or a
// malformed string: liveness then rests on the timeout alone).
bool process_alive(const std::string& identity);

}  // namespace gradex::comm
