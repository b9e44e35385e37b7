// gradex-bench exchange: replays a real model's gradients (bench/models/) through every exchange
// mode and reports, per mode: median and mean step time (slowest rank per step, over the measured
// steps after warm-up), bytes on the wire per step per rank (the communicator's bytes_sent), the
// dense fp32 ring's bytes for the same gradients and the compression ratio against it, and CPU time
// per step. Each mode's output is checked against the exact average on the first and last step.
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <optional>
#include <thread>

#include "base/error.h"
#include "bench/average_check.h"
#include "bench/command.h"
#include "bench/exchange_modes.h"
#include "bench/gradient_gen.h"
#include "bench/launcher.h"
#include "bench/rank_stats.h"
#include "bench/result_line.h"
#include "bench/stats.h"
#include "comm/collectives.h"
#include "comm/communicator.h"

namespace gradex::bench {
namespace {

struct ExchangeSettings {
  std::string model;
  std::vector<const ModeSpec*> modes;
  int steps = 20;
  // The auto policy re-plans from measured steps at its interval (GRADEX_POLICY_INTERVAL, 20):
  // with fewer unmeasured steps, auto's row mixed the start-up plan's steps with the next plan's
  // and named only the latter (measured once: 2.6x at 144 ms beside a final plan of 60x).
  int warmup = 20;
  double idle_s = 2;        // 0: no idle measurement
  bool interleave = false;  // the modes take turns step by step instead of one after another
  int submit_groups = 1;    // ModeContext::submit_groups
  double group_gap_ms = 0;
  double skew_ms = 0;  // ModeContext::skew_ms
  GradientOptions gradients;
};

// CPU an exchange engine burns while nothing is pending, per rank, as a share of one core.
struct IdleReport {
  double engine_pct = 0;     // an engine open after two steps, nothing submitted
  double no_engine_pct = 0;  // the same process with no engine, the same span: the floor
};

struct ModeReport {
  std::string name;
  double median_ms = 0, mean_ms = 0, cpu_ms = 0;
  double wire_bytes = 0;   // per step per rank, mean over ranks
  double check_error = 0;  // worst |error| / tolerance over the checks (0: not an average)
  double control_bytes =
      -1;                 // negotiation bytes per step per rank (-1: the mode does not negotiate)
  std::string codec_mix;  // this rank's (ExchangeMode::codec_mix)
};

// "[exchange] dense_fp16 step 7/25": rewritten in place on a terminal, one line per mode otherwise.
class Progress {
 public:
  explicit Progress(bool enabled) : enabled_(enabled), tty_(isatty(2) != 0) {}
  void update(const std::string& mode, int step, int total) {
    if (!enabled_) return;
    if (tty_) {
      std::cerr << "\r[exchange] " << mode << " step " << step + 1 << "/" << total << "   "
                << std::flush;
    } else if (step == 0) {
      std::cerr << "[exchange] " << mode << ": " << total << " steps" << std::endl;
    }
  }
  void done() {
    if (enabled_ && tty_) std::cerr << "\r\033[K" << std::flush;
  }

