#include "sync/timeline/recorder.h"

#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cinttypes>
#include <cstring>
#include <map>
#include <utility>
#include <vector>

#include "base/error.h"
#include "base/log.h"

namespace gradex::sync::timeline {
namespace {

std::atomic<uint64_t> next_recorder_id{1};

// Recorders opened in this process per directory, for the file name of the next one.
std::mutex opened_mutex;
std::map<std::string, int>& opened() {
  static std::map<std::string, int> counts;
  return counts;
}

// Creates `dir` and its missing parents; false (errno set) when one cannot be created.
bool make_directories(const std::string& dir) {
  for (size_t at = 1; at <= dir.size(); ++at) {
    if (at != dir.size() && dir[at] != '/') continue;
    const std::string part = dir.substr(0, at);
    if (::mkdir(part.c_str(), 0777) != 0 && errno != EEXIST) return false;
  }
  struct stat st;
  return ::stat(dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

std::string number(double v) {
  char text[32];
  std::snprintf(text, sizeof text, "%.3f", v);
  return text;
}

}  // namespace

std::string json_escape(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char esc[8];
          std::snprintf(esc, sizeof esc, "\\u%04x", static_cast<unsigned>(c));
          out += esc;
        } else {
          out += c;
        }
    }
  }
  return out;
}

void Args::name(const char* n) {
  if (!members_.empty()) members_ += ',';
  members_ += '"';
  members_ += n;
  members_ += "\":";
}

Args& Args::add(const char* n, const std::string& value) {
  name(n);
  members_ += '"' + json_escape(value) + '"';
  return *this;
}

Args& Args::add(const char* n, uint64_t value) {
  name(n);
  members_ += std::to_string(value);
  return *this;
}

Args& Args::add(const char* n, double value) {
  name(n);
  members_ += number(value);
  return *this;
}

Recorder::Recorder(const std::string& dir, int rank, int world_size)
    : id_(next_recorder_id.fetch_add(1)), origin_(Clock::now()) {
  if (!make_directories(dir))
    throw ConfigError("GRADEX_TIMELINE=" + dir + ": cannot create the directory (" +
                      std::strerror(errno) + ")");
  int n = 0;
  {
    std::lock_guard<std::mutex> lock(opened_mutex);
    n = ++opened()[dir];
  }
  path_ = dir + "/rank" + std::to_string(rank) + (n > 1 ? "." + std::to_string(n) : "") + ".json";
  // A process's further engines get pids of their own above the world's ranks.
  pid_ = rank + (n - 1) * world_size;
  file_ = std::fopen(path_.c_str(), "w");
  if (file_ == nullptr)
    throw ConfigError("GRADEX_TIMELINE=" + dir + ": cannot write " + path_ + " (" +
                      std::strerror(errno) + ")");
  const auto wall_us = std::chrono::duration_cast<std::chrono::microseconds>(
                           std::chrono::system_clock::now().time_since_epoch())
                           .count();
  std::lock_guard<std::mutex> lock(mutex_);
  buffer_ = "[\n";
  append("{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":" + std::to_string(pid_) +
         ",\"tid\":0,\"args\":{\"name\":\"rank " + std::to_string(rank) +
         (n > 1 ? " (engine " + std::to_string(n) + ")" : "") +
         "\",\"rank\":" + std::to_string(rank) + ",\"world_size\":" + std::to_string(world_size) +
         ",\"engine\":" + std::to_string(n) + ",\"origin_wall_us\":" + std::to_string(wall_us) +
         "}}");
  append("{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":" + std::to_string(pid_) +
         ",\"tid\":0,\"args\":{\"sort_index\":" + std::to_string(pid_) + "}}");
  named_rows_ = ",";
  last_write_ = origin_;
  write_buffer();
}

Recorder::~Recorder() {
  std::lock_guard<std::mutex> lock(mutex_);
  buffer_ += "\n]\n";
  write_buffer();
  if (std::fclose(file_) != 0) {
    GX_LOG(kWarn) << "GRADEX_TIMELINE: closing " << path_ << " failed: " << std::strerror(errno);
  }
}

