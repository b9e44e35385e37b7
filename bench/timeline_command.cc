// gradex-bench timeline DIR: merges the per-rank timelines GRADEX_TIMELINE=DIR wrote
// (sync/timeline/recorder.h) into one Chrome-trace file on one clock (sync/timeline/merge.h),
// to open in Perfetto or chrome://tracing, and says how each rank's clock was placed.
#include <cstdio>
#include <fstream>

#include "base/error.h"
#include "bench/command.h"
#include "sync/timeline/merge.h"

namespace gradex::bench {
namespace {

int run_timeline(const Args& args) {
  if (!args.given("dir"))
    throw InvalidArgument("give the GRADEX_TIMELINE directory: gradex-bench timeline DIR");
  const std::string dir = args.get("dir");
  const std::string out = args.given("out") ? args.get("out") : dir + "/merged.json";
  const sync::timeline::Merged merged = sync::timeline::merge_directory(dir);
  std::ofstream file(out, std::ios::binary | std::ios::trunc);
  file << merged.json;
  file.close();
  if (!file) throw InvalidArgument("cannot write " + out);
  size_t events = 0;
  for (const sync::timeline::RankClock& r : merged.ranks) {
    std::printf(
        "%-40s pid %-3d %7zu events, clock %+.1f us (rounds: %+.1f us over %zu, "
        "rounds last %.1f us)\n",
        r.file.c_str(), r.pid, r.events, r.offset_us, r.round_correction_us, r.rounds_matched,
        r.round_length_us);
    events += r.events;
  }
  std::printf(
      "wrote %s: %zu ranks, %zu events (open it in https://ui.perfetto.dev or "
      "chrome://tracing)\n",
      out.c_str(), merged.ranks.size(), events);
  return 0;
}

const CommandRegistration kRegistration({
    "timeline",
    "merges GRADEX_TIMELINE's per-rank timelines into one trace on one clock",
    "gradex-bench timeline DIR reads DIR/rank<r>.json (what GRADEX_TIMELINE=DIR made every rank\n"
    "write) and writes DIR/merged.json (--out): every rank's events on rank 0's clock, placed by\n"
    "the system clock each file records and corrected by the ends of the negotiation rounds,\n"
    "which every rank of an engine runs in the same order and leaves within about one round's\n"
    "length (a smaller correction is not applied).",
    {{"dir", "", "the GRADEX_TIMELINE directory (also the command's one bare word)", false, true},
     {"out", "", "where to write the merged trace (default: DIR/merged.json)"}},
    run_timeline,
});

}  // namespace
}  // namespace gradex::bench
