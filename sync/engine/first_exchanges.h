// Which exchanges run a tensor's codec for the first time: its first exchange after registration
// or after a switch of its rung. Such a unit allocates the codec's buffers, touches their pages and
// makes the transport's first sends of its size: on the loopback's 4 ranks on 2 cores it took
// 1.5-10x a steady unit of the same codec. CodecPlanner::observe_unit keeps no record of it
// (Snapshot::codec_factor, the link's fit), so a codec is not priced for the rest of a run at what
// its first step cost. Thread-safe: marked by the progress thread, taken by whichever thread
// completes the unit.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>

#include "sync/engine/pipeline.h"

namespace gradex::sync {

class FirstExchanges {
 public:
  // The exchange of `key` at agreed step `step` is its codec's first. At most kMaxMarks are held
  // (a mark beyond them is dropped: that unit is then recorded as any other).
  void mark(const std::string& key, uint64_t step);
  // Whether `unit` holds a marked exchange. The marks of its tensors at or before their steps
  // here are spent (a unit never observed leaves a mark that the tensor's next unit removes).
  bool take(const pipeline::Unit& unit);

  static constexpr size_t kMaxMarks = 4096;

 private:
  std::mutex mutex_;
  std::map<std::string, uint64_t> marks_;
};

}  // namespace gradex::sync
