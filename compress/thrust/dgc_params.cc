#include "compress/thrust/dgc_params.h"

#include <algorithm>
#include <cmath>

#include "compress/dgc/schedule.h"
#include "compress/dgc/select.h"

namespace gradex::compress::thrust_dgc {

StepParams make_step_params(const DgcOptions& o, size_t n, uint64_t step) {
  validate(o);
  StepParams p;
  const double sparsity = dgc::sparsity_at(o, step);
  const dgc::CountBounds b = dgc::count_bounds(o, n, sparsity);
  p.n = n;
  p.k = b.k;
  p.low = b.low;
  p.high = b.high;
  p.cap = b.cap;
  p.cand_cap = std::min(n, std::max(8 * b.k, b.high) + 1024);
  p.momentum = o.momentum;
  p.nesterov = o.nesterov;
  p.clip_limit = o.clip_norm > 0 ? o.clip_norm / std::sqrt(static_cast<double>(o.world_size)) : 0.0;
  const uint64_t seed = o.seed ^ (step * 0x9e3779b97f4a7c15ull);
  if (n > 0) {
    dgc::SamplePlan s = dgc::plan_sample(n, b.k, o.sample_ratio, seed);
    p.sample_m = s.m;
    p.sample_stride = s.stride;
    p.sample_offset = s.offset;
    p.sample_rank = s.rank;
  }
  p.max_rounds = o.max_rounds;
  p.exact = o.exact_selection;
  p.value_dtype = o.value_dtype;
  return p;
}

}  // namespace gradex::compress::thrust_dgc
