// gradex-dct-bench: the Adam codec's chunked DCT (compress/dct/chunked_dct.h, the fast transform)
// side by side, in one process, with the dense matrix product per block it replaced (kept here,
// and only here, as the "before"):
//   transform  forward + inverse of one tensor, ms per million elements (median of --reps), on
//              one thread and on a pool of --threads;
//   codec      one rank's whole step of the DCT Adam codec on the LM race's compressed tensors
//              (bench/lm/model.py: vocabulary 16,384, d 256, 3 layers; tensors of at least
//              16,384 elements): encode (transform, decayed buffer, top-k at 2%, wire) and the
//              sum of two ranks' payloads with the inverse transform, the shared pool sized
//              --threads. "before" is the element codec run on the matrix product's coefficients
//              (what DctAdamCodec did), "elements" the element codec alone (no transform: the
//              floor).
//
// Usage: gradex-dct-bench [--threads N] [--reps N] [--chunk C]
// Times are medians of wall and process CPU time (every thread's); on a shared machine compare CPU.
// Ends with a RESULT line: the 16384 x 256 case's CPU ms per million elements on one thread
// (dct_fast_cpu_ms_per_m_t1, dct_matrix_cpu_ms_per_m_t1) and wall ms on the pool, the speed-ups,
// and the codec step's CPU ms (codec_step_cpu_ms_{fast,matrix,elements}).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <time.h>

#include "base/config.h"
#include "base/thread_pool.h"
#include "compress/backend/adam_codec.h"
#include "compress/backend/backend.h"
#include "compress/backend/cpu_backend.h"
#include "compress/backend/dct_adam_codec.h"
#include "compress/dct/chunked_dct.h"
#include "compress/dgc/parallel.h"
#include "compress/options.h"

namespace {

namespace be = gradex::compress::backend;
using gradex::compress::dct::ChunkedDct;
using Clock = std::chrono::steady_clock;

// The transform before the fast DCT: per block X, C = Dr X Dc^T by two dense products (2 x side
// multiply-adds per element and direction), blocks spread over the pool as the fast one's tiles.
class MatrixDct {
 public:
  MatrixDct(size_t numel, uint64_t rows, uint32_t chunk) : geometry_(numel, rows, chunk) {
    br_ = geometry_.block_rows();
    bc_ = geometry_.block_cols();
    dr_ = matrix(br_);
    dc_ = matrix(bc_);
    dc_t_.resize(dc_.size());
    for (uint32_t f = 0; f < bc_; ++f)
      for (uint32_t j = 0; j < bc_; ++j)
        dc_t_[static_cast<size_t>(j) * bc_ + f] = dc_[static_cast<size_t>(f) * bc_ + j];
  }
  void run(const float* in, float* out, bool inverse, gradex::ThreadPool& pool) const {
    const uint64_t cols = geometry_.cols(), grid_cols = cols / bc_;
    const uint64_t blocks = (geometry_.rows() / br_) * grid_cols;
    const size_t bs = static_cast<size_t>(br_) * bc_;
    auto piece = [&](int p, int pieces) {
      std::vector<float> t(bs), src(bs);
      for (uint64_t b = blocks * p / pieces; b < blocks * (p + 1) / pieces; ++b) {
        const uint64_t gr = b / grid_cols, gc = b % grid_cols;
        if (!inverse)
          for (uint32_t i = 0; i < br_; ++i) {
            const float* row = in + (gr * br_ + i) * cols + gc * bc_;
            std::copy(row, row + bc_, src.data() + static_cast<size_t>(i) * bc_);
          }
        else
          std::copy(in + b * bs, in + (b + 1) * bs, src.data());
        for (uint32_t f = 0; f < br_; ++f) {
          float* tr = t.data() + static_cast<size_t>(f) * bc_;
          std::fill(tr, tr + bc_, 0.0f);
          for (uint32_t i = 0; i < br_; ++i) {
            const float l = inverse ? dr_[static_cast<size_t>(i) * br_ + f]
                                    : dr_[static_cast<size_t>(f) * br_ + i];
            const float* sr = src.data() + static_cast<size_t>(i) * bc_;
            for (uint32_t j = 0; j < bc_; ++j)
              tr[j] += l * sr[j];
          }
        }
        const std::vector<float>& right = inverse ? dc_ : dc_t_;
        for (uint32_t f = 0; f < br_; ++f) {
          const float* tr = t.data() + static_cast<size_t>(f) * bc_;
          float* rr = inverse ? out + (gr * br_ + f) * cols + gc * bc_
                              : out + b * bs + static_cast<size_t>(f) * bc_;
          std::fill(rr, rr + bc_, 0.0f);
          for (uint32_t j = 0; j < bc_; ++j) {
            const float* rt = right.data() + static_cast<size_t>(j) * bc_;
            for (uint32_t g = 0; g < bc_; ++g)
              rr[g] += tr[j] * rt[g];
          }
        }
      }
    };
    if (geometry_.numel() < (size_t{1} << 16) || pool.threads() <= 1 || blocks < 2) {
      piece(0, 1);
      return;
    }
    const int pieces = static_cast<int>(std::min<uint64_t>(blocks, pool.threads() * 4));
    pool.parallel_for(pieces, [&](int p) { piece(p, pieces); });
  }