 private:
  bool enabled_, tty_;
};

// One mode's engine and what its measured steps gave.
struct ModeRun {
  const ModeSpec* spec = nullptr;
  std::unique_ptr<ExchangeMode> mode;
  std::optional<Tolerance> tolerance;
  std::vector<double> times, cpus, bytes, control;
  double check_error = 0;
};

ModeRun start_mode(RankContext& ctx, const ModeSpec& spec, const ModelProfile& model,
                   const ExchangeSettings& s) {
  ModeContext mode_ctx{ctx.comm,  model,           ctx.config,     ctx.store,
                       spec.name, s.submit_groups, s.group_gap_ms, s.skew_ms};
  ModeRun run;
  run.spec = &spec;
  run.mode = spec.create(mode_ctx);
  run.tolerance = run.mode->tolerance();
  return run;
}

void run_step(RankContext& ctx, ModeRun& run, int step, const ExchangeSettings& s,
              const GradientGenerator& gen, const AverageChecker& checker,
              std::vector<float>& grads) {
  comm::Communicator& comm = ctx.comm;
  ExchangeMode& mode = *run.mode;
  const int total = s.warmup + s.steps;
  gen.generate(step, grads.data());  // not timed: the gradients come from the backward pass
  comm::barrier(comm);
  const uint64_t bytes0 = mode.bytes_sent().value_or(comm.bytes_sent());
  const uint64_t control0 = mode.control_bytes().value_or(0);
  const double cpu0 = process_cpu_seconds(), t0 = wall_seconds();
  mode.step(grads.data(), grads.size());
  const double t1 = wall_seconds(), cpu1 = process_cpu_seconds();
  const uint64_t bytes1 = mode.bytes_sent().value_or(comm.bytes_sent());
  const uint64_t control1 = mode.control_bytes().value_or(0);
  if (run.tolerance && (step == 0 || step == total - 1)) {
    run.check_error = std::max(run.check_error,
                               checker.check(run.spec->name, step, grads.data(), *run.tolerance));
  }
  if (step < s.warmup) return;
  run.times.push_back(t1 - t0);
  run.cpus.push_back(cpu1 - cpu0);
  run.bytes.push_back(static_cast<double>(bytes1 - bytes0));
  run.control.push_back(static_cast<double>(control1 - control0));
}

ModeReport finish_mode(RankContext& ctx, ModeRun& run) {
  comm::Communicator& comm = ctx.comm;
  ModeReport report;
  report.name = run.spec->name;
  std::vector<double> step_times = max_over_ranks(comm, run.times);  // a step ends on its slowest
  report.median_ms = median(step_times) * 1e3;
  report.mean_ms = mean(step_times) * 1e3;
  report.cpu_ms = mean(mean_over_ranks(comm, run.cpus)) * 1e3;
  report.wire_bytes = mean(mean_over_ranks(comm, run.bytes));
  report.check_error = maximum(max_over_ranks(comm, {run.check_error}));
  if (run.mode->control_bytes()) report.control_bytes = mean(mean_over_ranks(comm, run.control));
  report.codec_mix = run.mode->codec_mix();  // every rank holds the same plan
  return report;
}

// Process CPU over `seconds` of sleep on every rank (from a common barrier), as % of one core.
double idle_cpu_pct(comm::Communicator& comm, double seconds) {
  comm::barrier(comm);
  const double cpu0 = process_cpu_seconds(), t0 = wall_seconds();
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  const double pct = (process_cpu_seconds() - cpu0) / (wall_seconds() - t0) * 100.0;
  return mean(mean_over_ranks(comm, {pct}));
}

// The engine of the fixed policy (its steady state from the first step), warmed by two steps, then
// left idle; the floor is measured first in the same process so that the two figures stand side by
// side.
IdleReport measure_idle(RankContext& ctx, const ModelProfile& model, const ExchangeSettings& s,
                        const GradientGenerator& gen, std::vector<float>& grads) {
  IdleReport report;
  report.no_engine_pct = idle_cpu_pct(ctx.comm, s.idle_s);
  const ModeSpec* spec = select_modes("fixed").front();
  ModeContext mode_ctx{ctx.comm, model, ctx.config, ctx.store, "idle"};
  std::unique_ptr<ExchangeMode> mode = spec->create(mode_ctx);
  for (int step = 0; step < 2; ++step) {
    gen.generate(step, grads.data());
    mode->step(grads.data(), grads.size());
  }
  report.engine_pct = idle_cpu_pct(ctx.comm, s.idle_s);
  comm::barrier(ctx.comm);  // nobody closes its engine while another still measures
  return report;
}

void print_report(const RankContext& ctx, const ModelProfile& model, const ExchangeSettings& s,
                  const std::vector<ModeReport>& reports, const std::optional<IdleReport>& idle) {
  const double p = ctx.comm.size();
  const double dense_bytes = 2.0 * (p - 1) / p * static_cast<double>(model.total_numel) * 4.0;
  std::printf("%-12s %10s %10s %12s %12s %8s %10s %9s\n", "mode", "median_ms", "mean_ms", "wire_MB",
              "dense_MB", "ratio", "cpu_ms", "check");
  ResultLine result;
  result.add("model", model.name).add("params", model.total_numel);
  result.add("tensors", static_cast<int64_t>(model.tensors.size()));
  result.add("ranks", ctx.comm.size()).add("steps", s.steps);
  result.add("dense_bytes", static_cast<int64_t>(std::llround(dense_bytes)));
  for (const ModeReport& r : reports) {
    double ratio = dense_bytes / r.wire_bytes;
    std::printf("%-12s %10.2f %10.2f %12.2f %12.2f %8.3f %10.2f %9.3f\n", r.name.c_str(),
                r.median_ms, r.mean_ms, r.wire_bytes / 1e6, dense_bytes / 1e6, ratio, r.cpu_ms,
                r.check_error);
    result.add(r.name + "_step_ms", r.median_ms).add(r.name + "_mean_ms", r.mean_ms);
    result.add(r.name + "_wire_bytes", static_cast<int64_t>(std::llround(r.wire_bytes)));
    result.add(r.name + "_ratio", ratio);
    result.add(r.name + "_cpu_ms", r.cpu_ms);
  }
  // Negotiation messages (part of wire_MB), per step and rank, for the modes that negotiate.
  std::string control_line;
  for (const ModeReport& r : reports) {
    if (r.control_bytes < 0) continue;
    const auto bytes = static_cast<int64_t>(std::llround(r.control_bytes));
    control_line += " " + r.name + " " + std::to_string(bytes);
    result.add(r.name + "_control_bytes", bytes);
    if (r.name == "auto") result.add("control_bytes_per_step", bytes);
  }
  if (!control_line.empty())
    std::printf("negotiation bytes per step and rank:%s\n", control_line.c_str());
  if (idle) {
    std::printf("idle engine: %.2f%% of a core per rank (no engine: %.2f%%) over %.1f s\n",
                idle->engine_pct, idle->no_engine_pct, s.idle_s);
    result.add("idle_cpu_pct", idle->engine_pct);
    result.add("idle_cpu_pct_no_engine", idle->no_engine_pct);
  }
  std::printf(
      "(per step and rank; wire = bytes sent, dense = an fp32 ring's 2(P-1)/P x 4 bytes x "
      "params, ratio = dense / wire, check = worst error / tolerance vs the exact "
      "average)\n");
  for (const ModeReport& r : reports)
    if (!r.codec_mix.empty()) std::printf("%s codecs: %s\n", r.name.c_str(), r.codec_mix.c_str());
  for (const ModeReport& r : reports) {
    if (r.name.rfind("auto", 0) != 0) continue;
    std::printf(
        "auto = the default policy past its early-training ramp, auto_ramp = inside it; "
        "`gradex-bench plan --model %s` prints each tensor's choice and why\n",
        model.name.c_str());
    break;
  }
  std::printf("%s\n", result.str().c_str());
  std::fflush(stdout);
}

int exchange_rank(RankContext& ctx, const ExchangeSettings& s) {
  comm::Communicator& comm = ctx.comm;
  if (comm.size() < 2) throw InvalidArgument("exchange needs at least 2 ranks");
  ModelProfile model = load_model_profile(s.model);
  GradientGenerator gen(model, comm.rank(), s.gradients);
  AverageChecker checker(model, comm.size(), s.gradients);
  std::vector<float> grads(static_cast<size_t>(model.total_numel));
  if (ctx.reporter()) {
    std::printf(
        "gradex-bench exchange: %s (%zu tensors, %lld parameters), %d ranks on %u cores, "
        "%d steps after %d warm-up\n",
        model.name.c_str(), model.tensors.size(), static_cast<long long>(model.total_numel),
        comm.size(), std::thread::hardware_concurrency(), s.steps, s.warmup);
    std::fflush(stdout);
  }
  Progress progress(ctx.reporter());
  std::vector<ModeReport> reports;
  const int total = s.warmup + s.steps;
  if (s.interleave) {
    // Every mode's engine open at once; step k of every mode before step k + 1 of any, so that
    // load that drifts during the run falls on all modes alike, starting at mode k mod n (the
    // first mode of a round was seen to pay for the previous round's leftovers).
    std::vector<ModeRun> runs;
    for (const ModeSpec* spec : s.modes)
      runs.push_back(start_mode(ctx, *spec, model, s));
    for (int step = 0; step < total; ++step) {
      progress.update("interleaved", step, total);
      for (size_t i = 0; i < runs.size(); ++i)
        run_step(ctx, runs[(static_cast<size_t>(step) + i) % runs.size()], step, s, gen, checker,
                 grads);
    }
    progress.done();
    for (ModeRun& run : runs)
      reports.push_back(finish_mode(ctx, run));
    runs.clear();
  } else {
    for (const ModeSpec* spec : s.modes) {
      ModeRun run = start_mode(ctx, *spec, model, s);
      for (int step = 0; step < total; ++step) {
        progress.update(spec->name, step, total);
        run_step(ctx, run, step, s, gen, checker, grads);
      }
      progress.done();
      reports.push_back(finish_mode(ctx, run));
    }
  }
  std::optional<IdleReport> idle;
  if (s.idle_s > 0) {
    if (ctx.reporter()) std::cerr << "[exchange] idle engine, " << s.idle_s << " s" << std::endl;
    idle = measure_idle(ctx, model, s, gen, grads);
  }
  if (ctx.reporter()) print_report(ctx, model, s, reports, idle);
  return 0;
}

int run_exchange(const Args& args) {
  if (args.get_switch("print-config")) {
    const auto config = config::Config::from_environment();
    std::printf("%s%s", config.describe().c_str(), comm::describe_seal_setting(config).c_str());
    return 0;
  }
  ExchangeSettings s;
  s.model = args.get("model");
  load_model_profile(s.model);  // fail before spawning anything
  s.modes = select_modes(args.get("modes"));
  s.steps = static_cast<int>(args.get_int("steps", 1, 1000000));
  s.warmup = static_cast<int>(args.get_int("warmup", 0, 1000000));
  s.idle_s = args.get_float("idle-s", 0.0, 3600.0);
  s.interleave = args.get_switch("interleave");
  s.submit_groups = static_cast<int>(args.get_int("groups", 1, 1000000));
  s.group_gap_ms = args.get_float("group-gap-ms", 0.0, 60000.0);
  s.skew_ms = args.get_float("skew-ms", 0.0, 60000.0);
  s.gradients.seed = static_cast<uint64_t>(args.get_int("seed", 0, INT64_MAX));
  s.gradients.shared_fraction = args.get_float("shared-fraction", 0.0, 1.0);
  LaunchOptions launch = launch_options_from_args(args, "gradex-bench exchange");
  return run_ranks(launch, [&](RankContext& ctx) { return exchange_rank(ctx, s); });
}

std::vector<FlagSpec> exchange_flags() {
  std::string models;
  for (const std::string& n : builtin_model_names())
    models += (models.empty() ? "" : ", ") + n;
  std::string modes;
  for (const ModeSpec& m : exchange_modes())
    modes += (modes.empty() ? "" : ", ") + m.name;
  std::vector<FlagSpec> flags = {
      {"model", "resnet50", "gradient profile: " + models + ", or a profile file path"},
      {"modes", "all", "comma-separated modes to run (" + modes + ")"},
      {"steps", "20", "measured steps per mode"},
      {"warmup", "20",
       "unmeasured steps per mode before them (the auto policy's re-plan interval)"},
      {"seed", "1", "seed of the synthetic gradients"},
      {"idle-s", "2", "seconds of idle engine whose CPU is measured (0: skip)"},
      {"shared-fraction", "0.3", "share of the gradient variance common to all ranks"},
      {"groups", "1",
       "the engine's modes submit a step's tensors in this many groups of consecutive tensors, as "
       "a framework's buckets come out of the backward pass"},
      {"group-gap-ms", "0", "milliseconds between those groups (compute between buckets)"},
      {"skew-ms", "0",
       "the engine's modes: rank r hands a step's first tensors over r times this many "
       "milliseconds after rank 0 (ranks reaching a step's end apart, as ranks sharing cores do)"},
      {"interleave", "",
       "open every mode's engine at once and run them step by step in turn (ratios between "
       "modes on a noisy machine)",
       true},
      {"print-config", "", "print the effective GRADEX_* configuration and exit", true},
  };
  for (FlagSpec& f : launch_flags(4))
    flags.push_back(f);
  return flags;
}

std::string exchange_details() {
  std::string out = "Modes:\n";
  for (const ModeSpec& m : exchange_modes())
    if (m.in_all) out += "  " + m.name + ": " + m.description + "\n";
  out += "Modes run only when named in --modes:\n";
  for (const ModeSpec& m : exchange_modes())
    if (!m.in_all) out += "  " + m.name + ": " + m.description + "\n";
  out +=
      "Ends with RESULT model=... params=... ranks=... and, for every mode, <mode>_step_ms=...\n"
      "<mode>_mean_ms=... <mode>_wire_bytes=... <mode>_ratio=... <mode>_cpu_ms=...\n"
      "<mode>_control_bytes=... for the engine's modes (negotiation bytes per step and rank, part "
      "of wire_bytes), control_bytes_per_step=... (the same for auto)\n"
      "idle_cpu_pct=... (the default engine's CPU, % of a core per rank, while nothing is "
      "pending)\n"
      "idle_cpu_pct_no_engine=... (the same process without an engine, measured just before).";
  return out;
}

const CommandRegistration kRegistration({
    "exchange",
    "per-step gradient exchange of a real model's gradients, for every exchange mode",
    exchange_details(),
    exchange_flags(),
    run_exchange,
});

}  // namespace
}  // namespace gradex::bench
