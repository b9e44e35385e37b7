// gradex-bench plan: replays a real model's gradients (bench/models/) through the engine under
// GRADEX_POLICY=auto and prints the policy's plan: every tensor's codec with its predicted times
// (from rank 0's agreed numbers) and this rank's measured ones, then the step time measured after
// the last plan. Tensors are submitted in backward order (the profile's last tensor first), spread
// over --backward-ms, with --forward-ms of idle time between steps, so that the model has compute
// to hide communication behind (0 and 0: everything ready at once, nothing to hide behind).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <thread>

#include "base/error.h"
#include "bench/command.h"
#include "bench/gradient_gen.h"
#include "bench/launcher.h"
#include "bench/rank_stats.h"
#include "bench/result_line.h"
#include "bench/stats.h"
#include "comm/collectives.h"
#include "comm/rendezvous/store.h"
#include "sync/engine/engine.h"

namespace gradex::bench {
namespace {

struct PlanSettings {
  std::string model;
  int steps = 40;
  double backward_ms = 0;
  double forward_ms = 0;
  GradientOptions gradients;
};

void sleep_ms(double ms) {
  if (ms > 0) std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(ms));
}

int plan_rank(RankContext& ctx, const PlanSettings& s) {
  comm::Communicator& comm = ctx.comm;
  const ModelProfile model = load_model_profile(s.model);
  GradientGenerator gen(model, comm.rank(), s.gradients);
  std::vector<float> grads(static_cast<size_t>(model.total_numel));
  config::Config config = ctx.config;
  config.set("GRADEX_POLICY", "auto");
  const int interval = static_cast<int>(config.get_int("GRADEX_POLICY_INTERVAL"));
  sync::Engine engine(config, comm::make_prefix_store(ctx.store, "engine/plan/"), comm.rank(),
                      comm.size());
  std::vector<int64_t> offsets;
  int64_t offset = 0;
  for (const TensorSpec& t : model.tensors) {
    // PyTorch's layout: a weight's first dimension is its output rows.
    const uint64_t rows = t.shape.size() >= 2 ? static_cast<uint64_t>(t.shape[0]) : 0;
    engine.register_tensor(t.name, static_cast<uint64_t>(t.numel), DType::kFloat32, false, rows);
    offsets.push_back(offset);
    offset += t.numel;
  }
  const double gap_ms =
      model.tensors.empty() ? 0 : s.backward_ms / static_cast<double>(model.tensors.size());
  // Plans are made at steps 0, min(4, interval), then every multiple of the interval
  // (sync/policy/codec_planner.h): the step time is measured after the last of them.
  const int refine = std::min(4, interval);
  int last_plan = (s.steps - 1) / interval * interval;
  if (last_plan == 0 && s.steps - 1 >= refine) last_plan = refine;
  std::vector<double> times;
  std::vector<uint64_t> handles;
  for (int step = 0; step < s.steps; ++step) {
    gen.generate(step, grads.data());
    comm::barrier(comm);
    const auto t0 = std::chrono::steady_clock::now();
    handles.clear();
    for (size_t i = model.tensors.size(); i-- > 0;) {
      sleep_ms(gap_ms);  // the backward pass computing this gradient
      handles.push_back(engine.submit(model.tensors[i].name, grads.data() + offsets[i]));
    }
    for (uint64_t h : handles)
      engine.wait(h);
    engine.end_step();
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    sleep_ms(s.forward_ms);  // the next forward pass
    if (step >= last_plan && step > 0) times.push_back(seconds);
  }
  const std::vector<double> step_times = max_over_ranks(comm, times);
  if (ctx.reporter()) {
    std::printf(
        "gradex-bench plan: %s (%zu tensors, %lld parameters), %d ranks, %d steps, "
        "backward %.1f ms, forward %.1f ms\n",
        model.name.c_str(), model.tensors.size(), static_cast<long long>(model.total_numel),
        comm.size(), s.steps, s.backward_ms, s.forward_ms);
    std::printf("%s", engine.explain().c_str());
    const double median_ms = step_times.empty() ? 0 : median(step_times) * 1e3;
    std::printf(
        "measured: step %.3f ms (median over %zu steps from step %d, slowest rank), "
        "exposed beyond the backward pass %.3f ms\n",
        median_ms, step_times.size(), last_plan, median_ms - s.backward_ms);
    ResultLine result;
    result.add("model", model.name).add("ranks", comm.size()).add("steps", s.steps);
    result.add("step_ms", median_ms).add("exposed_ms", median_ms - s.backward_ms);
    std::printf("%s\n", result.str().c_str());
    std::fflush(stdout);
  }
  comm::barrier(comm);
  return 0;
}

int run_plan(const Args& args) {
  PlanSettings s;
  s.model = args.get("model");
  load_model_profile(s.model);  // fail before spawning anything
  s.steps = static_cast<int>(args.get_int("steps", 1, 1000000));
  s.backward_ms = args.get_float("backward-ms", 0.0, 1e6);
  s.forward_ms = args.get_float("forward-ms", 0.0, 1e6);
  s.gradients.seed = static_cast<uint64_t>(args.get_int("seed", 0, INT64_MAX));
  LaunchOptions launch = launch_options_from_args(args, "gradex-bench plan");
  return run_ranks(launch, [&](RankContext& ctx) { return plan_rank(ctx, s); });
}

std::vector<FlagSpec> plan_flags() {
  std::vector<FlagSpec> flags = {
      {"model", "resnet50", "gradient profile (as gradex-bench exchange)"},
      {"steps", "41", "steps to run (GRADEX_POLICY_INTERVAL decides when plans are made)"},
      {"backward-ms", "0", "the backward pass: submissions spread over this many ms"},
      {"forward-ms", "0", "idle ms between steps (the next forward pass)"},
      {"seed", "1", "seed of the synthetic gradients"},
  };
  for (FlagSpec& f : launch_flags(4))
    flags.push_back(f);
  return flags;
}

const CommandRegistration kRegistration({
    "plan",
    "GRADEX_POLICY=auto's per-tensor codec choice on a real model, predicted vs measured",
    "Runs the engine with GRADEX_POLICY=auto and prints rank 0's gradex_explain text: the agreed\n"
    "link, codec and step numbers, and per tensor its codec, why, its predicted ready / encode /\n"
    "transfer / done times and its measured time; then the measured step time after the last\n"
    "plan. Ends with RESULT model=... ranks=... steps=... step_ms=... exposed_ms=...",
    plan_flags(),
    run_plan,
});

}  // namespace
}  // namespace gradex::bench
