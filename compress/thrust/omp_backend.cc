#include "compress/thrust/omp_backend.h"

#include <thrust/copy.h>

#include <vector>

#include "base/error.h"
#include "compress/backend/buffered_dgc_state.h"
#include "compress/backend/host_resources.h"
#include "compress/backend/validate.h"
#include "compress/dgc/schedule.h"
#include "compress/thrust/dgc_algo.h"
#include "compress/thrust/omp_policy.h"
#include "compress/thrust/ops_algo.h"
#include "compress/thrust/step_info.h"

namespace gradex::compress::backend {
namespace {

using thrust_dgc::OmpPolicy;

// u, v and the selection in host buffers; the Thrust step's scratch grows to the largest step.
class OmpDgc final : public BufferedDgcState {
 public:
  OmpDgc(size_t numel, const DgcOptions& o) : BufferedDgcState(numel, o) {
    v_ = HostBuffer::make(n_ * 4);
    host_fill_zero(v_->data(), n_ * 4);
    if (o_.momentum > 0) {
      u_ = HostBuffer::make(n_ * 4);
      host_fill_zero(u_->data(), n_ * 4);
    }
    idx_.resize(cap_);
    val_.resize(cap_);
  }
  const uint32_t* selected_indices() const override { return idx_.data(); }
  const float* selected_values() const override { return val_.data(); }

  DgcStepInfo step(const float* grad, float grad_scale, Stream&) override {
    require_pointers(n_, "thrust-omp dgc step", grad);
    thrust_dgc::StepParams p = thrust_dgc::make_step_params(o_, n_, step_);
    p.grad_scale = grad_scale;
    sample_.resize(p.sample_m);
    cand_.resize(p.cand_cap);
    mag_.resize(p.cand_cap);
    OmpPolicy policy;
    thrust_dgc::StepAlgo<OmpPolicy> algo(policy, p, momentum_buffer(), v_->as<float>(),
                                         sample_.data(), cand_.data(), mag_.data(), idx_.data());
    thrust_dgc::StepResult r = algo.run(grad, val_.data());
    return thrust_dgc::step_info(r, o_, step_++);
  }

  void step_dense(const float* grad, float* dense_out, float grad_scale, Stream&) override {
    require_pointers(n_, "thrust-omp dgc step_dense", grad, dense_out);
    thrust_dgc::StepParams p = thrust_dgc::make_step_params(o_, n_, step_);
    p.grad_scale = grad_scale;
    OmpPolicy policy;
    thrust_dgc::StepAlgo<OmpPolicy> algo(policy, p, momentum_buffer(), v_->as<float>(), nullptr,
                                         nullptr, nullptr, nullptr);
    algo.run_dense(grad, dense_out);
    ++step_;
  }

 private:
  std::vector<uint32_t> idx_, cand_;
  std::vector<float> val_, sample_, mag_;
};

class OmpBackend final : public HostBackend<DeviceType::kThrustOmp, OmpDgc> {
 protected:
  CastCounts do_to_half(const float* in, uint16_t* out, size_t n, DType type, float scale,
                        Stream&) override {
    OmpPolicy policy;
    thrust_dgc::CastCounts c =
        thrust_dgc::cast_to_half(policy, in, out, n, scale, type == DType::kBFloat16);
    return {c.saturated, c.nonfinite};
  }
  void do_from_half(const uint16_t* in, float* out, size_t n, DType type, float scale, bool add,
                    Stream&) override {
    OmpPolicy policy;
    thrust_dgc::from_half(policy, in, out, n, type == DType::kBFloat16, scale, add);
  }
  size_t do_count_nonfinite(const float* x, size_t n, Stream&) override {
    OmpPolicy policy;
    return thrust_dgc::count_nonfinite(policy, x, n);
  }

  double do_sum_squares(const float* x, size_t n, Stream&) override {
    OmpPolicy policy;
    return thrust_dgc::sum_squares(policy, x, n);
  }
  void do_zero_nonfinite(float* x, size_t n, Stream&) override {
    OmpPolicy policy;
    thrust_dgc::zero_nonfinite(policy, x, n);
  }
  void do_apply_momentum(float* g, float* u, size_t n, float momentum, bool nesterov,
                         float grad_scale, Stream&) override {
    OmpPolicy policy;
    thrust_dgc::apply_momentum(policy, g, u, n, momentum, nesterov, grad_scale);
  }

  void do_gather(const FusionEntry* entries, size_t count, float* bucket, Stream&) override {
    for (size_t i = 0; i < count; ++i) {
      const FusionEntry& e = entries[i];
      if (e.numel) thrust::copy(thrust::omp::par, e.data, e.data + e.numel, bucket + e.offset);
    }
  }
  void do_scatter(const float* bucket, const FusionEntry* entries, size_t count, Stream&) override {
    for (size_t i = 0; i < count; ++i) {
      const FusionEntry& e = entries[i];
      if (e.numel)
        thrust::copy(thrust::omp::par, bucket + e.offset, bucket + e.offset + e.numel, e.data);
    }
  }

  void do_scatter_add(const uint32_t* indices, const float* values, size_t count, float* out,
                      size_t numel, float scale, Stream&) override {
    // Host memory: the bounds can be checked here (the CUDA backend relies on wire::decode).
    for (size_t j = 0; j < count; ++j)
      if (indices[j] >= numel)
        throw InvalidArgument("thrust-omp scatter_add: index " + std::to_string(indices[j]) +
                              " >= numel " + std::to_string(numel));
    OmpPolicy policy;
    thrust_dgc::scatter_add(policy, indices, values, count, out, scale);
  }
};

}  // namespace

BackendPtr make_thrust_omp_backend() {
  return std::make_shared<OmpBackend>();
}

}  // namespace gradex::compress::backend
