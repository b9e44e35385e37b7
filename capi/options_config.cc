#include "capi/options_config.h"

#include <string>
#include <vector>

#include "base/error.h"

namespace gradex::capi {

config::Config config_from_pairs(size_t count, const char* const* names,
                                 const char* const* values) {
  std::vector<std::string> api_names;
  for (size_t i = 0; i < count; ++i) {
    if (!names || !names[i] || !values || !values[i])
      throw InvalidArgument("config entry " + std::to_string(i) + " has a NULL name or value");
    api_names.emplace_back(names[i]);
  }
  auto config = config::Config::from_environment(api_names);
  for (size_t i = 0; i < count; ++i)
    config.set(names[i], values[i], config::Source::kApi);
  return config;
}

config::Config config_from_options(const gradex_engine_options_t& options) {
  if (options.api_version != GRADEX_API_VERSION)
    throw Error(ErrorCode::kVersion, "the plugin was built for gradex API version " +
                                         std::to_string(options.api_version) +
                                         ", this library implements version " +
                                         std::to_string(GRADEX_API_VERSION));
  return config_from_pairs(options.config_count, options.config_names, options.config_values);
}

}  // namespace gradex::capi
