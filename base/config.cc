#include "base/config.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>
#include <sstream>

#include "base/error.h"
#include "base/log.h"

extern char** environ;

namespace gradex::config {
namespace {

std::string trim(std::string_view text) {
  size_t b = 0, e = text.size();
  while (b < e && std::isspace(static_cast<unsigned char>(text[b])))
    ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(text[e - 1])))
    --e;
  return std::string(text.substr(b, e - b));
}

std::string format_number(double v) {
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  std::ostringstream os;
  os.precision(15);
  os << v;
  return os.str();
}

[[noreturn]] void invalid(const VarSpec& spec, std::string_view value, const std::string& why) {
  throw ConfigError(std::string(spec.name) + "='" + std::string(value) + "' is invalid: " + why +
                    " (allowed: " + describe_range(spec) + ")");
}

bool in_range(const VarSpec& spec, double v) {
  bool low_ok = spec.min_exclusive ? v > spec.min : v >= spec.min;
  bool high_ok = spec.max_exclusive ? v < spec.max : v <= spec.max;
  return low_ok && high_ok;
}

}  // namespace

int64_t parse_int_strict(std::string_view text, std::string_view what) {
  std::string s = trim(text);
  if (s.empty()) throw ConfigError(std::string(what) + " is empty; expected an integer");
  errno = 0;
  char* end = nullptr;
  long long v = std::strtoll(s.c_str(), &end, 10);
  if (errno == ERANGE) throw ConfigError(std::string(what) + "='" + s + "' is out of range");
  if (end == s.c_str() || *end != '\0')
    throw ConfigError(std::string(what) + "='" + s + "' is not an integer");
  return v;
}

double parse_float_strict(std::string_view text, std::string_view what) {
  std::string s = trim(text);
  if (s.empty()) throw ConfigError(std::string(what) + " is empty; expected a number");
  errno = 0;
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  if (end == s.c_str() || *end != '\0')
    throw ConfigError(std::string(what) + "='" + s + "' is not a number");
  if (std::isnan(v)) throw ConfigError(std::string(what) + "='" + s + "' is not a number");
  return v;
}

bool parse_bool_strict(std::string_view text, std::string_view what) {
  std::string s = trim(text);
  for (auto& c : s)
    c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (s == "1" || s == "true" || s == "yes" || s == "on") return true;
  if (s == "0" || s == "false" || s == "no" || s == "off") return false;
  throw ConfigError(std::string(what) + "='" + std::string(text) +
                    "' is not a boolean (use 1/0, true/false, yes/no, on/off)");
}

const VarSpec& spec(std::string_view name) {
  for (const auto& s : registry())
    if (name == s.name) return s;
  throw InternalError("GRADEX variable '" + std::string(name) +
                      "' is not declared in config_vars.cc");
}

std::string describe_range(const VarSpec& s) {
  switch (s.type) {
    case VarType::kInt:
    case VarType::kFloat: {
      std::string kind = s.type == VarType::kInt ? "an integer in " : "a number in ";
      return kind + (s.min_exclusive ? "(" : "[") + format_number(s.min) + ", " +
             format_number(s.max) + (s.max_exclusive ? ")" : "]");
    }
    case VarType::kBool:
      return "a boolean: 1/0, true/false, yes/no, on/off";
    case VarType::kString:
      return "any string";
    case VarType::kChoice:
      return std::string("one of ") + s.choices;
  }
  return "?";
}

const char* source_name(Source source) {
  switch (source) {
    case Source::kDefault:
      return "default";
    case Source::kEnvironment:
      return "environment";
    case Source::kApi:
      return "api";
  }
  return "?";
}

Config::Config() {
  for (const auto& s : registry())
    set(s.name, s.default_value, Source::kDefault);
}

void Config::set(std::string_view name, std::string_view raw, Source source) {
  const VarSpec* found = nullptr;
  for (const auto& s : registry())
    if (name == s.name) found = &s;
  if (found == nullptr)
    throw ConfigError("unknown configuration variable '" + std::string(name) +
                      "' (gradex-config lists the known ones)");
  const VarSpec& s = *found;
  Value value;
  value.source = source;
  std::string text = trim(raw);
  try {
    switch (s.type) {
      case VarType::kInt: {
        int64_t v = parse_int_strict(text, s.name);
        if (!in_range(s, static_cast<double>(v))) invalid(s, raw, "out of range");
        value.number = static_cast<double>(v);
        value.text = std::to_string(v);
        break;
      }
      case VarType::kFloat: {
        double v = parse_float_strict(text, s.name);
        if (!in_range(s, v)) invalid(s, raw, "out of range");
        value.number = v;
        value.text = format_number(v);
        break;
      }
      case VarType::kBool: {
        bool v = parse_bool_strict(text, s.name);
        value.number = v ? 1 : 0;
        value.text = v ? "1" : "0";
        break;
      }
      case VarType::kString:
        value.text = text;
        break;
      case VarType::kChoice: {
        std::string choices = s.choices;
        std::string lowered = text;
        for (auto& c : lowered)
          c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
        bool ok = false;
        size_t start = 0;
        while (start <= choices.size()) {
          size_t bar = choices.find('|', start);
          if (bar == std::string::npos) bar = choices.size();
          if (choices.compare(start, bar - start, lowered) == 0 && bar - start == lowered.size())
            ok = true;
          start = bar + 1;
        }
        if (!ok) invalid(s, raw, "not one of the choices");
        value.text = lowered;
        break;
      }
    }
  } catch (const ConfigError& e) {
    // Re-raise scalar parse failures with the allowed range attached.
    std::string msg = e.what();
    if (msg.find("allowed:") == std::string::npos) msg += " (allowed: " + describe_range(s) + ")";
    throw ConfigError(msg);
  }
  values_[s.name] = std::move(value);
}

