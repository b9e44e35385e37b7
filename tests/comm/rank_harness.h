// Test harnesses for comm/: ranks as threads (breadth, over real UCX inside one process) and ranks
// as forked processes (what threads cannot show: bootstrap across processes, a killed or stopped
// rank).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "comm/communicator.h"

namespace gradex::test {

// Short timeout and 64-byte ring chunks, so small buffers already take multi-chunk paths.
comm::CommOptions test_options();

// Runs fn(comm) for every rank of a world of `world_size`, each rank in its own thread with its
// own UCX communicator bootstrapped over one in-memory store. Joins every thread, then rethrows
// the first exception any rank threw (with its rank prepended to the message).
void run_ranks(int world_size, const std::function<void(comm::Communicator&)>& fn,
               const comm::CommOptions& options = test_options());

// Runs fn(comm) for every rank as run_ranks does, and returns each rank's gradex::Error message
// by rank ("" for a rank that threw none): for tests of failures that several ranks report.
std::vector<std::string> rank_errors(int world_size,
                                     const std::function<void(comm::Communicator&)>& fn,
                                     const comm::CommOptions& options = test_options());

// Forwards everything to `inner` and counts the messages sent (isend calls): how tests see how many
// messages, hence round trips, a collective takes.
class CountingCommunicator : public comm::Communicator {
 public:
  explicit CountingCommunicator(comm::Communicator& inner) : inner_(inner) {}
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  const comm::CommOptions& options() const override { return inner_.options(); }
  comm::RequestPtr isend(int peer, uint64_t tag, const void* data, size_t bytes) override {
    ++sends;
    return inner_.isend(peer, tag, data, bytes);
  }
  comm::RequestPtr irecv(int peer, uint64_t tag, void* data, size_t bytes) override {
    return inner_.irecv(peer, tag, data, bytes);
  }
  bool receives_any_length() const override { return inner_.receives_any_length(); }
  comm::RequestPtr irecv_any_length(int peer, uint64_t tag, comm::Bytes& out,
                                    size_t max_bytes) override {
    return inner_.irecv_any_length(peer, tag, out, max_bytes);
  }
  bool progress() override { return inner_.progress(); }
  bool test(comm::Request& r, const char* op) override { return inner_.test(r, op); }
  void wait_all(std::vector<comm::RequestPtr>& r, const char* op) override {
    inner_.wait_all(r, op);
  }
  size_t recv_length(const comm::Request& r) const override { return inner_.recv_length(r); }
  uint64_t next_collective_tag() override { return inner_.next_collective_tag(); }
  uint64_t bytes_sent() const override { return inner_.bytes_sent(); }
  uint64_t bytes_received() const override { return inner_.bytes_received(); }
  uint64_t sends = 0;

 private:
  comm::Communicator& inner_;
};

// A TCP port on 127.0.0.1 that was free a moment ago.
uint16_t free_port();

// What a forked rank reports back.
struct ChildResult {
  int rank = -1;
  bool exited = false;  // exited normally (else killed by a signal, see `signal`)
  int exit_code = -1;
  int signal = 0;
  bool watchdog_killed = false;
  std::string report;  // everything the child passed to report()
  double seconds = 0;  // from start() until the child was reaped
};

// Forks `world_size` children; child r runs fn(r) and exits with its return value (an escaping
// exception is reported and exits 99). Children never return into the test framework.
class ProcessGroup {
 public:
  ProcessGroup(int world_size, const std::function<int(int rank)>& fn);
  ~ProcessGroup();  // SIGKILLs and reaps whatever is still running

  pid_t pid(int rank) const { return pids_[static_cast<size_t>(rank)]; }
  void signal(int rank, int sig);
  // Reaps every child; children still running at `watchdog` are SIGKILLed and marked. When
  // `linger` is a rank, that child is SIGKILLed (after SIGCONT) as soon as all others are reaped.
  std::vector<ChildResult> wait(std::chrono::milliseconds watchdog, int linger = -1);
  // Blocks until `rank` has reported a line containing `text`, or `limit` passes; false then.
  bool wait_for_report(int rank, const std::string& text, std::chrono::milliseconds limit);

 private:
  void drain(int rank, int timeout_ms);

  std::vector<pid_t> pids_;
  std::vector<int> pipes_;  // read ends, one per child
  std::vector<std::string> reports_;
  std::chrono::steady_clock::time_point start_;
};

// In a child: appends a line to the report its parent reads (unbuffered, async-signal-free).
void report(const std::string& line);

}  // namespace gradex::test
