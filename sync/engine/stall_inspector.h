// The stall inspector (GRADEX_STALL_WARN_S): when some ranks have submitted a key and others have
// not for that long, rank 0 logs which ranks are late and which keys they miss, long before the
// negotiation gives up with a timeout error (GRADEX_TIMEOUT_S). It only reads what the negotiator
// already knows (who announced what, and since when) and never changes a verdict.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

namespace gradex::config {
class Config;
}

namespace gradex::sync {

// One key some ranks announced and others did not yet.
struct StallKey {
  std::string name;             // "tensor 'layer0.weight'", as errors name it
  std::vector<bool> announced;  // per rank
  std::chrono::steady_clock::time_point first_seen;
};

class StallInspector {
 public:
  using Clock = std::chrono::steady_clock;
  // `warn_after` > 0. `timeout` only appears in the message (how long until the error).
  StallInspector(std::chrono::milliseconds warn_after, std::chrono::milliseconds timeout);

  // True when a key first seen at `oldest` may be reported at `now` (lets the caller skip building
  // the key list on the many rounds with nothing stalled).
  bool due(Clock::time_point oldest, Clock::time_point now) const;
  // The earliest time at which due(oldest, now) holds: when rank 0's engine must run a round to
  // report, even with nothing to announce.
  Clock::time_point next_due(Clock::time_point oldest) const;
  // Logs (warn) one report of the keys pending for longer than warn_after, grouped by the set of
  // late ranks, at most once per warn_after (a long stall is reminded of, not repeated every
  // round). Returns the report, "" when nothing was logged.
  std::string inspect(const std::vector<StallKey>& pending, Clock::time_point now);

 private:
  std::chrono::milliseconds warn_after_;
  std::chrono::milliseconds timeout_;
  Clock::time_point last_report_{};
};

// From GRADEX_STALL_WARN_S (nullptr when 0: off).
std::unique_ptr<StallInspector> make_stall_inspector(const config::Config& config,
                                                     std::chrono::milliseconds timeout);

}  // namespace gradex::sync
