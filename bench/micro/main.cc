// gradex-microbench: runs the compress/ microbenchmarks (Google Benchmark flags apply) and ends
// with a RESULT line:
//   dgc_compress_25M_gelem_s   DGC step throughput at 25M floats, sparsity 0.999, one thread
//   dgc_over_stream_25M        streaming-kernel time / DGC time (1.0 = at the bandwidth bound)
//   dgc_over_stream_25M_t2     the same with two threads (against the one-thread stream)
//   bits_per_index_0.1pct      index bits per selected element, random support at 0.1% density
//   int8_encode_ns, int4_encode_ns   block codec encode with error feedback, ns per element (25M,
//                              the CPU's vector form); *_baseline_over_vector: the baseline form's
//                              time over the vector form's, in the same run
//   seal_aes256gcm_gb_s, open_aes256gcm_gb_s, seal_chacha20poly1305_gb_s, open_...: AEAD
//                              throughput of the sealed data plane, one thread, 256 KiB frames
//                              (a ring chunk); copy_gb_s: a plain copy of the same bytes
// Flags of its own: --large adds the 100M-element cases.
#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "bench_data.h"
#include "compress/compress.h"
#include "micro.h"

namespace {

// Console output as usual, plus seconds per iteration by benchmark name for the RESULT line.
class Recorder : public benchmark::ConsoleReporter {
 public:
  Recorder() : ConsoleReporter(OO_Tabular) {}  // no colour codes: the output goes to files
  void ReportRuns(const std::vector<Run>& runs) override {
    for (const Run& r : runs) {
      if (r.iterations <= 0 || r.run_type != Run::RT_Iteration) continue;
      std::string name = r.benchmark_name();
      const std::string suffix = "/real_time";
      if (name.size() > suffix.size() &&
          name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0)
        name.resize(name.size() - suffix.size());
      seconds[name] = r.real_accumulated_time / static_cast<double>(r.iterations);
      cpu_seconds[name] = r.cpu_accumulated_time / static_cast<double>(r.iterations);
    }
    ConsoleReporter::ReportRuns(runs);
  }
  static double get(const std::map<std::string, double>& m, const std::string& name) {
    auto it = m.find(name);
    return it == m.end() ? 0.0 : it->second;
  }
  std::map<std::string, double> seconds, cpu_seconds;
};

double bits_per_index(size_t n, double density) {
  const auto& idx = gradex::bench::support(n, density);
  std::vector<float> val(idx.size(), 1.0f);
  std::vector<uint8_t> out;
  gradex::compress::wire::encode({n, idx.data(), val.data(), idx.size(), gradex::DType::kFloat32},
                                 0, {}, out);
  auto h = gradex::compress::wire::parse_header(out.data(), out.size());
  return 8.0 * h.index_bytes / idx.size();
}

}  // namespace

int main(int argc, char** argv) {
  bool large = false;
  std::vector<char*> args;
  for (int i = 0; i < argc; ++i) {
    if (std::strcmp(argv[i], "--large") == 0)
      large = true;
    else
      args.push_back(argv[i]);
  }
  int n_args = static_cast<int>(args.size());
  benchmark::Initialize(&n_args, args.data());
  gradex::bench::register_dgc(large);
  gradex::bench::register_wire(large);
  gradex::bench::register_cast(large);
  gradex::bench::register_block_codecs(large);
  gradex::bench::register_seal();
  Recorder recorder;
  benchmark::RunSpecifiedBenchmarks(&recorder);
  benchmark::Shutdown();

  const double n = 25e6;
  const auto& wall = recorder.seconds;
  const auto& cpu = recorder.cpu_seconds;
  const double dgc = Recorder::get(wall, "dgc_compress/25M/s0.999/t1");
  const double dgc2 = Recorder::get(wall, "dgc_compress/25M/s0.999/t2");
  const double stream = Recorder::get(wall, "stream_20B/25M");
  // One-thread ratio on CPU time too: on a shared machine wall time also counts descheduling.
  const double dgc_cpu = Recorder::get(cpu, "dgc_compress/25M/s0.999/t1");
  const double stream_cpu = Recorder::get(cpu, "stream_20B/25M");
  auto ratio = [](double a, double b) { return b > 0 ? a / b : 0.0; };
  std::printf(
      "RESULT dgc_compress_25M_gelem_s=%.3f dgc_over_stream_25M=%.3f dgc_over_stream_25M_cpu=%.3f "
      "dgc_over_stream_25M_t2=%.3f stream_20B_25M_gb_s=%.2f bits_per_index_0.1pct=%.2f",
      ratio(n, dgc) / 1e9, ratio(stream, dgc), ratio(stream_cpu, dgc_cpu), ratio(stream, dgc2),
      ratio(20 * n, stream) / 1e9, bits_per_index(25000000, 0.001));
  for (const char* bits : {"8", "4"}) {  // the same line: one RESULT line per run
    const std::string at = std::string("int") + bits + "_encode/25M/";
    const double vec = Recorder::get(wall, at + "vector"),
                 base = Recorder::get(wall, at + "baseline");
    std::printf(" int%s_encode_ns=%.3f int%s_encode_baseline_over_vector=%.2f", bits, vec / n * 1e9,
                bits, ratio(base, vec));
  }
  const double chunk = 256.0 * 1024;
  for (const char* name : {"seal_aes256gcm", "open_aes256gcm", "seal_chacha20poly1305",
                           "open_chacha20poly1305", "copy"})
    std::printf(" %s_gb_s=%.2f", name,
                ratio(chunk, Recorder::get(wall, std::string(name) + "/256K")) / 1e9);
  std::printf("\n");
  return 0;
}
