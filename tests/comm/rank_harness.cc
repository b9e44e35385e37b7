#include "tests/comm/rank_harness.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <exception>
#include <mutex>
#include <stdexcept>
#include <thread>

#include "base/error.h"
#include "comm/rendezvous/memory_store.h"

namespace gradex::test {

comm::CommOptions test_options() {
  comm::CommOptions o;
  o.timeout = std::chrono::milliseconds(20000);
  o.ring_chunk_bytes = 64;
  return o;
}

namespace {

// fn(comm) in one thread per rank, each with its own UCX communicator over one in-memory store;
// failed(rank, exception) for a rank that threw (from that rank's thread). Joins every thread.
void in_rank_threads(int world_size, const comm::CommOptions& options,
                     const std::function<void(comm::Communicator&)>& fn,
                     const std::function<void(int, std::exception_ptr)>& failed) {
  auto store = std::make_shared<comm::MemoryStore>();
  std::vector<std::thread> threads;
  for (int r = 0; r < world_size; ++r) {
    threads.emplace_back([&, r] {
      try {
        auto comm = comm::create_ucx_communicator(store, r, world_size, options);
        fn(*comm);
      } catch (...) {
        failed(r, std::current_exception());
      }
    });
  }
  for (auto& t : threads)
    t.join();
}

}  // namespace

void run_ranks(int world_size, const std::function<void(comm::Communicator&)>& fn,
               const comm::CommOptions& options) {
  std::mutex mutex;
  std::exception_ptr first;
  int first_rank = -1;
  in_rank_threads(world_size, options, fn, [&](int r, std::exception_ptr e) {
    std::lock_guard<std::mutex> lock(mutex);
    if (!first) {
      first = e;
      first_rank = r;
    }
  });
  if (!first) return;
  try {
    std::rethrow_exception(first);
  } catch (const std::exception& e) {
    throw std::runtime_error("rank " + std::to_string(first_rank) + ": " + e.what());
  }
}

std::vector<std::string> rank_errors(int world_size,
                                     const std::function<void(comm::Communicator&)>& fn,
                                     const comm::CommOptions& options) {
  std::mutex mutex;
  std::vector<std::string> errors(static_cast<size_t>(world_size));
  in_rank_threads(world_size, options, fn, [&](int r, std::exception_ptr e) {
    try {
      std::rethrow_exception(e);
    } catch (const Error& error) {
      std::lock_guard<std::mutex> lock(mutex);
      errors[static_cast<size_t>(r)] = error.what();
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex);
      errors[static_cast<size_t>(r)] = "not a gradex error";
    }
  });
  return errors;
}

uint16_t free_port() {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    close(fd);
    throw std::runtime_error("free_port: bind failed");
  }
  socklen_t len = sizeof(a);
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  close(fd);
  return ntohs(a.sin_port);
}

namespace {
int g_report_fd = -1;
}

void report(const std::string& line) {
  if (g_report_fd < 0) return;
  std::string text = line + "\n";
  const char* p = text.data();
  size_t left = text.size();
  while (left > 0) {
    ssize_t n = ::write(g_report_fd, p, left);
    if (n <= 0) return;
    p += n;
    left -= static_cast<size_t>(n);
  }
}

ProcessGroup::ProcessGroup(int world_size, const std::function<int(int rank)>& fn)
    : reports_(static_cast<size_t>(world_size)), start_(std::chrono::steady_clock::now()) {
  for (int r = 0; r < world_size; ++r) {
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) throw std::runtime_error("pipe2 failed");
    std::fflush(nullptr);
    pid_t pid = fork();
    if (pid < 0) throw std::runtime_error("fork failed");
    if (pid == 0) {
      close(fds[0]);
      g_report_fd = fds[1];
      int code = 99;
      try {
        code = fn(r);
      } catch (const std::exception& e) {
        report(std::string("uncaught exception: ") + e.what());
      } catch (...) {
        report("uncaught non-standard exception");
      }
      std::fflush(nullptr);
      _exit(code);  // never run the parent's atexit handlers or gtest teardown
    }
    close(fds[1]);
    pids_.push_back(pid);
    pipes_.push_back(fds[0]);
  }
}

ProcessGroup::~ProcessGroup() {
  for (size_t r = 0; r < pids_.size(); ++r) {
    if (pids_[r] > 0) {
      kill(pids_[r], SIGKILL);
      waitpid(pids_[r], nullptr, 0);
    }
    if (pipes_[r] >= 0) close(pipes_[r]);
  }
}

void ProcessGroup::signal(int rank, int sig) {
  pid_t pid = pids_[static_cast<size_t>(rank)];
  if (pid > 0) kill(pid, sig);
}

void ProcessGroup::drain(int rank, int timeout_ms) {
  int& fd = pipes_[static_cast<size_t>(rank)];
  while (fd >= 0) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, timeout_ms) <= 0) return;
    char buf[4096];
    ssize_t n = read(fd, buf, sizeof(buf));
    if (n <= 0) {
      close(fd);
      fd = -1;
      return;
    }
    reports_[static_cast<size_t>(rank)].append(buf, static_cast<size_t>(n));
    timeout_ms = 0;
  }
}

bool ProcessGroup::wait_for_report(int rank, const std::string& text,
                                   std::chrono::milliseconds limit) {
  auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    drain(rank, 20);
    if (reports_[static_cast<size_t>(rank)].find(text) != std::string::npos) return true;
  }
  return false;
}

std::vector<ChildResult> ProcessGroup::wait(std::chrono::milliseconds watchdog, int linger) {
  std::vector<ChildResult> results(pids_.size());
  auto deadline = std::chrono::steady_clock::now() + watchdog;
  size_t left = pids_.size();
  for (size_t r = 0; r < pids_.size(); ++r) {
    results[r].rank = static_cast<int>(r);
    if (pids_[r] <= 0) --left;
  }
  while (left > 0) {
    bool overdue = std::chrono::steady_clock::now() >= deadline;
    for (size_t r = 0; r < pids_.size(); ++r) {
      if (pids_[r] <= 0) continue;
      drain(static_cast<int>(r), 0);
      if (overdue) {
        kill(pids_[r], SIGKILL);
        results[r].watchdog_killed = true;
      }
      int status = 0;
      pid_t got = waitpid(pids_[r], &status, overdue ? 0 : WNOHANG);
      if (got != pids_[r]) continue;
      ChildResult& res = results[r];
      res.seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
      res.exited = WIFEXITED(status);
      res.exit_code = res.exited ? WEXITSTATUS(status) : -1;
      res.signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
      pids_[r] = -1;
      --left;
    }
    if (linger >= 0 && left == 1 && pids_[static_cast<size_t>(linger)] > 0) {
      kill(pids_[static_cast<size_t>(linger)], SIGCONT);
      kill(pids_[static_cast<size_t>(linger)], SIGKILL);
    }
    if (left > 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  for (size_t r = 0; r < pids_.size(); ++r) {
    drain(static_cast<int>(r), 50);
    results[r].report = reports_[r];
  }
  return results;
}

}  // namespace gradex::test
