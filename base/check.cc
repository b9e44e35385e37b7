#include "base/check.h"

#include "base/log.h"

namespace gradex::detail {

void check_failed(const char* file, int line, const std::string& message) {
  std::string full = message + " at " + file + ":" + std::to_string(line);
  GX_LOG(kError) << full;
  throw InternalError(full);
}

}  // namespace gradex::detail
