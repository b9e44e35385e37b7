#include "sync/policy/policy_settings.h"

#include <mutex>
#include <set>
#include <vector>

#include "base/error.h"
#include "base/log.h"

namespace gradex::sync {
namespace {

// Settings only GRADEX_POLICY=fixed reads (sync/policy/policy.h's chain).
constexpr const char* kFixedOnly[] = {"GRADEX_SPARSITY", "GRADEX_WARMUP_STEPS",
                                      "GRADEX_DENSE_THRESHOLD"};
// Settings only GRADEX_POLICY=auto reads (sync/policy/codec_planner.h). GRADEX_POLICY_HORIZON_STEPS
// is not among them: it states how long the training runs, which plugins pass whatever the policy.
constexpr const char* kAutoOnly[] = {
    "GRADEX_POLICY_INTERVAL",      "GRADEX_POLICY_LADDER",      "GRADEX_POLICY_SLACK",
    "GRADEX_POLICY_DENSE_STEPS",   "GRADEX_POLICY_RAMP_STEPS",  "GRADEX_POLICY_MIN_SELECTED",
    "GRADEX_POLICY_INT8",          "GRADEX_POLICY_MIN_PER_ROW", "GRADEX_POLICY_PROBE",
    "GRADEX_POLICY_FIDELITY_INT8", "GRADEX_POLICY_INT4",        "GRADEX_POLICY_LEARN_LINK"};

bool given(const config::Config& c, const char* name) {
  return c.source_of(name) != config::Source::kDefault;
}

// "GRADEX_SPARSITY=0.99 (environment)".
std::string setting(const config::Config& c, const char* name) {
  return std::string(name) + "=" + c.canonical_text(name) + " (" +
         config::source_name(c.source_of(name)) + ")";
}

template <size_t N>
std::vector<const char*> given_of(const config::Config& c, const char* const (&names)[N]) {
  std::vector<const char*> out;
  for (const char* n : names)
    if (given(c, n)) out.push_back(n);
  return out;
}

}  // namespace

PolicyResolution resolve_policy(const config::Config& c) {
  std::vector<const char*> fixed_given = given_of(c, kFixedOnly);
  std::vector<const char*> auto_given = given_of(c, kAutoOnly);
  const config::Source policy_source = c.source_of("GRADEX_POLICY");

  if (policy_source == config::Source::kDefault) {
    if (!fixed_given.empty() && !auto_given.empty())
      throw ConfigError(setting(c, fixed_given.front()) +
                        " is a setting of GRADEX_POLICY=fixed and " +
                        setting(c, auto_given.front()) +
                        " one of GRADEX_POLICY=auto: they contradict each other; set GRADEX_POLICY "
                        "to the policy you want and remove the other's settings");
    if (!fixed_given.empty()) {
      std::string names;
      for (const char* n : fixed_given)
        names += (names.empty() ? "" : ", ") + setting(c, n);
      return {"fixed", "GRADEX_POLICY=fixed (instead of the default auto) because " + names +
                           (fixed_given.size() > 1 ? " are settings" : " is a setting") +
                           " of the fixed policy; set GRADEX_POLICY=auto and remove " +
                           (fixed_given.size() > 1 ? "them" : "it") +
                           " for the cost model's choice"};
    }
    return {"auto", ""};
  }

  const std::string policy = c.get_string("GRADEX_POLICY");
  for (const char* n : policy == "auto" ? fixed_given : auto_given) {
    // A policy the program set for its own engine masks the environment's other-policy settings.
    if (policy_source == config::Source::kApi && c.source_of(n) == config::Source::kEnvironment)
      continue;
    const std::string hint =
        policy == "auto"
            ? "GRADEX_POLICY=auto chooses each tensor's sparsity from GRADEX_POLICY_LADDER; remove "
              "one of the two, or set GRADEX_POLICY=fixed"
            : "GRADEX_POLICY=fixed never reads it; remove one of the two, or set "
              "GRADEX_POLICY=auto";
    throw ConfigError(setting(c, n) + " contradicts " + setting(c, "GRADEX_POLICY") + ": " + hint);
  }
  return {policy, ""};
}

config::Config with_resolved_policy(config::Config config, bool log) {
  PolicyResolution r = resolve_policy(config);
  if (r.policy == config.get_string("GRADEX_POLICY")) return config;
  config.set("GRADEX_POLICY", r.policy, config.source_of("GRADEX_POLICY"));
  if (log) {
    static std::mutex mutex;
    static std::set<std::string> said;
    std::lock_guard<std::mutex> lock(mutex);
    if (said.insert(r.reason).second) {
      GX_LOG(kWarn) << r.reason;
    }
  }
  return config;
}

}  // namespace gradex::sync
