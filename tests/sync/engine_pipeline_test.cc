// The engine's pipeline of stages (sync/engine/pipeline.h) through real ranks: a unit's handles
// complete as soon as its own results are written (a dense bucket does not wait for a DGC tensor's
// allgather), and a round of many DGC tensors cut into several units (groups and lone tensors)
// gives, bit for bit, what each tensor's codec gives alone: every rank's payload decoded in rank
// order (the engine before the pipeline did exactly that for all tensors of a round at once).
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>

#include "capi/engine_access.h"
#include "compress/backend/dgc_codec.h"
#include "compress/dgc/compressor.h"
#include "compress/half/cast.h"
#include "compress/wire/codec.h"
#include "engine_gates.h"
#include "process_ranks.h"
#include "rank_checks.h"
#include "sync/engine/pipeline.h"

using namespace gradex::test;
using gradex::sync::pipeline::Unit;
using gradex::sync::route::Path;

// One round holds a large DGC tensor and a small dense one. The progress thread is held before the
// DGC tensor's allgather: by then the dense handle has completed with the exact average, and the
// DGC handle has not.
TEST(EnginePipeline, DenseHandleCompletesWhileSparseIsStillInFlight) {
  const int world = 2;
  const uint64_t big = 400000, small = 100;
  auto results = run_ranks(
      world, {"GRADEX_SPARSITY=0.99", "GRADEX_MOMENTUM=0", "GRADEX_FP16=0"},
      [&](RankContext& ctx) -> std::string {
        RANK_OK(gradex_register_tensor(ctx.engine, "gate", 10, GRADEX_FLOAT32, GRADEX_DEVICE_CPU));
        RANK_OK(gradex_register_tensor(ctx.engine, "big", big, GRADEX_FLOAT32, GRADEX_DEVICE_CPU));
        RANK_OK(
            gradex_register_tensor(ctx.engine, "small", small, GRADEX_FLOAT32, GRADEX_DEVICE_CPU));
        auto gates = install_gates(ctx.engine);
        gates->gate("gate");
        gates->gate("big");
        // The gate's round holds the progress thread while both tensors are submitted, so that
        // the next round has them together on every rank.
        std::vector<float> g(10, 1.0f);
        gradex_handle_t hg, hb, hs;
        RANK_OK(gradex_submit(ctx.engine, "gate", g.data(), &hg));
        RANK_REQUIRE(gates->wait_reached("gate"), "the gate's transfer never came");
        std::vector<float> b = test_vector(1, ctx.rank, 0, big);
        std::vector<float> s = test_vector(2, ctx.rank, 0, small);
        RANK_OK(gradex_submit(ctx.engine, "big", b.data(), &hb));
        RANK_OK(gradex_submit(ctx.engine, "small", s.data(), &hs));
        gates->release("gate");
        RANK_OK(gradex_wait(ctx.engine, hg));
        RANK_REQUIRE(gates->wait_reached("big"), "the DGC tensor's transfer never came");
        int small_done = 0, big_done = 0;
        RANK_OK(gradex_test(ctx.engine, hs, &small_done));
        RANK_OK(gradex_test(ctx.engine, hb, &big_done));
        gates->release("big");
        // Both buffers belong to the engine until their handles complete: wait before any check.
        if (!small_done) RANK_OK(gradex_wait(ctx.engine, hs));
        if (!big_done) RANK_OK(gradex_wait(ctx.engine, hb));
        RANK_REQUIRE(small_done == 1, "the dense handle waited for the DGC tensor's exchange");
        RANK_REQUIRE(big_done == 0, "the DGC handle completed before its payloads travelled");
        for (uint64_t i = 0; i < small; ++i) {
          const float expect = (test_value(2, 0, 0, i) + test_value(2, 1, 0, i)) / 2.0f;
          RANK_REQUIRE(s[i] == expect, "small[" << i << "] = " << s[i] << ", expected " << expect);
        }
        uint64_t nonzero = 0;
        for (float x : b)
          nonzero += x != 0;
        RANK_REQUIRE(nonzero >= big / 200 && nonzero <= 2 * big * 13 / 1000,
                     nonzero << " non-zero elements in the DGC average");
        // The round travelled as two units: the dense bucket first, then the DGC tensor.
        auto sent = gates->sent();
        RANK_REQUIRE(sent.size() == 3 && sent[1].path == Path::kDense &&
                         sent[1].keys == std::vector<std::string>{"small"} &&
                         sent[2].path == Path::kSparse,
                     sent.size() << " transfers");
        return "";
      });
  EXPECT_EQ(failures(results), "");
}

