// The policy vocabulary: the codecs a tensor can be exchanged with, a rung (a codec and, for the
// sparse codecs, its sparsity) and a tensor's applied policy (a rung with the reason it was
// chosen), shared by GRADEX_POLICY=fixed, GRADEX_POLICY=auto's cost model
// (sync/policy/cost_model.h, sync/policy/codec_choice.h), the routes (sync/route/route.h) and the
// backends (sync/data/backend_path.h).
//
// GRADEX_POLICY=fixed's per-tensor policy: an ordered chain of candidates, the first that applies
// wins.
//   1. a GRADEX_SPARSITY_OVERRIDES entry matching the tensor's name ('dense', 'int8', 'int4'
//      or a sparsity);
//   2. fewer elements than GRADEX_DENSE_THRESHOLD -> dense (fused, 16-bit or fp32 on the wire);
//   3. otherwise DGC at GRADEX_SPARSITY (GRADEX_OPTIMIZER=adam: the Adam codec at
//      GRADEX_ADAM_SPARSITY; a sparse tensor's codec is then the Adam codec whatever decided it).
// A sparsity of exactly 0 from an override or the global setting means dense as well: there is
// nothing to compress, and the fused ring is cheaper than an allgather of everything.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "sync/engine/options.h"

namespace gradex::sync {

// The dense codecs name the precision the values travel in:
//   kHalf  the 16-bit dense wire (GRADEX_FP16=1, fp16 or bf16 as GRADEX_HALF_TYPE says): the
//          fused buckets dense tensors share. Never on an fp32 wire.
//   kFp32  fp32. On an fp32 wire (GRADEX_FP16=0) that is the dense wire itself, the same fused
//          buckets; on a 16-bit wire fp32 buckets of their own (route kDenseFp32: the auto
//          policy's fp32 rung, sync/route/route.h).
//   kInt8  the dense 8-bit route with error feedback (sync/data/int8_exchange.h), between 16-bit
//          and DGC on the ladder.
//   kInt4  the same route at 4 bits (about half of 8-bit's bytes), the rung after 8-bit.
// kInt8 and kInt4 are the quantized codecs: one route, one pair of residuals per tensor (a
// tensor moving between them keeps its residuals: both are the rounding error still owed).
// The sparse codecs select values rather than send every element:
//   kDgc   DGC top-k with momentum correction (SGD family).
//   kAdam  the sparse codec of GRADEX_OPTIMIZER=adam (compress/backend/adam_codec.h, with
//          GRADEX_ADAM_TRANSFORM=dct dct_adam_codec.h): under that optimizer it takes DGC's place.
// A run has one sparse codec, sparse_codec(options).
enum class Codec : uint8_t { kFp32 = 0, kHalf = 1, kDgc = 2, kInt8 = 3, kAdam = 4, kInt4 = 5 };
constexpr int kCodecs = 6;
const char* codec_name(Codec c);
// A codec that selects values (DGC, Adam) rather than sending every element.
inline bool is_sparse(Codec c) {
  return c == Codec::kDgc || c == Codec::kAdam;
}

// A dense codec with block codes and error feedback (the quantized route), and its code width.
inline bool is_quantized(Codec c) {
  return c == Codec::kInt8 || c == Codec::kInt4;
}
inline int quantized_bits(Codec c) {
  return c == Codec::kInt4 ? 4 : 8;
}

// The run's sparse codec: the Adam codec under GRADEX_OPTIMIZER=adam, else DGC. The one place
// that rule lives: every sparse rung a tensor is given, and every sparse codec built, follows it.
inline Codec sparse_codec(const EngineOptions& options) {
  return options.adam.codec ? Codec::kAdam : Codec::kDgc;
}

struct Rung {
  Codec codec = Codec::kFp32;
  double sparsity = 0;  // sparse codecs (kDgc, kAdam) only; 0 for the dense ones
  bool operator==(const Rung& o) const { return codec == o.codec && sparsity == o.sparsity; }
  bool operator!=(const Rung& o) const { return !(*this == o); }
};
// "fp32", "16-bit", "8-bit", "4-bit", "dgc 99.9%", "adam 98%".
std::string rung_name(const Rung& r);

// The rung a run actually applies for `r`, in the one encoding every applied policy uses (so that
// two applied rungs are the same policy exactly when they compare equal): a dense rung has
// sparsity 0; kHalf on an fp32 wire is kFp32 (both are that wire); a sparse rung takes the run's
// sparse codec at its sparsity.
Rung canonical_rung(const Rung& r, const EngineOptions& options);
// A dense tensor on the default dense wire: kHalf on a 16-bit wire, else kFp32.
Rung default_dense_rung(const EngineOptions& options);
// Whether a tensor at `r` travels in fp32 buckets of its own (route kDenseFp32): kFp32 on a 16-bit
// wire.
inline bool own_fp32_buckets(const Rung& r, bool half_on_wire) {
  return r.codec == Codec::kFp32 && half_on_wire;
}

// A tensor's applied policy: its rung (canonical_rung's encoding) and which candidate decided it,
// for logs, gradex_explain and gradex-bench.
struct AppliedPolicy {
  Rung rung;
  std::string reason;
};

AppliedPolicy choose_policy(const EngineOptions& options, const std::string& key, uint64_t numel);

// Candidate 1 alone: the policy of the first GRADEX_SPARSITY_OVERRIDES entry matching `key`, or
// none. The one place overrides are matched: the fixed chain and GRADEX_POLICY=auto (which keeps
// an overridden tensor as the override says) both read them here.
std::optional<AppliedPolicy> override_policy(const EngineOptions& options, const std::string& key);

// The sparse exchange (allgather of index/value pairs) moves more bytes than a dense 16-bit ring
// once density >= 1 / (2 * world_size); then a DGC tensor is sent dense for that step.
bool sparse_is_cheaper(double density, int world_size);

}  // namespace gradex::sync
