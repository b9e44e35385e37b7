// Proof, when an engine or a DiLoCo optimizer starts, that its ranks run with the options that
// must be equal everywhere (the variables declared with an Agreement scope in base/config_vars.cc,
// plus the versions of what crosses between ranks). Every rank sends its canonical digest to every
// other in one allgatherv right after connecting, before any gradient moves; every rank compares
// all digests identically, so a difference is the same ConfigError on every rank, naming each
// differing variable with every value and the ranks holding it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "base/config.h"
#include "comm/communicator.h"

namespace gradex::sync::agreement {

enum class Scope { kEngine, kOuter };

// Canonical digest of this rank: "name=value\n" lines, versions first (gradex.digest_format,
// gradex.api_version, gradex.wire_version, gradex.negotiation_version), then every variable whose
// declared Agreement covers `scope`, in registry order, with Config::canonical_text values.
// `api_version` is the version of the API the caller drives gradex through: capi/ passes the
// public header's GRADEX_API_VERSION (sync/ does not include the public header).
std::string digest(const config::Config& config, Scope scope, uint32_t api_version);

// "" when every rank's digest (indexed by rank) is the same; otherwise the ConfigError message:
// each differing entry with its values and their ranks, in digest order. A digest that cannot be
// read (another gradex build) differs in gradex.digest_format.
std::string compare(const std::vector<std::string>& digests, Scope scope);

// Exchanges digests over `comm` (collective: every rank of the communicator calls it once, first).
// On a difference every rank closes `comm` in step with the others (so no rank sees the others'
// departure as a peer failure) and throws the ConfigError from compare().
void require_agreement(std::unique_ptr<comm::Communicator>& comm, const config::Config& config,
                       Scope scope, uint32_t api_version);

}  // namespace gradex::sync::agreement
