// Helpers shared by the compress tests: deterministic random gradients.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

namespace gradex::compress::test {

// Normal(0, scale) values; every `zero_every`-th element is exactly 0 when zero_every > 0.
inline std::vector<float> random_grad(size_t n, uint64_t seed, float scale = 1.0f,
                                      size_t zero_every = 0) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> g(n);
  for (size_t i = 0; i < n; ++i)
    g[i] = (zero_every && i % zero_every == 0) ? 0.0f : dist(rng);
  return g;
}

// A sorted random support of `count` distinct indices in [0, numel).
inline std::vector<uint32_t> random_support(uint64_t numel, size_t count, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> taken(numel, 0);
  std::vector<uint32_t> idx;
  while (idx.size() < count) {
    uint32_t i = static_cast<uint32_t>(rng() % numel);
    if (!taken[i]) {
      taken[i] = 1;
      idx.push_back(i);
    }
  }
  std::sort(idx.begin(), idx.end());
  return idx;
}

}  // namespace gradex::compress::test
