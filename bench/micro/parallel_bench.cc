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
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
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
#include "sync/engine/pipeline.h"

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

constexpr uint64_t kGroupElements = (uint64_t{16} << 20) / 4;  // GRADEX_SPARSE_GROUP_MB's default

// The engine's DGC groups (pipeline::plan): consecutive tensors until a group holds
// kGroupElements; a larger tensor alone.
std::vector<std::vector<size_t>> make_units(const std::vector<uint64_t>& sizes) {
  std::vector<std::vector<size_t>> units;
  uint64_t in_unit = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (units.empty() || in_unit >= kGroupElements || sizes[i] >= kGroupElements) {
      units.emplace_back();
      in_unit = 0;
    }
    units.back().push_back(i);
    in_unit += sizes[i];
  }
  return units;
}

// One schedule at the current pool size (this process's shared pool).
double thread_cpu_ms() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return 1e3 * t.tv_sec + 1e-6 * t.tv_nsec;
}

// `cost_ms` (serial schedule on one thread only): each tensor's median CPU per step.
Timing run_schedule(const gradex::bench::ModelProfile& model, const Args& a, bool spread,
                    std::vector<double>* cost_ms = nullptr) {
  const int threads = gradex::shared_pool().threads();
  const uint64_t group = kGroupElements;
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
  std::vector<uint64_t> sizes;
  for (const Tensor& t : tensors)
    sizes.push_back(t.grad.size());
  const std::vector<std::vector<size_t>> units = make_units(sizes);
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
  std::vector<std::vector<double>> per_tensor(tensors.size());
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
          const double c0 = cost_ms ? thread_cpu_ms() : 0;
          tensors[i].codec->encode_step(tensors[i].grad.data(), 1.0f, *stream, message);
          if (cost_ms) per_tensor[i].push_back(thread_cpu_ms() - c0);
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
  if (cost_ms) {
    cost_ms->clear();
    for (std::vector<double>& c : per_tensor) {
      c.erase(c.begin(), c.begin() + warmup);
      std::sort(c.begin(), c.end());
      cost_ms->push_back(c[c.size() / 2]);
    }
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
// With one thread, also each tensor's CPU per step (`cost_ms`).
bool measure(const gradex::bench::ModelProfile& model, const Args& a, int threads, Timing* serial,
             Timing* spread, std::vector<double>* cost_ms) {
  int fds[2];
  if (pipe(fds) != 0) return false;
  std::fflush(nullptr);
  const pid_t pid = fork();
  if (pid < 0) return false;
  if (pid == 0) {
    close(fds[0]);
    gradex::configure_shared_pool(threads);
    std::vector<double> cost;
    Timing t[2] = {run_schedule(model, a, false, threads == 1 ? &cost : nullptr),
                   run_schedule(model, a, true)};
    const uint32_t count = static_cast<uint32_t>(cost.size());
    bool ok = write(fds[1], t, sizeof t) == static_cast<ssize_t>(sizeof t) &&
              write(fds[1], &count, 4) == 4;
    if (ok && count > 0)
      ok = write(fds[1], cost.data(), count * 8) == static_cast<ssize_t>(count * 8);
    _exit(ok ? 0 : 1);
  }
  close(fds[1]);
  auto read_all = [&](void* p, size_t bytes) {
    size_t got = 0;
    while (got < bytes) {
      const ssize_t r = read(fds[0], static_cast<char*>(p) + got, bytes - got);
      if (r <= 0) return false;
      got += static_cast<size_t>(r);
    }
    return true;
  };
  Timing t[2];
  uint32_t count = 0;
  bool ok = read_all(t, sizeof t) && read_all(&count, 4);
  if (ok && count > 0) {
    cost_ms->resize(count);
    ok = read_all(cost_ms->data(), count * 8);
  }
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  if (!ok || !WIFEXITED(status) || WEXITSTATUS(status) != 0) return false;
  *serial = t[0];
  *spread = t[1];
  return true;
}

// A step's makespan on `threads` threads from each tensor's one-thread CPU cost (list scheduling,
// heaviest first; a split tensor becomes equal chunks): the bound each schedule's own structure
// sets, leaving out memory bandwidth and hand-offs. serial: a unit's tensors in turn, a tensor
// split from 2^20 elements; spread: the engine's rule.
double makespan_ms(const std::vector<uint64_t>& sizes, const std::vector<double>& cost, int threads,
                   bool spread) {
  namespace dgc = gradex::compress::dgc;
  double total = 0;
  for (const std::vector<size_t>& unit : make_units(sizes)) {
    uint64_t work = 0;
    for (size_t i : unit)
      work += sizes[i];
    const bool spread_unit =
        spread && gradex::sync::pipeline::spread_prepare(threads, unit.size(), work);
    const size_t split =
        spread ? dgc::split_min_elements(threads, kGroupElements) : size_t{1} << 20;
    std::vector<double> tasks;
    double in_turn = 0;
    for (size_t i : unit) {
      const int chunks = dgc::pick_threads(sizes[i], threads, split);
      for (int c = 0; c < chunks; ++c)
        tasks.push_back(cost[i] / chunks);
      in_turn += cost[i] / chunks;
    }
    if (!spread_unit) {
      total += in_turn;
      continue;
    }
    std::sort(tasks.begin(), tasks.end(), std::greater<double>());
    std::vector<double> load(static_cast<size_t>(threads), 0.0);
    for (double task : tasks)
      *std::min_element(load.begin(), load.end()) += task;
    total += *std::max_element(load.begin(), load.end());
  }
  return total;
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
  std::vector<double> cost;  // each tensor's CPU per step on one thread
  for (int t : a.threads) {
    Timing serial, spread;
    if (!measure(model, a, t, &serial, &spread, &cost)) {
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
      "(spread_x: one thread's spread time over this row's; ratios against the first row)\n");
  // The bound of each schedule from the one-thread per-tensor costs (needs a 1-thread row).
  if (!cost.empty()) {
    std::vector<uint64_t> sizes;
    for (const auto& t : model.tensors)
      if (t.numel >= 16384) sizes.push_back(static_cast<uint64_t>(t.numel));
    const double one = makespan_ms(sizes, cost, 1, false);
    std::printf(
        "\nschedule bound from one thread's per-tensor CPU (%.1f ms a step; no memory "
        "bandwidth limit):\n%8s %14s %14s\n",
        one, "threads", "serial_bound_x", "spread_bound_x");
    for (int t : {1, 2, 4, 8, 16}) {
      const double ser = one / makespan_ms(sizes, cost, t, false);
      const double spr = one / makespan_ms(sizes, cost, t, true);
      std::printf("%8d %14.2f %14.2f\n", t, ser, spr);
      char item[160];
      std::snprintf(item, sizeof item, " bound_serial_t%d=%.2f bound_spread_t%d=%.2f", t, ser, t,
                    spr);
      result += item;
    }
  }
  std::printf("RESULT%s\n", result.c_str() + 6);
  return 0;
}
