// The engine on the host backends: DGC's error feedback loses nothing on
// every backend (sent + residual == submitted, whatever the selection), LocalSGD's local momentum
// steps, and the C API's device entry points (gradex_submit_device, gradex_handle_event,
// gradex_get_staged_bytes, gradex_device_available) with their errors. CTest label `backend`.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <iterator>
#include <thread>

#include "backend_runs.h"
#include "capi/engine_access.h"
#include "process_ranks.h"
#include "rank_checks.h"

using namespace gradex::test;

// Summed over ranks and steps, the delivered averages plus the residuals equal what was
// submitted, on every backend (the Thrust step may select other elements than the CPU's).
TEST(EngineDevice, ErrorFeedbackIsExactOnEveryBackend) {
  const int world = 3, steps = 5;
  const uint64_t n = 50000;
  const ScratchDir dir("device");
  for (const std::string& backend : engine_backends()) {
    auto results = run_ranks(
        world,
        {"GRADEX_SPARSITY=0.99", "GRADEX_MOMENTUM=0", "GRADEX_FP16=0",
         "GRADEX_DENSE_THRESHOLD=1000", "GRADEX_SPARSITY_OVERRIDES=check:dense",
         "GRADEX_BACKEND=" + backend},
        [&](RankContext& ctx) -> std::string {
          RANK_OK(gradex_register_tensor(ctx.engine, "w", n, GRADEX_FLOAT32, GRADEX_DEVICE_CPU));
          std::vector<double> submitted(n, 0), delivered(n, 0);
          for (int step = 0; step < steps; ++step) {
            std::vector<float> g = test_vector(3, ctx.rank, step, n);
            for (uint64_t i = 0; i < n; ++i)
              submitted[i] += g[i];
            gradex_handle_t h;
            RANK_OK(
                gradex_submit_device(ctx.engine, "w", g.data(), GRADEX_DEVICE_CPU, 0, nullptr, &h));
            RANK_OK(gradex_wait(ctx.engine, h));
            RANK_OK(gradex_handle_event(ctx.engine, h, nullptr));
            append_floats(dir.file(backend, "avg", ctx.rank), g);
            for (uint64_t i = 0; i < n; ++i)
              delivered[i] += g[i];
            RANK_OK(gradex_end_step(ctx.engine, nullptr));
          }
          gradex_stats_t s;
          RANK_OK(gradex_get_stats(ctx.engine, 0, &s));
          RANK_REQUIRE(s.sparse_exchanges == steps, "sparse exchanges " << s.sparse_exchanges);
          std::vector<float> residual = gradex::capi::engine_of(ctx.engine).residual_of("w");
          RANK_REQUIRE(residual.size() == n, "residual size " << residual.size());
          std::vector<float> sent(n);
          for (uint64_t i = 0; i < n; ++i)
            sent[i] = static_cast<float>(submitted[i] - residual[i]);
          RANK_OK(
              gradex_register_tensor(ctx.engine, "check", n, GRADEX_FLOAT32, GRADEX_DEVICE_CPU));
          gradex_handle_t h;
          RANK_OK(gradex_submit(ctx.engine, "check", sent.data(), &h));
          RANK_OK(gradex_wait(ctx.engine, h));
          double worst = 0;
          for (uint64_t i = 0; i < n; ++i)
            worst = std::max(worst, std::fabs(sent[i] - delivered[i]));
          RANK_REQUIRE(worst < 1e-5,
                       backend << ": delivered + residuals != submitted, worst " << worst);
          return "";
        },
        std::chrono::seconds(300));
    ASSERT_EQ(failures(results), "") << "GRADEX_BACKEND=" << backend;
    const auto avg0 = read_floats(dir.file(backend, "avg", 0));
    ASSERT_EQ(avg0.size(), n * steps);
    for (int r = 1; r < world; ++r)
      EXPECT_EQ(first_difference(avg0, read_floats(dir.file(backend, "avg", r))), -1)
          << backend << ": rank " << r << " received other averages than rank 0";
  }
}

