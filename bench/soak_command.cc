// gradex-bench soak: an endurance run. Replays a small model's gradients through one exchange mode
// (default: the engine's own policy, DGC for large tensors and fused fp16 for small ones) for many
// steps and watches each rank's resident memory and open file descriptors: after the warm-up
// neither may keep growing. Reports, per rank and as the worst over ranks, RSS and fd count at the
// end of the warm-up and at the end, and the largest RSS seen in between.
#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <string>

#include "base/error.h"
#include "bench/command.h"
#include "bench/exchange_modes.h"
#include "bench/gradient_gen.h"
#include "bench/launcher.h"
#include "bench/rank_stats.h"
#include "bench/result_line.h"
#include "bench/stats.h"

namespace gradex::bench {
namespace {

// A small CNN-like profile (~101 K parameters): six 128x128 weights (DGC at the default
// GRADEX_DENSE_THRESHOLD of 16384) and eight small tensors (fused dense fp16).
const char* const kSmallProfile =
    "# soak: a small model\n"
    "l0.weight 128 128\nl0.bias 128\nl1.weight 128 128\nl1.bias 128\nl2.weight 128 128\n"
    "l2.bias 128\nl3.weight 128 128\nl3.bias 128\nl4.weight 128 128\nl4.bias 128\n"
    "l5.weight 128 128\nl5.bias 128\nhead.weight 10 100\nhead.bias 1000\n";

// Resident set size of this process in KiB (VmRSS).
int64_t rss_kib() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6));
  throw InternalError("no VmRSS in /proc/self/status");
}

int64_t open_fds() {
  DIR* d = opendir("/proc/self/fd");
  if (!d) throw InternalError("cannot list /proc/self/fd");
  int64_t n = 0;
  while (dirent* e = readdir(d))
    if (e->d_name[0] != '.') ++n;
  closedir(d);
  return n - 1;  // the directory stream itself
}

struct SoakSettings {
  std::string model, mode;
  int steps = 20000, warmup = 1000, sample_every = 1000;
};

int soak_rank(RankContext& ctx, const SoakSettings& s) {
  comm::Communicator& comm = ctx.comm;
  ModelProfile model = s.model == "small" ? parse_model_profile(kSmallProfile, "soak", "small")
                                          : load_model_profile(s.model);
  const ModeSpec* spec = select_modes(s.mode).at(0);
  ModeContext mode_ctx{comm, model, ctx.config, ctx.store, spec->name};
  std::unique_ptr<ExchangeMode> mode = spec->create(mode_ctx);
  GradientGenerator gen(model, comm.rank(), {});
  std::vector<float> grads(static_cast<size_t>(model.total_numel));
  int64_t rss_warm = 0, fds_warm = 0, rss_peak = 0;
  const double t0 = wall_seconds();
  for (int step = 0; step < s.warmup + s.steps; ++step) {
    gen.generate(step % 64, grads.data());
    mode->step(grads.data(), grads.size());
    if (step + 1 == s.warmup) {
      rss_warm = rss_kib();
      fds_warm = open_fds();
    }
    if (step + 1 > s.warmup && (step + 1 - s.warmup) % s.sample_every == 0) {
      rss_peak = std::max(rss_peak, rss_kib());
      if (ctx.reporter()) {
        std::fprintf(stderr, "[soak] step %d: rss %lld KiB, %lld fds\n", step + 1,
                     static_cast<long long>(rss_kib()), static_cast<long long>(open_fds()));
      }
    }
  }
  const double seconds = wall_seconds() - t0;
  const int64_t rss_end = rss_kib(), fds_end = open_fds();
  std::vector<double> growth = max_over_ranks(
      comm, {static_cast<double>(rss_end - rss_warm), static_cast<double>(rss_peak - rss_warm),
             static_cast<double>(fds_end - fds_warm), static_cast<double>(rss_end),
             static_cast<double>(fds_end)});
  std::vector<double> warm =
      max_over_ranks(comm, {static_cast<double>(rss_warm), static_cast<double>(fds_warm)});
  if (ctx.reporter()) {
    std::printf(
        "gradex-bench soak: %s (%lld parameters), mode %s, %d ranks, %d steps after %d warm-up, "
        "%.0f s\n",
        model.name.c_str(), static_cast<long long>(model.total_numel), spec->name.c_str(),
        comm.size(), s.steps, s.warmup, seconds);
    std::printf(
        "worst rank: RSS %.0f KiB after warm-up, %.0f KiB at the end: growth %.0f KiB "
        "(peak growth %.0f KiB); fds %.0f -> %.0f (growth %.0f)\n",
        warm[0], growth[3], growth[0], growth[1], warm[1], growth[4], growth[2]);
    ResultLine r;
    r.add("model", model.name).add("mode", spec->name).add("ranks", comm.size());
    r.add("steps", s.steps).add("warmup", s.warmup).add("seconds", seconds);
    r.add("rss_growth_kib", static_cast<int64_t>(growth[0]));
    r.add("rss_peak_growth_kib", static_cast<int64_t>(growth[1]));
    r.add("fd_growth", static_cast<int64_t>(growth[2]));
    r.add("rss_end_kib", static_cast<int64_t>(growth[3]));
    r.add("fds_end", static_cast<int64_t>(growth[4]));
    std::printf("%s\n", r.str().c_str());
    std::fflush(stdout);
  }
  return 0;
}

int run_soak(const Args& args) {
  SoakSettings s;
  s.model = args.get("model");
  if (s.model != "small") load_model_profile(s.model);
  s.mode = args.get("mode");
  if (select_modes(s.mode).size() != 1) throw InvalidArgument("--mode takes exactly one mode");
  s.steps = static_cast<int>(args.get_int("steps", 1, 100000000));
  s.warmup = static_cast<int>(args.get_int("warmup", 1, 100000000));
  s.sample_every = static_cast<int>(args.get_int("sample-every", 1, 100000000));
  LaunchOptions launch = launch_options_from_args(args, "gradex-bench soak");
  return run_ranks(launch, [&](RankContext& ctx) { return soak_rank(ctx, s); });
}

std::vector<FlagSpec> soak_flags() {
  std::vector<FlagSpec> flags = {
      {"model", "small",
       "gradient profile: 'small' (~101 K parameters, built in), a built-in "
       "model name or a profile file"},
      {"mode", "auto", "the exchange mode (see gradex-bench exchange --help)"},
      {"steps", "20000", "steps after the warm-up"},
      {"warmup", "1000", "steps before the baseline is taken (allocators and caches settle)"},
      {"sample-every", "1000", "steps between RSS samples"},
  };
  for (FlagSpec& f : launch_flags(2))
    flags.push_back(f);
  for (FlagSpec& f : flags)
    if (f.name == "deadline-s") f.default_value = "7200";
  return flags;
}

const CommandRegistration kRegistration({
    "soak",
    "endurance: RSS and open-fd growth over 20,000 exchange steps of a small model",
    "Ends with RESULT rss_growth_kib=... rss_peak_growth_kib=... fd_growth=... (worst rank;\n"
    "growth = end minus the value after the warm-up).",
    soak_flags(),
    run_soak,
});

}  // namespace
}  // namespace gradex::bench
