// gradex-device-bench: the engine's per-tensor device work on one backend, timed step by step:
//   dgc_step     one DGC step (update, sampled threshold, selection, masking) on N floats
//   stage        the selection's device -> host copy (SelectionStager), the only DGC bytes that
//                cross PCIe on the way to the wire (0 on host backends, where nothing is copied)
//   dense_fp16   the dense path's pre-divided fp16 cast of the same N floats, and its staged bytes
// Usage: gradex-device-bench [--backend cpu|thrust-omp|cuda|all] [--numel N] [--steps S]
//                            [--sparsity X] [--threads T]
// Each backend ends with one line
//   RESULT backend=... numel=... dgc_step_ms=<median> dgc_step_min_ms=... dgc_step_cpu_ms=...
//          stage_ms=...
//          staged_bytes_per_step=... selected=... extra_passes=... dense_fp16_ms=...
//          dense_staged_bytes=...
// The gradient of step s is a window of a 2N-element random array in backend memory, so every
// step sees fresh values without generating N randoms per step. Timing is wall clock around each
// operation up to its completion (an event synchronize), i.e. what the engine's thread waits.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <random>
#include <string>
#include <vector>

#include "base/error.h"
#include "compress/backend/backend.h"
#include "compress/backend/staging.h"

namespace {

using gradex::compress::backend::DeviceType;
namespace be = gradex::compress::backend;

struct Args {
  std::string backend = "all";
  size_t numel = 25000000;
  int steps = 20;
  double sparsity = 0.999;
  int threads = 0;
};

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr,
               "gradex-device-bench: %s\nusage: gradex-device-bench [--backend "
               "cpu|thrust-omp|cuda|all] [--numel N] [--steps S] [--sparsity X] [--threads T]\n",
               why.c_str());
  std::exit(2);
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (i + 1 >= argc) usage("missing value after " + k);
    const std::string v = argv[++i];
    char* end = nullptr;
    if (k == "--backend") {
      a.backend = v;
    } else if (k == "--numel") {
      a.numel = std::strtoull(v.c_str(), &end, 10);
      if (*end || a.numel == 0) usage("--numel needs a positive integer, got " + v);
    } else if (k == "--steps") {
      a.steps = static_cast<int>(std::strtol(v.c_str(), &end, 10));
      if (*end || a.steps < 1 || a.steps > 100000) usage("--steps needs 1..100000, got " + v);
    } else if (k == "--sparsity") {
      a.sparsity = std::strtod(v.c_str(), &end);
      if (*end || !(a.sparsity >= 0 && a.sparsity < 1)) usage("--sparsity needs [0, 1), got " + v);
    } else if (k == "--threads") {
      a.threads = static_cast<int>(std::strtol(v.c_str(), &end, 10));
      if (*end || a.threads < 0 || a.threads > 256) usage("--threads needs 0..256, got " + v);
    } else {
      usage("unknown flag " + k);
    }
  }
  return a;
}

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// CPU time of the whole process (all threads), in ms: on a shared machine wall time also counts
// waiting for a core, and the Thrust-on-OpenMP backend's threads add up here.
double process_cpu_ms() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

void run(be::Backend& b, const Args& a) {
  const size_t n = a.numel;
  be::StreamPtr stream = b.create_stream();
  be::EventPtr done = b.create_event();
  auto wait = [&] {
    done->record(*stream);
    done->synchronize();
  };

  // The gradient pool: 2n normal values, generated on the host once and copied in.
  be::BufferPtr pool = b.allocate(2 * n * 4);
  {
    std::vector<float> host(2 * n);
    std::mt19937_64 rng(1);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    for (float& f : host)
      f = dist(rng);
    b.copy(pool->data(), host.data(), host.size() * 4, *stream);
    wait();
  }
  auto grad = [&](int step) { return pool->as<float>() + (size_t(step) * 7919 * 64) % n; };

  gradex::compress::DgcOptions o;
  o.sparsity = a.sparsity;
  o.threads = a.threads;
  be::DgcStatePtr dgc = b.create_dgc(n, o);
  be::SelectionStager stager(b);
  const int warm = 5;  // past the first steps, where the residual grows fastest
  for (int s = 0; s < warm; ++s) {
    be::DgcStepInfo info = dgc->step(grad(s), 1.0f, *stream);
    stager.stage(*dgc, info, *stream);
  }
  const size_t staged0 = stager.bytes_staged();
  std::vector<double> step_ms, stage_ms, step_cpu_ms;
  size_t selected = 0;
  int rounds = 0;
  for (int s = 0; s < a.steps; ++s) {
    auto t0 = std::chrono::steady_clock::now();
    const double c0 = process_cpu_ms();
    be::DgcStepInfo info = dgc->step(grad(warm + s), 1.0f, *stream);
    wait();
    step_ms.push_back(ms_since(t0));
    step_cpu_ms.push_back(process_cpu_ms() - c0);
    t0 = std::chrono::steady_clock::now();
    stager.stage(*dgc, info, *stream);
    stage_ms.push_back(ms_since(t0));
    selected += info.count;
    rounds += info.rounds;
  }
  const double staged_per_step = double(stager.bytes_staged() - staged0) / a.steps;

  // The dense path: pre-divided fp16 cast on the backend, then the 16-bit bucket to host memory.
  be::BufferPtr half = b.allocate(n * 2);
  be::BufferPtr host_half = b.host_accessible() ? nullptr : b.allocate_staging(n * 2);
  std::vector<double> dense_ms;
  for (int s = 0; s < std::min(a.steps, 5); ++s) {
    auto t0 = std::chrono::steady_clock::now();
    b.to_half(grad(s), half->as<uint16_t>(), n, gradex::DType::kFloat16, 0.25f, *stream);
    if (host_half) b.copy(host_half->data(), half->data(), n * 2, *stream);
    wait();
    dense_ms.push_back(ms_since(t0));
  }

  std::printf(
      "RESULT backend=%s numel=%zu sparsity=%g dgc_step_ms=%.3f dgc_step_min_ms=%.3f "
      "dgc_step_cpu_ms=%.3f stage_ms=%.3f staged_bytes_per_step=%.0f selected=%.0f "
      "extra_passes=%.2f "
      "dense_fp16_ms=%.3f dense_staged_bytes=%zu\n",
      be::device_type_name(b.type()), n, a.sparsity, median(step_ms),
      *std::min_element(step_ms.begin(), step_ms.end()), median(step_cpu_ms), median(stage_ms),
      staged_per_step, double(selected) / a.steps, double(rounds) / a.steps, median(dense_ms),
      b.host_accessible() ? size_t{0} : n * 2);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  std::vector<DeviceType> types;
  if (a.backend == "all") {
    types = {DeviceType::kCpu, DeviceType::kThrustOmp, DeviceType::kCuda};
  } else if (a.backend == "cpu") {
    types = {DeviceType::kCpu};
  } else if (a.backend == "thrust-omp") {
    types = {DeviceType::kThrustOmp};
  } else if (a.backend == "cuda") {
    types = {DeviceType::kCuda};
  } else {
    usage("unknown backend " + a.backend);
  }
  int failures = 0;
  for (DeviceType t : types) {
    try {
      be::BackendPtr b = be::get_backend(t);
      std::printf("# %s\n", b->name().c_str());
      run(*b, a);
    } catch (const gradex::Error& e) {
      // "all" skips what this machine lacks; an explicitly named backend must work.
      std::fprintf(stderr, "gradex-device-bench: %s: %s\n", be::device_type_name(t), e.what());
      if (a.backend != "all") ++failures;
    }
  }
  return failures ? 1 : 0;
}
