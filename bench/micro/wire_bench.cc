// Wire encode / decode of random supports (auto index coding, fp32 values) and the zstd stage on
// payloads produced by the DGC compressor. The bound of each is a memcpy of the same bytes.
#include <benchmark/benchmark.h>

#include <cstring>

#include "bench_data.h"
#include "compress/compress.h"
#include "compress/zstd/zstd_stage.h"
#include "micro.h"

namespace gradex::bench {
namespace {

using compress::wire::DecodedPayload;

std::vector<float> values_for(size_t count) {
  const auto& g = gradient(1000000, 0);
  std::vector<float> v(count);
  for (size_t j = 0; j < count; ++j)
    v[j] = g[j % g.size()];
  return v;
}

void bm_encode(benchmark::State& state, size_t n, double density) {
  const auto& idx = support(n, density);
  auto val = values_for(idx.size());
  std::vector<uint8_t> out;
  compress::wire::SparseRef ref{n, idx.data(), val.data(), idx.size(), DType::kFloat32};
  for (auto _ : state) {
    compress::wire::encode(ref, 1, {}, out);
    benchmark::DoNotOptimize(out.data());
  }
  auto h = compress::wire::parse_header(out.data(), out.size());
  state.SetItemsProcessed(state.iterations() * idx.size());
  state.SetBytesProcessed(state.iterations() * idx.size() * 8);
  state.counters["bits_per_index"] = 8.0 * h.index_bytes / idx.size();
  state.counters["payload_bytes"] = static_cast<double>(out.size());
  state.SetLabel(compress::index_coding_name(h.index_coding));
}

void bm_decode(benchmark::State& state, size_t n, double density) {
  const auto& idx = support(n, density);
  auto val = values_for(idx.size());
  std::vector<uint8_t> bytes;
  compress::wire::encode({n, idx.data(), val.data(), idx.size(), DType::kFloat32}, 1, {}, bytes);
  DecodedPayload p;
  for (auto _ : state) {
    compress::wire::decode(bytes.data(), bytes.size(), p);
    benchmark::DoNotOptimize(p.indices.data());
  }
  state.SetItemsProcessed(state.iterations() * idx.size());
  state.SetBytesProcessed(state.iterations() * idx.size() * 8);
}

void bm_copy(benchmark::State& state, size_t n, double density) {
  const size_t bytes = support(n, density).size() * 8;
  std::vector<uint8_t> a(bytes, 1), b(bytes);
  for (auto _ : state) {
    std::memcpy(b.data(), a.data(), bytes);
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * bytes / 8);
  state.SetBytesProcessed(state.iterations() * bytes);
}

// A real payload body: one DGC step's selection at 25M / 0.999 after warm-up steps.
const std::vector<uint8_t>& dgc_body(DType values) {
  static std::vector<uint8_t> body[3];
  auto& b = body[static_cast<int>(values)];
  if (b.empty()) {
    compress::DgcOptions o;
    o.value_dtype = values;
    const size_t n = 25000000;
    compress::DgcCompressor dgc(n, o);
    const float* base = gradient(2 * n, 0).data();  // windows: fresh values per step
    for (size_t s = 0; s < 10; ++s)
      dgc.step(base + s * 1000003);
    auto bytes = compress::wire::encode(dgc.step(base + 10 * 1000003), 1, {});
    b.assign(bytes.begin() + compress::wire::kHeaderBytes, bytes.end());
  }
  return b;
}

void bm_zstd(benchmark::State& state, DType values, int level) {
  const auto& body = dgc_body(values);
  std::vector<uint8_t> packed;
  bool kept = false;
  for (auto _ : state)
    kept = compress::zstd::compress(body.data(), body.size(), level, body.size(), packed);
  state.SetBytesProcessed(state.iterations() * body.size());
  state.counters["ratio"] = kept ? static_cast<double>(body.size()) / packed.size() : 1.0;
  state.counters["body_bytes"] = static_cast<double>(body.size());
}

}  // namespace

void register_wire(bool large) {
  for (size_t n : sizes(large)) {
    const std::string sz = size_name(n);
    for (double d : {0.01, 0.001}) {
      const std::string sp = d == 0.01 ? "s0.99" : "s0.999";
      benchmark::RegisterBenchmark(("memcpy_8B/" + sz + "/" + sp).c_str(), bm_copy, n, d)
          ->Unit(benchmark::kMicrosecond);
      benchmark::RegisterBenchmark(("encode/" + sz + "/" + sp).c_str(), bm_encode, n, d)
          ->Unit(benchmark::kMicrosecond);
      benchmark::RegisterBenchmark(("decode/" + sz + "/" + sp).c_str(), bm_decode, n, d)
          ->Unit(benchmark::kMicrosecond);
    }
  }
  for (DType t : {DType::kFloat32, DType::kFloat16})
    for (int level : {1, 3})
      benchmark::RegisterBenchmark(("zstd_dgc_payload/25M/s0.999/" + std::string(dtype_name(t)) +
                                    "/l" + std::to_string(level))
                                       .c_str(),
                                   bm_zstd, t, level)
          ->Unit(benchmark::kMicrosecond);
}

}  // namespace gradex::bench