// LocalSGD after its warm-up: local steps apply gradex's momentum in place on the tensor's
// backend, then parameters are averaged. thrust-omp reproduces the CPU backend bit for bit on the
// dense tensor (momentum is the same arithmetic everywhere). (The CPU backend's LocalSGD equals
// the classic host path's it replaced: tests/sync/engine_golden_test.cc.)
TEST(EngineDevice, LocalSgdStepsAgreeAcrossBackends) {
  const int world = 2, steps = 5;
  const uint64_t dense_n = 3000, dgc_n = 30000;
  const ScratchDir dir("device");
  const auto backends = engine_backends();
  for (const std::string& backend : backends) {
    auto results = run_ranks(
        world,
        {"GRADEX_LOCALSGD_PERIOD=2", "GRADEX_LOCALSGD_WARMUP_STEPS=1", "GRADEX_NESTEROV=1",
         "GRADEX_BACKEND=" + backend},
        [&](RankContext& ctx) -> std::string {
          RANK_OK(
              gradex_register_tensor(ctx.engine, "d", dense_n, GRADEX_FLOAT32, GRADEX_DEVICE_CPU));
          RANK_OK(
              gradex_register_tensor(ctx.engine, "s", dgc_n, GRADEX_FLOAT32, GRADEX_DEVICE_CPU));
          std::vector<float> pd = test_vector(40, ctx.rank, 0, dense_n);
          std::vector<float> ps = test_vector(41, ctx.rank, 0, dgc_n);
          for (int step = 0; step < steps; ++step) {
            std::vector<float> gd = test_vector(42, ctx.rank, step, dense_n);
            std::vector<float> gs = test_vector(43, ctx.rank, step, dgc_n);
            gradex_handle_t hd, hs;
            RANK_OK(gradex_submit(ctx.engine, "d", gd.data(), &hd));
            RANK_OK(gradex_submit(ctx.engine, "s", gs.data(), &hs));
            RANK_OK(gradex_wait(ctx.engine, hd));
            RANK_OK(gradex_wait(ctx.engine, hs));
            append_floats(dir.file(backend, "d", ctx.rank), gd);
            if (step > 0) append_floats(dir.file(backend, "s", ctx.rank), gs);  // local steps
            for (uint64_t i = 0; i < dense_n; ++i)
              pd[i] -= 0.1f * gd[i];
            for (uint64_t i = 0; i < dgc_n; ++i)
              ps[i] -= 0.1f * gs[i];
            int average = 0;
            RANK_OK(gradex_end_step(ctx.engine, &average));
            if (average) {
              RANK_OK(gradex_average(ctx.engine, "d", pd.data(), &hd));
              RANK_OK(gradex_average(ctx.engine, "s", ps.data(), &hs));
              RANK_OK(gradex_wait(ctx.engine, hd));
              RANK_OK(gradex_wait(ctx.engine, hs));
              append_floats(dir.file(backend, "d", ctx.rank), pd);
            }
          }
          return "";
        },
        std::chrono::seconds(300));
    ASSERT_EQ(failures(results), "") << "GRADEX_BACKEND=" << backend;
  }
  for (int r = 0; r < world; ++r) {
    const auto want_d = read_floats(dir.file("cpu", "d", r));
    ASSERT_GT(want_d.size(), steps * dense_n);
    for (size_t b = 1; b < backends.size(); ++b) {
      EXPECT_EQ(first_difference(want_d, read_floats(dir.file(backends[b], "d", r))), -1)
          << backends[b] << " rank " << r;
    }
    EXPECT_FALSE(read_floats(dir.file("cpu", "s", r)).empty()) << "rank " << r;
  }
}

