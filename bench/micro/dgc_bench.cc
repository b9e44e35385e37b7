// DGC step (update + select + mask) against its streaming bound: 20 bytes per element with fp32
// momentum and residual (read g, u, v; write u, v), 12 without momentum.
#include <benchmark/benchmark.h>

#include "bench_data.h"
#include "compress/compress.h"
#include "compress/dgc/kernels.h"
#include "micro.h"

namespace gradex::bench {
namespace {

void bm_stream(benchmark::State& state, size_t n) {
  const auto& g = gradient(2 * n, 0);
  std::vector<float> u(n, 0.0f), v(n, 0.0f);
  for (auto _ : state) {
    compress::dgc::stream_reference(g.data(), u.data(), v.data(), n);
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * n);
  state.SetBytesProcessed(state.iterations() * n * 20);
}

void bm_dgc(benchmark::State& state, size_t n, double sparsity, int threads, float momentum) {
  compress::DgcOptions o;
  o.sparsity = sparsity;
  o.momentum = momentum;
  o.threads = threads;
  compress::DgcCompressor dgc(n, o);
  // Each step's gradient is a different window of a 2n-element random array, so every element
  // sees fresh values (as in training) without generating n randoms per step.
  const float* base = gradient(2 * n, 0).data();
  auto grad = [&](size_t step) { return base + (step * 7919 * 64) % n; };
  size_t step = 0;
  for (; step < 20; ++step)  // past the first steps, where the residual grows fastest
    dgc.step(grad(step));
  size_t steps = 0, rounds = 0, selected = 0;
  for (auto _ : state) {
    const compress::Selection& sel = dgc.step(grad(step++));
    rounds += sel.rounds;
    selected += sel.indices.size();
    ++steps;
  }
  const size_t bytes = momentum > 0 ? 20 : 12;
  state.SetItemsProcessed(state.iterations() * n);
  state.SetBytesProcessed(state.iterations() * n * bytes);
  state.counters["extra_passes"] = static_cast<double>(rounds) / steps;
  state.counters["selected"] = static_cast<double>(selected) / steps;
}

}  // namespace

void register_dgc(bool large) {
  for (size_t n : sizes(large)) {
    const std::string sz = size_name(n);
    benchmark::RegisterBenchmark(("stream_20B/" + sz).c_str(), bm_stream, n)
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime();
    for (double s : {0.99, 0.999}) {
      const std::string sp = s == 0.99 ? "s0.99" : "s0.999";
      for (int t : {1, 2}) {
        benchmark::RegisterBenchmark(
            ("dgc_compress/" + sz + "/" + sp + "/t" + std::to_string(t)).c_str(), bm_dgc, n, s, t,
            0.9f)
            ->Unit(benchmark::kMillisecond)
            ->UseRealTime();
      }
    }
    benchmark::RegisterBenchmark(("dgc_compress_m0/" + sz + "/s0.999/t1").c_str(), bm_dgc, n, 0.999,
                                 1, 0.0f)
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime();
  }
}

}  // namespace gradex::bench