// Many DGC tensors of several sizes and dtypes in one round, cut into groups and lone tensors
// (GRADEX_SPARSE_GROUP_MB=0.1: 26,214 elements), beside a dense tensor and a DGC tensor on a dense
// step. Every DGC average equals, bit for bit, what P codecs of that tensor alone give: each
// rank's payload decoded in rank order into zeros, then cast to the tensor's dtype.
TEST(EnginePipeline, ManyDgcTensorsInOneRoundMatchEachCodecAlone) {
  const int world = 3;
  const int steps = 3;
  const uint64_t sizes[] = {3000, 7000, 12000, 30000, 150000, 4000};
  const gradex_dtype_t dtypes[] = {GRADEX_FLOAT32, GRADEX_FLOAT16, GRADEX_FLOAT32, GRADEX_BFLOAT16};
  struct Tensor {
    std::string key;
    uint64_t n;
    gradex_dtype_t dtype;
  };
  std::vector<Tensor> dgc;
  for (int i = 0; i < 22; ++i) {
    char key[8];
    std::snprintf(key, sizeof key, "t%02d", i);
    dgc.push_back({key, sizes[i % 6], dtypes[i % 4]});
  }
  auto results = run_ranks(
      world,
      {"GRADEX_SPARSITY=0.99", "GRADEX_DENSE_THRESHOLD=2000", "GRADEX_SPARSE_GROUP_MB=0.1",
       "GRADEX_SPARSITY_OVERRIDES=w.dense:0.5", "GRADEX_RING_CHUNK_KB=4"},
      [&](RankContext& ctx) -> std::string {
        namespace compress = gradex::compress;
        using compress::backend::tensor_key_id;
        auto& engine = gradex::capi::engine_of(ctx.engine);
        RANK_OK(gradex_register_tensor(ctx.engine, "gate", 10, GRADEX_FLOAT32, GRADEX_DEVICE_CPU));
        RANK_OK(gradex_register_tensor(ctx.engine, "d", 500, GRADEX_FLOAT32, GRADEX_DEVICE_CPU));
        RANK_OK(
            gradex_register_tensor(ctx.engine, "w.dense", 5000, GRADEX_FLOAT32, GRADEX_DEVICE_CPU));
        // The reference: P compressors per DGC tensor, one per rank, fed every rank's gradient,
        // their payloads encoded and accumulated in rank order.
        compress::DgcOptions dgc_options =
            compress::dgc_options_from_config(engine.config(), world);
        dgc_options.sparsity = 0.99;
        dgc_options.clip_norm = 0;
        const compress::WireOptions wire_options =
            compress::wire_options_from_config(engine.config());
        std::vector<std::vector<std::unique_ptr<compress::DgcCompressor>>> codecs(dgc.size());
        for (size_t k = 0; k < dgc.size(); ++k) {
          RANK_OK(gradex_register_tensor(ctx.engine, dgc[k].key.c_str(), dgc[k].n, dgc[k].dtype,
                                         GRADEX_DEVICE_CPU));
          for (int r = 0; r < world; ++r)
            codecs[k].push_back(std::make_unique<compress::DgcCompressor>(dgc[k].n, dgc_options));
        }
        auto gates = install_gates(ctx.engine);
        auto wire_type = [](gradex_dtype_t t) {
          return t == GRADEX_FLOAT16 ? gradex::DType::kFloat16 : gradex::DType::kBFloat16;
        };
        // A rank's gradient of tensor k as the engine sees it (16-bit tensors rounded). Mostly
        // a component all ranks share, so that their selections overlap and the order in which
        // the ranks' values are summed shows in the bits.
        auto gradient = [&](size_t k, int rank, int step) {
          std::vector<float> g = test_vector(100 + k, world, step, dgc[k].n);
          for (uint64_t i = 0; i < dgc[k].n; ++i)
            g[i] += 0.25f * test_value(100 + k, rank, step, i);
          if (dgc[k].dtype != GRADEX_FLOAT32) {
            std::vector<uint16_t> h(g.size());
            gradex::compress::half::to_half(g.data(), h.data(), g.size(), wire_type(dgc[k].dtype),
                                            1.0f);
            gradex::compress::half::from_half(h.data(), g.data(), g.size(), wire_type(dgc[k].dtype),
                                              1.0f);
          }
          return g;
        };
        for (int step = 0; step < steps; ++step) {
          gates->gate("gate");
          std::vector<float> gate(10, 1.0f), d = test_vector(7, ctx.rank, step, 500),
                                             wd = test_vector(8, ctx.rank, step, 5000);
          std::vector<std::vector<uint8_t>> buffers(dgc.size());
          gradex_handle_t hg, hd, hw;
          RANK_OK(gradex_submit(ctx.engine, "gate", gate.data(), &hg));
          RANK_REQUIRE(gates->wait_reached("gate"), "step " << step << ": no gate transfer");
          std::vector<gradex_handle_t> handles(dgc.size());
          for (size_t k = 0; k < dgc.size(); ++k) {
            std::vector<float> g = gradient(k, ctx.rank, step);
            buffers[k].resize(dgc[k].n * (dgc[k].dtype == GRADEX_FLOAT32 ? 4 : 2));
            if (dgc[k].dtype == GRADEX_FLOAT32)
              std::memcpy(buffers[k].data(), g.data(), g.size() * 4);
            else
              gradex::compress::half::to_half(g.data(),
                                              reinterpret_cast<uint16_t*>(buffers[k].data()),
                                              g.size(), wire_type(dgc[k].dtype), 1.0f);
            RANK_OK(gradex_submit(ctx.engine, dgc[k].key.c_str(), buffers[k].data(), &handles[k]));
          }
          RANK_OK(gradex_submit(ctx.engine, "d", d.data(), &hd));
          RANK_OK(gradex_submit(ctx.engine, "w.dense", wd.data(), &hw));
          gates->release("gate");
          RANK_OK(gradex_wait(ctx.engine, hg));
          for (size_t k = 0; k < dgc.size(); ++k)
            RANK_OK(gradex_wait(ctx.engine, handles[k]));
          RANK_OK(gradex_wait(ctx.engine, hd));
          RANK_OK(gradex_wait(ctx.engine, hw));
          RANK_OK(gradex_end_step(ctx.engine, nullptr));

          for (size_t k = 0; k < dgc.size(); ++k) {
            std::vector<std::vector<uint8_t>> payloads(world);
            for (int r = 0; r < world; ++r) {
              std::vector<float> g = gradient(k, r, step);
              codecs[k][r]->set_step(step);
              payloads[r] = compress::wire::encode(codecs[k][r]->step(g.data(), 1.0f),
                                                   tensor_key_id(dgc[k].key), wire_options);
            }
            std::vector<float> sum(dgc[k].n, 0.0f);
            for (int r = 0; r < world; ++r)
              compress::wire::accumulate(
                  compress::wire::decode(payloads[r].data(), payloads[r].size()), sum.data(),
                  sum.size(), 1.0f / static_cast<float>(world));
            std::vector<uint8_t> expect(buffers[k].size());
            if (dgc[k].dtype == GRADEX_FLOAT32)
              std::memcpy(expect.data(), sum.data(), expect.size());
            else
              gradex::compress::half::to_half(sum.data(),
                                              reinterpret_cast<uint16_t*>(expect.data()),
                                              sum.size(), wire_type(dgc[k].dtype), 1.0f);
            RANK_REQUIRE(expect == buffers[k], "step " << step << ": '" << dgc[k].key
                                                       << "' differs from its codec alone");
          }
        }
        gradex_stats_t s;
        RANK_OK(gradex_get_stats(ctx.engine, 0, &s));
        RANK_REQUIRE(s.sparse_exchanges == dgc.size() * steps && s.dense_fallbacks == steps,
                     "sparse " << s.sparse_exchanges << ", fallbacks " << s.dense_fallbacks);
        // The last round travelled as one dense bucket, then DGC units in key order: some groups,
        // some lone tensors, together every DGC tensor once.
        auto sent = gates->sent();
        std::vector<std::string> order;
        size_t groups = 0, lone = 0, first = sent.size();
        while (first > 0 && sent[first - 1].path == Path::kSparse)
          --first;
        RANK_REQUIRE(first >= 1 && sent[first - 1].path == Path::kDense &&
                         sent[first - 1].keys == (std::vector<std::string>{"d", "w.dense"}),
                     "the dense bucket did not travel first");
        for (size_t i = first; i < sent.size(); ++i) {
          (sent[i].keys.size() > 1 ? groups : lone) += 1;
          order.insert(order.end(), sent[i].keys.begin(), sent[i].keys.end());
        }
        std::vector<std::string> keys;
        for (const Tensor& t : dgc)
          keys.push_back(t.key);
        RANK_REQUIRE(order == keys, "DGC units out of key order");
        RANK_REQUIRE(groups >= 2 && lone >= 2, groups << " groups, " << lone << " lone tensors");
        return "";
      },
      std::chrono::seconds(240));
  EXPECT_EQ(failures(results), "");
}

