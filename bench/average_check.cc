#include "bench/average_check.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "base/error.h"

namespace gradex::bench {

namespace {
constexpr int64_t kChunk = int64_t{1} << 20;
}  // namespace

AverageChecker::AverageChecker(const ModelProfile& model, int world_size, GradientOptions options) {
  if (world_size < 1) throw InvalidArgument("average check: world size must be >= 1");
  for (int r = 0; r < world_size; ++r) {
    ranks_.push_back(std::make_unique<GradientGenerator>(model, r, options));
  }
  size_t n = model.tensors.size();
  checked_ = {0, n / 2, n - 1, model.largest_tensor()};
  std::sort(checked_.begin(), checked_.end());
  checked_.erase(std::unique(checked_.begin(), checked_.end()), checked_.end());
}

double AverageChecker::check(const std::string& mode, int64_t step, const float* result,
                             const Tolerance& tolerance) const {
  const ModelProfile& model = ranks_[0]->model();
  const double world = static_cast<double>(ranks_.size());
  double worst = 0;
  for (size_t t : checked_) {
    const TensorSpec& spec = model.tensors[t];
    const float* got_tensor = result + ranks_[0]->offset(t);
    // In chunks, so that checking GPT-2's 38M-element embedding needs little memory.
    for (int64_t begin = 0; begin < spec.numel; begin += kChunk) {
      const int64_t n = std::min(kChunk, spec.numel - begin);
      std::vector<double> sum(n, 0.0), abs_sum(n, 0.0);
      std::vector<float> g(n);
      for (const auto& gen : ranks_) {
        gen->generate_range(step, t, begin, n, g.data());
        for (int64_t i = 0; i < n; ++i) {
          sum[i] += g[i];
          abs_sum[i] += std::fabs(g[i]);
        }
      }
      const float* got = got_tensor + begin;
      for (int64_t i = 0; i < n; ++i) {
        double want = sum[i] / world;
        double allowed = tolerance.relative * abs_sum[i] / world + tolerance.absolute;
        double error = std::fabs(static_cast<double>(got[i]) - want);
        if (!(error <= allowed)) {  // also catches NaN
          std::ostringstream os;
          os.precision(9);
          os << mode << ": wrong average at step " << step << ", tensor '" << spec.name
             << "' element " << begin + i << ": got " << got[i] << ", expected " << want << " +- "
             << allowed;
          throw InternalError(os.str());
        }
        worst = std::max(worst, error / allowed);
      }
    }
  }
  return worst;
}

}  // namespace gradex::bench
