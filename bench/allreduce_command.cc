// gradex-bench allreduce: ring allreduce bus bandwidth against UCX point-to-point bandwidth, at the
// same message sizes, in one run.
//
// Allreduce: every rank runs `iters` fp32 allreduce_sum calls per size back to back; the time of a
// size is the slowest rank's; bus bandwidth = 2(P-1)/P * bytes / time (what each rank's link
// carries in a ring, comparable to a point-to-point figure).
// Point-to-point: rank 0 streams `iters` messages of each size to rank 1 with a window of messages
// in flight; rank 1 acknowledges the last one; bandwidth = iters * bytes / time on rank 0. The
// other ranks sleep meanwhile (idle_wait) so that they do not take cores from the measured pair.
#include <algorithm>
#include <cstdio>
#include <deque>
#include <iostream>
#include <thread>

#include "base/error.h"
#include "bench/command.h"
#include "bench/launcher.h"
#include "bench/rank_stats.h"
#include "bench/result_line.h"
#include "bench/stats.h"
#include "comm/collectives.h"

namespace gradex::bench {
namespace {

constexpr int kWindow = 4;                                // point-to-point messages in flight
constexpr int64_t kAutoBudgetBytes = int64_t{512} << 20;  // bytes per size when --iters 0

struct SizeResult {
  int64_t bytes = 0;
  int iters = 0;
  double allreduce_s = 0;  // per call, slowest rank
  double p2p_s = 0;        // per message
};

int iterations_for(int64_t bytes, int64_t flag_iters) {
  if (flag_iters > 0) return static_cast<int>(flag_iters);
  return static_cast<int>(std::clamp<int64_t>(kAutoBudgetBytes / bytes, 5, 100));
}

// Checks once per size that the allreduce really sums: rank r contributes r + 1 everywhere.
void verify_allreduce(comm::Communicator& comm, std::vector<float>& buffer, size_t count) {
  std::fill(buffer.begin(), buffer.begin() + count, static_cast<float>(comm.rank() + 1));
  comm::allreduce_sum(comm, buffer.data(), count, DType::kFloat32);
  float want = static_cast<float>(comm.size() * (comm.size() + 1) / 2);
  for (size_t i : {size_t{0}, count / 2, count - 1}) {
    if (buffer[i] != want) {
      throw InternalError("allreduce of " + std::to_string(count) + " floats: element " +
                          std::to_string(i) + " is " + std::to_string(buffer[i]) + ", expected " +
                          std::to_string(want));
    }
  }
}

double time_allreduce(comm::Communicator& comm, std::vector<float>& buffer, size_t count,
                      int iters) {
  verify_allreduce(comm, buffer, count);                    // also the warm-up
  std::fill(buffer.begin(), buffer.begin() + count, 0.0f);  // stays 0: no overflow over iters
  comm::barrier(comm);
  double start = wall_seconds();
  for (int i = 0; i < iters; ++i)
    comm::allreduce_sum(comm, buffer.data(), count, DType::kFloat32);
  double mine = (wall_seconds() - start) / iters;
  return max_over_ranks(comm, {mine})[0];
}

// The tags of one point-to-point stream of `count` messages, plus its ready and ack messages.
// Every rank draws them, whether it takes part or not, so that all ranks' tag sequences (and so
// the collectives after the phase) stay in step.
std::vector<uint64_t> draw_tags(comm::Communicator& comm, int count) {
  std::vector<uint64_t> tags;
  for (int i = 0; i < count + 2; ++i)
    tags.push_back(comm.next_collective_tag());
  return tags;
}

// One stream of `count` messages from rank 0 to rank 1 with tags from draw_tags(count); returns
// rank 0's elapsed seconds (0 on rank 1). Rank 1 posts its first receives, then says "ready":
// the clock starts with both sides in place.
double p2p_stream(comm::Communicator& comm, const std::vector<uint64_t>& tags,
                  std::vector<uint8_t>& buffer, size_t bytes, int count) {
  const uint64_t ready_tag = tags[count], done_tag = tags[count + 1];
  uint64_t token = 0;
  if (comm.rank() == 0) {
    auto ready = comm.irecv(1, ready_tag, &token, sizeof token);
    idle_wait(comm, *ready, "p2p ready");
    double start = wall_seconds();
    std::deque<comm::RequestPtr> inflight;
    for (int i = 0; i < count; ++i) {
      if (inflight.size() == kWindow) {
        std::vector<comm::RequestPtr> oldest;
        oldest.push_back(std::move(inflight.front()));
        inflight.pop_front();
        comm.wait_all(oldest, "p2p send");
      }
      inflight.push_back(comm.isend(1, tags[i], buffer.data(), bytes));
    }
    std::vector<comm::RequestPtr> rest(std::make_move_iterator(inflight.begin()),
                                       std::make_move_iterator(inflight.end()));
    comm.wait_all(rest, "p2p send");
    std::vector<comm::RequestPtr> done;
    done.push_back(comm.irecv(1, done_tag, &token, sizeof token));
    comm.wait_all(done, "p2p ack");
    return wall_seconds() - start;
  }
  std::deque<comm::RequestPtr> inflight;
  int posted = 0;
  for (; posted < std::min(count, kWindow); ++posted) {
    inflight.push_back(comm.irecv(0, tags[posted], buffer.data(), bytes));
  }
  std::vector<comm::RequestPtr> ready;
  ready.push_back(comm.isend(0, ready_tag, &token, sizeof token));
  comm.wait_all(ready, "p2p ready");
  while (!inflight.empty()) {
    std::vector<comm::RequestPtr> oldest;
    oldest.push_back(std::move(inflight.front()));
    inflight.pop_front();
    comm.wait_all(oldest, "p2p receive");
    if (posted < count) inflight.push_back(comm.irecv(0, tags[posted++], buffer.data(), bytes));
  }
  std::vector<comm::RequestPtr> done;
  done.push_back(comm.isend(0, done_tag, &token, sizeof token));
  comm.wait_all(done, "p2p ack");
  return 0.0;
}

// Ranks 0 and 1 measure; the others sleep until rank 0 releases them after the whole phase.
void p2p_phase(comm::Communicator& comm, std::vector<SizeResult>& results,
               std::vector<uint8_t>& buffer) {
  constexpr int kWarmupMessages = 2;  // registration, rendezvous set-up
  const uint64_t release_tag = comm.next_collective_tag();
  std::vector<std::vector<uint64_t>> warm_tags, timed_tags;
  for (const SizeResult& r : results) {
    warm_tags.push_back(draw_tags(comm, kWarmupMessages));
    timed_tags.push_back(draw_tags(comm, r.iters));
  }
  uint64_t token = 0;
  if (comm.rank() >= 2) {
    auto release = comm.irecv(0, release_tag, &token, sizeof token);
    idle_wait(comm, *release, "p2p phase release");
    return;
  }
  for (size_t i = 0; i < results.size(); ++i) {
    SizeResult& r = results[i];
    p2p_stream(comm, warm_tags[i], buffer, r.bytes, kWarmupMessages);
    r.p2p_s = p2p_stream(comm, timed_tags[i], buffer, r.bytes, r.iters) / r.iters;
  }
  if (comm.rank() == 0) {
    std::vector<comm::RequestPtr> releases;
    for (int peer = 2; peer < comm.size(); ++peer) {
      releases.push_back(comm.isend(peer, release_tag, &token, sizeof token));
    }
    comm.wait_all(releases, "p2p phase release");
  }
}

int run_allreduce(const Args& args) {
  int64_t min_bytes = args.get_bytes("min-bytes", 4, int64_t{1} << 34);
  int64_t max_bytes = args.get_bytes("max-bytes", min_bytes, int64_t{1} << 34);
  int64_t flag_iters = args.get_int("iters", 0, 1000000);
  if (min_bytes % 4 != 0) throw InvalidArgument("--min-bytes must be a multiple of 4 (fp32)");
  LaunchOptions launch = launch_options_from_args(args, "gradex-bench allreduce");

  return run_ranks(launch, [&](RankContext& ctx) {
    comm::Communicator& comm = ctx.comm;
    if (comm.size() < 2) throw InvalidArgument("allreduce needs at least 2 ranks");
    std::vector<SizeResult> results;
    for (int64_t b = min_bytes; b <= max_bytes; b *= 2) {
      results.push_back({b, iterations_for(b, flag_iters), 0, 0});
    }
    if (ctx.reporter()) {
      unsigned cores = std::thread::hardware_concurrency();
      std::printf(
          "gradex-bench allreduce: %d ranks on %u cores, fp32 ring allreduce vs rank 0 -> 1 "
          "point-to-point\n",
          comm.size(), cores);
      if (cores != 0 && static_cast<unsigned>(comm.size()) > cores) {
        std::printf(
            "note: more ranks than cores; the allreduce ranks compete for CPU, the "
            "point-to-point pair does not\n");
      }
      std::fflush(stdout);
    }
    std::vector<float> floats(static_cast<size_t>(max_bytes / 4));
    for (SizeResult& r : results) {
      if (ctx.reporter())
        std::cerr << "[allreduce] " << format_bytes(r.bytes) << " x " << r.iters << "\n";
      r.allreduce_s = time_allreduce(comm, floats, static_cast<size_t>(r.bytes / 4), r.iters);
    }
    floats = {};
    std::vector<uint8_t> bytes(comm.rank() < 2 ? static_cast<size_t>(max_bytes) : 0);
    if (ctx.reporter()) std::cerr << "[allreduce] point-to-point rank 0 -> 1\n";
    p2p_phase(comm, results, bytes);

    if (!ctx.reporter()) return 0;
    const double p = comm.size(), bus_factor = 2.0 * (p - 1) / p;
    std::printf("%10s %6s %12s %12s %12s %12s %8s\n", "size", "iters", "allreduce_ms", "algbw_GBps",
                "busbw_GBps", "p2p_GBps", "ratio");
    ResultLine result;
    double best_bus = 0, best_p2p = 0;
    for (const SizeResult& r : results) {
      double bus = bus_factor * r.bytes / r.allreduce_s / 1e9, p2p = r.bytes / r.p2p_s / 1e9;
      best_bus = std::max(best_bus, bus);
      best_p2p = std::max(best_p2p, p2p);
      std::printf("%10s %6d %12.3f %12.3f %12.3f %12.3f %8.3f\n", format_bytes(r.bytes).c_str(),
                  r.iters, r.allreduce_s * 1e3, r.bytes / r.allreduce_s / 1e9, bus, p2p, bus / p2p);
      if (r.bytes == int64_t{64} << 20) {
        result.add("busbw_ratio_64MiB", bus / p2p);
        result.add("busbw_64MiB_GBps", bus);
        result.add("p2p_64MiB_GBps", p2p);
        result.add("allreduce_64MiB_ms", r.allreduce_s * 1e3);
      }
    }
    result.add("busbw_peak_GBps", best_bus).add("p2p_peak_GBps", best_p2p);
    result.add("ranks", comm.size());
    std::printf("%s\n", result.str().c_str());
    std::fflush(stdout);
    return 0;
  });
}

std::vector<FlagSpec> allreduce_flags() {
  std::vector<FlagSpec> flags = {
      {"min-bytes", "64K", "smallest message (bytes; K, M, G suffixes), doubled up to --max-bytes"},
      {"max-bytes", "256M", "largest message"},
      {"iters", "0", "timed iterations per size (0: about 512 MiB per size, 5 to 100)"},
  };
  for (FlagSpec& f : launch_flags(4))
    flags.push_back(f);
  return flags;
}

const CommandRegistration kRegistration({
    "allreduce",
    "ring allreduce bus bandwidth vs UCX point-to-point bandwidth, 64 KiB to 256 MiB",
    "Bus bandwidth is 2(P-1)/P x bytes / time, the traffic of each rank's ring link. The\n"
    "point-to-point stream runs from rank 0 to rank 1 at the same sizes while the other ranks\n"
    "sleep. Ends with RESULT busbw_ratio_64MiB=... busbw_64MiB_GBps=... p2p_64MiB_GBps=...",
    allreduce_flags(),
    run_allreduce,
});

}  // namespace
}  // namespace gradex::bench
