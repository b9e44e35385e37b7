#include "compress/backend/host_reselect.h"

#include <algorithm>
#include <cmath>

#include "base/check.h"
#include "base/half.h"

namespace gradex::compress::backend {
namespace {

float round_to(float x, DType t) {
  switch (t) {
    case DType::kFloat16:
      return half_to_float(float_to_half(x));
    case DType::kBFloat16:
      return bf16_to_float(float_to_bf16(x));
    default:
      return x;
  }
}

}  // namespace

void reselect_host_sum(const std::vector<const wire::DecodedPayload*>& local, DType value_dtype,
                       HostSelection& out) {
  GX_CHECK(!local.empty());
  const uint64_t numel = local.front()->header.numel;
  size_t budget = 0, total = 0;
  for (const wire::DecodedPayload* p : local) {
    GX_CHECK_EQ(p->header.numel, numel);
    budget = std::max<size_t>(budget, p->indices.size());
    total += p->indices.size();
  }
  // The union of the indices with their sums, in index order: a k-way merge that adds each
  // index's values in payload (local rank) order.
  std::vector<uint32_t> idx;
  std::vector<float> sum;
  idx.reserve(total);
  sum.reserve(total);
  std::vector<size_t> at(local.size(), 0);
  for (;;) {
    uint64_t next = UINT64_MAX;
    for (size_t j = 0; j < local.size(); ++j)
      if (at[j] < local[j]->indices.size())
        next = std::min<uint64_t>(next, local[j]->indices[at[j]]);
    if (next == UINT64_MAX) break;
    float acc = 0.0f;
    for (size_t j = 0; j < local.size(); ++j)
      if (at[j] < local[j]->indices.size() && local[j]->indices[at[j]] == next)
        acc = acc + local[j]->values[at[j]++];
    idx.push_back(static_cast<uint32_t>(next));
    sum.push_back(acc);
  }
  // Which positions are kept: the `budget` largest magnitudes, ties to the lower index (a strict
  // total order, so every rank that runs this keeps the same set).
  std::vector<size_t> order(idx.size());
  for (size_t i = 0; i < order.size(); ++i)
    order[i] = i;
  std::vector<char> keep(idx.size(), 1);
  if (idx.size() > budget) {
    auto larger = [&](size_t a, size_t b) {
      const float ma = std::fabs(sum[a]), mb = std::fabs(sum[b]);
      return ma != mb ? ma > mb : idx[a] < idx[b];
    };
    std::nth_element(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(budget),
                     order.end(), larger);
    std::fill(keep.begin(), keep.end(), 0);
    for (size_t i = 0; i < budget; ++i)
      keep[order[i]] = 1;
  }
  out.kept_indices.clear();
  out.kept_values.clear();
  out.dropped.indices.clear();
  out.dropped.values.clear();
  out.dropped.header = wire::PayloadHeader{};
  out.dropped.header.numel = numel;
  for (size_t i = 0; i < idx.size(); ++i) {
    if (!keep[i]) {
      out.dropped.indices.push_back(idx[i]);
      out.dropped.values.push_back(sum[i]);
      continue;
    }
    const float kept = round_to(sum[i], value_dtype);
    out.kept_indices.push_back(idx[i]);
    out.kept_values.push_back(kept);
    if (kept != sum[i]) {
      out.dropped.indices.push_back(idx[i]);
      out.dropped.values.push_back(sum[i] - kept);
    }
  }
  out.dropped.header.selected = static_cast<uint32_t>(out.dropped.indices.size());
}

}  // namespace gradex::compress::backend
