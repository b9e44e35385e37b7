// Pre-divided fp32 -> fp16/bf16 casts and the reverse, against a 4-read/2-write streaming kernel.
#include <benchmark/benchmark.h>

#include "bench_data.h"
#include "compress/compress.h"
#include "micro.h"

namespace gradex::bench {
namespace {

void bm_stream(benchmark::State& state, size_t n) {
  const auto& g = gradient(n, 0);
  std::vector<uint16_t> out(n);
  for (auto _ : state) {
    stream_r4_w2(g.data(), out.data(), n);
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * n);
  state.SetBytesProcessed(state.iterations() * n * 6);
}

void bm_to_half(benchmark::State& state, size_t n, DType t) {
  const auto& g = gradient(n, 0);
  std::vector<uint16_t> out(n);
  for (auto _ : state) {
    auto st = compress::half::to_half_predivided(g.data(), out.data(), n, t, 8);
    benchmark::DoNotOptimize(st);
  }
  state.SetItemsProcessed(state.iterations() * n);
  state.SetBytesProcessed(state.iterations() * n * 6);
}

void bm_from_half(benchmark::State& state, size_t n, DType t) {
  std::vector<uint16_t> in(n, 0x3c00);
  std::vector<float> out(n);
  for (auto _ : state) {
    compress::half::from_half(in.data(), out.data(), n, t, 1.0f);
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * n);
  state.SetBytesProcessed(state.iterations() * n * 6);
}

// The engine's non-finite scan of a gradient before it is announced: one read.
void bm_count_nonfinite(benchmark::State& state, size_t n) {
  const auto& g = gradient(n, 0);
  for (auto _ : state) {
    size_t bad = compress::half::count_nonfinite(g.data(), n);
    benchmark::DoNotOptimize(bad);
  }
  state.SetItemsProcessed(state.iterations() * n);
  state.SetBytesProcessed(state.iterations() * n * 4);
}

}  // namespace

void register_cast(bool large) {
  for (size_t n : sizes(large)) {
    const std::string sz = size_name(n);
    benchmark::RegisterBenchmark(("stream_6B/" + sz).c_str(), bm_stream, n)
        ->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(("count_nonfinite/" + sz).c_str(), bm_count_nonfinite, n)
        ->Unit(benchmark::kMillisecond);
    for (DType t : {DType::kFloat16, DType::kBFloat16}) {
      const std::string tn = dtype_name(t);
      benchmark::RegisterBenchmark(("cast_to_" + tn + "/" + sz).c_str(), bm_to_half, n, t)
          ->Unit(benchmark::kMillisecond);
      benchmark::RegisterBenchmark(("cast_from_" + tn + "/" + sz).c_str(), bm_from_half, n, t)
          ->Unit(benchmark::kMillisecond);
    }
  }
}

}  // namespace gradex::bench