// Ranks that would cut a round into different units (here: different GRADEX_SPARSE_GROUP_MB)
// would issue different collectives: the start-up agreement (sync/negotiation/agreement.h) refuses
// them on every rank, naming the variable, before any unit travels.
TEST(EnginePipeline, DifferentSparseGroupsFailOnEveryRank) {
  auto results = run_ranks(
      2,
      {"GRADEX_SPARSITY=0.99", "GRADEX_DENSE_THRESHOLD=1000", "GRADEX_TIMEOUT_S=5",
       "GRADEX_STALL_WARN_S=0"},
      [&](RankContext& ctx) -> std::string {
        ::setenv("GRADEX_SPARSE_GROUP_MB", ctx.rank == 0 ? "1000" : "0", 1);
        std::string error;
        const gradex_status_t st = create_engine(ctx.rank, ctx.world, &ctx.engine, &error);
        RANK_REQUIRE(st == GRADEX_ERR_CONFIG, "status " << st << ": " << error);
        RANK_REQUIRE(error.find("GRADEX_SPARSE_GROUP_MB: '1000' on ranks [0], '0' on ranks [1]") !=
                         std::string::npos,
                     error);
        return "";
      },
      std::chrono::seconds(60), /*create_engine=*/false);
  EXPECT_EQ(failures(results), "");
}
