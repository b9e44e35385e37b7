#include "sync/data/codec_factory.h"

#include "base/check.h"
#include "compress/backend/adam_codec.h"
#include "compress/backend/dct_adam_codec.h"

namespace gradex::sync {

namespace be = compress::backend;

compress::DgcOptions sparse_codec_options(Codec kind, const config::Config& config,
                                          const EngineOptions& options, int world_size,
                                          double sparsity) {
  compress::DgcOptions o = compress::dgc_options_from_config(config, world_size);
  o.sparsity = sparsity;
  o.clip_norm = 0;
  if (kind == Codec::kAdam) {
    o.momentum = 0;
    o.residual_dct_chunk = options.adam.dct_chunk;
  }
  return o;
}

std::unique_ptr<be::DgcCodec> make_sparse_codec(Codec kind, be::Backend& backend,
                                                const std::string& key, uint64_t numel,
                                                uint64_t rows, const compress::DgcOptions& dgc,
                                                const compress::WireOptions& wire,
                                                const EngineOptions& options) {
  GX_CHECK(is_sparse(kind));
  if (kind == Codec::kAdam && options.adam.dct_chunk > 0)
    return std::make_unique<be::DctAdamCodec>(backend, key, numel, rows, dgc, wire,
                                              options.adam.decay);
  if (kind == Codec::kAdam)
    return std::make_unique<be::AdamCodec>(backend, key, numel, dgc, wire, options.adam.decay);
  return std::make_unique<be::DgcCodec>(backend, key, numel, dgc, wire);
}

}  // namespace gradex::sync
