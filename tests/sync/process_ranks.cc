#include "process_ranks.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>

namespace gradex::test {
namespace {

int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  int port = ntohs(addr.sin_port);
  ::close(fd);
  return port;
}

void write_all(int fd, const std::string& s) {
  size_t off = 0;
  while (off < s.size()) {
    ssize_t n = ::write(fd, s.data() + off, s.size() - off);
    if (n <= 0) return;
    off += static_cast<size_t>(n);
  }
}

}  // namespace

gradex_status_t create_engine(int rank, int world, gradex_engine_t** engine, std::string* error) {
  gradex_engine_options_t options;
  gradex_engine_options_init(&options);
  options.rank = rank;
  options.world_size = world;
  gradex_status_t s = gradex_engine_create(&options, engine);
  if (s != GRADEX_OK && error) *error = gradex_last_error();
  return s;
}

gradex_status_t create_outer(int rank, int world, gradex_outer_t** outer) {
  gradex_engine_options_t options;
  gradex_engine_options_init(&options);
  options.rank = rank;
  options.world_size = world;
  return gradex_outer_create(&options, outer);
}

gradex_store_t* connect_store(int process, int processes, std::string* error) {
  gradex_engine_options_t o;
  gradex_engine_options_init(&o);
  o.rank = process;
  o.world_size = processes;
  gradex_store_t* store = nullptr;
  if (gradex_store_connect(&o, &store) != GRADEX_OK) {
    if (error) *error = gradex_last_error();
    return nullptr;
  }
  return store;
}

void store_set(gradex_store_t* s, const std::string& key, const std::string& value) {
  s->set(s->context, key.c_str(), value.data(), value.size());
}

std::string store_get(gradex_store_t* s, const std::string& key) {
  void* value = nullptr;
  size_t length = 0;
  if (s->get(s->context, key.c_str(), 120000, &value, &length) != 0) return "";
  std::string out(static_cast<const char*>(value), length);
  s->release(s->context, value);
  return out;
}

ScratchDir::ScratchDir(const std::string& label) {
  std::string pattern = "/tmp/gradex-" + label + "-XXXXXX";
  if (::mkdtemp(pattern.data()) == nullptr)
    throw std::runtime_error("cannot make the scratch directory " + pattern + ": " +
                             std::strerror(errno));
  path_ = pattern;
}

ScratchDir::~ScratchDir() {
  std::error_code ignored;  // a directory already gone is no failure of the test
  std::filesystem::remove_all(path_, ignored);
}

std::string read_text_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

std::vector<std::string> run_ranks(int world, const std::vector<std::string>& env,
                                   const std::function<std::string(RankContext&)>& fn,
                                   std::chrono::seconds deadline, bool create) {
  const int port = free_port();
  std::vector<pid_t> pids(world);
  std::vector<int> fds(world);
  for (int r = 0; r < world; ++r) {
    int p[2];
    if (::pipe(p) != 0) std::abort();
    pid_t pid = ::fork();
    if (pid == 0) {
      ::close(p[0]);
      ::setenv("MASTER_ADDR", "127.0.0.1", 1);
      ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
      ::unsetenv("RANK");
      ::unsetenv("WORLD_SIZE");
      // The engine tests state exact thresholds (DGC above GRADEX_DENSE_THRESHOLD at
      // GRADEX_SPARSITY, the bit-identity goldens): they run the fixed policy unless they name one.
      ::setenv("GRADEX_POLICY", "fixed", 0);
      for (const auto& e : env) {
        size_t eq = e.find('=');
        if (eq == std::string::npos)
          ::unsetenv(e.c_str());  // a bare name: unset (the shipped default, e.g. GRADEX_POLICY)
        else
          ::setenv(e.substr(0, eq).c_str(), e.substr(eq + 1).c_str(), 1);
      }
      std::string result;
      try {
        RankContext ctx{r, world, nullptr};
        if (create) {
          std::string error;
          if (create_engine(r, world, &ctx.engine, &error) != GRADEX_OK)
            result = "rank " + std::to_string(r) + ": engine creation failed: " + error;
        }
        if (result.empty()) result = fn(ctx);
        if (ctx.engine && gradex_engine_destroy(ctx.engine) != GRADEX_OK && result.empty())
          result = std::string("engine destroy failed: ") + gradex_last_error();
      } catch (const std::exception& e) {
        result = std::string("exception: ") + e.what();
      }
      if (!result.empty()) result = "rank " + std::to_string(r) + ": " + result;
      write_all(p[1], result);
      ::close(p[1]);
      ::_exit(result.empty() ? 0 : 1);
    }
    ::close(p[1]);
    pids[r] = pid;
    fds[r] = p[0];
  }

  std::vector<std::string> results(world);
  std::vector<bool> open(world, true);
  auto end = std::chrono::steady_clock::now() + deadline;
  int remaining = world;
  while (remaining > 0) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        end - std::chrono::steady_clock::now());
    if (left.count() <= 0) break;
    std::vector<pollfd> pfds;
    std::vector<int> ranks;
    for (int r = 0; r < world; ++r)
      if (open[r]) {
        pfds.push_back({fds[r], POLLIN, 0});
        ranks.push_back(r);
      }
    if (::poll(pfds.data(), pfds.size(), static_cast<int>(std::min<int64_t>(left.count(), 1000))) <=
        0)
      continue;
    for (size_t i = 0; i < pfds.size(); ++i) {
      if (!(pfds[i].revents & (POLLIN | POLLHUP))) continue;
      char buf[4096];
      ssize_t n = ::read(pfds[i].fd, buf, sizeof(buf));
      if (n > 0) {
        results[ranks[i]].append(buf, static_cast<size_t>(n));
      } else {
        open[ranks[i]] = false;
        --remaining;
      }
    }
  }
  for (int r = 0; r < world; ++r) {
    if (open[r]) {
      ::kill(pids[r], SIGKILL);
      results[r] = "rank " + std::to_string(r) + ": killed by the test watchdog after " +
                   std::to_string(deadline.count()) + " s";
    }
    int status = 0;
    ::waitpid(pids[r], &status, 0);
    ::close(fds[r]);
    if (results[r].empty() && !(WIFEXITED(status) && WEXITSTATUS(status) == 0))
      results[r] = "rank " + std::to_string(r) + ": exited abnormally (status " +
                   std::to_string(status) + ")";
  }
  return results;
}

std::string failures(const std::vector<std::string>& results) {
  std::string all;
  for (const auto& r : results)
    if (!r.empty()) all += r + "\n";
  return all;
}

}  // namespace gradex::test
