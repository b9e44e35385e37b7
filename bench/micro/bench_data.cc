#include "bench_data.h"

#include <algorithm>
#include <map>
#include <random>

namespace gradex::bench {

const std::vector<float>& gradient(size_t n, int which) {
  static std::map<std::pair<size_t, int>, std::vector<float>> cache;
  auto& g = cache[{n, which}];
  if (g.empty()) {
    // A cheap normal generator (sum of uniforms) keeps 100M-element setup short.
    g.resize(n);
    uint64_t s = 0x9e3779b97f4a7c15ull * (which + 1) + n;
    for (size_t i = 0; i < n; ++i) {
      float sum = 0;
      for (int k = 0; k < 4; ++k) {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        sum += static_cast<float>(s >> 40) * (1.0f / 16777216.0f);
      }
      g[i] = (sum - 2.0f) * 1.7320508f;  // variance 1
    }
  }
  return g;
}

const std::vector<uint32_t>& support(size_t n, double density) {
  static std::map<std::pair<size_t, double>, std::vector<uint32_t>> cache;
  auto& idx = cache[{n, density}];
  if (idx.empty()) {
    // Bernoulli(density) per element: a random support with the right expected size.
    std::mt19937_64 rng(n);
    std::uniform_real_distribution<double> u(0.0, 1.0);
    for (size_t i = 0; i < n; ++i)
      if (u(rng) < density) idx.push_back(static_cast<uint32_t>(i));
  }
  return idx;
}

void stream_r4_w2(const float* __restrict in, uint16_t* __restrict out, size_t n) {
  const uint32_t* bits = reinterpret_cast<const uint32_t*>(in);
  for (size_t i = 0; i < n; ++i)
    out[i] = static_cast<uint16_t>(bits[i] >> 16);
}

std::string size_name(size_t n) {
  return std::to_string(n / 1000000) + "M";
}

std::vector<size_t> sizes(bool large) {
  std::vector<size_t> s = {1000000, 25000000};
  if (large) s.push_back(100000000);
  return s;
}

}  // namespace gradex::bench
