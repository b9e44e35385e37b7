// CUDA tensors through the engine (skipped where gradex's CUDA backend cannot load, i.e. without a
// GPU or without libgradex_backend_cuda.so): gradients in device memory, submitted with
// gradex_submit_device on a stream of the rank's own, results ordered with gradex_handle_event.
// Against the host path with the same inputs: dense tensors (momentum, fp16 casts, fusion) bit for
// bit, DGC's dense warm-up step bit for bit, every rank the same averages, and only payloads and
// 16-bit buckets staged (gradex_get_staged_bytes). CUDA is touched only inside the forked ranks
// (a CUDA context does not survive fork). CTest label `backend`.
#include <gtest/gtest.h>

#include "backend_runs.h"
#include "compress/backend/backend.h"
#include "process_ranks.h"
#include "rank_checks.h"

using namespace gradex::test;
namespace be = gradex::compress::backend;

namespace {

struct Spec {
  const char* key;
  uint64_t n;
  bool dgc;
};
const Spec kSpecs[] = {{"fc.weight", 40000, true}, {"fc.bias", 300, false}, {"conv", 9000, false}};
constexpr int kCount = 3, kSteps = 4;
constexpr char kSkip[] = "skip: ";

// One rank's run; `cuda`: gradients live in device memory.
std::string run_rank(RankContext& ctx, bool cuda, const ScratchDir& dir) {
  const char* tag = cuda ? "cuda" : "host";
  be::BackendPtr gpu;
  be::StreamPtr stream;
  if (cuda) {
    int available = 0;
    RANK_OK(gradex_device_available(GRADEX_DEVICE_CUDA, 0, &available));
    if (!available) return std::string(kSkip) + gradex_last_error();
    gpu = be::get_backend(be::DeviceType::kCuda, 0);
    stream = gpu->create_stream();
  }
  for (const Spec& s : kSpecs)
    RANK_OK(gradex_register_tensor(ctx.engine, s.key, s.n, GRADEX_FLOAT32,
                                   cuda ? GRADEX_DEVICE_CUDA : GRADEX_DEVICE_CPU));
  std::vector<be::BufferPtr> dev(kCount);
  std::vector<be::BufferPtr> host(kCount);
  be::EventPtr done = cuda ? gpu->create_event() : nullptr;
  for (int i = 0; cuda && i < kCount; ++i) {
    dev[i] = gpu->allocate(kSpecs[i].n * 4);
    host[i] = gpu->allocate_staging(kSpecs[i].n * 4);
  }
  for (int step = 0; step < kSteps; ++step) {
    std::vector<std::vector<float>> g(kCount);
    gradex_handle_t h[kCount];
    for (int i = 0; i < kCount; ++i) {
      g[i] = test_vector(200 + i, ctx.rank, step, kSpecs[i].n);
      if (!cuda) {
        RANK_OK(gradex_submit(ctx.engine, kSpecs[i].key, g[i].data(), &h[i]));
        continue;
      }
      std::memcpy(host[i]->data(), g[i].data(), kSpecs[i].n * 4);
      gpu->copy(dev[i]->data(), host[i]->data(), kSpecs[i].n * 4, *stream);
      RANK_OK(gradex_submit_device(ctx.engine, kSpecs[i].key, dev[i]->data(), GRADEX_DEVICE_CUDA, 0,
                                   stream->native(), &h[i]));
    }
    for (int i = 0; i < kCount; ++i) {
      RANK_OK(gradex_wait(ctx.engine, h[i]));
      if (cuda) {
        RANK_OK(gradex_handle_event(ctx.engine, h[i], stream->native()));
        gpu->copy(host[i]->data(), dev[i]->data(), kSpecs[i].n * 4, *stream);
        done->record(*stream);
        done->synchronize();
        std::memcpy(g[i].data(), host[i]->data(), kSpecs[i].n * 4);
      }
      append_floats(dir.file(tag, "out", ctx.rank), g[i]);
    }
    RANK_OK(gradex_end_step(ctx.engine, nullptr));
  }
  uint64_t staged = 0;
  RANK_OK(gradex_get_staged_bytes(ctx.engine, 0, &staged));
  uint64_t whole = 0;
  for (const Spec& s : kSpecs)
    whole += 8 * s.n * kSteps;
  RANK_REQUIRE(cuda ? staged > 0 && staged < whole : staged == 0,
               tag << ": staged " << staged << " bytes (whole fp32 copies: " << whole << ")");
  append_bytes(dir.file(tag, "staged", ctx.rank), &staged, sizeof(staged));
  return "";
}

}  // namespace

TEST(EngineCuda, CudaTensorsMatchTheHostPath) {
  const int world = 2;
  const ScratchDir dir("cuda");
  const std::vector<std::string> env = {"GRADEX_SPARSITY=0.99", "GRADEX_WARMUP_STEPS=3",
                                        "GRADEX_FUSION_MB=0.02", "GRADEX_TIMEOUT_S=60"};
  auto cuda = run_ranks(world, env, [&](RankContext& ctx) { return run_rank(ctx, true, dir); });
  if (cuda[0].find(kSkip) != std::string::npos) GTEST_SKIP() << cuda[0];
  ASSERT_EQ(failures(cuda), "");
  auto host = run_ranks(world, env, [&](RankContext& ctx) { return run_rank(ctx, false, dir); });
  ASSERT_EQ(failures(host), "");
  for (int r = 0; r < world; ++r) {
    const auto want = read_floats(dir.file("host", "out", r));
    const auto got = read_floats(dir.file("cuda", "out", r));
    ASSERT_EQ(want.size(), got.size());
    EXPECT_EQ(first_difference(read_floats(dir.file("cuda", "out", 0)), got), -1)
        << "rank " << r << " received other averages than rank 0";
    size_t at = 0;
    for (int step = 0; step < kSteps; ++step)
      for (const Spec& s : kSpecs) {
        if (!s.dgc || step == 0) {
          std::vector<float> a(want.begin() + at, want.begin() + at + s.n);
          std::vector<float> b(got.begin() + at, got.begin() + at + s.n);
          EXPECT_EQ(first_difference(a, b), -1) << s.key << " step " << step << " rank " << r;
        }
        at += s.n;
      }
    uint64_t staged = 0;
    const auto bytes = read_bytes(dir.file("cuda", "staged", r));
    if (bytes.size() == sizeof(staged)) std::memcpy(&staged, bytes.data(), sizeof(staged));
    std::printf("RESULT rank %d cuda_staged_bytes=%llu over %d steps\n", r,
                static_cast<unsigned long long>(staged), kSteps);
  }
}
