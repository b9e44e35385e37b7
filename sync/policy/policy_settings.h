// Which policy an engine runs when the user's settings speak for one: the precedence between
// GRADEX_POLICY and the settings that belong to one policy only.
//
// Every setting a user writes is honoured or rejected, never silently overridden by a default:
//   - GRADEX_POLICY left at its default (auto) while a fixed-policy setting is given
//     (GRADEX_SPARSITY, GRADEX_WARMUP_STEPS, GRADEX_DENSE_THRESHOLD, GRADEX_ADAM_SPARSITY): the
//     engine runs GRADEX_POLICY=fixed, which is the policy those settings describe, and rank 0
//     says so once in the log;
//   - GRADEX_POLICY=auto given together with a fixed-policy setting, or GRADEX_POLICY=fixed given
//     together with an auto-only setting (GRADEX_POLICY_LADDER, _RAMP_STEPS, ...), or settings of
//     both policies given while GRADEX_POLICY is not: a ConfigError naming both settings;
//   - settings both policies read (GRADEX_FP16, GRADEX_MOMENTUM, GRADEX_SPARSITY_OVERRIDES, ...)
//     are constraints of either policy and never change which one runs.
// A GRADEX_POLICY set through the API (a plugin's own exact engine, a program's config=) is the
// program's decision for that engine: the environment's settings of the other policy are meant for
// other engines of the process and are not an error there (they do not apply to it).
// GRADEX_POLICY_HORIZON_STEPS describes the training, not a choice, and is never a conflict.
//
// The resolved policy is written into the configuration, so the start-up agreement proves that
// every rank runs the same one (a rank whose environment differs fails the agreement naming
// GRADEX_POLICY and the ranks).
#pragma once

#include <string>

#include "base/config.h"

namespace gradex::sync {

struct PolicyResolution {
  std::string policy;  // "auto" or "fixed"
  // Why the default was not taken ("" when it was, or when GRADEX_POLICY was given).
  std::string reason;
};

// The policy `config` asks for; ConfigError for a contradiction, naming both settings and where
// each came from.
PolicyResolution resolve_policy(const config::Config& config);

// `config` with GRADEX_POLICY set to the resolved policy. `log`: a resolution away from the
// default is logged once per process (at warn level, so that the default log level shows it).
config::Config with_resolved_policy(config::Config config, bool log);

}  // namespace gradex::sync
