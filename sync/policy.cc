#include "sync/policy.h"

namespace gradex::sync {

std::optional<TensorPolicy> override_policy(const EngineOptions& options, const std::string& key) {
  TensorPolicy p;
  for (const auto& o : options.overrides) {
    if (!pattern_matches(o.pattern, key)) continue;
    if (o.int8) {
      p.int8 = true;
      p.reason = "override '" + o.pattern + "': int8";
      return p;
    }
    if (o.dense || o.sparsity == 0) {
      p.reason = "override '" + o.pattern + "': dense";
      return p;
    }
    p.kind = ExchangeKind::kSparse;
    p.sparsity = o.sparsity;
    p.reason = "override '" + o.pattern + "'";
    return p;
  }
  return std::nullopt;
}

TensorPolicy choose_policy(const EngineOptions& options, const std::string& key, uint64_t numel) {
  if (std::optional<TensorPolicy> forced = override_policy(options, key)) return *forced;
  TensorPolicy p;
  if (numel < options.dense_threshold) {
    p.reason = "below GRADEX_DENSE_THRESHOLD";
    return p;
  }
  if (options.adam_codec) {  // GRADEX_OPTIMIZER=adam: the Adam codec's own sparsity
    if (options.adam_sparsity == 0) {
      p.reason = "GRADEX_ADAM_SPARSITY=0";
      return p;
    }
    p.kind = ExchangeKind::kSparse;
    p.sparsity = options.adam_sparsity;
    p.reason = "GRADEX_OPTIMIZER=adam: Adam codec at GRADEX_ADAM_SPARSITY";
    return p;
  }
  if (options.sparsity == 0) {
    p.reason = "GRADEX_SPARSITY=0";
    return p;
  }
  p.kind = ExchangeKind::kSparse;
  p.sparsity = options.sparsity;
  p.reason = "GRADEX_SPARSITY";
  return p;
}

bool sparse_is_cheaper(double density, int world_size) {
  return density * 2.0 * world_size < 1.0;
}

}  // namespace gradex::sync