double Recorder::micros(Clock::time_point t) const {
  return std::chrono::duration<double, std::micro>(t - origin_).count();
}

void Recorder::append(const std::string& line) {
  if (!first_event_) buffer_ += ",\n";
  first_event_ = false;
  buffer_ += line;
  if (buffer_.size() >= kFlushBytes) write_buffer();
}

void Recorder::write_buffer() {
  if (buffer_.empty()) return;
  // A failed write loses timeline events, never the training: warned once per process.
  if (std::fwrite(buffer_.data(), 1, buffer_.size(), file_) != buffer_.size() ||
      std::fflush(file_) != 0) {
    static std::atomic<bool> warned{false};
    if (!warned.exchange(true)) {
      GX_LOG(kWarn) << "GRADEX_TIMELINE: writing " << path_ << " failed: " << std::strerror(errno);
    }
  }
  buffer_.clear();
  last_write_ = Clock::now();
}

void Recorder::span(int row, const std::string& name, Clock::time_point begin,
                    Clock::time_point end, const Args& args) {
  std::string line = "{\"name\":\"" + json_escape(name) +
                     "\",\"ph\":\"X\",\"ts\":" + number(micros(begin)) +
                     ",\"dur\":" + number(std::max(0.0, micros(end) - micros(begin))) +
                     ",\"pid\":" + std::to_string(pid_) + ",\"tid\":" + std::to_string(row);
  if (!args.empty()) line += ",\"args\":" + args.json();
  line += "}";
  std::lock_guard<std::mutex> lock(mutex_);
  append(line);
}

void Recorder::instant(int row, const std::string& name, Clock::time_point at, const Args& args) {
  std::string line =
      "{\"name\":\"" + json_escape(name) + "\",\"ph\":\"i\",\"ts\":" + number(micros(at)) +
      ",\"s\":\"t\",\"pid\":" + std::to_string(pid_) + ",\"tid\":" + std::to_string(row);
  if (!args.empty()) line += ",\"args\":" + args.json();
  line += "}";
  std::lock_guard<std::mutex> lock(mutex_);
  append(line);
}

int Recorder::thread_row(const char* role) {
  // Each thread remembers its row in each recorder it has recorded into (recorders are few).
  thread_local std::vector<std::pair<uint64_t, int>> rows;
  for (const auto& [id, row] : rows)
    if (id == id_) return row;
  std::lock_guard<std::mutex> lock(mutex_);
  const int row = next_thread_row_++;
  append("{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":" + std::to_string(pid_) +
         ",\"tid\":" + std::to_string(row) + ",\"args\":{\"name\":\"" + json_escape(role) + " " +
         std::to_string(row - kFirstThreadRow + 1) + "\"}}");
  rows.emplace_back(id_, row);
  return row;
}

void Recorder::name_row(int row, const std::string& name) {
  const std::string mark = std::to_string(row) + ",";
  std::lock_guard<std::mutex> lock(mutex_);
  if (named_rows_.find("," + mark) != std::string::npos) return;
  named_rows_ += mark;
  append("{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":" + std::to_string(pid_) +
         ",\"tid\":" + std::to_string(row) + ",\"args\":{\"name\":\"" + json_escape(name) + "\"}}");
  append("{\"name\":\"thread_sort_index\",\"ph\":\"M\",\"pid\":" + std::to_string(pid_) +
         ",\"tid\":" + std::to_string(row) + ",\"args\":{\"sort_index\":" + std::to_string(row) +
         "}}");
}

void Recorder::maybe_flush() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (Clock::now() - last_write_ >= std::chrono::seconds(1)) write_buffer();
}

void Recorder::flush() {
  std::lock_guard<std::mutex> lock(mutex_);
  write_buffer();
}

}  // namespace gradex::sync::timeline
