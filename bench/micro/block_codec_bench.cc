// The dense quantized route's block codecs (compress/backend/int8_codec.h, int4_codec.h): encode
// with error feedback and decode, each in the CPU's vector form and in the baseline form
// (base/vector_dispatch.h) side by side, so that the RESULT line's ratio is measured in one run.
#include <benchmark/benchmark.h>

#include <string>
#include <vector>

#include "base/cpu_features.h"
#include "bench_data.h"
#include "compress/backend/block_codec.h"
#include "micro.h"

namespace gradex::bench {
namespace {

void bm_encode(benchmark::State& state, size_t n, int bits, bool baseline) {
  const compress::backend::BlockCodec& c = compress::backend::block_codec(bits);
  const auto& g = gradient(n, 0);
  std::vector<float> residual(n, 0.0f);
  std::vector<uint8_t> out(c.encoded_size(n));
  BaselineIsaScope form(baseline);
  for (auto _ : state) {
    benchmark::DoNotOptimize(c.encode(g.data(), residual.data(), n, out.data()));
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * n);
}

void bm_decode(benchmark::State& state, size_t n, int bits, bool baseline) {
  const compress::backend::BlockCodec& c = compress::backend::block_codec(bits);
  const auto& g = gradient(n, 0);
  std::vector<float> residual(n, 0.0f), out(n);
  std::vector<uint8_t> bytes(c.encoded_size(n));
  c.encode(g.data(), residual.data(), n, bytes.data());
  BaselineIsaScope form(baseline);
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
