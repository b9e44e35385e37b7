// GRADEX_TIMELINE: one rank's timeline of its steps, written as Chrome-trace JSON (the array
// form, one event a line) that chrome://tracing and Perfetto open, and that `gradex-bench
// timeline DIR` merges across ranks (sync/timeline/merge.h).
//
// Events are complete spans ("ph":"X") and instants ("ph":"i") on rows ("tid"): one row per
// thread that records (the progress thread: negotiation and transfers; pool workers: encode and
// decode; the framework's threads: submissions and waits), one row per peer and direction for the
// traffic of each unit, and one row for what the framework waited on gradex each step. "pid" is
// the rank. Timestamps are microseconds of the steady clock since the recorder opened; the first
// line's metadata event carries the system clock at that instant, the merge's first estimate of
// how the ranks' clocks relate.
//
// Cost: an engine without a timeline holds a null recorder and tests it once per event site.
// With one, each event is formatted into a buffer under a mutex (about a microsecond); the buffer
// goes to the file when it passes kFlushBytes, at maybe_flush() once a second (the engine calls it
// at every step's end) and at destruction, which also closes the array.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <string>
#include <utility>

namespace gradex::sync::timeline {

using Clock = std::chrono::steady_clock;

// Fixed rows. Threads get rows from kFirstThreadRow on, peers from kFirstPeerRow on (two per peer:
// sends at kFirstPeerRow + 2p, receives one above).
constexpr int kWaitRow = 1;  // the framework's wait on gradex, one span per step
constexpr int kFirstThreadRow = 10;
constexpr int kFirstPeerRow = 1000;
constexpr int send_row(int peer) {
  return kFirstPeerRow + 2 * peer;
}
constexpr int recv_row(int peer) {
  return kFirstPeerRow + 2 * peer + 1;
}

// `text` as the contents of a JSON string (quotes, backslashes and control characters escaped).
std::string json_escape(const std::string& text);

// A JSON object's members, built in order: Args().add("route", "sparse").add("bytes", 123).
class Args {
 public:
  Args& add(const char* name, const std::string& value);
  Args& add(const char* name, const char* value) { return add(name, std::string(value)); }
  Args& add(const char* name, uint64_t value);
  Args& add(const char* name, int value) { return add(name, static_cast<uint64_t>(value)); }
  Args& add(const char* name, double value);
  // The object, "{...}".
  std::string json() const { return "{" + members_ + "}"; }
  bool empty() const { return members_.empty(); }
  // The members without braces, and an Args made of such text (for a description kept and reused).
  const std::string& members() const { return members_; }
  static Args from_members(std::string members) {
    Args a;
    a.members_ = std::move(members);
    return a;
  }

 private:
  void name(const char* n);
  std::string members_;
};

class Recorder {
 public:
  // Opens `dir`/rank<rank>.json, or rank<rank>.<n>.json for this process's n-th recorder (n >= 2)
  // in the same directory, creating `dir` if missing. ConfigError naming GRADEX_TIMELINE when
  // the directory or the file cannot be created.
  Recorder(const std::string& dir, int rank, int world_size);
  ~Recorder();
  Recorder(const Recorder&) = delete;
  Recorder& operator=(const Recorder&) = delete;

  const std::string& path() const { return path_; }

  void span(int row, const std::string& name, Clock::time_point begin, Clock::time_point end,
            const Args& args = Args());
  void instant(int row, const std::string& name, Clock::time_point at, const Args& args = Args());
  // The calling thread's row, named "<role> <n>" by the first thread that takes it.
  int thread_row(const char* role);
  // Names a fixed row (peer rows, the wait row); once per row.
  void name_row(int row, const std::string& name);
  // Writes the buffer when a second has passed since the last write.
  void maybe_flush();
  void flush();

  static constexpr size_t kFlushBytes = 1u << 20;

 private:
  void append(const std::string& line);  // mutex_ held
  void write_buffer();                   // mutex_ held
  double micros(Clock::time_point t) const;

  std::mutex mutex_;
  std::FILE* file_ = nullptr;
  std::string path_;
  std::string buffer_;
  int pid_ = 0;
  uint64_t id_ = 0;  // tells this recorder's thread rows from an earlier recorder's
  int next_thread_row_ = kFirstThreadRow;
  std::string named_rows_;  // ",row," for each named fixed row
  Clock::time_point origin_;
  Clock::time_point last_write_;
  bool first_event_ = true;
};

}  // namespace gradex::sync::timeline
