// The stateful per-tensor DGC compressor (Lin et al., "Deep Gradient Compression", ICLR 2018).
//
// State: the momentum buffer u (only when momentum > 0) and the residual v, both fp32 with numel
// elements. One step with gradient g (after optional clipping, g' = c*g):
//   u <- m*u + g';  v <- v + u   (Nesterov: v <- v + g' + m*u)
//   select S = the elements of largest |v| (about k = (1 - sparsity)*numel of them, never more
//   than the hard cap, at least one when v is non-zero), send their values, then zero them in v
//   (keeping the rounding error when values are 16-bit) and in u (momentum factor masking);
//   dense step: send all of v, zero v, keep u (see step_dense).
// Invariant, exactly in fp32, for every element i: sent_i + v_new_i == v_old_i + update_i, where
// v_old_i + update_i is the v computed above and sent_i is 0 for unselected elements.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "base/dtype.h"
#include "compress/options.h"

namespace gradex::compress {

// The result of one step: sorted, strictly increasing indices and their values. Values are exactly
// representable in value_dtype (the encoder sends them without further rounding).
struct Selection {
  std::vector<uint32_t> indices;
  std::vector<float> values;
  DType value_dtype = DType::kFloat32;
  uint64_t numel = 0;
  uint64_t step = 0;     // 0-based index of the step that produced it
  double sparsity = 0;   // the target sparsity of that step
  float threshold = 0;   // smallest selected |v| (the effective threshold); +inf when empty
  int rounds = 0;        // full passes over v spent on selection (0: the fused pass sufficed)
  bool exact = false;    // finished with an exact top-k over the whole tensor
  size_t saturated = 0;  // values clamped to the 16-bit range
};

class DgcCompressor {
 public:
  // Throws InvalidArgument for invalid options or numel > 2^32 (indices are uint32).
  DgcCompressor(size_t numel, DgcOptions options);

  size_t numel() const { return numel_; }
  const DgcOptions& options() const { return options_; }
  uint64_t steps_done() const { return step_; }
  // Sparsity, density and target count of the NEXT step (the engine uses density to decide on a
  // dense step: a sparse allgather only pays while density < 1/(2P)).
  double sparsity() const;
  double density() const { return 1.0 - sparsity(); }
  size_t target_count() const;

  // One sparse step. grad holds numel floats; it is multiplied by grad_scale (a clipping factor
  // decided by the caller, e.g. from the whole model's norm) and by the options' own clipping
  // factor before it enters u and v. The result is valid until the next call.
  const Selection& step(const float* grad, float grad_scale = 1.0f);
  // The same step (bit-identical selection and state), which also leaves grad all zeros: for a
  // caller whose gradient buffer then receives a sparse sum. The zeros are written in the pass
  // that reads grad, which is cheaper than a separate fill.
  const Selection& step_and_clear(float* grad, float grad_scale = 1.0f);
  // One dense step: the same update, then the whole new v is written to dense_out (numel floats)
  // and v is zeroed, so the invariant holds with every element sent. u is kept: a dense step is
  // an ordinary momentum-SGD step (dense_out = u when v was empty), and the momentum carries over
  // into later sparse steps. (The paper's masking of every sent element would leave a dense step
  // without momentum at all.)
  void step_dense(const float* grad, float* dense_out, float grad_scale = 1.0f);
  // Moves the schedule to step `step` (0-based): the sparsity, target count and sampling seed of
  // the next step derive from it. The engine sets it from the step counter all ranks agree on.
  void set_step(uint64_t step) { step_ = step; }
  // Sparsity / density at an arbitrary step (the schedule alone, no state).
  double sparsity_at_step(uint64_t step) const;

  // Read-only views of the state (u is null when momentum is 0).
  const float* residual() const { return v_.data(); }
  const float* momentum_buffer() const { return u_.empty() ? nullptr : u_.data(); }
  // Writable u, for the engine's LocalSGD local phase (which continues this rank's momentum
  // outside DGC); null when momentum is 0.
  float* mutable_momentum_buffer() { return u_.empty() ? nullptr : u_.data(); }

  // Checkpointing. The blob is versioned and carries numel and a checksum; load_state throws
  // StateError when the version, numel or momentum layout does not match, CorruptPayload when
  // the blob is damaged.
  std::vector<uint8_t> save_state() const;
  void load_state(const uint8_t* data, size_t size);
  // Zeroes u and v and restarts the schedule.
  void reset();

  // Step transactions (sync's snapshot/rollback): the complete mutable state (u, v, the step and
  // the threshold history), copied into buffers that keep their capacity, so that copying again
  // allocates nothing. restore_from a checkpoint of this compressor continues exactly.
  struct Checkpoint {
    std::vector<float> u, v;
    uint64_t step = 0;
    float last_threshold = 0, prev_threshold = 0;
  };
  void checkpoint_to(Checkpoint& c) const {
    c.u.assign(u_.begin(), u_.end());
    c.v.assign(v_.begin(), v_.end());
    c.step = step_;
    c.last_threshold = last_threshold_;
    c.prev_threshold = prev_threshold_;
  }
  void restore_from(const Checkpoint& c) {
    u_.assign(c.u.begin(), c.u.end());
    v_.assign(c.v.begin(), c.v.end());
    step_ = c.step;
    last_threshold_ = c.last_threshold;
    prev_threshold_ = c.prev_threshold;
  }

 private:
  float clip_scale(const float* grad) const;
  const Selection& step_impl(const float* grad, float* clear, float grad_scale);
  // clear: null, or grad itself (zeroed as it is read).
  void update(const float* grad, float* clear, float grad_scale, float hint, int threads);
  void select(int threads);
  void collect(float t, int threads, size_t* total);
  void finish_selection();

  size_t numel_;
  DgcOptions options_;
  std::vector<float> u_, v_;
  uint64_t step_ = 0;
  float last_threshold_ = 0;  // 0: none yet (first step, or after reset/restore)
  float prev_threshold_ = 0;  // the one before: their ratio predicts the next threshold

  Selection sel_;
  // Scratch: per-thread candidate buffers and their true counts, the sample, exact-selection space.
  std::vector<std::vector<uint32_t>> cand_;
  std::vector<size_t> found_;
  size_t cand_cap_ = 0;
  std::vector<float> scratch_;
};

}  // namespace gradex::compress
