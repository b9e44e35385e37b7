#include "outer/fragments.h"

#include <string>

#include "base/error.h"

namespace gradex::outer {

std::vector<size_t> split_fragments(const std::vector<uint64_t>& sizes, int64_t fragments) {
  const size_t F = static_cast<size_t>(fragments);
  if (fragments < 1 || sizes.size() < F)
    throw InvalidArgument("cannot split " + std::to_string(sizes.size()) + " tensors into " +
                          std::to_string(fragments) +
                          " fragments (GRADEX_OUTER_FRAGMENTS must be between 1 and the number "
                          "of parameter tensors)");
  uint64_t total = 0;
  for (uint64_t s : sizes)
    total += s;
  std::vector<size_t> first{0};
  uint64_t running = 0;
  for (size_t i = 0; i < sizes.size() && first.size() < F; ++i) {
    running += sizes[i];
    const size_t f = first.size();  // the cut that ends group f - 1
    // Cut after tensor i once the share is reached, but leave a tensor for each later group.
    const bool share_reached = static_cast<double>(running) * static_cast<double>(F) >=
                               static_cast<double>(total) * static_cast<double>(f);
    const bool must_cut = sizes.size() - (i + 1) == F - f;
    if (share_reached || must_cut) first.push_back(i + 1);
  }
  first.push_back(sizes.size());
  return first;
}

int64_t fragment_offset(int64_t f, int64_t fragments, int64_t period) {
  return (f * period / fragments) % period;
}

std::vector<int64_t> fragments_due(uint64_t step, int64_t fragments, int64_t period) {
  std::vector<int64_t> due;
  const int64_t phase = static_cast<int64_t>(step % static_cast<uint64_t>(period));
  for (int64_t f = 0; f < fragments; ++f)
    if (fragment_offset(f, fragments, period) == phase) due.push_back(f);
  return due;
}

}  // namespace gradex::outer
