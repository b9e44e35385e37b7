// The C API of membership changes and step transactions: gradex_engine_reconfigure,
// gradex_engine_abort, gradex_state_snapshot and gradex_state_rollback around sync::Engine, and the
// store and configuration checks that gradex_outer_reconfigure shares, and the first membership
// that gradex_engine_create and gradex_outer_create share.
#include <memory>
#include <string>

#include "base/config.h"
#include "base/error.h"
#include "capi/callback_store.h"
#include "capi/engine_access.h"
#include "capi/guarded.h"
#include "comm/communicator.h"
#include "comm/rendezvous/launch.h"
#include "gradex/gradex.h"

namespace gradex::capi {

void membership_of(const gradex_engine_options_t& options, const config::Config& config,
                   const std::shared_ptr<comm::Store>& current, const std::string& current_prefix,
                   const char* default_prefix, std::shared_ptr<comm::Store>* store,
                   std::string* prefix) {
  if (options.api_version != GRADEX_API_VERSION)
    throw Error(ErrorCode::kVersion, "the plugin was built for gradex API version " +
                                         std::to_string(options.api_version) +
                                         ", this library implements version " +
                                         std::to_string(GRADEX_API_VERSION));
  if (options.rank < 0 || options.world_size < 1 || options.rank >= options.world_size)
    throw InvalidArgument("rank " + std::to_string(options.rank) + " and world_size " +
                          std::to_string(options.world_size) +
                          " do not describe a membership (0 <= rank < world_size)");
  for (size_t i = 0; i < options.config_count; ++i) {
    if (!options.config_names || !options.config_names[i] || !options.config_values ||
        !options.config_values[i])
      throw InvalidArgument("config entry " + std::to_string(i) + " has a NULL name or value");
    const std::string name = options.config_names[i];
    config::Config given;
    given.set(name, options.config_values[i]);  // ConfigError for an unknown name or bad value
    if (given.canonical_text(name) != config.canonical_text(name))
      throw ConfigError(name + "=" + options.config_values[i] + " differs from this engine's " +
                        name + "=" + config.canonical_text(name) +
                        ": a reconfiguration keeps the configuration (leave config entries empty, "
                        "or destroy and create the engine to change it)");
  }
  const std::string new_prefix = options.store_prefix ? options.store_prefix : default_prefix;
  if (options.store == nullptr) {
    if (!current)
      throw InvalidArgument(
          "options.store is NULL and this object was bootstrapped through the environment's TCP "
          "store, which it does not keep: pass the new membership's store");
    if (new_prefix == current_prefix)
      throw InvalidArgument("the store already holds the current membership's keys under prefix '" +
                            new_prefix + "': give a new store or a new store_prefix");
    *store = current;
  } else {
    *store = std::make_shared<CallbackStore>(*options.store);
  }
  *prefix = new_prefix;
}

FirstMembership first_membership(const gradex_engine_options_t& options,
                                 const config::Config& config, const char* default_prefix) {
  FirstMembership m;
  m.rank = options.rank;
  m.world_size = options.world_size;
  if ((m.rank < 0) != (m.world_size < 0))
    throw InvalidArgument("rank and world_size must both be given or both be < 0");
  comm::LaunchInfo info;
  if (m.rank < 0 || options.store == nullptr) info = comm::launch_info_from_environment();
  if (m.rank < 0) {
    m.rank = info.rank;
    m.world_size = info.world_size;
  } else {
    info.rank = m.rank;
    info.world_size = m.world_size;
  }
  std::shared_ptr<comm::Store> store;
  if (options.store != nullptr) {
    store = std::make_shared<CallbackStore>(*options.store);
    m.reusable_store = store;
  } else {
    store = comm::connect_tcp_store(info, comm::comm_options_from_config(config));
  }
  m.prefix = options.store_prefix ? options.store_prefix : default_prefix;
  m.store = comm::make_prefix_store(store, m.prefix);
  return m;
}

}  // namespace gradex::capi

extern "C" {

gradex_status_t gradex_engine_reconfigure(gradex_engine_t* engine,
                                          const gradex_engine_options_t* options) {
  return gradex::capi::guarded("gradex_engine_reconfigure", [&] {
    auto& e = gradex::capi::engine_of(engine);
    gradex::capi::require(options, "options");
    gradex::capi::refuse_while_delayed(engine, "gradex_engine_reconfigure");
    std::shared_ptr<gradex::comm::Store> store;
    std::string prefix;
    gradex::capi::membership_of(*options, e.config(), engine->store, engine->prefix, "gradex/",
                                &store, &prefix);
    engine->store = store;
    engine->prefix = prefix;
    gradex::capi::delay_of(engine).on_reconfigure();
    e.reconfigure(gradex::comm::make_prefix_store(store, prefix), options->rank,
                  options->world_size);
  });
}

gradex_status_t gradex_engine_abort(gradex_engine_t* engine, const char* reason) {
  return gradex::capi::guarded("gradex_engine_abort", [&] {
    gradex::capi::engine_of(engine).abort(reason ? reason : "(no reason given)");
  });
}

gradex_status_t gradex_state_snapshot(gradex_engine_t* engine) {
  return gradex::capi::guarded("gradex_state_snapshot", [&] {
    gradex::capi::refuse_while_delayed(engine,
                                       "gradex_state_snapshot (torchft's step transaction)");
    gradex::capi::engine_of(engine).snapshot_state();
  });
}

gradex_status_t gradex_state_rollback(gradex_engine_t* engine) {
  return gradex::capi::guarded("gradex_state_rollback",
                               [&] { gradex::capi::engine_of(engine).rollback_state(); });
}

}  // extern "C"
