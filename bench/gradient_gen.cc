#include "bench/gradient_gen.h"

#include <algorithm>
#include <cmath>

#include "base/error.h"

namespace gradex::bench {

namespace {

// Coprime pool lengths (both odd, differing by 10, neither a multiple of 5).
constexpr size_t kSharedPoolSize = (size_t{1} << 20) + 7;
constexpr size_t kRankPoolSize = (size_t{1} << 20) - 3;

// splitmix64: a counter-based generator, so every value depends only on its inputs (portable
// determinism; std:: distributions differ between standard libraries).
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
uint64_t mix(uint64_t a, uint64_t b) {
  return mix(a ^ mix(b + 0x632be59bd9b4e019ull));
}

class Stream {
 public:
  explicit Stream(uint64_t key) : state_(key) {}
  uint64_t next() { return mix(state_++); }
  // Uniform in (0, 1): never exactly 0, so log() is safe.
  double uniform() { return (static_cast<double>(next() >> 11) + 0.5) * 0x1.0p-53; }
  double gaussian() {
    double u = uniform(), v = uniform();
    return std::sqrt(-2.0 * std::log(u)) * std::cos(6.283185307179586 * v);
  }

 private:
  uint64_t state_;
};

// Heavy-tailed values with zero mean and unit variance: 70% gaussian, 25% laplace, 5% student-t
// with 3 degrees of freedom (infinite kurtosis: the rare large gradients that top-k selects).
std::vector<float> make_pool(size_t size, uint64_t key) {
  Stream rng(key);
  std::vector<double> values(size);
  for (double& x : values) {
    double pick = rng.uniform();
    if (pick < 0.70) {
      x = rng.gaussian();
    } else if (pick < 0.95) {
      double u = rng.uniform() - 0.5;
      x = (u < 0 ? 1.0 : -1.0) * std::log(1.0 - 2.0 * std::fabs(u)) / std::sqrt(2.0);
    } else {
      double g = rng.gaussian(), a = rng.gaussian(), b = rng.gaussian(), c = rng.gaussian();
      x = g / std::sqrt((a * a + b * b + c * c) / 3.0);
    }
  }
  double mean = 0, square = 0;
  for (double x : values)
    mean += x;
  mean /= static_cast<double>(size);
  for (double x : values)
    square += (x - mean) * (x - mean);
  double inv_std = 1.0 / std::sqrt(square / static_cast<double>(size));
  std::vector<float> pool(size);
  for (size_t i = 0; i < size; ++i)
    pool[i] = static_cast<float>((values[i] - mean) * inv_std);
  return pool;
}

double tensor_scale(const TensorSpec& t) {
  if (t.shape.size() == 1) return 0.1 / std::sqrt(static_cast<double>(t.numel));
  return 1.0 / std::sqrt(static_cast<double>(t.numel / t.shape[0]));
}

// A factor in [0.8, 1.25], log-uniform.
double jitter(uint64_t bits) {
  double u = static_cast<double>(bits >> 11) * 0x1.0p-53;
  return std::exp((2.0 * u - 1.0) * std::log(1.25));
}

}  // namespace

GradientGenerator::GradientGenerator(const ModelProfile& model, int rank, GradientOptions options)
    : model_(model), rank_(rank), options_(options) {
  if (rank < 0) throw InvalidArgument("gradient generator: negative rank " + std::to_string(rank));
  if (!(options.shared_fraction >= 0.0 && options.shared_fraction <= 1.0)) {
    throw InvalidArgument("gradient generator: shared_fraction must be in [0, 1], got " +
                          std::to_string(options.shared_fraction));
  }
  int64_t offset = 0;
  for (const TensorSpec& t : model_.tensors) {
    offsets_.push_back(offset);
    scales_.push_back(tensor_scale(t));
    offset += t.numel;
  }
  shared_pool_ = make_pool(kSharedPoolSize, mix(options.seed, 0x5eedull));
  rank_pool_ = make_pool(kRankPoolSize, mix(mix(options.seed, 0x7a2cull), uint64_t(rank) + 1));
}

void GradientGenerator::generate(int64_t step, float* out) const {
  for (size_t t = 0; t < model_.tensors.size(); ++t)
    generate_tensor(step, t, out + offsets_[t]);
}

void GradientGenerator::generate_tensor(int64_t step, size_t tensor, float* out) const {
  generate_range(step, tensor, 0, model_.tensors.at(tensor).numel, out);
}

void GradientGenerator::generate_range(int64_t step, size_t tensor, int64_t begin, int64_t count,
                                       float* out) const {
  const TensorSpec& spec = model_.tensors.at(tensor);
  if (begin < 0 || count < 0 || begin > spec.numel - count) {
    throw InvalidArgument("gradient range [" + std::to_string(begin) + ", +" +
                          std::to_string(count) + ") outside tensor '" + spec.name + "'");
  }
  // Everything shared depends on (seed, step, tensor); the rank part additionally on the rank.
  uint64_t key = mix(mix(options_.seed, static_cast<uint64_t>(step)), tensor);
  uint64_t rank_key = mix(key, 0x1000ull + static_cast<uint64_t>(rank_));
  uint64_t shared_bits = mix(key, 1), rank_bits = mix(rank_key, 2);
  double sign = (mix(key, 3) & 1) ? -1.0 : 1.0;
  const float a = static_cast<float>(sign * scales_[tensor] * std::sqrt(options_.shared_fraction) *
                                     jitter(shared_bits));
  const float b = static_cast<float>(scales_[tensor] * std::sqrt(1.0 - options_.shared_fraction) *
                                     jitter(rank_bits));
  const uint64_t skip = static_cast<uint64_t>(begin);
  size_t ps = (mix(key, 4) % kSharedPoolSize + skip % kSharedPoolSize) % kSharedPoolSize;
  size_t pr = (mix(rank_key, 5) % kRankPoolSize + skip % kRankPoolSize) % kRankPoolSize;
  const float* shared = shared_pool_.data();
  const float* own = rank_pool_.data();
  // Contiguous runs up to the next wrap of either pool: a plain loop the compiler vectorizes.
  int64_t i = 0;
  while (i < count) {
    size_t run =
        std::min({static_cast<size_t>(count - i), kSharedPoolSize - ps, kRankPoolSize - pr});
    float* dst = out + i;
    const float* s = shared + ps;
    const float* r = own + pr;
    for (size_t k = 0; k < run; ++k)
      dst[k] = a * s[k] + b * r[k];
    i += static_cast<int64_t>(run);
    ps = (ps + run) % kSharedPoolSize;
    pr = (pr + run) % kRankPoolSize;
  }
}

}  // namespace gradex::bench
