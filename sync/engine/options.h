// The engine's options, resolved once from the GRADEX_* registry at engine creation.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "base/config.h"
#include "base/dtype.h"

namespace gradex::sync {

enum class NonFinitePolicy { kPropagate, kZero, kError };

// One entry of GRADEX_SPARSITY_OVERRIDES: tensors whose name matches `pattern` get `sparsity`, or
// go dense when `dense` is set, or dense on the quantized route (sync/data/int8_exchange.h) with
// quant_bits codes ('int8': 8, 'int4': 4; 0: not that route).
struct PolicyOverride {
  std::string pattern;
  bool dense = false;
  int quant_bits = 0;
  double sparsity = 0;
};

struct EngineOptions {
  std::chrono::milliseconds timeout{300000};
  uint64_t dense_threshold = 16384;
  size_t fusion_bytes = 64u << 20;
  bool half_on_wire = true;
  DType half_type = DType::kFloat16;
  double sparsity = 0.999;
  std::vector<PolicyOverride> overrides;
  NonFinitePolicy nonfinite = NonFinitePolicy::kPropagate;
  // GRADEX_MOMENTUM / GRADEX_NESTEROV: gradex owns momentum on every path when momentum > 0.
  float momentum = 0.0f;
  bool nesterov = false;
  // GRADEX_CLIP_NORM: clipping at clip_norm / sqrt(world size) of this rank's gradient norm.
  double clip_norm = 0;
  // GRADEX_OPTIMIZER=adam: compressed tensors use the Adam codec (compress/backend/adam_codec.h)
  // at GRADEX_ADAM_SPARSITY with decay GRADEX_ADAM_DECAY instead of DGC at GRADEX_SPARSITY.
  // GRADEX_ADAM_TRANSFORM=dct: the Adam codec runs on the chunked DCT (dct_adam_codec.h) with
  // blocks of at most GRADEX_ADAM_DCT_CHUNK; 0: on the elements.
  struct Adam {
    bool codec = false;
    double sparsity = 0.98;
    float decay = 0.9f;
    uint32_t dct_chunk = 64;
  } adam;

  // GRADEX_SPARSE_COLLECTIVE: the ring allgatherv or the direct one for sparse payloads; auto
  // chooses per unit from the payload sizes and the agreed link model (sync/data/sparse_gather.h).
  enum class SparseCollective { kAuto, kRing, kDirect };
  // GRADEX_DENSE_COLLECTIVE: the ring or the direct allreduce for dense buckets; auto chooses per
  // bucket from the agreed link model (sync/route/route.h: dense_direct_max_bytes) and,
  // on a latency-bound link, lets small dense gradients ride a round's DGC gather
  // (sync/data/gather_rider.h); gather: every dense gradient of a round with a DGC unit rides it,
  // other rounds' buckets as auto.
  enum class DenseCollective { kAuto, kRing, kDirect, kGather };
  // GRADEX_HIERARCHICAL: dense buckets and sparse payloads through comm/hierarchical.h. auto: when
  // the job spans two hosts or more and some host holds two ranks or more (comm::hierarchy_pays).
  enum class Hierarchical { kAuto, kOff, kOn };
  // How units travel: the collectives' choices and what the link model needs to be told.
  struct Collectives {
    SparseCollective sparse = SparseCollective::kAuto;
    DenseCollective dense = DenseCollective::kAuto;
    Hierarchical hierarchical = Hierarchical::kAuto;
    // GRADEX_PORT_QUEUE_MS, in seconds: what a switch port between hosts buffers (auto's incast
    // term), and whether the user set it (then it is taken as written: no measured incast burst).
    double port_queue_s = 1e-3;
    bool port_queue_explicit = false;
    // GRADEX_SPARSE_GROUP_MB: DGC tensors of a round travel in groups of consecutive tensors (key
    // order) holding at least this many bytes of fp32 gradient; a larger tensor travels alone
    // (0: every DGC tensor alone). Each group is one unit of the engine's pipeline
    // (sync/engine/pipeline.h).
    size_t sparse_group_bytes = 16u << 20;
  } collectives;
  // The planner's rank-count guess of the transfer's latency terms (sync/policy/codec_planner.cc);
  // the engine itself chooses per unit (sync/data/sparse_gather.h).
  static constexpr int kSparseRingMinRanks = 8;
  bool sparse_ring_for(int world_size) const {
    return collectives.sparse == SparseCollective::kRing ||
           (collectives.sparse == SparseCollective::kAuto && world_size >= kSparseRingMinRanks);
  }

  // GRADEX_LOCALSGD_PERIOD, GRADEX_LOCALSGD_WARMUP_STEPS (sync/engine/localsgd.h).
  struct LocalSgd {
    int64_t period = 0;
    int64_t warmup_steps = 0;
  } localsgd;
  // GRADEX_TIMELINE: where this rank writes its timeline (sync/timeline/recorder.h); empty: off.
  std::string timeline_dir;
};

// Reads every engine-level variable; throws ConfigError for invalid values (overrides included).
EngineOptions engine_options_from_config(const config::Config& config);

// Norm clipping (GRADEX_CLIP_NORM, as the DGC paper's local clipping): the factor that brings a
// gradient of L2 norm `norm` down to clip_norm / sqrt(world_size); 1 when it is already within,
// and when the norm is not finite (then the non-finite gradient is skipped everywhere instead).
float clip_scale_for_norm(double clip_norm, int world_size, double norm);

// Parses GRADEX_SPARSITY_OVERRIDES; ConfigError naming the offending entry.
std::vector<PolicyOverride> parse_policy_overrides(const std::string& text);

// A pattern with glob characters ('*', '?', '[...]') matches the whole name as fnmatch(3) does;
// one without them matches as a substring.
bool pattern_matches(const std::string& pattern, const std::string& name);

}  // namespace gradex::sync
