#include "sync/engine/stall_inspector.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <sstream>

#include "base/config.h"
#include "base/log.h"

namespace gradex::sync {
namespace {

constexpr size_t kNamesShown = 5;  // keys named per group; the rest are counted

std::string rank_list(const std::vector<bool>& announced, bool value) {
  std::string s;
  for (size_t r = 0; r < announced.size(); ++r) {
    if (announced[r] != value) continue;
    s += (s.empty() ? "" : ", ") + std::to_string(r);
  }
  return "[" + s + "]";
}

std::string seconds(std::chrono::steady_clock::duration d) {
  std::ostringstream os;
  os.precision(1);
  os << std::fixed << std::chrono::duration<double>(d).count() << " s";
  return os.str();
}

}  // namespace

StallInspector::StallInspector(std::chrono::milliseconds warn_after,
                               std::chrono::milliseconds timeout)
    : warn_after_(warn_after), timeout_(timeout) {}

bool StallInspector::due(Clock::time_point oldest, Clock::time_point now) const {
  return now - oldest >= warn_after_ &&
         (last_report_ == Clock::time_point{} || now - last_report_ >= warn_after_);
}

StallInspector::Clock::time_point StallInspector::next_due(Clock::time_point oldest) const {
  Clock::time_point t = oldest + warn_after_;
  if (last_report_ != Clock::time_point{}) t = std::max(t, last_report_ + warn_after_);
  return t;
}

std::string StallInspector::inspect(const std::vector<StallKey>& pending, Clock::time_point now) {
  if (last_report_ != Clock::time_point{} && now - last_report_ < warn_after_) return "";
  // Group the stalled keys by which ranks are late: usually one rank is behind on many keys.
  struct Group {
    std::vector<bool> announced;
    std::vector<std::string> names;
    Clock::duration longest{0};
  };
  std::map<std::vector<bool>, Group> groups;
  for (const StallKey& k : pending) {
    Clock::duration waited = now - k.first_seen;
    if (waited < warn_after_) continue;
    Group& g = groups[k.announced];
    g.announced = k.announced;
    g.names.push_back(k.name);
    if (waited > g.longest) g.longest = waited;
  }
  if (groups.empty()) return "";
  std::string report;
  for (const auto& [key, g] : groups) {
    std::string names;
    for (size_t i = 0; i < g.names.size() && i < kNamesShown; ++i)
      names += (i ? ", " : "") + g.names[i];
    if (g.names.size() > kNamesShown)
      names += " and " + std::to_string(g.names.size() - kNamesShown) + " more";
    if (!report.empty()) report += "; ";
    report += "ranks " + rank_list(g.announced, false) + " are late: they have not submitted " +
              std::to_string(g.names.size()) + " key(s) that ranks " +
              rank_list(g.announced, true) + " submitted up to " + seconds(g.longest) +
              " ago: " + names;
  }
  report = "stall: " + report +
           " (GRADEX_STALL_WARN_S; the job fails after GRADEX_TIMEOUT_S = " + seconds(timeout_) +
           ")";
  GX_LOG(kWarn) << report;
  last_report_ = now;
  return report;
}

std::unique_ptr<StallInspector> make_stall_inspector(const config::Config& config,
                                                     std::chrono::milliseconds timeout) {
  double s = config.get_float("GRADEX_STALL_WARN_S");
  if (s <= 0) return nullptr;
  auto warn = std::chrono::milliseconds(std::max<long long>(1, std::llround(s * 1000)));
  return std::make_unique<StallInspector>(warn, timeout);
}

}  // namespace gradex::sync
