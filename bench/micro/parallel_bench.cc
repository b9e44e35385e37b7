// gradex-parallel-bench: the engine's prepare stage of one DGC step over a model's tensors (the
// CPU backend's DgcCodec::encode_step: momentum correction, residual, selection, masking, wire
// encoding, framed per unit) at 1, 2, 4, 8, 16 worker-pool threads, wall time per step side by
// side with its ratio to one thread. Two schedules of the same work:
//   spread   what the engine does: each unit's tensors spread over the pool largest first
//            (pipeline::spread_prepare, ThreadPool::parallel_for_heaviest_first), tensors above
//            compress::dgc::split_min_elements(threads, unit) split inside their step too;
//   serial   the engine before it: a unit's tensors one after another, a tensor split across
//            threads only from 2^20 elements.
// Units are the engine's DGC groups (consecutive tensors until GRADEX_SPARSE_GROUP_MB's 16 MB of
// fp32; a larger tensor alone). DGC tensors are those of at least GRADEX_DENSE_THRESHOLD's 16,384
// elements. Each thread count runs in a child process of its own, because the worker pool is
// sized once per process. Only the compression is timed: every step's gradients are copied into
// place before the clock starts (the step clears them, as in the engine).
//
// Usage: gradex-parallel-bench [--model resnet50] [--threads 1,2,4,8,16] [--steps 20]
//                              [--sparsity 0.999]
// Ends with a RESULT line (parallel_<model>_t<N>_ms and _speedup for each thread count).
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "base/config.h"
#include "base/thread_pool.h"
#include "bench/model_profile.h"
#include "compress/backend/backend.h"
#include "compress/backend/dgc_codec.h"
#include "compress/dgc/parallel.h"
#include "compress/options.h"
#include "compress/wire/message.h"
#include "sync/pipeline.h"

namespace {

namespace be = gradex::compress::backend;
using Clock = std::chrono::steady_clock;

struct Args {
  std::string model = "resnet50";
  std::vector<int> threads = {1, 2, 4, 8, 16};
  int steps = 20;
  double sparsity = 0.999;
};

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr,
               "gradex-parallel-bench: %s\nusage: gradex-parallel-bench [--model NAME|PATH] "
               "[--threads 1,2,4,8,16] [--steps N] [--sparsity S]\n",
               why.c_str());
  std::exit(2);
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) usage(flag + " needs a value");
    const std::string v = argv[++i];
    char* end = nullptr;
    if (flag == "--model") {
      a.model = v;
    } else if (flag == "--threads") {
      a.threads.clear();
      std::stringstream in(v);
      for (std::string item; std::getline(in, item, ',');) {
        const long t = std::strtol(item.c_str(), &end, 10);
        if (item.empty() || *end || t < 1 || t > 256) usage("--threads takes 1..256, got " + v);
        a.threads.push_back(static_cast<int>(t));
      }
    } else if (flag == "--steps") {
      a.steps = static_cast<int>(std::strtol(v.c_str(), &end, 10));
      if (*end || a.steps < 1 || a.steps > 100000) usage("--steps takes 1..100000, got " + v);
    } else if (flag == "--sparsity") {
      a.sparsity = std::strtod(v.c_str(), &end);
      if (*end || !(a.sparsity > 0 && a.sparsity < 1)) usage("--sparsity takes (0, 1), got " + v);
    } else {
      usage("unknown flag " + flag);
    }
  }
  return a;
}

struct Timing {
  double median_ms = 0, min_ms = 0;
  double cpu_ms = 0;        // process CPU per step (every thread), mean
  double cpu_per_wall = 0;  // process CPU seconds per wall second while timed
};

