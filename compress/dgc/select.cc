#include "compress/dgc/select.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace gradex::compress::dgc {
namespace {

uint64_t splitmix(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// |x| with NaN mapped to 0: NaN is never selected and must not reach a comparison-based sort.
inline float magnitude(float x) {
  float a = std::fabs(x);
  return a == a ? a : 0.0f;
}

}  // namespace

SamplePlan plan_sample(size_t n, size_t k, double sample_ratio, uint64_t seed) {
  SamplePlan p;
  double want = std::max(std::ceil(sample_ratio * n), std::ceil(32.0 * n / std::max<size_t>(k, 1)));
  p.m = std::clamp<size_t>(static_cast<size_t>(want), 1, n);
  p.stride = std::max<size_t>(1, n / p.m);
  uint64_t state = seed;
  p.offset = p.stride > 1 ? splitmix(state) % p.stride : 0;
  double r = std::round(static_cast<double>(p.m) * k / n);
  p.rank = std::clamp<size_t>(static_cast<size_t>(r), 1, p.m);
  return p;
}

float sample_threshold(const float* v, size_t n, size_t k, const DgcOptions& o, uint64_t seed,
                       std::vector<float>& s) {
  SamplePlan p = plan_sample(n, k, o.sample_ratio, seed);
  s.resize(p.m);
  if (o.sample_mode == SampleMode::kRandom && p.m < n) {
    uint64_t state = seed ^ 0x5851f42d4c957f2dull;
    for (size_t i = 0; i < p.m; ++i)
      s[i] = magnitude(v[splitmix(state) % n]);
  } else {
    for (size_t i = 0; i < p.m; ++i)
      s[i] = magnitude(v[p.offset + i * p.stride]);
  }
  auto nth = s.begin() + (p.rank - 1);
  std::nth_element(s.begin(), nth, s.end(), std::greater<float>());
  return *nth;
}

void top_k_among(const float* v, std::vector<uint32_t>& cand, size_t k) {
  if (cand.size() <= k) return;
  // The k-th largest magnitude from a contiguous copy (cheaper than sorting indices through v),
  // then one ordered filter: everything above it, and ties in index order.
  thread_local std::vector<float> mag;
  mag.resize(cand.size());
  for (size_t j = 0; j < cand.size(); ++j)
    mag[j] = std::fabs(v[cand[j]]);
  std::nth_element(mag.begin(), mag.begin() + (k - 1), mag.end(), std::greater<float>());
  const float t = mag[k - 1];
  size_t above = 0;
  for (uint32_t i : cand)
    above += std::fabs(v[i]) > t;
  size_t ties = k - above, out = 0;
  for (uint32_t i : cand) {
    const float a = std::fabs(v[i]);
    if (a > t || (a == t && ties > 0)) {
      if (a == t) --ties;
      cand[out++] = i;
    }
  }
  cand.resize(out);
}

void exact_top_k(const float* v, size_t n, size_t k, std::vector<uint32_t>& out,
                 std::vector<float>& s) {
  out.clear();
  if (k == 0 || n == 0) return;
  s.resize(n);
  for (size_t i = 0; i < n; ++i)
    s[i] = magnitude(v[i]);
  std::nth_element(s.begin(), s.begin() + (k - 1), s.end(), std::greater<float>());
  const float t = s[k - 1];
  size_t above = 0;
  for (size_t i = 0; i < n; ++i)
    above += std::fabs(v[i]) > t;
  size_t ties = t > 0 ? k - above : 0;  // zeros are never selected
  for (size_t i = 0; i < n; ++i) {
    float a = std::fabs(v[i]);
    if (a > t) {
      out.push_back(static_cast<uint32_t>(i));
    } else if (a == t && ties > 0) {
      out.push_back(static_cast<uint32_t>(i));
      --ties;
    }
  }
}

}  // namespace gradex::compress::dgc
