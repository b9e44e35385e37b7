#include "comm/topology/host_identity.h"

#include <unistd.h>

#include <fstream>
#include <sstream>

namespace gradex::comm {
namespace {

std::string namespace_link(const char* path) {
  char target[128] = {};
  ssize_t n = ::readlink(path, target, sizeof(target) - 1);
  return n < 0 ? std::string() : std::string(target, static_cast<size_t>(n));
}

// Field 22 of /proc/<pid>/stat (start time in clock ticks since boot) and field 3 (state); the
// command name (field 2) may hold spaces and parentheses, so fields are counted after its last ')'.
bool read_stat(const std::string& pid, std::string& start_time, char& state) {
  std::ifstream in("/proc/" + pid + "/stat");
  std::string line;
  if (!std::getline(in, line)) return false;
  const size_t close = line.rfind(')');
  if (close == std::string::npos) return false;
  std::istringstream rest(line.substr(close + 1));
  std::string field;
  rest >> state;  // field 3
  for (int f = 4; f <= 22; ++f)
    if (!(rest >> field)) return false;
  start_time = field;
  return true;
}

}  // namespace

std::string host_identity(const std::string& override_id) {
  if (!override_id.empty()) return "id:" + override_id;
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  std::string boot_id;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> boot_id;
  return std::string(host) + "|" + boot_id + "|" + namespace_link("/proc/self/ns/net");
}

std::string process_identity() {
  const std::string pid = std::to_string(::getpid());
  std::string start;
  char state = '?';
  if (!read_stat(pid, start, state)) start.clear();
  return namespace_link("/proc/self/ns/pid") + "|" + pid + "|" + start;
}

bool process_alive(const std::string& identity) {
  const size_t a = identity.find('|');
  const size_t b = a == std::string::npos ? a : identity.find('|', a + 1);
  if (b == std::string::npos) return true;
  const std::string ns = identity.substr(0, a);
  const std::string pid = identity.substr(a + 1, b - a - 1);
  const std::string start = identity.substr(b + 1);
  if (ns.empty() || start.empty() || ns != namespace_link("/proc/self/ns/pid")) return true;
  std::string now_start;
  char state = '?';
  if (!read_stat(pid, now_start, state)) return false;  // no such process
  return now_start == start && state != 'Z' && state != 'X';
}

}  // namespace gradex::comm
