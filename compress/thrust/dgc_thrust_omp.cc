#include "compress/thrust/dgc_thrust_omp.h"

#include <vector>

#include "base/error.h"
#include "compress/thrust/dgc_algo.h"
#include "compress/thrust/omp_policy.h"

namespace gradex::compress::thrust_dgc {

StepResult omp_step(const StepParams& p, const float* g, float* u, float* v, uint32_t* out_idx,
                    float* out_val) {
  if (p.momentum != 0.0f && u == nullptr && p.n > 0)
    throw InvalidArgument("thrust_dgc::omp_step: momentum > 0 needs the momentum buffer u");
  std::vector<float> sample(p.sample_m), mag(p.cand_cap);
  std::vector<uint32_t> cand(p.cand_cap);
  OmpPolicy backend;
  StepAlgo<OmpPolicy> algo(backend, p, u, v, sample.data(), cand.data(), mag.data(), out_idx);
  return algo.run(g, out_val);
}

CastCounts omp_to_half(const float* in, uint16_t* out, size_t n, DType type, float scale) {
  if (type == DType::kFloat32)
    throw InvalidArgument("thrust_dgc::omp_to_half: type must be 16-bit");
  OmpPolicy backend;
  return cast_to_half(backend, in, out, n, scale, type == DType::kBFloat16);
}

}  // namespace gradex::compress::thrust_dgc