Config Config::from_strings(const std::vector<std::string>& assignments, Source source,
                            const std::vector<std::string>& skip) {
  Config config;
  for (const auto& a : assignments) {
    size_t eq = a.find('=');
    std::string name = a.substr(0, eq);
    if (name.rfind("GRADEX_", 0) != 0) continue;
    std::string value = eq == std::string::npos ? "" : a.substr(eq + 1);
    if (std::find(skip.begin(), skip.end(), name) != skip.end()) continue;
    bool declared = false;
    for (const auto& s : registry())
      declared |= name == s.name;
    if (!declared) {
      config.unknown_names_.push_back(name);
      continue;
    }
    config.set(name, value, source);
  }
  return config;
}

Config Config::from_environment(const std::vector<std::string>& api_names) {
  std::vector<std::string> assignments;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e)
    assignments.emplace_back(*e);
  Config config = from_strings(assignments, Source::kEnvironment, api_names);
  static std::mutex warned_mutex;
  static std::set<std::string> warned;
  std::lock_guard<std::mutex> lock(warned_mutex);
  for (const auto& name : config.unknown_names_) {
    if (warned.insert(name).second) {
      GX_LOG(kWarn) << "ignoring unknown environment variable " << name
                    << " (a typo? gradex-config lists the known GRADEX_* variables)";
    }
  }
  return config;
}

const Config::Value& Config::value_of(std::string_view name, VarType expected) const {
  const VarSpec& s = spec(name);
  bool compatible =
      s.type == expected || (expected == VarType::kString && s.type == VarType::kChoice);
  if (!compatible)
    throw InternalError("GRADEX variable " + std::string(name) + " read with the wrong type");
  return values_.find(name)->second;
}

int64_t Config::get_int(std::string_view name) const {
  return static_cast<int64_t>(value_of(name, VarType::kInt).number);
}
double Config::get_float(std::string_view name) const {
  return value_of(name, VarType::kFloat).number;
}
bool Config::get_bool(std::string_view name) const {
  return value_of(name, VarType::kBool).number != 0;
}
const std::string& Config::get_string(std::string_view name) const {
  return value_of(name, VarType::kString).text;
}
Source Config::source_of(std::string_view name) const {
  spec(name);
  return values_.find(name)->second.source;
}

const char* agreement_name(Agreement agree) {
  switch (agree) {
    case Agreement::kPerRank:
      return "may differ per rank";
    case Agreement::kEngine:
      return "equal on every rank (engine)";
    case Agreement::kOuter:
      return "equal on every rank (DiLoCo)";
    case Agreement::kAllRanks:
      return "equal on every rank (engine, DiLoCo)";
  }
  return "?";
}

std::string Config::canonical_text(std::string_view name) const {
  const VarSpec& s = spec(name);
  const Value& v = values_.find(name)->second;
  if (s.type != VarType::kFloat || std::isinf(v.number)) return v.text;
  std::ostringstream os;
  os.precision(15);
  os << v.number;
  if (std::strtod(os.str().c_str(), nullptr) == v.number) return os.str();
  os.str("");
  os.precision(17);
  os << v.number;
  return os.str();
}

std::string Config::describe() const {
  std::ostringstream os;
  for (const auto& s : registry()) {
    const Value& v = values_.find(s.name)->second;
    // Secrets are never printed, only whether one is set.
    const bool hidden = std::string_view(s.name).find("SECRET") != std::string_view::npos &&
                        std::string_view(s.name).find("FILE") == std::string_view::npos &&
                        !v.text.empty();
    os << s.name << "=" << (hidden ? "<hidden>" : v.text) << "    [" << source_name(v.source)
       << "; default '" << s.default_value << "'; " << describe_range(s) << "; "
       << agreement_name(s.agree) << "]\n    " << s.help << "\n";
  }
  for (const auto& name : unknown_names_)
    os << name << "    [unknown: ignored]\n";
  return os.str();
}

}  // namespace gradex::config
