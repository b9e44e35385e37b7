// Shared inputs of the compress microbenchmarks: gradients and supports are generated once per
// size and reused by every benchmark of that size; the streaming bound kernels live here too.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace gradex::bench {

// Normal(0, 1) gradients of n elements (cached per (n, which)).
const std::vector<float>& gradient(size_t n, int which);
// A sorted random support of round(density * n) indices in [0, n) (cached).
const std::vector<uint32_t>& support(size_t n, double density);

// Streaming bound of the casts: read fp32, write 16 bits, no rounding work. (The DGC step's bound,
// read g, u, v and write u, v, is compress::dgc::stream_reference, built like the DGC kernel.)
void stream_r4_w2(const float* in, uint16_t* out, size_t n);

std::string size_name(size_t n);  // 1M, 25M, 100M

// Sizes benchmarked: 1M and 25M, plus 100M when --large is given.
std::vector<size_t> sizes(bool large);

}  // namespace gradex::bench
