#include "compress/dgc/compressor.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "base/check.h"
#include "base/error.h"
#include "compress/dgc/kernels.h"
#include "compress/dgc/parallel.h"
#include "compress/dgc/schedule.h"
#include "compress/dgc/select.h"
#include "compress/half/cast.h"

namespace gradex::compress {

using namespace dgc;

DgcCompressor::DgcCompressor(size_t numel, DgcOptions options)
    : numel_(numel), options_(std::move(options)) {
  validate(options_);
  if (numel_ > (uint64_t{1} << 32))
    throw InvalidArgument("DgcCompressor: " + std::to_string(numel_) +
                          " elements exceed the 2^32 that uint32 indices can address");
  v_.assign(numel_, 0.0f);
  if (options_.momentum > 0.0f) u_.assign(numel_, 0.0f);
  sel_.value_dtype = options_.value_dtype;
  sel_.numel = numel_;
}

double DgcCompressor::sparsity() const {
  return sparsity_at(options_, step_);
}

double DgcCompressor::sparsity_at_step(uint64_t step) const {
  return sparsity_at(options_, step);
}

size_t DgcCompressor::target_count() const {
  return count_bounds(options_, numel_, sparsity()).k;
}

float DgcCompressor::clip_scale(const float* grad) const {
  if (options_.clip_norm <= 0.0f || numel_ == 0) return 1.0f;
  // Partial sums over fixed blocks, added in block order: the norm (and so every bit of the step)
  // does not depend on how many threads split the tensor.
  constexpr size_t kBlock = size_t{1} << 16;
  const size_t blocks = (numel_ + kBlock - 1) / kBlock;
  std::vector<double> parts(blocks, 0.0);
  const int threads = pick_threads(numel_, options_.threads, options_.parallel_min_elements);
  parallel_chunks(blocks, std::min<int>(threads, static_cast<int>(blocks)),
                  [&](int, size_t b, size_t e) {
                    for (size_t k = b; k < e; ++k)
                      parts[k] = sum_squares(grad, k * kBlock, std::min(numel_, (k + 1) * kBlock));
                  });
  double norm = 0;
  for (double p : parts)
    norm += p;
  norm = std::sqrt(norm);
  double limit = options_.clip_norm / std::sqrt(static_cast<double>(options_.world_size));
  if (!(norm > limit)) return 1.0f;  // also when the norm is NaN: clipping cannot help there
  return static_cast<float>(limit / norm);
}

void DgcCompressor::update(const float* grad, float* clear, float grad_scale, float hint,
                           int threads) {
  UpdateParams p;
  p.momentum = options_.momentum;
  p.nesterov = options_.nesterov;
  p.grad_scale = clip_scale(grad) * grad_scale;
  p.hint = hint;
  float* u = u_.empty() ? nullptr : u_.data();
  parallel_chunks(numel_, threads, [&](int c, size_t b, size_t e) {
    const size_t cap = std::min(cand_cap_, e - b);
    found_[c] = clear ? update_collect_and_clear(clear, u, v_.data(), b, e, p, cand_[c].data(), cap)
                      : update_and_collect(grad, u, v_.data(), b, e, p, cand_[c].data(), cap);
  });
}

void DgcCompressor::collect(float t, int threads, size_t* total) {
  parallel_chunks(numel_, threads, [&](int c, size_t b, size_t e) {
    found_[c] = collect_at_least(v_.data(), b, e, t, cand_[c].data(), std::min(cand_cap_, e - b));
  });
  *total = 0;
  for (int c = 0; c < threads; ++c)
    *total += found_[c];
}

const Selection& DgcCompressor::step(const float* grad, float grad_scale) {
  return step_impl(grad, nullptr, grad_scale);
}

const Selection& DgcCompressor::step_and_clear(float* grad, float grad_scale) {
  return step_impl(grad, grad, grad_scale);
}

const Selection& DgcCompressor::step_impl(const float* grad, float* clear, float grad_scale) {
  if (numel_ > 0 && grad == nullptr) throw InvalidArgument("DgcCompressor::step: grad is null");
  const double sparsity = sparsity_at(options_, step_);
  const CountBounds b = count_bounds(options_, numel_, sparsity);
  const int threads = pick_threads(numel_, options_.threads, options_.parallel_min_elements);
  // Candidate buffers: generous, so that a threshold that is merely close still lands in them and
  // the exact top-k among candidates finishes the job without another pass. cand_cap_ bounds the
  // total; a chunk never holds more candidates than elements, so its buffer needs no more room
  // than that (every chunk's candidates are kept whenever the total fits, however it is split).
  cand_cap_ = std::min(numel_, std::max(8 * b.k, b.high) + 1024);
  if (static_cast<int>(cand_.size()) < threads) cand_.resize(threads);
  found_.assign(threads, 0);
  for (int c = 0; c < threads; ++c) {
    size_t begin, end;
    chunk_bounds(numel_, threads, c, &begin, &end);
    const size_t cap = std::min(cand_cap_, end - begin);
    if (cand_[c].size() < cap) cand_[c].resize(cap);
  }

  // A dense target (sparsity 0) selects every non-zero element in the fused pass: the identity.
  const bool dense_target = b.k >= numel_ && !options_.exact_selection;
  const bool use_hint = options_.reuse_threshold && !options_.exact_selection &&
                        last_threshold_ > 0 && std::isfinite(last_threshold_);
  // While the residual grows (early training) the threshold grows step over step: extrapolate
  // the last ratio (bounded) so that the candidates at the hint still fit the buffer.
  const float growth =
      prev_threshold_ > 0 ? std::clamp(last_threshold_ / prev_threshold_, 0.8f, 1.5f) : 1.0f;
  const float hint = dense_target ? kMinThreshold
                     : use_hint
                         ? std::max(last_threshold_ * growth * options_.hint_margin, kMinThreshold)
                         : std::numeric_limits<float>::infinity();
  update(grad, clear, grad_scale, hint, threads);

  sel_.indices.clear();
  sel_.step = step_;
  sel_.sparsity = sparsity;
  sel_.rounds = 0;
  sel_.exact = false;
  auto gather = [&] {
    for (int c = 0; c < threads; ++c)
      sel_.indices.insert(sel_.indices.end(), cand_[c].begin(), cand_[c].begin() + found_[c]);
    if (sel_.indices.size() > b.high) top_k_among(v_.data(), sel_.indices, b.k);
  };

  size_t total = 0;
  for (int c = 0; c < threads; ++c)
    total += found_[c];
  bool done = false;
  if (numel_ == 0) {
    done = true;
  } else if (options_.exact_selection) {
    exact_top_k(v_.data(), numel_, b.k, sel_.indices, scratch_);
    sel_.exact = done = true;
  } else if (dense_target || (use_hint && total >= b.low && total <= cand_cap_)) {
    gather();
    done = true;
  }
  if (!done) {
    const uint64_t seed = options_.seed ^ (step_ * 0x9e3779b97f4a7c15ull);
    float t =
        std::max(sample_threshold(v_.data(), numel_, b.k, options_, seed, scratch_), kMinThreshold);
    float too_low = 0, too_high = std::numeric_limits<float>::infinity();  // bracket of t
    for (int r = 0; r < options_.max_rounds && !done; ++r) {
      ++sel_.rounds;
      collect(t, threads, &total);
      if ((total >= b.low && total <= cand_cap_) || (total < b.low && t == kMinThreshold)) {
        gather();  // the second case: fewer non-zeros than `low`, send them all
        done = true;
        break;
      }
      if (total > cand_cap_)
        too_low = t;
      else
        too_high = t;
      float next = std::isfinite(too_high) && too_low > 0
                       ? static_cast<float>(std::sqrt(double(too_low) * too_high))
                       : (total > cand_cap_ ? t * 4.0f : t * 0.25f);
      next = std::max(next, kMinThreshold);
      if (!std::isfinite(next) || next == t) break;
      t = next;
    }
    if (!done) {
      exact_top_k(v_.data(), numel_, b.k, sel_.indices, scratch_);
      sel_.exact = true;
    }
  }
  finish_selection();
  ++step_;
  return sel_;
}

void DgcCompressor::finish_selection() {
  const size_t c = sel_.indices.size();
  GX_CHECK_LE(c, count_bounds(options_, numel_, sel_.sparsity).cap);
  sel_.values.resize(c);
  sel_.saturated = 0;
  float* v = v_.data();
  float* u = u_.empty() ? nullptr : u_.data();
  float threshold = std::numeric_limits<float>::infinity();
  const DType dt = options_.value_dtype;
  for (size_t j = 0; j < c; ++j) {
    const uint32_t i = sel_.indices[j];
    const float x = v[i];
    threshold = std::min(threshold, std::fabs(x));
    bool saturated = false;
    const float sent = dt == DType::kFloat32 ? x : half::round_to(x, dt, &saturated);
    sel_.saturated += saturated;
    sel_.values[j] = sent;
    v[i] = x - sent;  // 0 for fp32; the 16-bit rounding error otherwise (exact: Sterbenz)
    if (u) u[i] = 0.0f;
  }
  sel_.threshold = threshold;
  if (c > 0 && std::isfinite(threshold)) {
    prev_threshold_ = last_threshold_;
    last_threshold_ = threshold;
  }
}

void DgcCompressor::step_dense(const float* grad, float* dense_out, float grad_scale) {
  if (numel_ > 0 && (grad == nullptr || dense_out == nullptr))
    throw InvalidArgument("DgcCompressor::step_dense: null buffer");
  const int threads = pick_threads(numel_, options_.threads, options_.parallel_min_elements);
  cand_cap_ = 0;
  if (static_cast<int>(cand_.size()) < threads) cand_.resize(threads);
  found_.assign(threads, 0);
  update(grad, nullptr, grad_scale, std::numeric_limits<float>::infinity(), threads);
  parallel_chunks(numel_, threads, [&](int, size_t b, size_t e) {
    std::copy(v_.begin() + b, v_.begin() + e, dense_out + b);
    std::fill(v_.begin() + b, v_.begin() + e, 0.0f);
  });
  ++step_;
}

void DgcCompressor::reset() {
  std::fill(v_.begin(), v_.end(), 0.0f);
  std::fill(u_.begin(), u_.end(), 0.0f);
  step_ = 0;
  last_threshold_ = prev_threshold_ = 0;
}

}  // namespace gradex::compress
