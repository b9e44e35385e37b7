// The registry of GRADEX_* variables. Every variable is declared exactly once, in config_vars.cc,
// with its type, default, allowed range and help. Values are parsed strictly: a bad value is a
// ConfigError naming the variable and its allowed range; an unknown GRADEX_* name in the
// environment is a warning (most likely a typo). Values set through the API override the
// environment.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace gradex::config {

enum class VarType { kInt, kFloat, kBool, kString, kChoice };

// Which ranks must run with the same value of a variable. Stated in every declaration; an engine
// (and a DiLoCo optimizer) proves at start-up that its ranks agree on every variable of its scope
// (sync/negotiation/agreement.h): a difference is a ConfigError on every rank naming the variable,
// the values and the ranks. docs/configuration.md gives the reason for each choice.
enum class Agreement : uint8_t {
  kPerRank = 0,   // may legitimately differ (local resources, logging, local waits, secrets)
  kEngine = 1,    // equal on every rank of an engine
  kOuter = 2,     // equal on every rank of a DiLoCo optimizer (GRADEX_OUTER_*)
  kAllRanks = 3,  // both
};
// "may differ per rank", "equal on every rank (engine)", ... for gradex-config and the docs.
const char* agreement_name(Agreement agree);
inline bool agrees_in(Agreement declared, Agreement scope) {
  return (static_cast<uint8_t>(declared) & static_cast<uint8_t>(scope)) != 0;
}

struct VarSpec {
  const char* name;
  VarType type;
  const char* default_value;  // parsed with the same rules as a user's value
  double min;                 // kInt / kFloat only
  double max;
  bool min_exclusive;
  bool max_exclusive;
  const char* choices;  // kChoice only: '|'-separated
  Agreement agree;      // which ranks must hold the same value
  const char* help;
};

// All declared variables, in display order.
const std::vector<VarSpec>& registry();
// The spec of a declared variable; InternalError if the name was never declared (a gradex bug).
const VarSpec& spec(std::string_view name);
// "an integer in [0, 22]", "one of fp16|bf16", ... for error messages and help.
std::string describe_range(const VarSpec& spec);

enum class Source { kDefault, kEnvironment, kApi };
const char* source_name(Source source);

class Config {
 public:
  // Every variable at its default.
  Config();
  // Defaults overridden by the process environment. Throws ConfigError on the first invalid value;
  // warns (once per name, on stderr) about GRADEX_* names that are not declared.
  // Names in `api_names` are skipped: the API sets them, so their environment values (even invalid
  // ones) do not matter.
  static Config from_environment(const std::vector<std::string>& api_names = {});
  // Same, from an explicit list of "NAME=value" strings (tests use this instead of setenv).
  static Config from_strings(const std::vector<std::string>& assignments, Source source,
                             const std::vector<std::string>& skip = {});

  // Strictly parses and stores a value. Throws ConfigError for an undeclared name or invalid value.
  void set(std::string_view name, std::string_view value, Source source = Source::kApi);

  int64_t get_int(std::string_view name) const;
  double get_float(std::string_view name) const;
  bool get_bool(std::string_view name) const;
  const std::string& get_string(std::string_view name) const;  // kString and kChoice
  Source source_of(std::string_view name) const;
  // The value as text that is equal for two values exactly when they are equal (numbers: the
  // shortest of 15 or 17 significant digits that reads back exactly): what agreement digests hold.
  std::string canonical_text(std::string_view name) const;

  // The effective configuration: one block per variable with value, source, range and help.
  std::string describe() const;
  // Unknown GRADEX_* names seen by from_environment (kept for tests and for describe()).
  const std::vector<std::string>& unknown_names() const { return unknown_names_; }

 private:
  struct Value {
    std::string text;   // normalized textual form
    double number = 0;  // kInt, kFloat, kBool
    Source source = Source::kDefault;
  };
  const Value& value_of(std::string_view name, VarType expected) const;

  std::map<std::string, Value, std::less<>> values_;
  std::vector<std::string> unknown_names_;
};

// Strict scalar parsers, shared with other environment readers (the bootstrap's RANK/WORLD_SIZE).
// They accept the whole string or throw ConfigError mentioning `what`.
int64_t parse_int_strict(std::string_view text, std::string_view what);
double parse_float_strict(std::string_view text, std::string_view what);
bool parse_bool_strict(std::string_view text, std::string_view what);

}  // namespace gradex::config
