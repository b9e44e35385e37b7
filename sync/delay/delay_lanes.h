// The delayed exchange's lanes (GRADEX_DELAY = D >= 2): D engines of their own, each with its own
// membership (communicator, negotiation, progress thread) under the store prefix
// "delay-lane<i>/", so that D exchanges of a tensor are in flight at once. Step s of every tensor
// goes to lane s mod D; a lane holds one exchange of a tensor at a time, the one of step s - D,
// which step s's correction needs anyway (sync/delay/delay_line.h). One engine keeps one exchange
// of a tensor in flight, so without lanes no D overlaps more than one step of compute.
//
// Each lane runs its own codecs and error feedback on the steps it carries (a DGC residual holds
// what its lane has not sent yet and is sent by its lane), its own GRADEX_POLICY=auto planner
// (which sees D steps of compute between its submissions), and no momentum: gradex's momentum
// (GRADEX_MOMENTUM) is applied once, in submission order, by the delay line, and the lanes exchange
// what it makes.
#pragma once

#include <atomic>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "base/config.h"
#include "base/dtype.h"
#include "sync/engine/stats.h"

namespace gradex::sync {
class AgreedLink;
class Engine;
}  // namespace gradex::sync

namespace gradex::sync::delay {

class DelayLanes {
 public:
  // Makes the engine of lane slot `slot` from `config` (collective: every rank makes the same
  // lanes), starting with `link` (the delayed engine's agreed link; Engine's adopted_link). Slots
  // are never reused by one delay line, so a slot's store keys are its own.
  using Factory = std::function<std::unique_ptr<Engine>(int slot, config::Config config,
                                                        const AgreedLink* link)>;
  enum class Start {
    kNow,         // the constructor returns with every lane connected
    kBackground,  // a thread of this object connects them; wait_ready() ends it
  };

  // Collective: `count` lane engines, in lane order, in slots first_slot.., with the delayed
  // engine's configuration, which they keep except GRADEX_DELAY, GRADEX_MOMENTUM, GRADEX_NESTEROV
  // (0: the delay line's) and GRADEX_TIMELINE (the delayed engine's alone). Each lane takes
  // `delayed`'s link model as it is now when it has one (no probe per lane), when its layout found
  // no regions GRADEX_HIERARCHY_TIER=host (no round trips measured again per lane), and under
  // GRADEX_STRIPES=auto one connection per peer (the lanes are the parallel flows). With
  // kBackground, `delayed` keeps exchanging meanwhile (only its configuration and a copy of its
  // link model are read, here), and `make` must be callable from another thread.
  DelayLanes(const Factory& make, Engine& delayed, int count, int first_slot,
             Start start = Start::kNow);
  // Waits for a background start first (bounded by the lanes' GRADEX_TIMEOUT_S).
  ~DelayLanes();
  DelayLanes(const DelayLanes&) = delete;
  DelayLanes& operator=(const DelayLanes&) = delete;

  // Whether every lane is connected (never blocks). Always true after a kNow start.
  bool ready() const;
  // Blocks until every lane is connected; rethrows the error that stopped a background start.
  void wait_ready();
  // The seconds the lanes took to connect (0 before ready).
  double connect_seconds() const;
  // Whether the lanes took a probed link model at their start; lanes started before the delayed
  // engine's probe did not, and take `link` (its agreed model, copied while it was idle) at
  // wait_ready(), before their first exchange, so that no lane probes again.
  bool has_link() const;
  void adopt_later(std::unique_ptr<AgreedLink> link);

  // The accessors below need ready().
  int count() const { return static_cast<int>(lanes_.size()); }
  Engine& lane(int i) { return *lanes_.at(static_cast<size_t>(i)); }

  // Collective (the same n at the same step on every rank): closes the lanes from n on, last first.
  void keep_first(int n);
  void register_tensor(const std::string& key, uint64_t numel, DType dtype, uint64_t rows);
  // Every lane's counters together.
  Stats stats(bool last_step) const;
  // Each lane's state, in lane order (the delay line's checkpoint).
  std::vector<std::vector<uint8_t>> save_states();
  void load_states(const std::vector<std::pair<const uint8_t*, size_t>>& states);
  // The lanes' plans, one block per lane (gx.explain).
  std::string explain() const;

 private:
  void connect(const Factory& make, const config::Config& lane_config, int count, int first_slot,
               int rank);

  std::vector<std::unique_ptr<Engine>> lanes_;
  std::unique_ptr<AgreedLink> link_;   // the delayed engine's model when the lanes were asked for
  std::unique_ptr<AgreedLink> later_;  // adopt_later's, adopted by wait_ready
  std::thread starter_;                // kBackground: connects the lanes
  std::atomic<bool> ready_{false};
  std::exception_ptr failure_;  // of the background start, read after joining starter_
  double connect_seconds_ = 0;
};

}  // namespace gradex::sync::delay
