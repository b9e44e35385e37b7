// The gradex kernels (ops declared in ops.cc). The async ones submit to the engine, queue a Job on
// the engine's slot and return at once; the slot's completion waiter calls `done` (pending.h).
//
// Engine buffers: an output is forwarded from its input when TF allows it (the input is not used
// elsewhere), else allocated and filled with a copy; the engine then averages it in place.
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "pending.h"
#include "slots.h"
#include "status.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"

namespace gradex_tf {
namespace {

using tensorflow::AsyncOpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;

absl::Status dtype_code(tensorflow::DataType dt, const std::string& key, gradex_dtype_t* out) {
  switch (dt) {
    case tensorflow::DT_FLOAT:
      *out = GRADEX_FLOAT32;
      return absl::OkStatus();
    case tensorflow::DT_HALF:
      *out = GRADEX_FLOAT16;
      return absl::OkStatus();
    case tensorflow::DT_BFLOAT16:
      *out = GRADEX_BFLOAT16;
      return absl::OkStatus();
    default:
      return to_tf_status(GRADEX_ERR_INVALID_ARGUMENT,
                          "tensor '" + key + "' has dtype " + tensorflow::DataTypeString(dt) +
                              "; gradex exchanges float32, float16 and bfloat16");
  }
}

// Registers `key` (idempotent) and submits `data`; gradient or parameter average.
absl::Status submit(gradex_engine_t* engine, const std::string& key, uint64_t numel,
                    gradex_dtype_t dtype, void* data, bool parameters, gradex_handle_t* handle) {
  gradex_status_t status =
      gradex_register_tensor(engine, key.c_str(), numel, dtype, GRADEX_DEVICE_CPU);
  if (status == GRADEX_OK) {
    status = parameters ? gradex_average(engine, key.c_str(), data, handle)
                        : gradex_submit(engine, key.c_str(), data, handle);
  }
  return to_tf_status(status,
                      status == GRADEX_OK ? std::string() : std::string(gradex_last_error()));
}

// The slot's engine, acquired for this invocation; sets the context's status on failure.
std::shared_ptr<Slot> acquire_slot(OpKernelContext* ctx, int64_t id) {
  std::string error;
  std::shared_ptr<Slot> slot = find_slot(id, &error);
  if (slot == nullptr) {
    ctx->SetStatus(to_tf_status(GRADEX_ERR_INVALID_ARGUMENT, error));
    return nullptr;
  }
  if (!slot->acquire()) {
    ctx->SetStatus(to_tf_status(GRADEX_ERR_INVALID_ARGUMENT,
                                "gradex engine slot " + std::to_string(id) + " is shutting down"));
    return nullptr;
  }
  return slot;
}

// Registers cancellation and hands the submitted handles to the slot's completion waiter.
void start(const std::shared_ptr<Slot>& slot, const std::shared_ptr<Pending>& pending,
           std::vector<gradex_handle_t> handles) {
  pending->watch_cancellation(pending);
  Job job;
  job.handles = std::move(handles);
  job.complete = [pending](gradex_status_t status, const std::string& message) {
    pending->complete(status, message);
  };
  slot->enqueue(std::move(job));
}

// GradexExchange: averages a list of tensors, each under its own key (one engine policy per
// tensor).
class ExchangeOp : public AsyncOpKernel {
 public:
  explicit ExchangeOp(OpKernelConstruction* c) : AsyncOpKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("keys", &keys_));
    OP_REQUIRES_OK(c, c->GetAttr("engine", &engine_));
    OP_REQUIRES_OK(c, c->GetAttr("parameters", &parameters_));
  }

  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    const int n = ctx->num_inputs();
    OP_REQUIRES_ASYNC(ctx, static_cast<int>(keys_.size()) == n,
                      to_tf_status(GRADEX_ERR_INVALID_ARGUMENT,
                                   "GradexExchange has " + std::to_string(n) + " tensors but " +
                                       std::to_string(keys_.size()) + " keys"),
                      done);
    std::shared_ptr<Slot> slot = acquire_slot(ctx, engine_);
    if (slot == nullptr) return done();
    auto pending = std::make_shared<Pending>(ctx, done);
    std::vector<gradex_handle_t> handles;
    for (int i = 0; i < n && pending->local.ok(); ++i) {
      const Tensor& in = ctx->input(i);
      Tensor* out = nullptr;
      pending->local = ctx->forward_input_or_allocate_output({i}, i, in.shape(), &out);
      if (!pending->local.ok()) break;
      if (out->data() != in.data() && in.TotalBytes() > 0)
        std::memcpy(out->data(), in.data(), in.TotalBytes());
      if (in.NumElements() == 0) continue;  // the same on every rank: nothing to exchange
      gradex_dtype_t dtype = GRADEX_FLOAT32;
      pending->local = dtype_code(in.dtype(), keys_[i], &dtype);
      if (!pending->local.ok()) break;
      gradex_handle_t handle = 0;
      pending->local = submit(slot->engine(), keys_[i], static_cast<uint64_t>(in.NumElements()),
                              dtype, out->data(), parameters_, &handle);
      if (!pending->local.ok()) break;
      pending->buffers.push_back(*out);
      handles.push_back(handle);
    }
    start(slot, pending, std::move(handles));
  }

 private:
  std::vector<std::string> keys_;
  int64_t engine_ = 0;
  bool parameters_ = false;
};

