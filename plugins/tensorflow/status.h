// Engine status codes as TensorFlow statuses. The message is "gradex[<STATUS>]: <engine message>"
// so that the Python package can raise the matching gradex exception; the TF error code is the
// closest TF equivalent (a timeout is DEADLINE_EXCEEDED, a lost peer UNAVAILABLE, ...), so code
// that catches tf.errors keeps working.
#ifndef GRADEX_PLUGINS_TENSORFLOW_STATUS_H_
#define GRADEX_PLUGINS_TENSORFLOW_STATUS_H_

#include <string>

#include "absl/status/status.h"
#include "gradex/gradex.h"

namespace gradex_tf {

absl::Status to_tf_status(gradex_status_t status, const std::string& message);

}  // namespace gradex_tf

#endif  // GRADEX_PLUGINS_TENSORFLOW_STATUS_H_
