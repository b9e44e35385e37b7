// Per-tensor exchange policy: an ordered chain of candidates, the first that applies wins.
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

TensorPolicy choose_policy(const EngineOptions& options, const std::string& key, uint64_t numel);

// Candidate 1 alone: the policy of the first GRADEX_SPARSITY_OVERRIDES entry matching `key`, or
// none. The one place overrides are matched: the fixed chain and GRADEX_POLICY=auto (which keeps
// an overridden tensor as the override says) both read them here.
std::optional<TensorPolicy> override_policy(const EngineOptions& options, const std::string& key);

// The sparse exchange (allgather of index/value pairs) moves more bytes than a dense 16-bit ring
// once density >= 1 / (2 * world_size); then a DGC tensor is sent dense for that step.
bool sparse_is_cheaper(double density, int world_size);

}  // namespace gradex::sync
