// Options of the compress/ layer: one struct per compressor, built from the GRADEX_* registry by
// the helpers below. Every field has a safe default; validate() rejects nonsense with
// InvalidArgument before a compressor is built.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "base/config.h"
#include "base/dtype.h"

namespace gradex::compress {

// Index coding of sparse payloads. The numeric values are part of the wire format (never renumber);
// kAuto is an encoder request only and never appears on the wire.
enum class IndexCoding : uint8_t { kVarint = 0, kRice = 1, kBitmap = 2, kAuto = 255 };
const char* index_coding_name(IndexCoding coding);

// How the DGC threshold sample is drawn: every (n/m)-th element from a random offset, or m
// uniformly random positions.
enum class SampleMode : uint8_t { kStrided, kRandom };

struct DgcOptions {
  // Target sparsity (fraction of elements NOT sent) once warm-up is over, in [0, 1).
  double sparsity = 0.999;
  // Warm-up length in steps: the sparsity goes through 0.75, 0.9375, 0.984375, 0.996 (each capped
  // at `sparsity`) in four equal stages, then stays at `sparsity`. 0: no warm-up.
  int64_t warmup_steps = 0;
  // Explicit per-step sparsities (step 0 first); when non-empty it replaces the warm-up ramp, and
  // steps past its end use `sparsity`.
  std::vector<double> schedule;
  // Momentum correction: u <- m*u + g; v <- v + u (Nesterov: v <- v + g + m*u). m = 0 is plain
  // error-feedback top-k and keeps no momentum buffer at all.
  float momentum = 0.9f;
  bool nesterov = false;
  // Local clipping of g by its L2 norm at clip_norm / sqrt(world_size) before accumulation; 0: off.
  float clip_norm = 0.0f;
  int world_size = 1;
  // Fraction of elements sampled to estimate the threshold (raised when needed so that the sample
  // holds enough elements above it for the target count).
  double sample_ratio = 0.01;
  SampleMode sample_mode = SampleMode::kStrided;
  // Type of the selected values. With fp16/bf16 the values are rounded (saturating) by the
  // compressor and the rounding error stays in the residual, so the invariant holds exactly.
  DType value_dtype = DType::kFloat32;
  // Hard cap on the selected count per step; 0: ceil(accept_high * k) for the step's target k.
  size_t max_selected = 0;
  // CPU threads for large tensors (0: hardware concurrency, at most 8).
  int threads = 0;
  uint64_t seed = 0;
  // Reuse the previous step's threshold (lowered by hint_margin) to collect candidates during the
  // fused update pass, which saves a full pass over v when it works (it falls back otherwise).
  bool reuse_threshold = true;
  // What the residual v holds: 0, the tensor's elements; c > 0, the coefficients of its chunked
  // DCT with chunk c (compress/dct/chunked_dct.h, the DCT Adam codec). Checkpoints record it
  // (state format 2), so that a residual is never restored into another domain.
  uint32_t residual_dct_chunk = 0;

  // --- tuning and test-only knobs ---
  double accept_low = 0.8;    // accept a threshold when its count lies in [accept_low*k,
  double accept_high = 1.3;   //                                            accept_high*k]
  int max_rounds = 10;        // adaptation rounds before the exact selection
  float hint_margin = 0.95f;  // candidates are collected at hint_margin * predicted threshold
  size_t parallel_min_elements = size_t{1} << 20;  // smaller tensors run on one thread
  bool exact_selection = false;  // always select exactly the top k (ties: lower index first)
};

struct WireOptions {
  IndexCoding index_coding = IndexCoding::kAuto;
  int zstd_level = 0;  // 0: off; 1..22: applied when it shrinks the payload
};

// Throws InvalidArgument naming the offending field.
void validate(const DgcOptions& options);

// GRADEX_SPARSITY, GRADEX_WARMUP_STEPS, GRADEX_MOMENTUM, GRADEX_NESTEROV, GRADEX_CLIP_NORM,
// GRADEX_SAMPLE_RATIO, GRADEX_SPARSE_VALUES, GRADEX_THREADS; world_size must be >= 1.
DgcOptions dgc_options_from_config(const config::Config& config, int world_size);
// GRADEX_INDEX_CODING, GRADEX_ZSTD_LEVEL.
WireOptions wire_options_from_config(const config::Config& config);

}  // namespace gradex::compress
