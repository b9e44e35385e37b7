#include "sync/engine/options.h"

#include <fnmatch.h>

#include <cmath>

#include "base/error.h"

namespace gradex::sync {
namespace {

std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t");
  if (b == std::string::npos) return "";
  size_t e = s.find_last_not_of(" \t");
  return s.substr(b, e - b + 1);
}

}  // namespace

bool pattern_matches(const std::string& pattern, const std::string& name) {
  // A plain name is a substring; a glob (shell rules: '*', '?', '[...]') matches the whole name.
  if (pattern.find_first_of("*?[") == std::string::npos)
    return name.find(pattern) != std::string::npos;
  return fnmatch(pattern.c_str(), name.c_str(), 0) == 0;
}

std::vector<PolicyOverride> parse_policy_overrides(const std::string& text) {
  std::vector<PolicyOverride> result;
  size_t start = 0;
  while (start < text.size()) {
    size_t comma = text.find(',', start);
    if (comma == std::string::npos) comma = text.size();
    std::string entry = trim(text.substr(start, comma - start));
    start = comma + 1;
    if (entry.empty()) continue;
    size_t colon = entry.rfind(':');
    auto fail = [&](const std::string& why) {
      throw ConfigError("GRADEX_SPARSITY_OVERRIDES entry '" + entry + "' is invalid: " + why +
                        " (expected 'pattern:sparsity' with sparsity in [0, 1), "
                        "'pattern:dense', 'pattern:int8' or 'pattern:int4')");
    };
    if (colon == std::string::npos) fail("no ':'");
    PolicyOverride o;
    o.pattern = trim(entry.substr(0, colon));
    std::string value = trim(entry.substr(colon + 1));
    if (o.pattern.empty()) fail("empty pattern");
    if (value == "dense") {
      o.dense = true;
    } else if (value == "int8" || value == "int4") {
      o.dense = true;
      o.quant_bits = value == "int8" ? 8 : 4;
    } else {
      try {
        o.sparsity = config::parse_float_strict(value, "sparsity");
      } catch (const ConfigError&) {
        fail("'" + value + "' is neither a number nor 'dense', 'int8' or 'int4'");
      }
      if (!(o.sparsity >= 0 && o.sparsity < 1)) fail("sparsity out of range");
    }
    result.push_back(o);
  }
  return result;
}

EngineOptions engine_options_from_config(const config::Config& c) {
  EngineOptions o;
  o.timeout = std::chrono::milliseconds(
      static_cast<int64_t>(std::llround(c.get_float("GRADEX_TIMEOUT_S") * 1000.0)));
  if (o.timeout.count() < 1) o.timeout = std::chrono::milliseconds(1);
  o.dense_threshold = static_cast<uint64_t>(c.get_int("GRADEX_DENSE_THRESHOLD"));
  o.fusion_bytes = static_cast<size_t>(c.get_float("GRADEX_FUSION_MB") * (1 << 20));
  o.half_on_wire = c.get_bool("GRADEX_FP16");
  o.half_type = c.get_string("GRADEX_HALF_TYPE") == "bf16" ? DType::kBFloat16 : DType::kFloat16;
  o.sparsity = c.get_float("GRADEX_SPARSITY");
  o.overrides = parse_policy_overrides(c.get_string("GRADEX_SPARSITY_OVERRIDES"));
  const std::string& nf = c.get_string("GRADEX_NONFINITE");
  o.nonfinite = nf == "zero"    ? NonFinitePolicy::kZero
                : nf == "error" ? NonFinitePolicy::kError
                                : NonFinitePolicy::kPropagate;
  o.momentum = static_cast<float>(c.get_float("GRADEX_MOMENTUM"));
  o.nesterov = c.get_bool("GRADEX_NESTEROV");
  o.clip_norm = c.get_float("GRADEX_CLIP_NORM");
  o.adam.codec = c.get_string("GRADEX_OPTIMIZER") == "adam";
  // A GRADEX_SPARSITY the user set (and no GRADEX_ADAM_SPARSITY) is their choice for every codec.
  o.adam.sparsity = c.source_of("GRADEX_SPARSITY") != config::Source::kDefault &&
                            c.source_of("GRADEX_ADAM_SPARSITY") == config::Source::kDefault
                        ? o.sparsity
                        : c.get_float("GRADEX_ADAM_SPARSITY");
  o.adam.decay = static_cast<float>(c.get_float("GRADEX_ADAM_DECAY"));
  o.adam.dct_chunk = c.get_string("GRADEX_ADAM_TRANSFORM") == "dct"
                         ? static_cast<uint32_t>(c.get_int("GRADEX_ADAM_DCT_CHUNK"))
                         : 0u;
  if (o.adam.codec && o.momentum > 0)
    throw ConfigError(
        "GRADEX_MOMENTUM=" + c.canonical_text("GRADEX_MOMENTUM") +
        " with GRADEX_OPTIMIZER=adam: an optimizer that keeps its own moments gets no "
        "gradex momentum (set GRADEX_MOMENTUM=0, or GRADEX_OPTIMIZER to its family)");
  const std::string& collective = c.get_string("GRADEX_SPARSE_COLLECTIVE");
  o.collectives.sparse = collective == "ring"     ? EngineOptions::SparseCollective::kRing
                         : collective == "direct" ? EngineOptions::SparseCollective::kDirect
                                                  : EngineOptions::SparseCollective::kAuto;
  const std::string& dense_collective = c.get_string("GRADEX_DENSE_COLLECTIVE");
  o.collectives.dense = dense_collective == "ring"     ? EngineOptions::DenseCollective::kRing
                        : dense_collective == "direct" ? EngineOptions::DenseCollective::kDirect
                        : dense_collective == "gather" ? EngineOptions::DenseCollective::kGather
                                                       : EngineOptions::DenseCollective::kAuto;
  const std::string& hierarchical = c.get_string("GRADEX_HIERARCHICAL");
  o.collectives.hierarchical = hierarchical == "0"   ? EngineOptions::Hierarchical::kOff
                               : hierarchical == "1" ? EngineOptions::Hierarchical::kOn
                                                     : EngineOptions::Hierarchical::kAuto;
  o.collectives.port_queue_s = c.get_float("GRADEX_PORT_QUEUE_MS") / 1000.0;
  o.collectives.port_queue_explicit =
      c.source_of("GRADEX_PORT_QUEUE_MS") != config::Source::kDefault;
  o.collectives.sparse_group_bytes =
      static_cast<size_t>(c.get_float("GRADEX_SPARSE_GROUP_MB") * (1 << 20));
  o.localsgd.period = c.get_int("GRADEX_LOCALSGD_PERIOD");
  o.localsgd.warmup_steps = c.get_int("GRADEX_LOCALSGD_WARMUP_STEPS");
  o.timeline_dir = c.get_string("GRADEX_TIMELINE");
  return o;
}

float clip_scale_for_norm(double clip_norm, int world_size, double norm) {
  const double limit = clip_norm / std::sqrt(static_cast<double>(world_size));
  if (!(norm > limit) || !std::isfinite(norm)) return 1.0f;
  return static_cast<float>(limit / norm);
}

}  // namespace gradex::sync