// GradexBroadcast: root_rank's tensor on every rank, bit for bit, for any dtype. The engine only
// averages, so the bytes travel as 16-bit pieces held in float32 (root: the piece, others: 0); the
// average times the world size is the piece exactly (an integer below 2^16, carried by an exact
// fp32 dense sum of one non-zero value). The Python package runs broadcasts on an engine configured
// for that (dense, fp32 on the wire, no momentum).
class BroadcastOp : public AsyncOpKernel {
 public:
  explicit BroadcastOp(OpKernelConstruction* c) : AsyncOpKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("key", &key_));
    OP_REQUIRES_OK(c, c->GetAttr("engine", &engine_));
    OP_REQUIRES_OK(c, c->GetAttr("root_rank", &root_));
  }

  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    const Tensor& in = ctx->input(0);
    Tensor* out = nullptr;
    OP_REQUIRES_OK_ASYNC(ctx, ctx->allocate_output(0, in.shape(), &out), done);
    const size_t bytes = in.TotalBytes();
    if (bytes == 0) return done();
    std::shared_ptr<Slot> slot = acquire_slot(ctx, engine_);
    if (slot == nullptr) return done();
    int32_t rank = 0, world = 0;
    gradex_status_t status = gradex_engine_rank(slot->engine(), &rank, &world);
    if (status == GRADEX_OK && (root_ < 0 || root_ >= world)) {
      slot->release();
      ctx->SetStatus(to_tf_status(GRADEX_ERR_INVALID_ARGUMENT,
                                  "broadcast '" + key_ + "': root_rank " + std::to_string(root_) +
                                      " is not in [0, " + std::to_string(world) + ")"));
      return done();
    }
    if (status != GRADEX_OK) {
      slot->release();
      ctx->SetStatus(to_tf_status(status, gradex_last_error()));
      return done();
    }
    const int64_t pieces = static_cast<int64_t>((bytes + 1) / 2);
    Tensor wire;
    auto pending = std::make_shared<Pending>(ctx, done);
    pending->local =
        ctx->allocate_temp(tensorflow::DT_FLOAT, tensorflow::TensorShape({pieces}), &wire);
    std::vector<gradex_handle_t> handles;
    if (pending->local.ok()) {
      float* w = wire.flat<float>().data();
      const auto* src = static_cast<const uint8_t*>(in.data());
      for (int64_t j = 0; j < pieces; ++j) {
        const uint32_t lo = src[2 * j];
        const uint32_t hi = static_cast<size_t>(2 * j + 1) < bytes ? src[2 * j + 1] : 0;
        w[j] = rank == root_ ? static_cast<float>(lo | (hi << 8)) : 0.0f;
      }
      gradex_handle_t handle = 0;
      pending->local = submit(slot->engine(), "broadcast/" + key_, static_cast<uint64_t>(pieces),
                              GRADEX_FLOAT32, w, false, &handle);
      if (pending->local.ok()) handles.push_back(handle);
    }
    pending->buffers = {wire, *out};
    const std::string key = key_;
    Tensor result = *out;
    pending->after = [wire, result, bytes, world, key]() mutable -> absl::Status {
      const float* w = wire.flat<float>().data();
      auto* dst = static_cast<uint8_t*>(result.data());
      for (size_t j = 0; j < (bytes + 1) / 2; ++j) {
        const double piece = std::rint(static_cast<double>(w[j]) * world);
        if (!(piece >= 0 && piece <= 65535))
          return to_tf_status(GRADEX_ERR_INTERNAL,
                              "broadcast '" + key +
                                  "': the engine's average is not exact (is the collective engine "
                                  "configured dense fp32?)");
        const auto v = static_cast<uint32_t>(piece);
        dst[2 * j] = static_cast<uint8_t>(v & 0xff);
        if (2 * j + 1 < bytes) dst[2 * j + 1] = static_cast<uint8_t>(v >> 8);
      }
      return absl::OkStatus();
    };
    start(slot, pending, std::move(handles));
  }

 private:
  std::string key_;
  int64_t engine_ = 0;
  int64_t root_ = 0;
};