// Ranks may submit through different entry points (gradex_submit_device with host memory on ranks
// 0 and 2, gradex_submit on rank 1): the engine's pipeline cuts the same units (dense buckets,
// groups of DGC tensors) from agreed data only, and every rank must see bit for bit what a run
// submitting through gradex_submit alone delivers (dense units, DGC groups of several tensors).
// Which tensors share a round depends on timing, so each dense tensor travels in a bucket of its
// own here (a ring allreduce's summation order depends on the bucket; DGC averages do not depend on
// the grouping): the two runs then deliver the same bits whatever rounds the ranks formed.
TEST(EngineDevice, MixedEntryPointsMatch) {
  const int world = 3, steps = 6;
  struct Spec {
    const char* key;
    uint64_t n;
  };
  // dgc.a travels alone; dgc.b..d form one group (0.1 MB = 25,000 floats) when ready together;
  // dense.* travel alone (4,000 bytes of fp16 at most per bucket).
  const Spec specs[] = {{"dgc.a", 40000},  {"dgc.b", 8000},   {"dgc.c", 9000},  {"dgc.d", 12000},
                        {"dense.e", 3000}, {"dense.f", 2000}, {"dense.g", 5000}};
  const std::vector<std::string> env = {
      "GRADEX_SPARSITY=0.99",        "GRADEX_WARMUP_STEPS=2",
      "GRADEX_DENSE_THRESHOLD=1000", "GRADEX_SPARSITY_OVERRIDES=dense:dense",
      "GRADEX_SPARSE_GROUP_MB=0.1",  "GRADEX_FUSION_MB=0.004",
      "GRADEX_TIMEOUT_S=60"};
  const ScratchDir dir("device");
  for (const std::string& run : {std::string("host"), std::string("mixed")}) {
    auto results = run_ranks(
        world, env,
        [&](RankContext& ctx) -> std::string {
          const bool device = run == "mixed" && ctx.rank != 1;
          std::string error;
          gradex_status_t st = create_engine(ctx.rank, ctx.world, &ctx.engine, &error);
          RANK_REQUIRE(st == GRADEX_OK, "create: " << error);
          for (const Spec& t : specs)
            RANK_OK(
                gradex_register_tensor(ctx.engine, t.key, t.n, GRADEX_FLOAT32, GRADEX_DEVICE_CPU));
          for (int step = 0; step < steps; ++step) {
            std::vector<std::vector<float>> g;
            std::vector<gradex_handle_t> h(std::size(specs));
            for (size_t i = 0; i < std::size(specs); ++i)
              g.push_back(test_vector(40 + i, ctx.rank, step, specs[i].n));
            for (size_t k = 0; k < std::size(specs); ++k) {
              const size_t i = (k + ctx.rank) % std::size(specs);
              RANK_OK(device ? gradex_submit_device(ctx.engine, specs[i].key, g[i].data(),
                                                    GRADEX_DEVICE_CPU, 0, nullptr, &h[i])
                             : gradex_submit(ctx.engine, specs[i].key, g[i].data(), &h[i]));
            }
            for (size_t i = 0; i < std::size(specs); ++i) {
              RANK_OK(gradex_wait(ctx.engine, h[i]));
              append_floats(dir.file(run, "out", ctx.rank), g[i]);
            }
            RANK_OK(gradex_end_step(ctx.engine, nullptr));
          }
          gradex_stats_t s;
          RANK_OK(gradex_get_stats(ctx.engine, 0, &s));
          RANK_REQUIRE(s.sparse_exchanges > 0, "no sparse exchange happened");
          for (const Spec& t : specs)
            append_floats(dir.file(run, "residual", ctx.rank),
                          gradex::capi::engine_of(ctx.engine).residual_of(t.key));
          return "";
        },
        std::chrono::seconds(300), /*create_engine=*/false);
    ASSERT_EQ(failures(results), "") << run;
  }
  const auto want = read_floats(dir.file("host", "out", 0));
  uint64_t per_step = 0;
  for (const Spec& t : specs)
    per_step += t.n;
  ASSERT_EQ(want.size(), per_step * steps);
  for (int r = 0; r < world; ++r) {
    EXPECT_EQ(first_difference(read_floats(dir.file("mixed", "out", 0)),
                               read_floats(dir.file("mixed", "out", r))),
              -1)
        << "rank " << r << " received other averages than rank 0 in the mixed run";
    EXPECT_EQ(first_difference(want, read_floats(dir.file("mixed", "out", r))), -1)
        << "rank " << r << " (" << (r == 1 ? "gradex_submit" : "gradex_submit_device") << ")";
    EXPECT_EQ(first_difference(read_floats(dir.file("host", "residual", r)),
                               read_floats(dir.file("mixed", "residual", r))),
              -1)
        << "residuals of rank " << r;
  }
}

