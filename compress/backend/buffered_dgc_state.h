// What every Thrust-based DGC state (the OpenMP and CUDA backends) keeps the same way: its size,
// options, step counter and selection capacity, and u and v in backend buffers. An implementation
// adds its selection storage and its step kernels. Header-only: the CUDA backend is a library of
// its own and links no other backend code.
#pragma once

#include <cstddef>
#include <cstdint>

#include "compress/backend/backend.h"
#include "compress/backend/validate.h"
#include "compress/dgc/schedule.h"

namespace gradex::compress::backend {

class BufferedDgcState : public DgcState {
 public:
  size_t numel() const override { return n_; }
  const DgcOptions& options() const override { return o_; }
  uint64_t steps_done() const override { return step_; }
  void set_step(uint64_t step) override { step_ = step; }
  double density() const override { return 1.0 - dgc::sparsity_at(o_, step_); }
  size_t capacity() const override { return cap_; }
  const float* residual() const override { return v_->as<float>(); }
  // Null when momentum is 0 (no u buffer is allocated then).
  float* momentum_buffer() override { return u_ ? u_->as<float>() : nullptr; }

 protected:
  BufferedDgcState(size_t numel, const DgcOptions& options)
      : n_(numel), o_(options), cap_(max_selected_count(numel, options)) {}

  size_t n_;
  DgcOptions o_;
  size_t cap_;
  uint64_t step_ = 0;
  BufferPtr u_, v_;  // the constructor of the implementation allocates and zeroes them
};

}  // namespace gradex::compress::backend