// GradexEndStep: ends the engine's step (local, non-blocking); true when LocalSGD says to average
// parameters now.
class EndStepOp : public tensorflow::OpKernel {
 public:
  explicit EndStepOp(OpKernelConstruction* c) : OpKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("engine", &engine_));
  }

  void Compute(OpKernelContext* ctx) override {
    std::shared_ptr<Slot> slot = acquire_slot(ctx, engine_);
    if (slot == nullptr) return;
    int average_now = 0;
    const gradex_status_t status = gradex_end_step(slot->engine(), &average_now);
    const std::string error = status == GRADEX_OK ? std::string() : gradex_last_error();
    slot->release();
    OP_REQUIRES_OK(ctx, to_tf_status(status, error));
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, tensorflow::TensorShape({}), &out));
    out->scalar<bool>()() = average_now != 0;
  }

 private:
  int64_t engine_ = 0;
};

}  // namespace
}  // namespace gradex_tf

namespace tensorflow {

REGISTER_KERNEL_BUILDER(Name("GradexExchange").Device(DEVICE_CPU), gradex_tf::ExchangeOp);
REGISTER_KERNEL_BUILDER(Name("GradexBroadcast").Device(DEVICE_CPU), gradex_tf::BroadcastOp);
REGISTER_KERNEL_BUILDER(Name("GradexEndStep").Device(DEVICE_CPU), gradex_tf::EndStepOp);
// GPU placement: the same kernels with every input and output in host memory (TF copies device
// tensors to the host and back around the op). Device-resident exchange needs a C API taking device
// memory (docs/tensorflow.md, Limitations).
REGISTER_KERNEL_BUILDER(
    Name("GradexExchange").Device(DEVICE_GPU).HostMemory("tensors").HostMemory("averaged"),
    gradex_tf::ExchangeOp);
REGISTER_KERNEL_BUILDER(
    Name("GradexBroadcast").Device(DEVICE_GPU).HostMemory("tensor").HostMemory("output"),
    gradex_tf::BroadcastOp);
REGISTER_KERNEL_BUILDER(Name("GradexEndStep").Device(DEVICE_GPU).HostMemory("average_now"),
                        gradex_tf::EndStepOp);

}  // namespace tensorflow
