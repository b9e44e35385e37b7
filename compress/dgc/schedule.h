// The DGC sparsity schedule: which sparsity a given step uses, and the target count k it implies.
#pragma once

#include <cstddef>
#include <cstdint>

#include "compress/options.h"

namespace gradex::compress::dgc {

// Sparsity of step `step` (0-based) under `options` (explicit schedule, warm-up ramp or target).
double sparsity_at(const DgcOptions& options, uint64_t step);

// Target selected count for `numel` elements at `sparsity`: round((1 - sparsity) * numel), at
// least 1 for a non-empty tensor.
size_t target_count(size_t numel, double sparsity);

// Accept window [low, high] and hard cap for target k (cap = max_selected or ceil(high * k)).
struct CountBounds {
  size_t k, low, high, cap;
};
CountBounds count_bounds(const DgcOptions& options, size_t numel, double sparsity);

}  // namespace gradex::compress::dgc