 private:
  static std::vector<float> matrix(uint32_t n) {
    std::vector<float> d(static_cast<size_t>(n) * n);
    const double pi = std::acos(-1.0);
    for (uint32_t f = 0; f < n; ++f)
      for (uint32_t j = 0; j < n; ++j)
        d[static_cast<size_t>(f) * n + j] = static_cast<float>(
            std::sqrt((f == 0 ? 1.0 : 2.0) / n) * std::cos(pi * (2.0 * j + 1.0) * f / (2.0 * n)));
    return d;
  }
  ChunkedDct geometry_;
  uint32_t br_, bc_;
  std::vector<float> dr_, dc_, dc_t_;
};

struct Shape {
  const char* name;
  uint64_t rows, cols;
};

// bench/lm/model.py's parameters of at least 16,384 elements, as [rows, cols].
const std::vector<Shape> kRaceTensors = {
    {"embed", 16384, 256},    {"pos", 64, 256},         {"0.attn.in", 768, 256},
    {"0.attn.out", 256, 256}, {"0.mlp.0", 1024, 256},   {"0.mlp.2", 256, 1024},
    {"1.attn.in", 768, 256},  {"1.attn.out", 256, 256}, {"1.mlp.0", 1024, 256},
    {"1.mlp.2", 256, 1024},   {"2.attn.in", 768, 256},  {"2.attn.out", 256, 256},
    {"2.mlp.0", 1024, 256},   {"2.mlp.2", 256, 1024},   {"out", 16384, 256}};

double cpu_ms() {
  timespec t;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return 1e3 * static_cast<double>(t.tv_sec) + 1e-6 * static_cast<double>(t.tv_nsec);
}

// Medians over `reps` runs of wall and process CPU time (every thread's), after one warm-up run.
// On a shared machine the CPU time is the figure to compare: the wall time includes waiting for
// a core.
struct Cost {
  double wall_ms, cpu_ms;
};

Cost median_cost(int reps, const std::function<void()>& fn) {
  fn();  // warm caches, pages and the pool
  std::vector<double> wall, cpu;
  for (int r = 0; r < reps; ++r) {
    const double c0 = cpu_ms();
    const auto t0 = Clock::now();
    fn();
    wall.push_back(1e3 * std::chrono::duration<double>(Clock::now() - t0).count());
    cpu.push_back(cpu_ms() - c0);
  }
  std::sort(wall.begin(), wall.end());
  std::sort(cpu.begin(), cpu.end());
  return {wall[wall.size() / 2], cpu[cpu.size() / 2]};
}

std::vector<float> normal(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> x(n);
  for (float& v : x)
    v = d(rng);
  return x;
}

struct Args {
  int threads = 0, reps = 7;
  uint32_t chunk = 64;
};

Args parse(int argc, char** argv) {
  Args a;
  a.threads = static_cast<int>(std::min(8u, std::max(1u, std::thread::hardware_concurrency())));
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const long v = std::strtol(argv[i + 1], nullptr, 10);
    if (flag == "--threads" && v >= 1 && v <= 256) {
      a.threads = static_cast<int>(v);
    } else if (flag == "--reps" && v >= 1 && v <= 1000) {
      a.reps = static_cast<int>(v);
    } else if (flag == "--chunk" && v >= 1 && v <= ChunkedDct::kMaxChunk) {
      a.chunk = static_cast<uint32_t>(v);
    } else {
      std::fprintf(
          stderr, "usage: gradex-dct-bench [--threads 1..256] [--reps 1..1000] [--chunk 1..256]\n");
      std::exit(2);
    }
  }
  if (argc % 2 == 0) {
    std::fprintf(stderr, "usage: gradex-dct-bench [--threads N] [--reps N] [--chunk C]\n");
    std::exit(2);
  }
  return a;
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  gradex::configure_shared_pool(a.threads);
  gradex::ThreadPool one(1), many(a.threads);
  std::printf("gradex-dct-bench: chunk %u, pool of %d threads, median of %d\n\n", a.chunk,
              a.threads, a.reps);

