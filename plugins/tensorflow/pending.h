// One running invocation of an async gradex kernel: who calls `done`, exactly once.
//
// Two parties may finish it: the slot's completion waiter (the engine completed every handle) and
// the step's cancellation callback. Whoever claims `claimed` first sets the status and calls
// `done`; the other does nothing. The completion waiter deregisters the cancellation callback only
// after claiming, i.e. before `done`, while the cancellation manager is certainly alive. After a
// cancellation the engine still owns the buffers until its handles complete: they are kept alive by
// `buffers`, not by the (finished) kernel context, which is never touched again.
#ifndef GRADEX_PLUGINS_TENSORFLOW_PENDING_H_
#define GRADEX_PLUGINS_TENSORFLOW_PENDING_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "status.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace gradex_tf {

class Pending {
 public:
  Pending(tensorflow::OpKernelContext* ctx, tensorflow::AsyncOpKernel::DoneCallback done)
      : ctx_(ctx), done_(std::move(done)) {}

  // Buffers the engine reads or writes; kept until the engine has completed.
  std::vector<tensorflow::Tensor> buffers;
  // Runs on success before `done` (e.g. decoding a broadcast into the output); may fail.
  std::function<absl::Status()> after;
  // A failure found while submitting (later handles were not submitted): reported instead of the
  // engine's status, once the handles that were submitted have completed.
  absl::Status local = absl::OkStatus();

  // Registers the cancellation callback. Call after every handle is submitted, before the job is
  // queued. When the step is already cancelled, finishes with CANCELLED at once.
  void watch_cancellation(const std::shared_ptr<Pending>& self) {
    cm_ = ctx_->cancellation_manager();
    if (cm_ == nullptr) return;
    token_ = cm_->get_cancellation_token();
    std::weak_ptr<Pending> weak = self;
    const bool registered = cm_->RegisterCallback(token_, [weak] {
      if (auto p = weak.lock()) p->cancelled();
    });
    if (!registered) {
      cm_ = nullptr;
      cancelled();
    }
  }

  // The engine completed every handle (completion waiter).
  void complete(gradex_status_t status, const std::string& message) {
    if (claimed_.exchange(true)) return;  // cancelled: the context is gone
    if (cm_ != nullptr) cm_->DeregisterCallback(token_);
    absl::Status result = local.ok() ? to_tf_status(status, message) : local;
    if (result.ok() && after) result = after();
    if (!result.ok()) ctx_->SetStatus(result);
    done_();
  }

 private:
  void cancelled() {
    if (claimed_.exchange(true)) return;
    ctx_->SetStatus(
        absl::CancelledError("gradex: the step was cancelled while an exchange was in flight (the "
                             "engine completes it in "
                             "the background)"));
    done_();
  }

  tensorflow::OpKernelContext* ctx_;
  tensorflow::AsyncOpKernel::DoneCallback done_;
  tensorflow::CancellationManager* cm_ = nullptr;
  tensorflow::CancellationToken token_ = 0;
  std::atomic<bool> claimed_{false};
};

}  // namespace gradex_tf

#endif  // GRADEX_PLUGINS_TENSORFLOW_PENDING_H_
