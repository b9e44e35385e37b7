#include "compress/backend/cpu_backend.h"

#include <cmath>
#include <cstring>

#include "base/error.h"
#include "base/vector_dispatch.h"
#include "compress/backend/host_resources.h"
#include "compress/backend/validate.h"
#include "compress/dgc/compressor.h"
#include "compress/dgc/kernels.h"
#include "compress/half/cast.h"

namespace gradex::compress::backend {
namespace {

// g <- g * s, then (m > 0) u <- m * u + g and g <- u (Nesterov: g + m * u), one pass, branch-free
// so that it vectorizes (it streams 16 bytes an element and was the engine's dearest loop on the
// dense quantized route before). The same multiplies and adds, in the same order, as one element
// at a time: the bits do not depend on the vector width.
template <bool Momentum, bool Nesterov>
GX_ALWAYS_INLINE void momentum_pass(float* __restrict g, float* __restrict u, size_t n, float m,
                                    float s) {
  for (size_t i = 0; i < n; ++i) {
    const float gi = g[i] * s;
    if constexpr (!Momentum) {
      g[i] = gi;
    } else {
      const float ui = m * u[i] + gi;
      u[i] = ui;
      g[i] = Nesterov ? gi + m * ui : ui;
    }
  }
}

class CpuDgc final : public DgcState {
 public:
  CpuDgc(size_t numel, const DgcOptions& o)
      : dgc_(numel, o), capacity_(max_selected_count(numel, o)) {}
  size_t numel() const override { return dgc_.numel(); }
  const DgcOptions& options() const override { return dgc_.options(); }
  uint64_t steps_done() const override { return dgc_.steps_done(); }
  void set_step(uint64_t step) override { dgc_.set_step(step); }
  double density() const override { return dgc_.density(); }
  size_t capacity() const override { return capacity_; }
  const float* residual() const override { return dgc_.residual(); }
  float* momentum_buffer() override { return dgc_.mutable_momentum_buffer(); }

  DgcStepInfo step(const float* grad, float grad_scale, Stream&) override {
    return report(dgc_.step(grad, grad_scale));
  }
  DgcStepInfo step_and_clear(float* grad, float grad_scale, Backend&, Stream&) override {
    return report(dgc_.step_and_clear(grad, grad_scale));
  }
  const uint32_t* selected_indices() const override {
    return sel_ ? sel_->indices.data() : nullptr;
  }
  const float* selected_values() const override { return sel_ ? sel_->values.data() : nullptr; }
  void step_dense(const float* grad, float* dense_out, float grad_scale, Stream&) override {
    sel_ = nullptr;  // the dense step invalidates the last selection
    dgc_.step_dense(grad, dense_out, grad_scale);
  }
  // DgcCompressor's own checkpoint, threshold history included: a restored CPU state continues
  // exactly.
  std::vector<uint8_t> save_state(Backend&, Stream&) override { return dgc_.save_state(); }
  void load_state(const uint8_t* data, size_t size, Backend&, Stream&) override {
    sel_ = nullptr;
    dgc_.load_state(data, size);
  }
  void snapshot(Backend&, Stream&) override {
    dgc_.checkpoint_to(checkpoint_);
    has_checkpoint_ = true;
  }
  bool has_snapshot() const override { return has_checkpoint_; }
  bool rollback(Backend&, Stream&) override {
    if (!has_checkpoint_) return false;
    sel_ = nullptr;
    dgc_.restore_from(checkpoint_);
    return true;
  }

 private:
  DgcStepInfo report(const Selection& s) {
    sel_ = &s;
    return step_info_of(s.step, s.sparsity, s.indices.size(), s);
  }

  DgcCompressor dgc_;
  size_t capacity_;
  const Selection* sel_ = nullptr;
  DgcCompressor::Checkpoint checkpoint_;  // snapshot(): kept, reused by the next one
  bool has_checkpoint_ = false;
};

class CpuBackend final : public HostBackend<DeviceType::kCpu, CpuDgc> {
 protected:
  CastCounts do_to_half(const float* in, uint16_t* out, size_t n, DType type, float scale,
                        Stream&) override {
    half::CastStats s = half::to_half(in, out, n, type, scale);
    return {s.saturated, s.nonfinite};
  }
  void do_from_half(const uint16_t* in, float* out, size_t n, DType type, float scale, bool add,
                    Stream&) override {
    if (add)
      half::add_from_half(in, out, n, type, scale);
    else
      half::from_half(in, out, n, type, scale);
  }
  // compress/half's scans: bit tests, split over the worker pool for large tensors.
  size_t do_count_nonfinite(const float* x, size_t n, Stream&) override {
    return half::count_nonfinite(x, n);
  }

  double do_sum_squares(const float* x, size_t n, Stream&) override {
    return dgc::sum_squares(x, 0, n);
  }
  void do_zero_nonfinite(float* x, size_t n, Stream&) override { half::zero_nonfinite(x, n); }
  // The same expressions, in the same order, as DGC's update kernel (compress/dgc/kernels.cc).
  void do_apply_momentum(float* g, float* u, size_t n, float m, bool nesterov, float s,
                         Stream&) override {
    if (m == 0.0f) {
      if (s != 1.0f)
        with_vector_isa(
            [&]() GX_VECTOR_BODY { momentum_pass<false, false>(g, nullptr, n, 0.0f, s); });
      return;
    }
    if (nesterov)
      with_vector_isa([&]() GX_VECTOR_BODY { momentum_pass<true, true>(g, u, n, m, s); });
    else
      with_vector_isa([&]() GX_VECTOR_BODY { momentum_pass<true, false>(g, u, n, m, s); });
  }

  void do_gather(const FusionEntry* entries, size_t count, float* bucket, Stream&) override {
    for (size_t i = 0; i < count; ++i)
      if (entries[i].numel)
        std::memcpy(bucket + entries[i].offset, entries[i].data, entries[i].numel * 4);
  }
  void do_scatter(const float* bucket, const FusionEntry* entries, size_t count, Stream&) override {
    for (size_t i = 0; i < count; ++i)
      if (entries[i].numel)
        std::memcpy(entries[i].data, bucket + entries[i].offset, entries[i].numel * 4);
  }

  void do_scatter_add(const uint32_t* indices, const float* values, size_t count, float* out,
                      size_t numel, float scale, Stream&) override {
    for (size_t j = 0; j < count; ++j) {
      const uint32_t i = indices[j];
      if (i >= numel)
        throw InvalidArgument("cpu scatter_add: index " + std::to_string(i) + " >= numel " +
                              std::to_string(numel));
      out[i] += scale * values[j];  // wire::accumulate's expression
    }
  }
};

}  // namespace

BackendPtr make_cpu_backend() {
  return std::make_shared<CpuBackend>();
}

}  // namespace gradex::compress::backend
