// The policy vocabulary: the codecs a tensor can be exchanged with, a rung (a codec and, for the
// sparse codecs, its sparsity), and a tensor's applied policy (TensorPolicy, derived from a rung by
// policy_of), shared by GRADEX_POLICY=fixed, GRADEX_POLICY=auto's cost model (sync/cost_model.h,
// sync/codec_choice.h) and the routes.
//
// GRADEX_POLICY=fixed's per-tensor policy: an ordered chain of candidates, the first that applies
// wins.
//   1. a GRADEX_SPARSITY_OVERRIDES entry matching the tensor's name ('dense', 'int8' or a
//      sparsity);
//   2. fewer elements than GRADEX_DENSE_THRESHOLD -> dense (fused, 16-bit or fp32 on the wire);
//   3. otherwise DGC at GRADEX_SPARSITY (GRADEX_OPTIMIZER=adam: the Adam codec at
//      GRADEX_ADAM_SPARSITY; a sparse tensor's codec is then the Adam codec whatever decided it).
// A sparsity of exactly 0 from an override or the global setting means dense as well: there is
// nothing to compress, and the fused ring is cheaper than an allgather of everything.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "sync/options.h"

namespace gradex::sync {

// kInt8: the dense 8-bit route (sync/int8_exchange.h), on the ladder between 16-bit and DGC.
// kAdam: the sparse codec of GRADEX_OPTIMIZER=adam (compress/backend/adam_codec.h, with
// GRADEX_ADAM_TRANSFORM=dct dct_adam_codec.h): under that optimizer it takes DGC's place as the
// sparse rung (a run has one sparse codec: the engine gives every sparse tensor the Adam codec).
enum class Codec : uint8_t { kFp32 = 0, kHalf = 1, kDgc = 2, kInt8 = 3, kAdam = 4 };
constexpr int kCodecs = 5;
const char* codec_name(Codec c);
// A codec that selects values (DGC, Adam) rather than sending every element.
inline bool is_sparse(Codec c) {
  return c == Codec::kDgc || c == Codec::kAdam;
}

struct Rung {
  Codec codec = Codec::kFp32;
  double sparsity = 0;  // sparse codecs (kDgc, kAdam) only
  bool operator==(const Rung& o) const { return codec == o.codec && sparsity == o.sparsity; }
  bool operator!=(const Rung& o) const { return !(*this == o); }
};
// "fp32", "16-bit", "dgc 99.9%", "adam 98%".
std::string rung_name(const Rung& r);

enum class ExchangeKind { kDense, kSparse };

struct TensorPolicy {
  ExchangeKind kind = ExchangeKind::kDense;
  double sparsity = 0;  // target sparsity for kSparse
  std::string reason;   // which candidate decided, for logs and gradex-bench
  // kDense on fp32 although the dense wire is 16-bit (GRADEX_POLICY=auto's fp32 rung).
  bool full_precision = false;
  // kDense on the 8-bit route with error feedback (sync/int8_exchange.h): an 'int8' override or
  // GRADEX_POLICY=auto's 8-bit rung.
  bool int8 = false;
};

// The two spellings of one policy. `half_on_wire`: the dense wire is 16-bit (GRADEX_FP16/BF16), so
// a dense tensor on the default wire is kHalf and kFp32 means fp32 buckets of its own; on an fp32
// wire both dense rungs are the default wire. `sparse_codec`: the run's sparse codec (kDgc, or
// kAdam under GRADEX_OPTIMIZER=adam). policy_of leaves `reason` empty.
TensorPolicy policy_of(const Rung& rung, bool half_on_wire);
Rung rung_of(const TensorPolicy& policy, Codec sparse_codec, bool half_on_wire);

TensorPolicy choose_policy(const EngineOptions& options, const std::string& key, uint64_t numel);

// Candidate 1 alone: the policy of the first GRADEX_SPARSITY_OVERRIDES entry matching `key`, or
// none. The one place overrides are matched: the fixed chain and GRADEX_POLICY=auto (which keeps
// an overridden tensor as the override says) both read them here.
std::optional<TensorPolicy> override_policy(const EngineOptions& options, const std::string& key);

// The sparse exchange (allgather of index/value pairs) moves more bytes than a dense 16-bit ring
// once density >= 1 / (2 * world_size); then a DGC tensor is sent dense for that step.
bool sparse_is_cheaper(double density, int world_size);

}  // namespace gradex::sync
