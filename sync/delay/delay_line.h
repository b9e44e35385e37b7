// The delayed (overlapped) exchange, GRADEX_DELAY (Delayed Gradient Averaging): the exchange of a
// tensor's step-t gradient runs while the next steps compute, and the gradient handed back at step
// t is this rank's own gradient corrected by the newest average it has,
//
//   update_t = g_t + (avg_{t-D} - g_{t-D})        (t >= D; before that update_t = g_t),
//
// so every rank applies the same averaged past and differs only by its last D local gradients
// (their sum telescopes: sum_s update_s = sum_{s <= t-D} avg_s + sum_{t-D < s <= t} g_s).
//
// It sits at the C API's submit/complete boundary (capi/), so every front end that submits through
// gradex_submit / gradex_submit_absent gets it: submit() copies g_t, starts the engine's exchange
// on a second copy (the codec, its error feedback and momentum correction run on that copy as
// without delay), and answers with a handle that is already complete, the corrected gradient
// written into the caller's buffer. The engine keeps one exchange of a tensor in flight, so
// submit() waits for the tensor's previous exchange (step t-1) before starting step t's: its
// exchange time overlaps one step of compute, whatever D (a larger D adds staleness, not overlap,
// on this engine; the auto rule therefore chooses 0 or 1, sync/delay/delay_rule.h).
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "base/config.h"
#include "base/dtype.h"
#include "sync/delay/delay_rule.h"

namespace gradex::sync {
class Engine;
}

namespace gradex::sync::delay {

class DelayLine {
 public:
  // Reads GRADEX_DELAY from the engine's configuration (check_delay_composes has accepted it).
  explicit DelayLine(Engine& engine);
  ~DelayLine();
  DelayLine(const DelayLine&) = delete;
  DelayLine& operator=(const DelayLine&) = delete;

  // The delay steps now apply (0: every call passes through to the engine unchanged).
  int delay() const;
  // Handles this line answers carry this bit (the engine's never do: they count from 1).
  static constexpr uint64_t kHandleBit = uint64_t{1} << 63;
  static bool owns(uint64_t handle) { return (handle & kHandleBit) != 0; }

  // gradex_register_tensor: the line learns the tensor's size and type. InvalidArgument naming
  // GRADEX_DELAY for a CUDA tensor while a fixed D > 0 is set (the copies are host memory); under
  // auto a CUDA tensor keeps D at 0.
  void on_register(const std::string& key, uint64_t numel, DType dtype, bool cuda);
  // With delay() > 0: the delayed exchange of `data` (absent: this rank contributes zeros, as
  // Engine::submit_absent); `data` holds update_t on return and the handle is complete.
  uint64_t submit(const std::string& key, void* data, bool absent);
  // gradex_wait / gradex_test of a handle submit() returned: releases it (InvalidArgument when it
  // is unknown or already released).
  void release(uint64_t handle);
  // gradex_end_step, after the engine's: under auto, the measurement and (once) the agreed
  // decision.
  void on_end_step();
  // Waits for every exchange in flight and forgets the averages not yet applied: what
  // gx.synchronize() does before it averages the parameters (after which those averages are part of
  // every rank's model). The next D steps apply local gradients only, as at the start.
  void drain();
  // The engine's state with the line's (exchanges in flight are waited for and saved with their
  // results, so a resumed run continues bit for bit); without delay the engine's state unchanged.
  std::vector<uint8_t> save_state();
  // Either format. A plain engine state empties the line.
  void load_state(const uint8_t* data, size_t size);
  // One line for gx.explain: the delay and why.
  std::string explain() const;

 private:
  struct Slot {
    std::vector<uint8_t> local;      // g_s as submitted (zeros for an absent contribution)
    std::vector<uint8_t> exchanged;  // the engine's buffer: avg_s once `handle` is done
    uint64_t handle = 0;             // the engine's handle while in flight, else 0
    uint64_t step = 0;               // the tensor's submission count when it was submitted
  };
  struct Line {
    uint64_t numel = 0;
    DType dtype = DType::kFloat32;
    uint64_t submitted = 0;  // submissions so far
    std::deque<Slot> slots;  // oldest first: steps t-k..t-1
    std::vector<Slot> spare;
    std::mutex mutex;  // one submission of a tensor at a time
  };
  Line& line_of(const std::string& key);
  void settle(Slot& slot);  // waits for its exchange, if any
  // Waits for every tensor's exchanges of steps before `step`: a step's first submission waits for
  // the whole previous step, so that its own submissions reach the engine together (one
  // negotiation round) instead of one by one between the previous step's completions. Only earlier
  // steps: every rank submitted those before starting this one, whatever its order within a step.
  void settle_before(uint64_t step);
  void drain_locked();

  Engine& engine_;
  DelayRule rule_;
  mutable std::mutex mutex_;  // lines_ (the map), issued_, next_handle_
  std::map<std::string, std::unique_ptr<Line>> lines_;
  std::set<uint64_t> issued_;
  const bool stale_;       // GRADEX_DELAY_RULE=stale: avg_{t-D} alone, for comparison
  bool has_cuda_ = false;  // a CUDA tensor is registered: auto keeps D at 0
  uint64_t next_handle_ = 1;
};

}  // namespace gradex::sync::delay
