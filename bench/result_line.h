// The one machine-readable line every gradex-bench command ends with:
//   RESULT key=value key=value ...
// Keys are [A-Za-z0-9_.]+, values never contain whitespace or '='. Numbers are written compactly
// (up to 6 significant digits, no trailing zeros), so scripts can split on spaces and '='.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace gradex::bench {

class ResultLine {
 public:
  // Each add() appends in order; a key added twice is an InvalidArgument (scripts would silently
  // read one of the two).
  ResultLine& add(const std::string& key, double value);
  ResultLine& add(const std::string& key, int64_t value);
  ResultLine& add(const std::string& key, int value) {
    return add(key, static_cast<int64_t>(value));
  }
  ResultLine& add(const std::string& key, const std::string& value);
  ResultLine& add(const std::string& key, const char* value) {
    return add(key, std::string(value));
  }

  // "RESULT k=v k=v" (no trailing newline). "RESULT" alone when empty.
  std::string str() const;

 private:
  std::vector<std::pair<std::string, std::string>> items_;
};

// Compact decimal form of a double: "%.6g" without trailing zeros; "nan", "inf", "-inf" as such.
std::string format_number(double value);

// Parses a line produced by ResultLine::str() back into key/value pairs (tests and scripts).
// InvalidArgument when the line does not start with "RESULT" or an item is not key=value.
std::vector<std::pair<std::string, std::string>> parse_result_line(const std::string& line);

}  // namespace gradex::bench
