#include "sync/policy.h"

#include <cstdio>

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

const char* codec_name(Codec c) {
  switch (c) {
    case Codec::kFp32:
      return "fp32";
    case Codec::kHalf:
      return "16-bit";
    case Codec::kDgc:
      return "dgc";
    case Codec::kInt8:
      return "8-bit";
    case Codec::kAdam:
      return "adam";
  }
  return "?";
}

std::string rung_name(const Rung& r) {
  if (!is_sparse(r.codec)) return codec_name(r.codec);
  char b[48];
  std::snprintf(b, sizeof b, "%s %g%%", codec_name(r.codec), r.sparsity * 100.0);
  return b;
}

TensorPolicy policy_of(const Rung& rung, bool half_on_wire) {
  TensorPolicy p;
  if (is_sparse(rung.codec)) {  // the engine's sparse codec (DGC, or Adam's)
    p.kind = ExchangeKind::kSparse;
    p.sparsity = rung.sparsity;
  } else {
    // fp32 on a 16-bit default wire travels in fp32 buckets of its own.
    p.full_precision = rung.codec == Codec::kFp32 && half_on_wire;
    p.int8 = rung.codec == Codec::kInt8;
  }
  return p;
}

Rung rung_of(const TensorPolicy& policy, Codec sparse_codec, bool half_on_wire) {
  if (policy.kind == ExchangeKind::kSparse) return Rung{sparse_codec, policy.sparsity};
  if (policy.int8) return Rung{Codec::kInt8, 0};
  if (policy.full_precision || !half_on_wire) return Rung{Codec::kFp32, 0};
  return Rung{Codec::kHalf, 0};
}

bool sparse_is_cheaper(double density, int world_size) {
  return density * 2.0 * world_size < 1.0;
}

}  // namespace gradex::sync
