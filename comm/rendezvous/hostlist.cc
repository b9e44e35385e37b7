// expand_hostlist: Slurm's compressed hostlist syntax, e.g. "node[01-04,07],login1" or
// "rack[1-2]-n[01-02]" (brackets multiply). Ranges keep the zero padding of their first bound.
#include <string>
#include <vector>

#include "base/error.h"
#include "comm/rendezvous/launch.h"

namespace gradex::comm {
namespace {

constexpr size_t kMaxHosts = 1000000;

[[noreturn]] void bad(const std::string& what, const std::string& list, const std::string& why) {
  throw ConfigError(what + "='" + list + "' is not a valid Slurm hostlist: " + why);
}

bool all_digits(const std::string& s) {
  if (s.empty() || s.size() > 18) return false;
  for (char c : s)
    if (c < '0' || c > '9') return false;
  return true;
}

std::string padded(uint64_t v, size_t width) {
  std::string s = std::to_string(v);
  if (s.size() < width) s.insert(0, width - s.size(), '0');
  return s;
}

// The values of one bracket body "01-04,07".
std::vector<std::string> expand_bracket(const std::string& body, const std::string& what,
                                        const std::string& list) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= body.size()) {
    size_t comma = body.find(',', start);
    if (comma == std::string::npos) comma = body.size();
    std::string item = body.substr(start, comma - start);
    size_t dash = item.find('-');
    std::string lo = item.substr(0, dash);
    std::string hi = dash == std::string::npos ? lo : item.substr(dash + 1);
    if (!all_digits(lo) || !all_digits(hi)) bad(what, list, "'[" + body + "]' has a bad range");
    uint64_t a = std::stoull(lo), b = std::stoull(hi);
    if (b < a) bad(what, list, "range " + item + " is descending");
    if (b - a >= kMaxHosts) bad(what, list, "range " + item + " is too long");
    for (uint64_t v = a; v <= b; ++v)
      out.push_back(padded(v, lo.size()));
    start = comma + 1;
  }
  return out;
}

// Expands one comma-free (at top level) host pattern.
void expand_pattern(const std::string& pattern, const std::string& what, const std::string& list,
                    std::vector<std::string>* out) {
  std::vector<std::string> partial{""};
  size_t i = 0;
  while (i < pattern.size()) {
    size_t open = pattern.find('[', i);
    std::string literal = pattern.substr(i, open == std::string::npos ? open : open - i);
    if (literal.find(']') != std::string::npos) bad(what, list, "unbalanced ']'");
    for (auto& p : partial)
      p += literal;
    if (open == std::string::npos) break;
    size_t close = pattern.find(']', open);
    if (close == std::string::npos) bad(what, list, "unbalanced '['");
    std::vector<std::string> values =
        expand_bracket(pattern.substr(open + 1, close - open - 1), what, list);
    if (partial.size() * values.size() > kMaxHosts) bad(what, list, "more than 1000000 hosts");
    std::vector<std::string> next;
    for (const auto& p : partial)
      for (const auto& v : values)
        next.push_back(p + v);
    partial.swap(next);
    i = close + 1;
  }
  for (auto& p : partial) {
    if (p.empty()) bad(what, list, "empty host name");
    if (out->size() >= kMaxHosts) bad(what, list, "more than 1000000 hosts");
    out->push_back(std::move(p));
  }
}

}  // namespace

std::vector<std::string> expand_hostlist(const std::string& list, const std::string& what) {
  std::vector<std::string> hosts;
  int depth = 0;
  size_t start = 0;
  for (size_t i = 0; i <= list.size(); ++i) {
    char c = i < list.size() ? list[i] : ',';
    if (c == '[') {
      if (++depth > 1) bad(what, list, "nested '['");
    } else if (c == ']') {
      if (--depth < 0) bad(what, list, "unbalanced ']'");
    } else if (c == ',' && depth == 0) {
      expand_pattern(list.substr(start, i - start), what, list, &hosts);
      start = i + 1;
    } else if (c == ' ' || c == '\t' || c == '\n') {
      bad(what, list, "whitespace inside the list");
    }
  }
  if (depth != 0) bad(what, list, "unbalanced '['");
  return hosts;
}

}  // namespace gradex::comm