  // --- the transform alone ---
  const std::vector<Shape> shapes = {{"16384x256", 16384, 256},
                                     {"1024x256", 1024, 256},
                                     {"600x500 (60x50 blocks)", 600, 500},
                                     {"1x1048576 (1-D)", 1, 1048576}};
  std::printf("%-24s %7s | %-27s | %-27s | %-27s\n", "forward+inverse", "blocks",
              "1 thread, CPU: fast matrix", "pool, wall: fast matrix", "pool, CPU: fast matrix");
  Cost big[4] = {};  // the 16384 x 256 case: fast t1, matrix t1, fast tN, matrix tN
  for (const Shape& s : shapes) {
    const size_t n = s.rows * s.cols;
    const ChunkedDct fast(n, s.rows, a.chunk);
    const MatrixDct matrix(n, s.rows, a.chunk);
    const std::vector<float> x = normal(n, 1);
    std::vector<float> c(n), back(n);
    const double per_m = 1e6 / static_cast<double>(n);
    Cost m[4];
    int k = 0;
    for (gradex::ThreadPool* pool : {&one, &many}) {
      m[k++] = median_cost(a.reps, [&] {
        fast.forward(x.data(), c.data(), *pool);
        fast.inverse(c.data(), back.data(), *pool);
      });
      m[k++] = median_cost(a.reps, [&] {
        matrix.run(x.data(), c.data(), false, *pool);
        matrix.run(c.data(), back.data(), true, *pool);
      });
    }
    for (Cost& x : m) {
      x.wall_ms *= per_m;
      x.cpu_ms *= per_m;
    }
    char blocks[32];
    std::snprintf(blocks, sizeof blocks, "%ux%u", fast.block_rows(), fast.block_cols());
    std::printf("%-24s %7s | %7.2f %8.2f %7.1fx | %7.2f %8.2f %7.1fx | %7.2f %8.2f %7.1fx\n",
                s.name, blocks, m[0].cpu_ms, m[1].cpu_ms, m[1].cpu_ms / m[0].cpu_ms, m[2].wall_ms,
                m[3].wall_ms, m[3].wall_ms / m[2].wall_ms, m[2].cpu_ms, m[3].cpu_ms,
                m[3].cpu_ms / m[2].cpu_ms);
    if (s.rows == 16384) std::copy(m, m + 4, big);
  }
  std::printf("(ms per million elements, forward and inverse)\n\n");

