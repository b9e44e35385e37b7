// gradex_check_config: validates GRADEX_* names and values in this process, exactly as engine
// creation parses them, without creating an engine or touching the network. Plugins call it when a
// lazy object (one whose engine starts later) is constructed, so that a misspelt or out-of-range
// config= entry fails there instead of inside the first backward().
#include <algorithm>
#include <string>
#include <string_view>
#include <vector>

#include "base/config.h"
#include "base/error.h"
#include "capi/guarded.h"
#include "capi/options_config.h"
#include "comm/communicator.h"
#include "gradex/gradex.h"
#include "outer/outer.h"
#include "sync/engine/options.h"
#include "sync/policy/policy_settings.h"

namespace {

// Levenshtein distance, for suggesting the declared name closest to a misspelt one.
size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j)
    row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

bool is_declared(std::string_view name) {
  for (const auto& s : gradex::config::registry())
    if (name == s.name) return true;
  return false;
}

// ConfigError for an undeclared name: names the nearest declared variable and its allowed values
// when one is close enough to be the intended one.
[[noreturn]] void unknown_name(const std::string& name) {
  const gradex::config::VarSpec* nearest = nullptr;
  size_t best = 0;
  for (const auto& s : gradex::config::registry()) {
    size_t d = edit_distance(name, s.name);
    if (nearest == nullptr || d < best) {
      nearest = &s;
      best = d;
    }
  }
  std::string message = "unknown configuration variable '" + name + "'";
  if (nearest != nullptr && best <= std::max<size_t>(3, name.size() / 4))
    message += " (did you mean " + std::string(nearest->name) + ", " +
               gradex::config::describe_range(*nearest) + "?)";
  else
    message += " (gradex-config lists the known ones)";
  throw gradex::ConfigError(message);
}

}  // namespace

extern "C" gradex_status_t gradex_check_config(size_t count, const char* const* names,
                                               const char* const* values) {
  return gradex::capi::guarded("gradex_check_config", [&] {
    // An unknown name is named with its closest declared one before the registry parses anything.
    for (size_t i = 0; i < count; ++i)
      if (names && names[i] && !is_declared(names[i])) unknown_name(names[i]);
    auto config = gradex::capi::config_from_pairs(count, names, values);
    // The cross-variable rules engine and DiLoCo creation apply (overrides' syntax, the outer
    // delay below the period, a readable secret file, ...).
    gradex::sync::resolve_policy(config);
    gradex::sync::engine_options_from_config(config);
    gradex::comm::comm_options_from_config(config);
    gradex::outer::outer_options_from_config(config);
  });
}
