// For in-tree tests and tools linked against gradex_capi_static: the C++ engine behind a C handle.
// Not part of the public API (libgradex.so does not export it).
#pragma once

#include <memory>
#include <string>

#include "base/config.h"
#include "comm/rendezvous/store.h"
#include "gradex/gradex.h"
#include "sync/delay/delay_line.h"
#include "sync/engine/engine.h"

struct gradex_engine {
  std::unique_ptr<gradex::sync::Engine> engine;
  // The store a reconfiguration with options.store == NULL reuses (null when the engine was
  // bootstrapped through the environment's TCP store), and the prefix of the current membership.
  std::shared_ptr<gradex::comm::Store> store;
  std::string prefix;
  // The first membership's prefixed store, rank and world size: where GRADEX_DELAY's lanes meet
  // (sync/delay/delay_lanes.h).
  std::shared_ptr<gradex::comm::Store> lane_store;
  int lane_rank = -1;
  int lane_world = 0;
  // GRADEX_DELAY's delay line over `engine` (capi/delay.cc; declared after it: destroyed first).
  std::unique_ptr<gradex::sync::delay::DelayLine> delay;
};

namespace gradex::capi {

// gradex_engine_reconfigure / gradex_outer_reconfigure: the membership's store (options.store, else
// `current`: InvalidArgument when there is none) and prefix (NULL: `default_prefix`);
// InvalidArgument when both would be the current membership's (its keys are still in the store).
// ConfigError naming the variable when a config entry of `options` differs from `config` (a
// reconfiguration keeps the configuration). Sets *store and *prefix.
void membership_of(const gradex_engine_options_t& options, const config::Config& config,
                   const std::shared_ptr<comm::Store>& current, const std::string& current_prefix,
                   const char* default_prefix, std::shared_ptr<comm::Store>* store,
                   std::string* prefix);

// gradex_engine_create / gradex_outer_create: the first membership. Rank and world size are the
// options' (both given, or both < 0: the launcher's environment); the store is options.store, else
// the environment's TCP store (authenticated with config's job secret), under options.store_prefix
// or `default_prefix`.
struct FirstMembership {
  std::shared_ptr<comm::Store> store;  // prefixed: what the engine or outer optimizer uses
  int rank = -1;
  int world_size = -1;
  // For a later reconfiguration: options.store's wrapper (null for the TCP store, which it cannot
  // reuse) and the prefix.
  std::shared_ptr<comm::Store> reusable_store;
  std::string prefix;
};
FirstMembership first_membership(const gradex_engine_options_t& options,
                                 const config::Config& config, const char* default_prefix);

sync::Engine& engine_of(gradex_engine_t* engine);
// The engine's delay line; `delayed`: whether submissions now go through it (D > 0).
sync::delay::DelayLine& delay_of(gradex_engine_t* engine);
bool delayed(gradex_engine_t* engine);
// InvalidArgument naming GRADEX_DELAY and `operation` while submissions are delayed (D > 0):
// torchft's step transactions and membership changes do not compose with averages in flight.
void refuse_while_delayed(gradex_engine_t* engine, const char* operation);

// Sets the calling thread's gradex_last_error() message (for C API functions in other files).
void set_last_error(const std::string& message);

}  // namespace gradex::capi
