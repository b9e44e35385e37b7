#include "sync/timeline/merge.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <regex>

#include "base/error.h"

namespace gradex::sync::timeline {
namespace {

struct Line {
  std::string text;  // without the separating comma
  bool has_ts = false;
  size_t ts_at = 0, ts_end = 0;  // the number after "ts":
  double ts = 0;
};

struct RankFile {
  RankClock clock;
  double origin_wall_us = 0;
  std::vector<Line> lines;
  std::map<uint64_t, double> round_end_us;  // round -> end, on the rank's own clock
  std::vector<double> round_lengths_us;
};

// The number of member `name` in `text` ("name":<number>), or false.
bool number_member(const std::string& text, const std::string& name, double& value,
                   size_t* at = nullptr, size_t* end = nullptr) {
  const std::string key = "\"" + name + "\":";
  const size_t k = text.find(key);
  if (k == std::string::npos) return false;
  const size_t from = k + key.size();
  char* stop = nullptr;
  value = std::strtod(text.c_str() + from, &stop);
  if (stop == text.c_str() + from) return false;
  if (at != nullptr) *at = from;
  if (end != nullptr) *end = static_cast<size_t>(stop - text.c_str());
  return true;
}

RankFile read_rank(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw InvalidArgument("cannot read " + path);
  RankFile f;
  f.clock.file = path;
  std::string raw;
  bool opened = false, found_origin = false;
  while (std::getline(in, raw)) {
    if (raw == "[") {
      opened = true;
      continue;
    }
    if (raw == "]" || raw.empty()) continue;
    if (!opened || raw.front() != '{')
      throw InvalidArgument(path + " is not a gradex timeline (GRADEX_TIMELINE's rank<r>.json)");
    if (raw.back() == ',') raw.pop_back();
    Line line;
    line.text = raw;
    if (raw.find("\"name\":\"process_name\"") != std::string::npos) {
      double pid = 0, engine = 1;
      if (number_member(raw, "origin_wall_us", f.origin_wall_us) &&
          number_member(raw, "pid", pid)) {
        f.clock.pid = static_cast<int>(pid);
        if (number_member(raw, "engine", engine)) f.clock.engine = static_cast<int>(engine);
        found_origin = true;
      }
    }
    line.has_ts = number_member(raw, "ts", line.ts, &line.ts_at, &line.ts_end);
    if (line.has_ts) {
      ++f.clock.events;
      double round = 0, dur = 0;
      if (raw.rfind("{\"name\":\"negotiate\"", 0) == 0 && number_member(raw, "round", round) &&
          number_member(raw, "dur", dur))
        f.round_end_us[static_cast<uint64_t>(round)] = line.ts + dur;
      if (raw.rfind("{\"name\":\"negotiate\"", 0) == 0 && number_member(raw, "dur", dur))
        f.round_lengths_us.push_back(dur);
    }
    f.lines.push_back(std::move(line));
  }
  if (!found_origin) throw InvalidArgument(path + " has no gradex timeline header (process_name)");
  return f;
}

double median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::nth_element(values.begin(), values.begin() + values.size() / 2, values.end());
  return values[values.size() / 2];
}

std::string format_us(double v) {
  char text[40];
  std::snprintf(text, sizeof text, "%.3f", v);
  return text;
}

}  // namespace

Merged merge_files(const std::vector<std::string>& files) {
  if (files.empty()) throw InvalidArgument("no gradex timeline files to merge");
  std::vector<RankFile> ranks;
  for (const std::string& path : files)
    ranks.push_back(read_rank(path));
  std::sort(ranks.begin(), ranks.end(),
            [](const RankFile& a, const RankFile& b) { return a.clock.pid < b.clock.pid; });
  double earliest = std::numeric_limits<double>::max();
  for (const RankFile& r : ranks)
    earliest = std::min(earliest, r.origin_wall_us);
  for (RankFile& r : ranks)
    r.clock.offset_us = r.origin_wall_us - earliest;
  // Per engine (a process's n-th recorder: the same engine on every rank), its first rank's rounds
  // are the reference; every other rank of it is moved by the median of (reference end - its end)
  // over the rounds both ran. Different engines run different rounds: they keep the system clock.
  for (size_t i = 0; i < ranks.size(); ++i) {
    RankFile& r = ranks[i];
    const RankFile* reference = nullptr;
    for (const RankFile& candidate : ranks)
      if (candidate.clock.engine == r.clock.engine) {
        reference = &candidate;
        break;
      }
    if (reference == &r) continue;
    const RankFile& first = *reference;
    std::vector<double> differences;
    for (const auto& [round, end] : r.round_end_us) {
      auto ref = first.round_end_us.find(round);
      if (ref == first.round_end_us.end()) continue;
      differences.push_back((ref->second + first.clock.offset_us) - (end + r.clock.offset_us));
    }
    if (differences.empty()) continue;
    r.clock.rounds_matched = differences.size();
    r.clock.round_correction_us = median(differences);
    // Ranks leave a round within about its own length of each other (on a WAN, rank 0 decides a
    // one-way latency before the others hear it): a smaller correction is the protocol's, not the
    // clocks', and the system clocks are kept.
    r.clock.round_length_us = median(r.round_lengths_us);
    if (std::abs(r.clock.round_correction_us) <= r.clock.round_length_us)
      r.clock.round_correction_us = 0;
    r.clock.offset_us += r.clock.round_correction_us;
  }
  // Nothing before 0: shift everyone by the earliest shifted event.
  double lowest = 0;
  for (const RankFile& r : ranks)
    for (const Line& l : r.lines)
      if (l.has_ts) lowest = std::min(lowest, l.ts + r.clock.offset_us);
  Merged out;
  out.json = "[\n";
  bool first_line = true;
  for (RankFile& r : ranks) {
    r.clock.offset_us -= lowest;
    for (const Line& l : r.lines) {
      out.json += first_line ? "" : ",\n";
      first_line = false;
      if (!l.has_ts) {
        out.json += l.text;
        continue;
      }
      out.json +=
          l.text.substr(0, l.ts_at) + format_us(l.ts + r.clock.offset_us) + l.text.substr(l.ts_end);
    }
    out.ranks.push_back(r.clock);
  }
  out.json += "\n]\n";
  return out;
}

Merged merge_directory(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code error;
  if (!fs::is_directory(dir, error))
    throw InvalidArgument(dir + " is not a directory (give the GRADEX_TIMELINE directory)");
  const std::regex name(R"(rank[0-9]+(\.[0-9]+)?\.json)");
  std::vector<std::string> files;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string file = entry.path().filename().string();
    if (entry.is_regular_file() && std::regex_match(file, name))
      files.push_back(entry.path().string());
  }
  if (files.empty())
    throw InvalidArgument(dir + " holds no rank<r>.json (GRADEX_TIMELINE's files)");
  std::sort(files.begin(), files.end());
  return merge_files(files);
}

}  // namespace gradex::sync::timeline
