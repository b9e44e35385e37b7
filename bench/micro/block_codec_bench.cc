// The dense quantized route's block codecs (compress/backend/int8_codec.h, int4_codec.h): encode
// with error feedback and decode, each in the CPU's vector form and in the baseline form
// (base/vector_dispatch.h) side by side, so that the RESULT line's ratio is measured in one run.
#include <benchmark/benchmark.h>

#include <string>
#include <vector>

#include "base/cpu_features.h"
#include "bench_data.h"
#include "compress/backend/int4_codec.h"
#include "compress/backend/int8_codec.h"
#include "micro.h"

namespace gradex::bench {
namespace {

struct BlockCodec {
  size_t (*encoded_size)(size_t);
  size_t (*encode)(const float*, float*, size_t, uint8_t*);
  void (*decode)(const uint8_t*, size_t, float*);
};

BlockCodec codec_of(int bits) {
  if (bits == 4)
    return {compress::backend::int4::encoded_size, compress::backend::int4::encode,
            compress::backend::int4::decode};
  return {compress::backend::int8::encoded_size, compress::backend::int8::encode,
          compress::backend::int8::decode};
}

// Restores the CPU's choice when a benchmark ends.
struct Form {
  explicit Form(bool baseline) { force_baseline_isa(baseline); }
  ~Form() { force_baseline_isa(false); }
};

void bm_encode(benchmark::State& state, size_t n, int bits, bool baseline) {
  const BlockCodec c = codec_of(bits);
  const auto& g = gradient(n, 0);
  std::vector<float> residual(n, 0.0f);
  std::vector<uint8_t> out(c.encoded_size(n));
  Form form(baseline);
  for (auto _ : state) {
    benchmark::DoNotOptimize(c.encode(g.data(), residual.data(), n, out.data()));
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * n);
}

void bm_decode(benchmark::State& state, size_t n, int bits, bool baseline) {
  const BlockCodec c = codec_of(bits);
  const auto& g = gradient(n, 0);
  std::vector<float> residual(n, 0.0f), out(n);
  std::vector<uint8_t> bytes(c.encoded_size(n));
  c.encode(g.data(), residual.data(), n, bytes.data());
  Form form(baseline);
  for (auto _ : state) {
    c.decode(bytes.data(), n, out.data());
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * n);
}

}  // namespace

void register_block_codecs(bool large) {
  for (size_t n : sizes(large))
    for (int bits : {8, 4})
      for (bool baseline : {false, true}) {
        const std::string name = "int" + std::to_string(bits) + "_%s/" + size_name(n) +
                                 (baseline ? "/baseline" : "/vector");
        for (auto [what, fn] : {std::pair{"encode", bm_encode}, std::pair{"decode", bm_decode}}) {
          std::string full = name;
          full.replace(full.find("%s"), 2, what);
          benchmark::RegisterBenchmark(full.c_str(), fn, n, bits, baseline)
              ->Unit(benchmark::kMillisecond)
              ->UseRealTime();
        }
      }
}

}  // namespace gradex::bench
