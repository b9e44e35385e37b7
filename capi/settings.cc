// gradex_get_setting_number: a numeric GRADEX_* setting as the engine (or the environment) holds
// it, so that plugins read settings by name instead of parsing gradex_describe_config's text.
#include <string>
#include <string_view>

#include "base/config.h"
#include "base/error.h"
#include "capi/engine_access.h"
#include "capi/guarded.h"
#include "gradex/gradex.h"

namespace {

double number_of(const gradex::config::Config& config, std::string_view name) {
  const gradex::config::VarSpec* found = nullptr;
  for (const auto& spec : gradex::config::registry())
    if (name == spec.name) found = &spec;
  if (found == nullptr)
    throw gradex::InvalidArgument("'" + std::string(name) + "' is not a GRADEX_* setting");
  switch (found->type) {
    case gradex::config::VarType::kInt:
      return static_cast<double>(config.get_int(name));
    case gradex::config::VarType::kFloat:
      return config.get_float(name);
    case gradex::config::VarType::kBool:
      return config.get_bool(name) ? 1.0 : 0.0;
    default:
      throw gradex::InvalidArgument(std::string(name) + " is " +
                                    gradex::config::describe_range(*found) + ", not a number");
  }
}

}  // namespace

extern "C" gradex_status_t gradex_get_setting_number(const gradex_engine_t* engine,
                                                     const char* name, double* value) {
  return gradex::capi::guarded("gradex_get_setting_number", [&] {
    gradex::capi::require(name, "name");
    gradex::capi::require(value, "value");
    const double number =
        engine != nullptr
            ? number_of(gradex::capi::engine_of(const_cast<gradex_engine_t*>(engine)).config(),
                        name)
            : number_of(gradex::config::Config::from_environment(), name);
    *value = number;
  });
}
