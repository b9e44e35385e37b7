// Minimal leveled logging to stderr: "gradex[rank] LEVEL: message". The level comes from
// GRADEX_LOG_LEVEL (read once, lazily); the rank prefix is set by whoever knows it (the
// communicator).
#pragma once

#include <chrono>
#include <sstream>

namespace gradex::log {

enum class Level : int { kError = 0, kWarn = 1, kInfo = 2, kDebug = 3 };

bool enabled(Level level);
void set_level(Level level);
void set_rank(int rank);
void write(Level level, const std::string& message);
// Whole milliseconds from `from` to `to`, as a log line gives a duration ("2203").
std::string ms_between(std::chrono::steady_clock::time_point from,
                       std::chrono::steady_clock::time_point to);

class Line {
 public:
  explicit Line(Level level) : level_(level) {}
  ~Line() { write(level_, stream_.str()); }
  template <typename T>
  Line& operator<<(const T& value) {
    stream_ << value;
    return *this;
  }

 private:
  Level level_;
  std::ostringstream stream_;
};

}  // namespace gradex::log

#define GX_LOG(level)                                         \
  if (!::gradex::log::enabled(::gradex::log::Level::level)) { \
  } else                                                      \
    ::gradex::log::Line(::gradex::log::Level::level)