double cpu_seconds() {
  rusage u;
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_stime.tv_sec + 1e-6 * (u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

// One schedule at the current pool size (this process's shared pool).
Timing run_schedule(const gradex::bench::ModelProfile& model, const Args& a, bool spread) {
  const int threads = gradex::shared_pool().threads();
  const uint64_t group = (uint64_t{16} << 20) / 4;  // GRADEX_SPARSE_GROUP_MB's default, elements
  gradex::config::Config config;
  gradex::compress::DgcOptions o = gradex::compress::dgc_options_from_config(config, 1);
  o.sparsity = a.sparsity;
  o.momentum = 0.9f;  // DGC's reference setting (a plugin that takes SGD's momentum over sets it)
  o.threads = threads;
  o.parallel_min_elements =
      spread ? gradex::compress::dgc::split_min_elements(threads, group) : size_t{1} << 20;
  const gradex::compress::WireOptions wire = gradex::compress::wire_options_from_config(config);
  be::BackendPtr backend = be::get_backend(be::DeviceType::kCpu);
  be::StreamPtr stream = backend->create_stream();

  struct Tensor {
    std::unique_ptr<be::DgcCodec> codec;
    std::vector<float> grad;
    std::vector<uint8_t> payload;
  };
  std::vector<Tensor> tensors;
  for (const auto& t : model.tensors) {
    if (t.numel < 16384) continue;  // GRADEX_DENSE_THRESHOLD: dense
    Tensor x;
    x.codec =
        std::make_unique<be::DgcCodec>(*backend, t.name, static_cast<size_t>(t.numel), o, wire);
    x.grad.resize(static_cast<size_t>(t.numel));
    tensors.push_back(std::move(x));
  }
  // Units: the engine's DGC groups (pipeline::plan).
  std::vector<std::vector<size_t>> units;
  uint64_t in_unit = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const uint64_t n = tensors[i].grad.size();
    if (units.empty() || in_unit >= group || n >= group) {
      units.emplace_back();
      in_unit = 0;
    }
    units.back().push_back(i);
    in_unit += n;
  }
  // Gradients: windows of one normal(0, 1) pool, a different window every step.
  std::vector<float> pool(size_t{1} << 22);
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& x : pool)
    x = normal(rng);
  auto fill = [&](int step) {
    size_t at = (static_cast<size_t>(step) * 7919 * 64) % pool.size();
    for (Tensor& t : tensors)
      for (size_t done = 0; done < t.grad.size();) {
        const size_t n = std::min(t.grad.size() - done, pool.size() - at);
        std::memcpy(t.grad.data() + done, pool.data() + at, n * 4);
        done += n;
        at = (at + n) % pool.size();
      }
  };
  std::vector<uint8_t> message;
  auto compress_step = [&] {
    for (const std::vector<size_t>& unit : units) {
      message.clear();
      gradex::compress::wire::begin_message(message, static_cast<uint32_t>(unit.size()));
      uint64_t work = 0;
      std::vector<uint64_t> weight;
      for (size_t i : unit) {
        weight.push_back(tensors[i].grad.size());
        work += weight.back();
      }
      if (spread && gradex::sync::pipeline::spread_prepare(threads, unit.size(), work)) {
        gradex::shared_pool().parallel_for_heaviest_first(weight, [&](int j) {
          Tensor& t = tensors[unit[static_cast<size_t>(j)]];
          t.payload.clear();
          t.codec->encode_step(t.grad.data(), 1.0f, *stream, t.payload);
        });
        for (size_t i : unit) {
          const size_t at = gradex::compress::wire::begin_payload(message);
          message.insert(message.end(), tensors[i].payload.begin(), tensors[i].payload.end());
          gradex::compress::wire::end_payload(message, at);
        }
      } else {
        for (size_t i : unit) {
          const size_t at = gradex::compress::wire::begin_payload(message);
          tensors[i].codec->encode_step(tensors[i].grad.data(), 1.0f, *stream, message);
          gradex::compress::wire::end_payload(message, at);
        }
      }
    }
  };
  const int warmup = 5;
  std::vector<double> ms;
  double cpu = 0, wall = 0;
  for (int step = 0; step < warmup + a.steps; ++step) {
    fill(step);
    const double c0 = cpu_seconds();
    const auto t0 = Clock::now();
    compress_step();
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    if (step < warmup) continue;
    ms.push_back(1e3 * s);
    wall += s;
    cpu += cpu_seconds() - c0;
  }
  std::sort(ms.begin(), ms.end());
  Timing t;
  t.median_ms = ms[ms.size() / 2];
  t.min_ms = ms.front();
  t.cpu_ms = 1e3 * cpu / static_cast<double>(ms.size());
  t.cpu_per_wall = wall > 0 ? cpu / wall : 0;
  return t;
}

