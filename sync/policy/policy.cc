#include "sync/policy/policy.h"

#include <cstdio>

namespace gradex::sync {

namespace {

// Sparse at sparsity `s` with the run's sparse codec, or dense on the default wire when `s` is 0
// (nothing to compress): the fixed chain's and the overrides' one rule, each with its reasons.
AppliedPolicy at_sparsity(const EngineOptions& options, double s, std::string sparse_reason,
                          std::string dense_reason) {
  if (s == 0) return {default_dense_rung(options), std::move(dense_reason)};
  return {Rung{sparse_codec(options), s}, std::move(sparse_reason)};
}

}  // namespace

std::optional<AppliedPolicy> override_policy(const EngineOptions& options, const std::string& key) {
  for (const auto& o : options.overrides) {
    if (!pattern_matches(o.pattern, key)) continue;
    const std::string name = "override '" + o.pattern + "'";
    if (o.quant_bits == 8) return AppliedPolicy{Rung{Codec::kInt8, 0}, name + ": int8"};
    if (o.quant_bits == 4) return AppliedPolicy{Rung{Codec::kInt4, 0}, name + ": int4"};
    return at_sparsity(options, o.dense ? 0 : o.sparsity, name, name + ": dense");
  }
  return std::nullopt;
}

AppliedPolicy choose_policy(const EngineOptions& options, const std::string& key, uint64_t numel) {
  if (std::optional<AppliedPolicy> forced = override_policy(options, key)) return *forced;
  if (numel < options.dense_threshold)
    return {default_dense_rung(options), "below GRADEX_DENSE_THRESHOLD"};
  if (options.adam.codec)  // GRADEX_OPTIMIZER=adam: the Adam codec's own sparsity
    return at_sparsity(options, options.adam.sparsity,
                       "GRADEX_OPTIMIZER=adam: Adam codec at GRADEX_ADAM_SPARSITY",
                       "GRADEX_ADAM_SPARSITY=0");
  return at_sparsity(options, options.sparsity, "GRADEX_SPARSITY", "GRADEX_SPARSITY=0");
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
    case Codec::kInt4:
      return "4-bit";
  }
  return "?";
}

std::string rung_name(const Rung& r) {
  if (!is_sparse(r.codec)) return codec_name(r.codec);
  char b[48];
  std::snprintf(b, sizeof b, "%s %g%%", codec_name(r.codec), r.sparsity * 100.0);
  return b;
}

Rung default_dense_rung(const EngineOptions& options) {
  return Rung{options.half_on_wire ? Codec::kHalf : Codec::kFp32, 0};
}

Rung canonical_rung(const Rung& r, const EngineOptions& options) {
  if (is_sparse(r.codec)) return Rung{sparse_codec(options), r.sparsity};
  if (r.codec == Codec::kHalf) return default_dense_rung(options);
  return Rung{r.codec, 0};
}

bool sparse_is_cheaper(double density, int world_size) {
  return density * 2.0 * world_size < 1.0;
}

}  // namespace gradex::sync
