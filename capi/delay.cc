// The C API of the delayed exchange (GRADEX_DELAY, sync/delay/delay_line.h): the drain, the current
// delay, and the helpers capi/gradex.cc and capi/membership.cc route through.
#include "base/error.h"
#include "capi/engine_access.h"
#include "capi/guarded.h"
#include "gradex/gradex.h"

namespace gradex::capi {

sync::delay::DelayLine& delay_of(gradex_engine_t* engine) {
  engine_of(engine);  // InvalidArgument for a NULL engine
  if (!engine->delay) throw InternalError("engine has no delay line");
  return *engine->delay;
}

bool delayed(gradex_engine_t* engine) {
  return delay_of(engine).delay() > 0;
}

void refuse_while_delayed(gradex_engine_t* engine, const char* operation) {
  const int d = delay_of(engine).delay();
  if (d > 0)
    throw InvalidArgument(std::string(operation) +
                          " does not compose with the delayed exchange (D=" + std::to_string(d) +
                          " from GRADEX_DELAY): averages still in flight would be rolled back or "
                          "lost; set GRADEX_DELAY=0");
}

}  // namespace gradex::capi

extern "C" {

gradex_status_t gradex_delay_drain(gradex_engine_t* engine) {
  return gradex::capi::guarded("gradex_delay_drain",
                               [&] { gradex::capi::delay_of(engine).drain(); });
}

gradex_status_t gradex_get_delay(gradex_engine_t* engine, int* delay) {
  return gradex::capi::guarded("gradex_get_delay", [&] {
    auto& line = gradex::capi::delay_of(engine);
    gradex::capi::require(delay, "delay");
    *delay = line.delay();
  });
}

}  // extern "C"