// Runs both schedules with a pool of `threads` in a child process; "serial spread" timings back.
bool measure(const gradex::bench::ModelProfile& model, const Args& a, int threads, Timing* serial,
             Timing* spread) {
  int fds[2];
  if (pipe(fds) != 0) return false;
  std::fflush(nullptr);
  const pid_t pid = fork();
  if (pid < 0) return false;
  if (pid == 0) {
    close(fds[0]);
    gradex::configure_shared_pool(threads);
    Timing t[2] = {run_schedule(model, a, false), run_schedule(model, a, true)};
    const ssize_t w = write(fds[1], t, sizeof t);
    _exit(w == static_cast<ssize_t>(sizeof t) ? 0 : 1);
  }
  close(fds[1]);
  Timing t[2];
  size_t got = 0;
  while (got < sizeof t) {
    const ssize_t r = read(fds[0], reinterpret_cast<char*>(t) + got, sizeof t - got);
    if (r <= 0) break;
    got += static_cast<size_t>(r);
  }
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  if (got != sizeof t || !WIFEXITED(status) || WEXITSTATUS(status) != 0) return false;
  *serial = t[0];
  *spread = t[1];
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  gradex::bench::ModelProfile model;
  try {
    model = gradex::bench::load_model_profile(a.model);
  } catch (const std::exception& e) {
    usage(e.what());
  }
  uint64_t dgc_elements = 0, small = 0;
  size_t dgc_tensors = 0;
  for (const auto& t : model.tensors) {
    if (t.numel < 16384) continue;
    ++dgc_tensors;
    dgc_elements += static_cast<uint64_t>(t.numel);
    if (t.numel < (int64_t{1} << 20)) small += static_cast<uint64_t>(t.numel);
  }
  const unsigned cores = std::thread::hardware_concurrency();
  std::printf(
      "model %s: %zu DGC tensors, %.2fM elements (%.0f%% in tensors under 2^20), sparsity %g, "
      "%d steps, %u hardware threads\n",
      model.name.c_str(), dgc_tensors, dgc_elements / 1e6, 100.0 * small / dgc_elements, a.sparsity,
      a.steps, cores);
  std::printf("%8s %10s %10s %10s %10s %9s %14s %9s\n", "threads", "serial_ms", "spread_ms",
              "spread/t1", "serial/t1", "spread_x", "cpu_ms ser/spr", "cpu/wall");
  std::string result = "RESULT";
  double base_spread = 0, base_serial = 0;
  for (int t : a.threads) {
    Timing serial, spread;
    if (!measure(model, a, t, &serial, &spread)) {
      std::fprintf(stderr, "gradex-parallel-bench: the run with %d threads failed\n", t);
      return 1;
    }
    if (base_spread == 0) {
      base_spread = spread.median_ms;
      base_serial = serial.median_ms;
    }
    const double speedup = base_spread / spread.median_ms;
    std::printf("%8d %10.2f %10.2f %10.3f %10.3f %9.2f %6.1f / %5.1f %9.2f%s\n", t,
                serial.median_ms, spread.median_ms, spread.median_ms / base_spread,
                serial.median_ms / base_serial, speedup, serial.cpu_ms, spread.cpu_ms,
                spread.cpu_per_wall,
                cores > 0 && static_cast<unsigned>(t) > cores ? "  (more threads than cores)" : "");
    char item[160];
    std::snprintf(item, sizeof item, " parallel_%s_t%d_ms=%.3f parallel_%s_t%d_speedup=%.3f",
                  model.name.c_str(), t, spread.median_ms, model.name.c_str(), t, speedup);
    result += item;
  }
  std::printf(
      "(spread_x: one thread's spread time over this row's; ratios against the first "
      "row)\n%s\n",
      result.c_str());
  return 0;
}
