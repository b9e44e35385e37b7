// Command-line flags of one gradex-bench command: declared up front (name, default, help), parsed
// strictly. "--name value" and "--name=value" both work; a switch takes no value. Unknown flags,
// missing values, stray positional words (beyond a flag declared positional) and malformed numbers
// are InvalidArgument errors that name the flag, so a typo never silently runs a different
// benchmark.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace gradex::bench {

struct FlagSpec {
  std::string name;           // without the leading "--"
  std::string default_value;  // ignored for switches
  std::string help;
  bool is_switch = false;
  // The command's one bare word (not starting with --) is this flag's value: `gradex-bench
  // timeline DIR` is `--dir DIR`. At most one flag of a command is positional.
  bool positional = false;
};

class Args {
 public:
  // `words` are the arguments after the command name.
  static Args parse(const std::vector<FlagSpec>& specs, const std::vector<std::string>& words);

  // True when the flag was given on the command line (switches: when present).
  bool given(const std::string& name) const;
  std::string get(const std::string& name) const;
  // Strict integer / float within [min, max]; the error names the flag and the range.
  int64_t get_int(const std::string& name, int64_t min, int64_t max) const;
  double get_float(const std::string& name, double min, double max) const;
  // A byte count: an integer with an optional suffix K, M or G (binary: 64K = 65536), within
  // [min, max].
  int64_t get_bytes(const std::string& name, int64_t min, int64_t max) const;
  bool get_switch(const std::string& name) const;

 private:
  const FlagSpec& spec(const std::string& name) const;

  std::vector<FlagSpec> specs_;
  std::map<std::string, std::string> values_;  // only flags that were given
};

// "  --name VALUE   help (default: x)" lines for --help output.
std::string describe_flags(const std::vector<FlagSpec>& specs);

// "64 KiB", "1 MiB", "256 MiB", "1000 B": exact binary units for table rows and RESULT keys.
std::string format_bytes(int64_t bytes);

}  // namespace gradex::bench
