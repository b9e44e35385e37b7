// gradex-bench allgather: the ring allgatherv, the direct allgatherv (two rounds: sizes, then
// payloads) and allgatherv_inline (one round trip up to GRADEX_ALLGATHER_INLINE_KB, the direct
// exchange above), side by side, at the payload sizes of sparse (DGC) exchanges and negotiation.
//
// Every rank contributes `bytes` bytes. Per size, the collectives alternate call by call (so
// that all see the same network and load); the time of a call is the slowest rank's, from a
// barrier to the call's return. Each collective is verified once per size before timing.
// 176 KiB is about one rank's DGC payload of a ResNet-50 step at 99.9% sparsity: `gradex-bench
// exchange` reports dgc999_wire_bytes ~ 497 kB per rank at 4 ranks, i.e. 3 copies of ~165 kB.
#include <algorithm>
#include <cstdio>
#include <iostream>

#include "base/error.h"
#include "bench/command.h"
#include "bench/launcher.h"
#include "bench/rank_stats.h"
#include "bench/result_line.h"
#include "bench/stats.h"
#include "comm/collectives.h"

namespace gradex::bench {
namespace {

using Collective = std::vector<comm::Bytes> (*)(comm::Communicator&, const void*, size_t);

uint8_t byte_of(int rank, size_t i) {
  return static_cast<uint8_t>(rank * 29 + i * 7 + (i >> 10));
}

void verify(comm::Communicator& comm, Collective fn, const std::vector<uint8_t>& mine,
            const char* name) {
  auto all = fn(comm, mine.data(), mine.size());
  for (int r = 0; r < comm.size(); ++r) {
    const comm::Bytes& p = all[static_cast<size_t>(r)];
    if (p.size() != mine.size())
      throw InternalError(std::string(name) + ": payload of rank " + std::to_string(r) + " has " +
                          std::to_string(p.size()) + " bytes, expected " +
                          std::to_string(mine.size()));
    for (size_t i = 0; i < p.size(); i += 997)
      if (p[i] != byte_of(r, i))
        throw InternalError(std::string(name) + ": payload of rank " + std::to_string(r) +
                            " wrong at byte " + std::to_string(i));
  }
}

// allgatherv_inline at the communicator's inline maximum, payloads above it directly.
std::vector<comm::Bytes> inline_allgatherv(comm::Communicator& comm, const void* data,
                                           size_t bytes) {
  std::vector<comm::Bytes> result;
  comm::AllgathervOptions options;
  options.inline_max_bytes = comm.options().allgather_inline_bytes;
  comm::allgatherv_inline(comm, data, bytes, result, options);
  return result;
}

// Seconds of one call on this rank, from a common barrier.
double timed_call(comm::Communicator& comm, Collective fn, const std::vector<uint8_t>& mine) {
  comm::barrier(comm);
  const double start = wall_seconds();
  fn(comm, mine.data(), mine.size());
  return wall_seconds() - start;
}

int run_allgather(const Args& args) {
  const int64_t min_bytes = args.get_bytes("min-bytes", 1, int64_t{1} << 30);
  const int64_t max_bytes = args.get_bytes("max-bytes", min_bytes, int64_t{1} << 30);
  const int64_t flag_iters = args.get_int("iters", 1, 100000);
  const std::string only = args.get("only");
  if (only != "both" && only != "all" && only != "direct" && only != "ring" && only != "inline")
    throw InvalidArgument("--only must be all, both, direct, ring or inline, got '" + only + "'");
  const bool run_direct = only == "all" || only == "both" || only == "direct";
  const bool run_ring = only == "all" || only == "both" || only == "ring";
  const bool run_inline = only == "all" || only == "inline";
  LaunchOptions launch = launch_options_from_args(args, "gradex-bench allgather");

  return run_ranks(launch, [&](RankContext& ctx) {
    comm::Communicator& comm = ctx.comm;
    if (comm.size() < 2) throw InvalidArgument("allgather needs at least 2 ranks");
    if (ctx.reporter()) {
      std::printf(
          "gradex-bench allgather: %d ranks, ring vs direct (two-round) vs inline (one round "
          "trip up to %zu bytes) allgatherv, slowest rank\n",
          comm.size(), comm.options().allgather_inline_bytes);
      std::printf("%10s %6s %12s %12s %12s %12s %13s\n", "bytes", "iters", "direct_ms", "ring_ms",
                  "inline_ms", "direct/ring", "direct/inline");
      std::fflush(stdout);
    }
    ResultLine result;
    double ratio_at_min = 0;
    for (int64_t b = min_bytes; b <= max_bytes; b *= 2) {
      std::vector<uint8_t> mine(static_cast<size_t>(b));
      for (size_t i = 0; i < mine.size(); ++i)
        mine[i] = byte_of(comm.rank(), i);
      if (run_direct) verify(comm, comm::allgatherv, mine, "allgatherv");  // also the warm-up
      if (run_ring) verify(comm, comm::ring_allgatherv, mine, "ring_allgatherv");
      if (run_inline) verify(comm, inline_allgatherv, mine, "allgatherv_inline");
      if (ctx.reporter())
        std::cerr << "[allgather] " << format_bytes(b) << " x " << flag_iters << "\n";
      std::vector<double> direct, ring, inlined;
      for (int64_t i = 0; i < flag_iters; ++i) {
        direct.push_back(run_direct ? timed_call(comm, comm::allgatherv, mine) : 0.0);
        ring.push_back(run_ring ? timed_call(comm, comm::ring_allgatherv, mine) : 0.0);
        inlined.push_back(run_inline ? timed_call(comm, inline_allgatherv, mine) : 0.0);
      }
      // Slowest rank per call, then the median over calls (robust to a stray hiccup).
      std::vector<double> mine_times = direct;
      mine_times.insert(mine_times.end(), ring.begin(), ring.end());
      mine_times.insert(mine_times.end(), inlined.begin(), inlined.end());
      std::vector<double> slowest = max_over_ranks(comm, mine_times);
      const double d = median({slowest.begin(), slowest.begin() + flag_iters});
      const double r = median({slowest.begin() + flag_iters, slowest.begin() + 2 * flag_iters});
      const double n = median({slowest.begin() + 2 * flag_iters, slowest.end()});
      if (!ctx.reporter()) continue;
      auto cell = [](bool ran, double v) { return ran ? format_number(v) : std::string("-"); };
      std::printf("%10s %6lld %12s %12s %12s %12s %13s\n", format_bytes(b).c_str(),
                  static_cast<long long>(flag_iters), cell(run_direct, d * 1e3).c_str(),
                  cell(run_ring, r * 1e3).c_str(), cell(run_inline, n * 1e3).c_str(),
                  cell(run_direct && run_ring, d / r).c_str(),
                  cell(run_direct && run_inline, d / n).c_str());
      std::fflush(stdout);
      std::string key = format_bytes(b);
      key.erase(std::remove(key.begin(), key.end(), ' '), key.end());
      if (run_direct) result.add("direct_" + key + "_ms", d * 1e3);
      if (run_ring) result.add("ring_" + key + "_ms", r * 1e3);
      if (run_inline) result.add("inline_" + key + "_ms", n * 1e3);
      if (run_direct && run_inline) result.add("direct_over_inline_" + key, d / n);
      if (b == min_bytes && run_direct && run_ring) ratio_at_min = d / r;
    }
    if (!ctx.reporter()) return 0;
    if (ratio_at_min > 0) result.add("direct_over_ring_min_bytes", ratio_at_min);
    result.add("ranks", comm.size());
    std::printf("%s\n", result.str().c_str());
    std::fflush(stdout);
    return 0;
  });
}

std::vector<FlagSpec> allgather_flags() {
  std::vector<FlagSpec> flags = {
      {"min-bytes", "88K",
       "smallest payload per rank (K, M, G suffixes), doubled up to --max-bytes"},
      {"max-bytes", "2816K", "largest payload per rank"},
      {"iters", "20", "timed calls of each collective per size"},
      {"only", "both",
       "both (direct and ring), all (and inline), direct, ring or inline: time one collective "
       "alone (e.g. to attribute retransmissions to it)"},
  };
  for (FlagSpec& f : launch_flags(4))
    flags.push_back(f);
  return flags;
}

const CommandRegistration kRegistration({
    "allgather",
    "ring vs direct vs one-round (inline) allgatherv (sparse payload sizes), side by side",
    "Each rank contributes the same number of bytes; the collectives alternate call by call,\n"
    "timed from a barrier on the slowest rank (median over calls). --only all adds\n"
    "allgatherv_inline (one round trip up to GRADEX_ALLGATHER_INLINE_KB). Ends with RESULT\n"
    "direct_<size>_ms=... ring_<size>_ms=... [inline_<size>_ms=... direct_over_inline_<size>=...]\n"
    "direct_over_ring_min_bytes=...",
    allgather_flags(),
    run_allgather,
});

}  // namespace
}  // namespace gradex::bench
