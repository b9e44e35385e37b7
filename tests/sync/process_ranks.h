// Runs one function per rank in forked child processes that bootstrap a gradex engine through the C
// API over a real TCP store on 127.0.0.1 and real UCX. Each child reports "" (success) or a failure
// message through a pipe; a watchdog kills every child at the deadline, so a test can fail but
// never hang.
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "gradex/gradex.h"

namespace gradex::test {

struct RankContext {
  int rank = 0;
  int world = 1;
  gradex_engine_t* engine = nullptr;  // created before fn runs, destroyed after
};

// fn returns "" on success or a description of what went wrong. `env` entries ("NAME=value") are
// set in every child before its engine is created. When `create_engine` is false, fn gets no engine
// (ctx.engine == nullptr) and creates its own.
std::vector<std::string> run_ranks(int world, const std::vector<std::string>& env,
                                   const std::function<std::string(RankContext&)>& fn,
                                   std::chrono::seconds deadline = std::chrono::seconds(120),
                                   bool create_engine = true);

// Creates an engine for rank/world from the environment's MASTER_ADDR/MASTER_PORT (set by
// run_ranks), or returns the status with the message in `error`.
gradex_status_t create_engine(int rank, int world, gradex_engine_t** engine, std::string* error);
// The same for an outer optimizer (gradex_outer_create); the message stays in gradex_last_error().
gradex_status_t create_outer(int rank, int world, gradex_outer_t** outer);

// A connection to the launcher's TCP store (gradex_store_connect) as process `process` of
// `processes`, or nullptr with the message in `error` (when given).
gradex_store_t* connect_store(int process, int processes, std::string* error = nullptr);
// The store's set and get (a get waits up to 120 s; "" when the key could not be read by then).
void store_set(gradex_store_t* s, const std::string& key, const std::string& value);
std::string store_get(gradex_store_t* s, const std::string& key);

// A whole file's bytes ("" when it cannot be read): results that ranks leave for the test to
// compare.
std::string read_text_file(const std::string& path);

// A fresh directory /tmp/gradex-<label>-XXXXXX for the files ranks leave for the test, removed with
// everything in it when the object goes, so a failing test leaves nothing behind. Made in the
// test's process before run_ranks forks (the children end with _exit and never remove it). Throws
// std::runtime_error naming the directory when it cannot be made.
class ScratchDir {
 public:
  explicit ScratchDir(const std::string& label);
  ~ScratchDir();
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;

  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }
  // "<part>.<kind>.<rank>": one rank's file of one run of several (a backend's, a device's).
  std::string file(const std::string& part, const std::string& kind, int rank) const {
    return file(part + "." + kind + "." + std::to_string(rank));
  }

 private:
  std::string path_;
};

// Joins the failure messages of all ranks ("" when every rank succeeded).
std::string failures(const std::vector<std::string>& results);

}  // namespace gradex::test