TEST(EngineDevice, CApiEntryPointsAndErrors) {
  auto results = run_ranks(
      2, {"GRADEX_BACKEND=cpu", "GRADEX_TIMEOUT_S=30"}, [&](RankContext& ctx) -> std::string {
        const uint64_t n = 1000;
        RANK_OK(gradex_register_tensor(ctx.engine, "w", n, GRADEX_FLOAT32, GRADEX_DEVICE_CPU));
        std::vector<float> g(n, static_cast<float>(ctx.rank + 1));
        gradex_handle_t h;
        if (ctx.rank == 1) std::this_thread::sleep_for(std::chrono::milliseconds(1500));
        RANK_OK(gradex_submit_device(ctx.engine, "w", g.data(), GRADEX_DEVICE_CPU, 0, nullptr, &h));
        if (ctx.rank == 0) {  // rank 1 submits 1.5 s later: still in flight here
          RANK_REQUIRE(gradex_handle_event(ctx.engine, h, nullptr) == GRADEX_ERR_INVALID_ARGUMENT,
                       "handle_event on a handle in flight must fail");
          RANK_REQUIRE(std::string(gradex_last_error()).find("not complete") != std::string::npos,
                       gradex_last_error());
        }
        RANK_OK(gradex_wait(ctx.engine, h));
        RANK_OK(gradex_handle_event(ctx.engine, h, nullptr));
        for (float x : g)
          RANK_REQUIRE(x != 0, "average lost");
        // Unknown handles, negative device indices and unknown device types are refused by name.
        RANK_REQUIRE(
            gradex_handle_event(ctx.engine, 987654, nullptr) == GRADEX_ERR_INVALID_ARGUMENT,
            "unknown handle");
        RANK_REQUIRE(gradex_submit_device(ctx.engine, "w", g.data(), GRADEX_DEVICE_CPU, -1, nullptr,
                                          &h) == GRADEX_ERR_INVALID_ARGUMENT,
                     "negative device index");
        RANK_REQUIRE(
            gradex_register_tensor(ctx.engine, "x", n, GRADEX_FLOAT32,
                                   static_cast<gradex_device_t>(7)) == GRADEX_ERR_INVALID_ARGUMENT,
            "unknown device type");
        // CUDA tensors: float32 only; submitted with gradex_submit_device; a host pointer call is
        // refused naming the right entry point.
        RANK_REQUIRE(gradex_register_tensor(ctx.engine, "c16", n, GRADEX_FLOAT16,
                                            GRADEX_DEVICE_CUDA) == GRADEX_ERR_INVALID_ARGUMENT,
                     "fp16 CUDA tensor accepted");
        RANK_REQUIRE(std::string(gradex_last_error()).find("float32") != std::string::npos,
                     gradex_last_error());
        RANK_OK(gradex_register_tensor(ctx.engine, "c", n, GRADEX_FLOAT32, GRADEX_DEVICE_CUDA));
        RANK_REQUIRE(gradex_register_tensor(ctx.engine, "c", n, GRADEX_FLOAT32,
                                            GRADEX_DEVICE_CPU) == GRADEX_ERR_INVALID_ARGUMENT,
                     "re-registration in other memory");
        RANK_REQUIRE(gradex_submit(ctx.engine, "c", g.data(), &h) == GRADEX_ERR_INVALID_ARGUMENT,
                     "host submit of a CUDA tensor");
        RANK_REQUIRE(
            std::string(gradex_last_error()).find("gradex_submit_device") != std::string::npos,
            gradex_last_error());
        RANK_REQUIRE(gradex_submit_device(ctx.engine, "w", g.data(), GRADEX_DEVICE_CUDA, 0, nullptr,
                                          &h) == GRADEX_ERR_INVALID_ARGUMENT,
                     "CUDA submit of a host tensor");
        int available = -1;
        RANK_OK(gradex_device_available(GRADEX_DEVICE_CPU, 0, &available));
        RANK_REQUIRE(available == 1, "host memory is always available");
        RANK_OK(gradex_device_available(GRADEX_DEVICE_CUDA, 0, &available));
        if (available == 0) {  // this machine has no CUDA backend: the submission says so
          RANK_REQUIRE(std::string(gradex_last_error()).find("CUDA") != std::string::npos,
                       gradex_last_error());
          int dummy = 0;
          RANK_REQUIRE(gradex_submit_device(ctx.engine, "c", &dummy, GRADEX_DEVICE_CUDA, 0, nullptr,
                                            &h) == GRADEX_ERR_INVALID_ARGUMENT,
                       "CUDA submit without a CUDA backend");
          RANK_REQUIRE(std::string(gradex_last_error()).find("CUDA backend") != std::string::npos,
                       gradex_last_error());
        }
        uint64_t staged = 1;
        RANK_OK(gradex_get_staged_bytes(ctx.engine, 1, &staged));
        RANK_REQUIRE(staged == 0, "staged " << staged);
        return "";
      });
  EXPECT_EQ(failures(results), "");
}

TEST(EngineDevice, UnknownBackendIsAConfigError) {
  auto results = run_ranks(
      1, {"GRADEX_BACKEND=gpu"},
      [&](RankContext& ctx) -> std::string {
        gradex_engine_t* engine = nullptr;
        std::string error;
        gradex_status_t s = create_engine(ctx.rank, ctx.world, &engine, &error);
        if (engine) gradex_engine_destroy(engine);
        RANK_REQUIRE(s == GRADEX_ERR_CONFIG, "status " << s << ": " << error);
        RANK_REQUIRE(error.find("GRADEX_BACKEND") != std::string::npos, error);
        return "";
      },
      std::chrono::seconds(60), false);
  EXPECT_EQ(failures(results), "");
}
