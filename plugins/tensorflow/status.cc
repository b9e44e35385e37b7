#include "status.h"

#include "gradex/status_name.h"

namespace gradex_tf {
namespace {

absl::StatusCode tf_code(gradex_status_t status) {
  switch (status) {
    case GRADEX_OK:
      return absl::StatusCode::kOk;
    case GRADEX_ERR_INVALID_ARGUMENT:
    case GRADEX_ERR_CONFIG:
      return absl::StatusCode::kInvalidArgument;
    case GRADEX_ERR_TIMEOUT:
      return absl::StatusCode::kDeadlineExceeded;
    case GRADEX_ERR_PEER:
    case GRADEX_ERR_TRANSPORT:
      return absl::StatusCode::kUnavailable;
    case GRADEX_ERR_CORRUPT:
      return absl::StatusCode::kDataLoss;
    case GRADEX_ERR_MISMATCH:
    case GRADEX_ERR_STATE:
    case GRADEX_ERR_VERSION:
      return absl::StatusCode::kFailedPrecondition;
    case GRADEX_ERR_ABORTED:  // an abort (this rank's or a peer's) or a reconfiguration
      return absl::StatusCode::kAborted;
    case GRADEX_ERR_INTERNAL:
      break;
  }
  return absl::StatusCode::kInternal;
}

}  // namespace

absl::Status to_tf_status(gradex_status_t status, const std::string& message) {
  if (status == GRADEX_OK) return absl::OkStatus();
  return absl::Status(tf_code(status),
                      std::string("gradex[") + gradex_status_name(status) + "]: " + message);
}

}  // namespace gradex_tf
