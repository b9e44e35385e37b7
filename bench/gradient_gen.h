// Realistic synthetic gradients for a model profile, deterministic per (seed, rank, step, tensor).
//
// What makes them realistic enough for compression and exchange benchmarks:
//  - per-tensor magnitude from the fan-in: weights ~ 1/sqrt(fan_in) (fan_in = numel / shape[0]),
//    one-dimensional tensors (biases, norms) ten times smaller than 1/sqrt(numel);
//  - heavy tails: a mix of gaussian, laplace and student-t(3) values, normalized to unit variance;
//  - correlation across data-parallel ranks: a component shared by every rank (a fraction of the
//    variance, `shared_fraction`) plus per-rank noise;
//  - variation across steps: each (step, tensor) reads the pools at fresh offsets with a fresh sign
//    and a jitter of the scale in [0.8, 1.25].
//
// Speed: two pools of ~1M values (shared, per rank) are generated once; a step is one fused
// multiply-add per element over contiguous runs of the pools. The two pool lengths are coprime, so
// no run of values repeats within any tensor of realistic size.
#pragma once

#include <cstdint>
#include <vector>

#include "bench/model_profile.h"

namespace gradex::bench {

struct GradientOptions {
  uint64_t seed = 1;
  double shared_fraction = 0.3;  // in [0, 1]: share of the variance common to all ranks
};

class GradientGenerator {
 public:
  // InvalidArgument for a negative rank or a shared_fraction outside [0, 1].
  GradientGenerator(const ModelProfile& model, int rank, GradientOptions options = {});

  // Writes every tensor's gradient for `step` into `out` (total_numel floats, tensors back to back
  // in profile order, tensor t at offset(t)).
  void generate(int64_t step, float* out) const;
  // One tensor's gradient for `step`: exactly its slice of generate()'s output.
  void generate_tensor(int64_t step, size_t tensor, float* out) const;
  // Elements [begin, begin + count) of that tensor's gradient (InvalidArgument when out of range).
  void generate_range(int64_t step, size_t tensor, int64_t begin, int64_t count, float* out) const;

  // Element offset of tensor t in the flat buffer.
  int64_t offset(size_t tensor) const { return offsets_.at(tensor); }
  // The standard deviation aimed at for tensor t, before the per-step jitter.
  double scale(size_t tensor) const { return scales_.at(tensor); }
  const ModelProfile& model() const { return model_; }
  int rank() const { return rank_; }

 private:
  ModelProfile model_;
  int rank_;
  GradientOptions options_;
  std::vector<int64_t> offsets_;
  std::vector<double> scales_;
  std::vector<float> shared_pool_;  // same on every rank (depends on the seed only)
  std::vector<float> rank_pool_;    // depends on (seed, rank)
};

}  // namespace gradex::bench
