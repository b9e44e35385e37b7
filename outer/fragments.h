// Streaming DiLoCo's fragments: contiguous groups of tensors (in registration order, i.e. layer
// order), balanced by element count, and the schedule on which each one synchronizes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace gradex::outer {

// Splits tensors of the given sizes into `fragments` contiguous non-empty groups; returns the
// index of the first tensor of each group plus the total count at the end (fragments + 1
// entries). Cuts fall where the running element count first reaches f * total / fragments.
// InvalidArgument when there are fewer tensors than fragments.
std::vector<size_t> split_fragments(const std::vector<uint64_t>& sizes, int64_t fragments);

// The step (in [0, period)) at which fragment f synchronizes, modulo the period: f * H / F.
int64_t fragment_offset(int64_t f, int64_t fragments, int64_t period);

// Fragments due after completed inner step `step` (1-based: the first step() call ends step 1):
// those with step mod H == fragment_offset(f). Fragment 0 is due at H, 2H, ...
std::vector<int64_t> fragments_due(uint64_t step, int64_t fragments, int64_t period);

}  // namespace gradex::outer
