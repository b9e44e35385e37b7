// Threshold estimation and exact selection for DGC. Magnitudes are compared as |v|; an element of
// value 0 is never selected. Exact selections break ties at the threshold by lower index first, so
// the CPU and Thrust implementations agree bit for bit.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "compress/options.h"

namespace gradex::compress::dgc {

// Smallest threshold the selection uses: selecting |v| >= kMinThreshold means "every non-zero".
constexpr float kMinThreshold = 1.401298464e-45f;  // the smallest positive subnormal

// Sample geometry for n elements and target k: m samples, every `stride`-th from `offset` (strided
// mode), and the rank (1-based, among the m sampled magnitudes, largest first) that estimates the
// threshold. m = max(sample_ratio * n, 32 * n / k) capped at n, so the sample holds ~32 or more
// elements above the threshold.
struct SamplePlan {
  size_t m, stride, offset, rank;
};
SamplePlan plan_sample(size_t n, size_t k, double sample_ratio, uint64_t seed);

// Estimated threshold from a sample of |v| (scratch is reused between calls).
float sample_threshold(const float* v, size_t n, size_t k, const DgcOptions& options, uint64_t seed,
                       std::vector<float>& scratch);

// Keeps the k candidates of largest |v| (ties: lower index), sorted ascending. cand must be sorted.
void top_k_among(const float* v, std::vector<uint32_t>& cand, size_t k);

// Exact selection over all of v: the k largest non-zero magnitudes, ties by lower index, sorted.
void exact_top_k(const float* v, size_t n, size_t k, std::vector<uint32_t>& out,
                 std::vector<float>& scratch);

}  // namespace gradex::compress::dgc
