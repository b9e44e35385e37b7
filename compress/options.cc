#include "compress/options.h"

#include <cmath>
#include <string>

#include "base/error.h"

namespace gradex::compress {

const char* index_coding_name(IndexCoding coding) {
  switch (coding) {
    case IndexCoding::kVarint:
      return "varint";
    case IndexCoding::kRice:
      return "rice";
    case IndexCoding::kBitmap:
      return "bitmap";
    case IndexCoding::kAuto:
      return "auto";
  }
  return "invalid";
}

namespace {
void require(bool ok, const std::string& what) {
  if (!ok) throw InvalidArgument("DgcOptions: " + what);
}
bool valid_sparsity(double s) {
  return std::isfinite(s) && s >= 0.0 && s < 1.0;
}
}  // namespace

void validate(const DgcOptions& o) {
  require(valid_sparsity(o.sparsity),
          "sparsity must be in [0, 1), got " + std::to_string(o.sparsity));
  require(o.warmup_steps >= 0, "warmup_steps must be >= 0");
  for (size_t i = 0; i < o.schedule.size(); ++i)
    require(valid_sparsity(o.schedule[i]), "schedule[" + std::to_string(i) + "] must be in [0, 1)");
  require(std::isfinite(o.momentum) && o.momentum >= 0.0f && o.momentum < 1.0f,
          "momentum must be in [0, 1)");
  require(std::isfinite(o.clip_norm) && o.clip_norm >= 0.0f, "clip_norm must be >= 0");
  require(o.world_size >= 1, "world_size must be >= 1");
  require(o.sample_ratio > 0.0 && o.sample_ratio <= 1.0, "sample_ratio must be in (0, 1]");
  require(o.accept_low > 0.0 && o.accept_low <= 1.0, "accept_low must be in (0, 1]");
  require(o.accept_high >= 1.0, "accept_high must be >= 1");
  require(o.max_rounds >= 0 && o.max_rounds <= 64, "max_rounds must be in [0, 64]");
  require(o.hint_margin > 0.0f && o.hint_margin <= 1.0f, "hint_margin must be in (0, 1]");
  require(o.threads >= 0 && o.threads <= 256, "threads must be in [0, 256]");
  require(dtype_valid(static_cast<uint8_t>(o.value_dtype)), "value_dtype is invalid");
  require(o.residual_dct_chunk <= 256, "residual_dct_chunk must be in [0, 256]");
}

DgcOptions dgc_options_from_config(const config::Config& config, int world_size) {
  if (world_size < 1) throw InvalidArgument("dgc_options_from_config: world_size must be >= 1");
  DgcOptions o;
  o.sparsity = config.get_float("GRADEX_SPARSITY");
  o.warmup_steps = config.get_int("GRADEX_WARMUP_STEPS");
  o.momentum = static_cast<float>(config.get_float("GRADEX_MOMENTUM"));
  o.nesterov = config.get_bool("GRADEX_NESTEROV");
  o.clip_norm = static_cast<float>(config.get_float("GRADEX_CLIP_NORM"));
  o.world_size = world_size;
  o.sample_ratio = config.get_float("GRADEX_SAMPLE_RATIO");
  const std::string& values = config.get_string("GRADEX_SPARSE_VALUES");
  o.value_dtype = values == "fp16"   ? DType::kFloat16
                  : values == "bf16" ? DType::kBFloat16
                                     : DType::kFloat32;
  o.threads = static_cast<int>(config.get_int("GRADEX_THREADS"));
  validate(o);
  return o;
}

WireOptions wire_options_from_config(const config::Config& config) {
  WireOptions w;
  const std::string& coding = config.get_string("GRADEX_INDEX_CODING");
  w.index_coding = coding == "varint"   ? IndexCoding::kVarint
                   : coding == "rice"   ? IndexCoding::kRice
                   : coding == "bitmap" ? IndexCoding::kBitmap
                                        : IndexCoding::kAuto;
  w.zstd_level = static_cast<int>(config.get_int("GRADEX_ZSTD_LEVEL"));
  return w;
}

}  // namespace gradex::compress
