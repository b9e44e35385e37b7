// Every exchange mode on ranks as threads over real UCX: its output must be the average within the
// tolerance it declares, its bytes on the wire what its format implies.
#include "bench/exchange_modes.h"

#include <gtest/gtest.h>

#include <exception>
#include <mutex>
#include <thread>

#include "base/error.h"
#include "bench/average_check.h"
#include "bench/gradient_gen.h"
#include "comm/rendezvous/memory_store.h"

namespace gradex::bench {
namespace {

ModelProfile test_model() {
  return parse_model_profile("w 40 30 3 3\nb 40\nfc 10 5000\nfc.b 10\n", "test", "test");
}

// Runs `steps` steps of `mode_name` on `world` threads; returns rank 0's bytes sent per step.
double run_mode(const std::string& mode_name, int world, int steps) {
  ModelProfile model = test_model();
  auto store = std::make_shared<comm::MemoryStore>();
  config::Config config;
  comm::CommOptions options;
  options.timeout = comm::Millis(60000);
  options.ring_chunk_bytes = 4096;  // several chunks per ring step
  std::vector<double> bytes_per_step(world);
  std::vector<std::exception_ptr> errors(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      try {
        auto comm = comm::create_ucx_communicator(store, r, world, options);
        ModeContext ctx{*comm, model, config, store, mode_name};
        std::unique_ptr<ExchangeMode> mode = select_modes(mode_name)[0]->create(ctx);
        GradientGenerator gen(model, r);
        AverageChecker checker(model, world, GradientOptions{});
        std::vector<float> grads(model.total_numel);
        auto sent = [&] { return mode->bytes_sent().value_or(comm->bytes_sent()); };
        uint64_t before = sent();
        for (int step = 0; step < steps; ++step) {
          gen.generate(step, grads.data());
          mode->step(grads.data(), grads.size());
          ASSERT_TRUE(mode->tolerance().has_value());
          EXPECT_LE(checker.check(mode_name, step, grads.data(), *mode->tolerance()), 1.0);
        }
        bytes_per_step[r] = double(sent() - before) / steps;
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  }
  for (auto& t : threads)
    t.join();
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
  return bytes_per_step[0];
}

TEST(ExchangeModes, DenseModesDeliverTheAverage) {
  const double params = static_cast<double>(test_model().total_numel);
  for (int world : {2, 3}) {
    const double ring = 2.0 * (world - 1) / world * params;  // elements each rank sends
    EXPECT_NEAR(run_mode("dense_fp32", world, 3), ring * 4, ring * 0.05) << world;
    EXPECT_NEAR(run_mode("dense_fp16", world, 3), ring * 2, ring * 0.05) << world;
  }
}

// The engine's dense 16-bit route: the average within 16-bit rounding, and about a 16-bit ring's
// bytes (the engine's own communicator; its negotiation adds a little).
TEST(ExchangeModes, Engine16DeliversTheAverageOnA16BitWire) {
  const double params = static_cast<double>(test_model().total_numel);
  for (int world : {2, 3}) {
    const double ring = 2.0 * (world - 1) / world * params;
    EXPECT_NEAR(run_mode("engine16", world, 3), ring * 2, ring * 0.25) << world;
  }
}

TEST(ExchangeModes, TableAndSelection) {
  ASSERT_GE(exchange_modes().size(), 2u);
  EXPECT_EQ(exchange_modes()[0].name, "dense_fp32");
  for (const ModeSpec& m : exchange_modes()) {
    for (char c : m.name)
      EXPECT_TRUE((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_');
    EXPECT_FALSE(m.description.empty());
  }
  // "all" is every mode except the named-only ones (in_all false: reproductions of old paths).
  size_t in_all = 0;
  for (const ModeSpec& m : exchange_modes())
    in_all += m.in_all ? 1 : 0;
  EXPECT_LT(in_all, exchange_modes().size());
  EXPECT_EQ(select_modes("all").size(), in_all);
  for (const ModeSpec* m : select_modes("all"))
    EXPECT_TRUE(m->in_all);
  EXPECT_EQ(select_modes("dgc999_2round").size(), 1u);
  auto two = select_modes("dense_fp16,dense_fp32");
  ASSERT_EQ(two.size(), 2u);
  EXPECT_EQ(two[0]->name, "dense_fp16");
  EXPECT_THROW(select_modes("dense_fp8"), InvalidArgument);
  EXPECT_THROW(select_modes("dense_fp32,dense_fp32"), InvalidArgument);
  EXPECT_THROW(select_modes(""), InvalidArgument);
}

// The demo's "auto codecs" line: tensors and values per codec, and why the dense ones stayed
// dense (the sparse rungs' floor of kept values, or the cost model), read from the plan's rows.
TEST(ExchangeModes, CodecMixCountsCodecsAndWhyTensorsStayDense) {
  const std::string plan =
      "GRADEX_POLICY=auto: re-evaluated every 20 steps\n"
      "tensor  elements codec  ready_ms enc_ms comm_ms done_ms meas_ms why\n"
      "bn1.bias 64 16-bit 0.1 0.0 1.4 1.5 - least compression: not on the exposed tail, or no "
      "rung is cheaper; dense: too small for any sparse rung: dgc 90% would keep 6 < "
      "GRADEX_POLICY_MIN_SELECTED values\n"
      "l.conv 147456 16-bit 0.1 0.0 3.2 9.1 1.3 least compression: not on the exposed tail, or "
      "no rung is cheaper; dense: dgc 99.9% would keep 37 < GRADEX_POLICY_MIN_SELECTED values\n"
      "fc 2048000 dgc 99.9% 0.1 0.6 1.0 2.0 1.9 exposed tail: raised\n"
      "w 1000000 dgc 99.9% 0.1 0.6 1.0 2.0 1.9 exposed tail: raised\n";
  EXPECT_EQ(
      codec_mix_of_plan(plan),
      "16-bit 2 tensors (0.148 M values; 1 too small for any sparse rung; 1 "
      "left dense by the cost model (the link needs no more)), dgc 99.9% 2 tensors (3.05 M values)");
  EXPECT_EQ(codec_mix_of_plan("GRADEX_POLICY=fixed\ntensor x\n"), "");
}

}  // namespace
}  // namespace gradex::bench
