// `gradex-bench timeline DIR`: the ranks' timelines (sync/timeline/recorder.h) in one Chrome-trace
// file on one clock.
//
// Each rank's timestamps count from its own recorder's opening on its own steady clock. The merge
// first places every rank by the system clock its file records for that instant (exact on one
// host; across hosts as good as their clock synchronisation), then corrects each rank by its
// negotiation rounds: every rank runs every round of an engine, in the same order, and a round is
// an exchange that ends on every rank within about one message latency, so the median difference
// between a rank's round ends and the first rank's of the same engine (a process's n-th recorder,
// rank<r>.<n>.json) is that rank's clock offset, when it exceeds the rank's median round length
// (ranks leave a round within about its length of each other: less is the protocol, not the
// clocks). Only the merge reads files the recorder wrote; it relies on their form (one event a
// line, "ts" as the third member).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace gradex::sync::timeline {

struct RankClock {
  std::string file;
  int pid = 0;
  int engine = 1;  // the process's n-th recorder (rank<r>.<n>.json; 1: rank<r>.json)
  // Microseconds added to the rank's timestamps: from the system clocks, and the correction
  // the negotiation rounds gave (0 when the rank shares no round with the first).
  double offset_us = 0;
  double round_correction_us = 0;
  double round_length_us = 0;  // the median of the rank's negotiation rounds
  size_t rounds_matched = 0;
  size_t events = 0;
};

struct Merged {
  std::string json;  // the merged trace (a JSON array)
  std::vector<RankClock> ranks;
};

// Merges every rank<r>[.<n>].json in `dir`. InvalidArgument when there is none, or when a file is
// not one the recorder wrote.
Merged merge_directory(const std::string& dir);

// The same for explicit files (tests).
Merged merge_files(const std::vector<std::string>& files);

}  // namespace gradex::sync::timeline
