// OuterOptimizer's unit of background work, shared by its source files (not a public header).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/error.h"
#include "outer/outer_optimizer.h"

namespace gradex::outer {

// One exchange: a fragment's contribution (fragment >= 0) and/or the buffers, averaged by the
// worker; merged by the caller's thread at `merge_step`.
struct OuterOptimizer::Job {
  int64_t fragment = -1;
  uint64_t launch_step = 0;
  uint64_t merge_step = 0;
  std::vector<float> values;
  std::vector<float> local;  // the fragment's local copy at the launch (synchronize_all's rebase)
  std::vector<float> buffers;
  bool done = false;                // set by the worker, under the optimizer's mutex
  ErrorCode code = ErrorCode::kOk;  // the exchange's failure, when done
  std::string message;
};

}  // namespace gradex::outer
