#include "link.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <regex>
#include <stdexcept>

namespace gradex::delayline {

int64_t Pipe::admit(int64_t now_ns, size_t bytes) {
  const int64_t start = std::max(now_ns, busy_until_ns_);
  const double queued_bytes = static_cast<double>(start - now_ns) * rate_bps_ / 8e9;
  if (start > now_ns &&
      queued_bytes + static_cast<double>(bytes) > static_cast<double>(queue_bytes_)) {
    return -1;
  }
  busy_until_ns_ =
      start + static_cast<int64_t>(std::llround(static_cast<double>(bytes) * 8e9 / rate_bps_));
  return busy_until_ns_;
}

Topology::Topology(const TopologySpec& spec) : spec_(spec) {
  const int n = hosts();
  if (n < 2) throw std::invalid_argument("a topology needs at least 2 hosts");
  int regions = 0;
  for (int r : spec.region_of) {
    if (r < 0) throw std::invalid_argument("region numbers start at 0");
    regions = std::max(regions, r + 1);
  }
  for (int r = 0; r < regions; ++r) {
    if (std::find(spec.region_of.begin(), spec.region_of.end(), r) == spec.region_of.end()) {
      throw std::invalid_argument("region " + std::to_string(r) +
                                  " has no host (regions are 0..R-1)");
    }
  }
  if (spec.intra.rate_bps <= 0) throw std::invalid_argument("the intra-region rate must be > 0");
  if (regions > 1 && spec.inter.rate_bps <= 0) {
    throw std::invalid_argument("the inter-region rate must be > 0");
  }
  std::vector<Pipe*> up(n), down(n), inter(static_cast<size_t>(regions) * regions, nullptr);
  std::vector<LinkSpec> inter_spec(static_cast<size_t>(regions) * regions, spec.inter);
  for (const auto& [pair, link] : spec.inter_pairs) {
    const auto [a, b] = pair;
    if (a < 0 || b >= regions || a >= b || link.rate_bps <= 0) {
      throw std::invalid_argument("bad region pair " + std::to_string(a) + "-" + std::to_string(b) +
                                  " (regions are 0.." + std::to_string(regions - 1) + ", a < b)");
    }
    inter_spec[a * regions + b] = inter_spec[b * regions + a] = link;
  }
  for (int h = 0; h < n; ++h) {
    up[h] = make_pipe(spec.intra.rate_bps);
    down[h] = make_pipe(spec.intra.rate_bps);
  }
  for (int a = 0; a < regions; ++a) {
    for (int b = 0; b < regions; ++b) {
      if (a != b) inter[a * regions + b] = make_pipe(inter_spec[a * regions + b].rate_bps);
    }
  }
  paths_.resize(static_cast<size_t>(n) * n);
  for (int s = 0; s < n; ++s) {
    for (int d = 0; d < n; ++d) {
      if (s == d) continue;
      const int rs = spec.region_of[s], rd = spec.region_of[d];
      auto& path = paths_[s * n + d];
      if (rs == rd) {
        path = {{up[s], spec.intra.delay_ns}, {down[d], 0}};
      } else {
        path = {{up[s], 0},
                {inter[rs * regions + rd], inter_spec[rs * regions + rd].delay_ns, true},
                {down[d], 0}};
      }
    }
  }
}

Pipe* Topology::make_pipe(double rate_bps) {
  const double queue = std::max(rate_bps / 8 * spec_.queue_ms / 1e3, 4.0 * spec_.mtu);
  pipes_.push_back(std::make_unique<Pipe>(rate_bps, static_cast<int64_t>(queue)));
  return pipes_.back().get();
}

double parse_rate(const std::string& text) {
  static const std::regex form(R"(([0-9]+(\.[0-9]+)?)([kmg]?)bit)");
  std::smatch m;
  if (!std::regex_match(text, m, form)) {
    throw std::invalid_argument("bad rate '" + text + "' (expected e.g. 1gbit, 100mbit, 500kbit)");
  }
  const double unit = m[3] == "k" ? 1e3 : m[3] == "m" ? 1e6 : m[3] == "g" ? 1e9 : 1;
  const double bps = std::stod(m[1]) * unit;
  if (bps < 1e3) throw std::invalid_argument("rate '" + text + "' is below 1kbit");
  return bps;
}

int64_t parse_time(const std::string& text) {
  static const std::regex form(R"(([0-9]+(\.[0-9]+)?)(us|ms|s))");
  std::smatch m;
  if (!std::regex_match(text, m, form)) {
    throw std::invalid_argument("bad time '" + text + "' (expected e.g. 25ms, 0.25ms, 100us)");
  }
  const double unit = m[3] == "us" ? 1e3 : m[3] == "ms" ? 1e6 : 1e9;
  return static_cast<int64_t>(std::llround(std::stod(m[1]) * unit));
}

LinkSpec parse_link(const std::string& text) {
  const auto comma = text.find(',');
  if (comma == std::string::npos) {
    throw std::invalid_argument("bad link '" + text + "' (expected RATE,DELAY, e.g. 1gbit,25ms)");
  }
  return {parse_rate(text.substr(0, comma)), parse_time(text.substr(comma + 1))};
}

std::map<std::pair<int, int>, LinkSpec> parse_inter_pairs(const std::string& text) {
  static const std::regex form(R"(([0-9]+)-([0-9]+):(.+))");
  std::map<std::pair<int, int>, LinkSpec> out;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t end = std::min(text.find(';', start), text.size());
    const std::string item = text.substr(start, end - start);
    std::smatch m;
    if (!std::regex_match(item, m, form)) {
      throw std::invalid_argument("bad region pair '" + item + "' (expected e.g. 0-2:1gbit,75ms)");
    }
    int a = std::stoi(m[1]), b = std::stoi(m[2]);
    if (a > b) std::swap(a, b);
    out[{a, b}] = parse_link(m[3]);
    start = end + 1;
  }
  return out;
}

}  // namespace gradex::delayline
