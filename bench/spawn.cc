#include "bench/spawn.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include "base/error.h"
#include "bench/result_line.h"

extern char** environ;

namespace gradex::bench {

namespace {

using Clock = std::chrono::steady_clock;

volatile sig_atomic_t g_received_signal = 0;

void on_stop_signal(int sig) {
  g_received_signal = sig;
}

// Installs forwarding handlers for SIGINT/SIGTERM for the lifetime of the object.
class SignalGuard {
 public:
  SignalGuard() {
    g_received_signal = 0;
    struct sigaction sa {};
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_int_);
    sigaction(SIGTERM, &sa, &old_term_);
  }
  ~SignalGuard() {
    sigaction(SIGINT, &old_int_, nullptr);
    sigaction(SIGTERM, &old_term_, nullptr);
  }

 private:
  struct sigaction old_int_ {};
  struct sigaction old_term_ {};
};

bool is_launcher_variable(const char* entry) {
  static const char* const names[] = {
      "RANK=",        "WORLD_SIZE=",       "LOCAL_RANK=", "MASTER_ADDR=",
      "MASTER_PORT=", "LOCAL_WORLD_SIZE=", "GROUP_RANK=", "OMPI_COMM_WORLD_"};
  for (const char* name : names) {
    if (std::strncmp(entry, name, std::strlen(name)) == 0) return true;
  }
  return false;
}

// The child's environment, built before fork(): after fork only async-signal-safe calls are made.
std::vector<std::string> child_environment(const SpawnOptions& o, uint16_t port, int rank) {
  std::vector<std::string> env;
  for (char** e = environ; e && *e; ++e) {
    if (!is_launcher_variable(*e)) env.emplace_back(*e);
  }
  env.push_back("RANK=" + std::to_string(rank));
  env.push_back("LOCAL_RANK=" + std::to_string(rank));
  env.push_back("WORLD_SIZE=" + std::to_string(o.ranks));
  env.push_back("LOCAL_WORLD_SIZE=" + std::to_string(o.ranks));
  env.push_back("MASTER_ADDR=" + o.master_addr);
  env.push_back("MASTER_PORT=" + std::to_string(port));
  return env;
}

std::vector<char*> pointers(std::vector<std::string>& strings) {
  std::vector<char*> out;
  for (std::string& s : strings)
    out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

struct Child {
  pid_t pid = -1;
  bool running = false;
};

void signal_running(std::vector<Child>& children, int sig) {
  for (Child& c : children) {
    if (c.running) kill(c.pid, sig);
  }
}

// Reaps whatever has exited without blocking; returns the rank of a child that failed (exit code
// != 0 or killed by a signal) among those reaped, recording its status, or -1.
int reap(std::vector<Child>& children, int* status_out) {
  int failed = -1;
  for (size_t r = 0; r < children.size(); ++r) {
    Child& c = children[r];
    if (!c.running) continue;
    int status = 0;
    pid_t got = waitpid(c.pid, &status, WNOHANG);
    if (got != c.pid) continue;
    c.running = false;
    int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (code != 0 && failed < 0) {
      failed = static_cast<int>(r);
      *status_out = code;
    }
  }
  return failed;
}

bool any_running(const std::vector<Child>& children) {
  for (const Child& c : children) {
    if (c.running) return true;
  }
  return false;
}

// SIGTERM everyone still running, give them `grace`, then SIGKILL and reap. Never blocks longer
// than grace plus a moment.
void stop_all(std::vector<Child>& children, std::chrono::milliseconds grace) {
  signal_running(children, SIGTERM);
  auto until = Clock::now() + grace;
  int ignored = 0;
  while (any_running(children) && Clock::now() < until) {
    reap(children, &ignored);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  signal_running(children, SIGKILL);
  for (Child& c : children) {
    if (c.running) waitpid(c.pid, nullptr, 0);
    c.running = false;
  }
}

}  // namespace

uint16_t pick_free_port(const std::string& addr) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw TransportError(std::string("socket() failed: ") + std::strerror(errno));
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = 0;
  if (inet_pton(AF_INET, addr.c_str(), &sa.sin_addr) != 1) {
    close(fd);
    throw InvalidArgument("'" + addr + "' is not an IPv4 address");
  }
  socklen_t len = sizeof sa;
  if (bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len) != 0) {
    int err = errno;
    close(fd);
    throw TransportError("cannot find a free port on " + addr + ": " + std::strerror(err));
  }
  close(fd);
  return ntohs(sa.sin_port);
}

SpawnResult spawn_local_ranks(const SpawnOptions& o) {
  if (o.ranks < 1) throw InvalidArgument("ranks must be >= 1, got " + std::to_string(o.ranks));
  if (o.executable.empty() || o.argv.empty()) throw InvalidArgument("nothing to spawn");
  uint16_t port = o.master_port ? o.master_port : pick_free_port(o.master_addr);

  std::vector<std::string> argv_strings = o.argv;
  std::vector<char*> argv = pointers(argv_strings);
  std::vector<std::vector<std::string>> envs;
  std::vector<std::vector<char*>> envps;
  for (int r = 0; r < o.ranks; ++r)
    envs.push_back(child_environment(o, port, r));
  for (auto& env : envs)
    envps.push_back(pointers(env));

  SignalGuard guard;  // installed before the first fork: no signal is lost in between
  std::vector<Child> children(o.ranks);
  pid_t parent = getpid();
  for (int r = 0; r < o.ranks; ++r) {
    pid_t pid = fork();
    if (pid < 0) {
      int err = errno;
      stop_all(children, o.kill_grace);
      throw TransportError(std::string("fork() failed: ") + std::strerror(err));
    }
    if (pid == 0) {
      // Child: die with the parent (no orphaned ranks spinning in UCX), default signal handling.
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(127);
      signal(SIGINT, SIG_DFL);
      signal(SIGTERM, SIG_DFL);
      execve(o.executable.c_str(), argv.data(), envps[r].data());
      const char msg[] = "gradex-bench: execve failed for a spawned rank\n";
      ssize_t ignored = write(2, msg, sizeof msg - 1);
      (void)ignored;
      _exit(127);
    }
    children[r] = Child{pid, true};
  }

  SpawnResult result;
  auto deadline = Clock::now() + o.deadline;
  while (any_running(children)) {
    int status = 0;
    int failed = reap(children, &status);
    if (failed >= 0) {
      result.exit_code = status;
      result.failed_rank = failed;
      result.message = "rank " + std::to_string(failed) + " failed with exit status " +
                       std::to_string(status) + "; stopped the other ranks";
      stop_all(children, o.kill_grace);
      break;
    }
    if (g_received_signal != 0) {
      int sig = g_received_signal;
      signal_running(children, sig);
      result.interrupted_by = sig;
      result.exit_code = 128 + sig;
      result.message = std::string("interrupted by ") + (sig == SIGINT ? "SIGINT" : "SIGTERM") +
                       "; forwarded it to the ranks";
      // The ranks got the signal itself first; SIGTERM/SIGKILL only those that ignore it.
      auto until = Clock::now() + o.kill_grace;
      while (any_running(children) && Clock::now() < until) {
        reap(children, &status);
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
      stop_all(children, o.kill_grace);
      break;
    }
    if (Clock::now() >= deadline) {
      result.exit_code = 124;
      result.deadline_expired = true;
      result.message = "deadline of " + format_number(o.deadline.count() / 1000.0) +
                       " s passed; stopped all ranks";
      stop_all(children, o.kill_grace);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return result;
}

}  // namespace gradex::bench
