#include "bench/result_line.h"

#include <cmath>
#include <cstdio>
#include <sstream>

#include "base/error.h"

namespace gradex::bench {

namespace {

void check_key(const std::string& key) {
  bool ok = !key.empty();
  for (char c : key) {
    bool word = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                c == '_' || c == '.';
    ok = ok && word;
  }
  if (!ok) throw InvalidArgument("RESULT key '" + key + "' must match [A-Za-z0-9_.]+");
}

void check_value(const std::string& key, const std::string& value) {
  bool ok = !value.empty();
  for (char c : value)
    ok = ok && c != '=' && c != ' ' && c != '\t' && c != '\n' && c != '\r';
  if (!ok) {
    throw InvalidArgument("RESULT value of '" + key + "' ('" + value +
                          "') must be non-empty without whitespace or '='");
  }
}

}  // namespace

std::string format_number(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.6g", value);
  std::string s(buf);
  // %g already drops trailing zeros of the fraction; keep "-0" out of the output.
  if (s == "-0") s = "0";
  return s;
}

ResultLine& ResultLine::add(const std::string& key, const std::string& value) {
  check_key(key);
  check_value(key, value);
  for (const auto& item : items_) {
    if (item.first == key) throw InvalidArgument("RESULT key '" + key + "' added twice");
  }
  items_.emplace_back(key, value);
  return *this;
}

ResultLine& ResultLine::add(const std::string& key, double value) {
  return add(key, format_number(value));
}

ResultLine& ResultLine::add(const std::string& key, int64_t value) {
  return add(key, std::to_string(value));
}

std::string ResultLine::str() const {
  std::string out = "RESULT";
  for (const auto& [key, value] : items_)
    out += " " + key + "=" + value;
  return out;
}

std::vector<std::pair<std::string, std::string>> parse_result_line(const std::string& line) {
  std::istringstream in(line);
  std::string word;
  if (!(in >> word) || word != "RESULT") {
    throw InvalidArgument("not a RESULT line: '" + line + "'");
  }
  std::vector<std::pair<std::string, std::string>> items;
  while (in >> word) {
    size_t eq = word.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == word.size()) {
      throw InvalidArgument("RESULT item '" + word + "' is not key=value");
    }
    items.emplace_back(word.substr(0, eq), word.substr(eq + 1));
  }
  return items;
}

}  // namespace gradex::bench
