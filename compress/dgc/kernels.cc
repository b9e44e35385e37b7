#include "compress/dgc/kernels.h"

#include <algorithm>
#include <cmath>

namespace gradex::compress::dgc {
namespace {

// Elements per block: the update of a block is a branch-free, vectorizable loop that also ORs the
// candidate test; only blocks holding a candidate (rare at high sparsity) are rescanned to emit.
constexpr size_t kBlock = 64;

inline size_t emit_block(const float* v, size_t b, size_t e, float t, uint32_t* cand, size_t cap,
                         size_t found) {
  if (found + (e - b) <= cap) {
    // Branch-free compaction: always store, advance only on a hit. Dense blocks (low sparsity)
    // cost no mispredictions this way.
    for (size_t i = b; i < e; ++i) {
      cand[found] = static_cast<uint32_t>(i);
      found += std::fabs(v[i]) >= t;
    }
    return found;
  }
  for (size_t i = b; i < e; ++i) {
    if (std::fabs(v[i]) >= t) {
      if (found < cap) cand[found] = static_cast<uint32_t>(i);
      ++found;
    }
  }
  return found;
}

enum class Mode { kPlain, kMomentum, kNesterov };

// Clear: g[i] = 0 after it is read (g is only written when Clear is set).
template <Mode M, bool Clear>
size_t update_impl(float* __restrict g, float* __restrict u, float* __restrict v, size_t begin,
                   size_t end, const UpdateParams& p, uint32_t* cand, size_t cap) {
  const float m = p.momentum, s = p.grad_scale, t = p.hint;
  size_t found = 0;
  for (size_t b = begin; b < end; b += kBlock) {
    const size_t e = std::min(end, b + kBlock);
    int hit = 0;
    for (size_t i = b; i < e; ++i) {
      const float gi = g[i] * s;
      if constexpr (Clear) g[i] = 0.0f;
      float vi;
      if constexpr (M == Mode::kPlain) {
        vi = v[i] + gi;
      } else {
        const float ui = m * u[i] + gi;
        u[i] = ui;
        vi = M == Mode::kNesterov ? v[i] + (gi + m * ui) : v[i] + ui;
      }
      v[i] = vi;
      hit |= std::fabs(vi) >= t;
    }
    if (hit) found = emit_block(v, b, e, t, cand, cap, found);
  }
  return found;
}

template <bool Clear>
size_t update_dispatch(float* g, float* u, float* v, size_t begin, size_t end,
                       const UpdateParams& p, uint32_t* cand, size_t cap) {
  if (p.momentum == 0.0f)
    return update_impl<Mode::kPlain, Clear>(g, u, v, begin, end, p, cand, cap);
  if (p.nesterov) return update_impl<Mode::kNesterov, Clear>(g, u, v, begin, end, p, cand, cap);
  return update_impl<Mode::kMomentum, Clear>(g, u, v, begin, end, p, cand, cap);
}

}  // namespace

size_t update_and_collect(const float* g, float* u, float* v, size_t begin, size_t end,
                          const UpdateParams& p, uint32_t* cand, size_t cap) {
  // Never written through: update_impl<.., false> only reads g.
  return update_dispatch<false>(const_cast<float*>(g), u, v, begin, end, p, cand, cap);
}

size_t update_collect_and_clear(float* g, float* u, float* v, size_t begin, size_t end,
                                const UpdateParams& p, uint32_t* cand, size_t cap) {
  return update_dispatch<true>(g, u, v, begin, end, p, cand, cap);
}

size_t collect_at_least(const float* __restrict v, size_t begin, size_t end, float t,
                        uint32_t* cand, size_t cap) {
  size_t found = 0;
  for (size_t b = begin; b < end; b += kBlock) {
    const size_t e = std::min(end, b + kBlock);
    int hit = 0;
    for (size_t i = b; i < e; ++i)
      hit |= std::fabs(v[i]) >= t;
    if (hit) found = emit_block(v, b, e, t, cand, cap, found);
  }
  return found;
}

double sum_squares(const float* __restrict g, size_t begin, size_t end) {
  double total = 0;
  for (size_t b = begin; b < end; b += 1024) {
    const size_t e = std::min(end, b + 1024);
    float part = 0;  // fp32 partial sums over short blocks vectorize; the total stays in double
    for (size_t i = b; i < e; ++i)
      part += g[i] * g[i];
    total += part;
  }
  return total;
}

void stream_reference(const float* __restrict g, float* __restrict u, float* __restrict v,
                      size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const float gi = g[i];
    u[i] += gi;
    v[i] += gi;
  }
}

}  // namespace gradex::compress::dgc
