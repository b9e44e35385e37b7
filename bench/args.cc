#include "bench/args.h"

#include <algorithm>

#include "base/config.h"
#include "base/error.h"

namespace gradex::bench {

namespace {

std::string known_flags(const std::vector<FlagSpec>& specs) {
  std::string known;
  for (const FlagSpec& s : specs)
    known += (known.empty() ? "--" : ", --") + s.name;
  return known.empty() ? "none" : known;
}

}  // namespace

Args Args::parse(const std::vector<FlagSpec>& specs, const std::vector<std::string>& words) {
  Args args;
  args.specs_ = specs;
  for (size_t i = 0; i < words.size(); ++i) {
    const std::string& word = words[i];
    if (word.size() < 3 || word.compare(0, 2, "--") != 0) {
      auto positional =
          std::find_if(specs.begin(), specs.end(), [](const FlagSpec& s) { return s.positional; });
      if (positional == specs.end() || args.values_.count(positional->name))
        throw InvalidArgument("unexpected argument '" + word + "' (flags start with --)");
      args.values_[positional->name] = word;
      continue;
    }
    std::string name = word.substr(2), value;
    size_t eq = name.find('=');
    bool inline_value = eq != std::string::npos;
    if (inline_value) {
      value = name.substr(eq + 1);
      name.resize(eq);
    }
    auto it =
        std::find_if(specs.begin(), specs.end(), [&](const FlagSpec& s) { return s.name == name; });
    if (it == specs.end()) {
      throw InvalidArgument("unknown flag '--" + name + "' (known: " + known_flags(specs) + ")");
    }
    if (it->is_switch) {
      if (inline_value) throw InvalidArgument("flag '--" + name + "' takes no value");
      value = "1";
    } else if (!inline_value) {
      if (i + 1 >= words.size()) throw InvalidArgument("flag '--" + name + "' needs a value");
      value = words[++i];
    }
    if (args.values_.count(name)) throw InvalidArgument("flag '--" + name + "' given twice");
    args.values_[name] = value;
  }
  return args;
}

const FlagSpec& Args::spec(const std::string& name) const {
  for (const FlagSpec& s : specs_) {
    if (s.name == name) return s;
  }
  throw InternalError("flag '--" + name + "' read but never declared");
}

bool Args::given(const std::string& name) const {
  spec(name);
  return values_.count(name) != 0;
}

std::string Args::get(const std::string& name) const {
  const FlagSpec& s = spec(name);
  auto it = values_.find(name);
  return it != values_.end() ? it->second : s.default_value;
}

int64_t Args::get_int(const std::string& name, int64_t min, int64_t max) const {
  std::string what = "flag --" + name;
  int64_t value = config::parse_int_strict(get(name), what);
  if (value < min || value > max) {
    throw InvalidArgument(what + " must be in [" + std::to_string(min) + ", " +
                          std::to_string(max) + "], got " + std::to_string(value));
  }
  return value;
}

double Args::get_float(const std::string& name, double min, double max) const {
  std::string what = "flag --" + name;
  double value = config::parse_float_strict(get(name), what);
  if (!(value >= min && value <= max)) {
    throw InvalidArgument(what + " must be in [" + std::to_string(min) + ", " +
                          std::to_string(max) + "], got " + get(name));
  }
  return value;
}

int64_t Args::get_bytes(const std::string& name, int64_t min, int64_t max) const {
  std::string what = "flag --" + name;
  std::string text = get(name);
  int shift = 0;
  if (!text.empty()) {
    char unit = text.back();
    if (unit == 'K' || unit == 'k') shift = 10;
    if (unit == 'M' || unit == 'm') shift = 20;
    if (unit == 'G' || unit == 'g') shift = 30;
    if (shift) text.pop_back();
  }
  int64_t value = config::parse_int_strict(text, what);
  if (value < 0 || value > (int64_t{1} << 40)) {
    throw InvalidArgument(what + "='" + get(name) + "' is not a byte count");
  }
  value <<= shift;
  if (value < min || value > max) {
    throw InvalidArgument(what + " must be in [" + format_bytes(min) + ", " + format_bytes(max) +
                          "], got " + get(name));
  }
  return value;
}

bool Args::get_switch(const std::string& name) const {
  if (!spec(name).is_switch) throw InternalError("flag '--" + name + "' is not a switch");
  return values_.count(name) != 0;
}

std::string describe_flags(const std::vector<FlagSpec>& specs) {
  auto left_of = [](const FlagSpec& s) { return "  --" + s.name + (s.is_switch ? "" : " VALUE"); };
  size_t width = 0;
  for (const FlagSpec& s : specs)
    width = std::max(width, left_of(s).size());
  std::string out;
  for (const FlagSpec& s : specs) {
    std::string left = left_of(s);
    left.resize(width, ' ');
    out += left + "  " + s.help;
    if (!s.is_switch && !s.default_value.empty()) out += " (default: " + s.default_value + ")";
    out += "\n";
  }
  return out;
}

std::string format_bytes(int64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int unit = 0;
  while (unit < 4 && bytes != 0 && bytes % 1024 == 0) {
    bytes /= 1024;
    ++unit;
  }
  return std::to_string(bytes) + " " + units[unit];
}

}  // namespace gradex::bench