  // --- the codec's step on the race model ---
  gradex::config::Config config;
  gradex::compress::DgcOptions o = gradex::compress::dgc_options_from_config(config, 2);
  o.sparsity = 0.98;  // GRADEX_ADAM_SPARSITY's default
  o.momentum = 0;
  o.warmup_steps = 0;
  o.parallel_min_elements = gradex::compress::dgc::split_min_elements(a.threads, (16u << 20) / 4);
  gradex::compress::DgcOptions od = o;
  od.residual_dct_chunk = a.chunk;
  const gradex::compress::WireOptions wire = gradex::compress::wire_options_from_config(config);
  be::BackendPtr backend = be::make_cpu_backend();
  be::StreamPtr stream = backend->create_stream();
  struct Tensor {
    Shape shape{};
    size_t n = 0;
    std::unique_ptr<be::DgcCodec> fast, fast_peer, elem, elem_peer, elem_only, elem_only_peer;
    std::unique_ptr<MatrixDct> matrix;
    std::vector<float> g, g_peer, c, out;
  };
  std::vector<Tensor> tensors;
  size_t total = 0;
  for (const Shape& s : kRaceTensors) {
    Tensor t;
    t.shape = s;
    t.n = s.rows * s.cols;
    auto dct_codec = [&] {
      return std::make_unique<be::DctAdamCodec>(*backend, s.name, t.n, s.rows, od, wire, 0.9f);
    };
    auto elem_codec = [&] {
      return std::make_unique<be::AdamCodec>(*backend, s.name, t.n, o, wire, 0.9f);
    };
    t.fast = dct_codec();
    t.fast_peer = dct_codec();
    t.elem = elem_codec();
    t.elem_peer = elem_codec();
    t.elem_only = elem_codec();
    t.elem_only_peer = elem_codec();
    t.matrix = std::make_unique<MatrixDct>(t.n, s.rows, a.chunk);
    t.g = normal(t.n, 2);
    t.g_peer = normal(t.n, 3);
    t.c.resize(t.n);
    t.out.resize(t.n);
    total += t.n;
    tensors.push_back(std::move(t));
  }
  // One rank's step: its encode (timed), the peer's encode (not timed), the sum of both payloads
  // and the inverse (timed). `transform` null: the fast codec; else the element codec on the
  // matrix product's coefficients; `none`: the element codec on the elements.
  enum class Kind { kFast, kMatrix, kElements };
  auto step_cost = [&](Kind kind) {
    Cost sum{0, 0};
    for (Tensor& t : tensors) {
      std::vector<float> g = t.g, gp = t.g_peer;
      std::vector<uint8_t> mine, peer;
      be::DgcCodec& codec = kind == Kind::kFast     ? *t.fast
                            : kind == Kind::kMatrix ? *t.elem
                                                    : *t.elem_only;
      be::DgcCodec& other = kind == Kind::kFast     ? *t.fast_peer
                            : kind == Kind::kMatrix ? *t.elem_peer
                                                    : *t.elem_only_peer;
      double c0 = cpu_ms();
      auto t0 = Clock::now();
      if (kind == Kind::kMatrix) {
        t.matrix->run(g.data(), t.c.data(), false, gradex::shared_pool());
        codec.encode_step(t.c.data(), 1.0f, *stream, mine);
        std::fill(g.begin(), g.end(), 0.0f);
      } else {
        codec.encode_step(g.data(), 1.0f, *stream, mine);
      }
      sum.wall_ms += 1e3 * std::chrono::duration<double>(Clock::now() - t0).count();
      sum.cpu_ms += cpu_ms() - c0;
      if (kind == Kind::kMatrix) {
        t.matrix->run(gp.data(), t.c.data(), false, gradex::shared_pool());
        other.encode_step(t.c.data(), 1.0f, *stream, peer);
      } else {
        other.encode_step(gp.data(), 1.0f, *stream, peer);
      }
      const std::vector<gradex::compress::wire::PayloadSpan> both = {{mine.data(), mine.size()},
                                                                     {peer.data(), peer.size()}};
      c0 = cpu_ms();
      t0 = Clock::now();
      if (kind == Kind::kMatrix) {
        std::fill(t.c.begin(), t.c.end(), 0.0f);
        codec.sum_payloads(both, 0.5f, t.c.data(), *stream);
        t.matrix->run(t.c.data(), g.data(), true, gradex::shared_pool());
      } else {
        codec.sum_payloads(both, 0.5f, g.data(), *stream);
      }
      sum.wall_ms += 1e3 * std::chrono::duration<double>(Clock::now() - t0).count();
      sum.cpu_ms += cpu_ms() - c0;
    }
    return sum;
  };
  Cost codec[3];
  const char* names[3] = {"fast DCT (DctAdamCodec)", "matrix DCT (before)", "elements (no DCT)"};
  for (int k = 0; k < 3; ++k) {
    const Kind kind = static_cast<Kind>(k);
    step_cost(kind);
    std::vector<double> wall, cpu;
    for (int r = 0; r < a.reps; ++r) {
      const Cost c = step_cost(kind);
      wall.push_back(c.wall_ms);
      cpu.push_back(c.cpu_ms);
    }
    std::sort(wall.begin(), wall.end());
    std::sort(cpu.begin(), cpu.end());
    codec[k] = {wall[wall.size() / 2], cpu[cpu.size() / 2]};
  }
  std::printf(
      "codec step on the race model (%zu compressed elements, %zu tensors), one rank, pool of "
      "%d:\n",
      total, tensors.size(), a.threads);
  for (int k = 0; k < 3; ++k)
    std::printf(
        "  %-26s wall %8.2f ms, CPU %8.2f ms per step  (CPU %6.2f ms per million elements)\n",
        names[k], codec[k].wall_ms, codec[k].cpu_ms,
        codec[k].cpu_ms * 1e6 / static_cast<double>(total));
  std::printf(
      "RESULT dct_fast_cpu_ms_per_m_t1=%.3f dct_matrix_cpu_ms_per_m_t1=%.3f dct_speedup_t1=%.2f "
      "dct_fast_wall_ms_per_m_t%d=%.3f dct_matrix_wall_ms_per_m_t%d=%.3f dct_speedup_wall_t%d=%.2f "
      "codec_step_cpu_ms_fast=%.2f codec_step_cpu_ms_matrix=%.2f codec_step_cpu_ms_elements=%.2f\n",
      big[0].cpu_ms, big[1].cpu_ms, big[1].cpu_ms / big[0].cpu_ms, a.threads, big[2].wall_ms,
      a.threads, big[3].wall_ms, a.threads, big[3].wall_ms / big[2].wall_ms, codec[0].cpu_ms,
      codec[1].cpu_ms, codec[2].cpu_ms);
  return 0;
}
