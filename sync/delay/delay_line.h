// The delayed (overlapped) exchange, GRADEX_DELAY (Delayed Gradient Averaging): the exchange of a
// tensor's step-t gradient runs while the next steps compute, and the gradient handed back at step
// t is this rank's own gradient corrected by the newest average it has,
//
//   update_t = x_t + (avg_{t-D} - x_{t-D})        (t >= D; before that update_t = x_t),
//
// so every rank applies the same averaged past and differs only by its last D local gradients
// (their sum telescopes: sum_s update_s = sum_{s <= t-D} avg_s + sum_{t-D < s <= t} x_s).
//
// It sits at the C API's submit/complete boundary (capi/), so every front end that submits through
// gradex_submit / gradex_submit_absent gets it: submit() copies x_t, starts an exchange on a second
// copy, and answers with a handle that is already complete, the corrected gradient written into
// the caller's buffer.
//
// D = 1: the delayed engine itself exchanges g_t (its codec, error feedback and momentum correction
// run on the copy as without delay), so avg is its averaged momentum; x_t is g_t, or under gradex's
// momentum (GRADEX_MOMENTUM) this rank's own u_t = m u_{t-1} + g_t (Nesterov: g_t + m u_t), the
// same recursion, so that the corrected steps sum to the averaged momentum of the past plus x_t
// rather than lag a momentum step behind. An engine keeps one exchange of a tensor in flight, so
// step t waits for step t-1's exchange: one step of compute overlaps it.
//
// D >= 2: D exchanges in flight, one per lane (sync/delay/delay_lanes.h): step s goes to lane
// s mod D, and step t waits only for step t-D's exchange, which its correction needs. A lane gets
// its step's tensors together when the step ends (gradex_end_step), one negotiation round a step
// whatever order and pace the framework hands them over in. gradex's
// momentum (GRADEX_MOMENTUM, SGD's taken over) is then applied here, once per step in submission
// order, u_t = m u_{t-1} + g_t, and x_t = u_t (Nesterov: g_t + m u_t): the lanes exchange x_t, so
// that avg(x_t) is the momentum of the averaged gradients, as dense SGD momentum has it. When auto
// chooses D >= 2 after steps without delay, the delayed engine's momentum u and DGC residual move
// here: u continues, the residual is added to the next x (it is gradient not applied yet).
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
#include "sync/delay/delay_lanes.h"
#include "sync/delay/delay_rule.h"
#include "sync/engine/stats.h"

namespace gradex::sync {
class Engine;
}

namespace gradex::sync::delay {

class DelayLine {
 public:
  // Reads GRADEX_DELAY from the engine's configuration (check_delay_composes has accepted it).
  // `make_lane` makes the lanes of D >= 2 (null: D is held at 1, with the reason in the log and
  // explain()). Collective with a fixed GRADEX_DELAY >= 2: the lanes are made here.
  DelayLine(Engine& engine, DelayLanes::Factory make_lane);
  ~DelayLine();
  DelayLine(const DelayLine&) = delete;
  DelayLine& operator=(const DelayLine&) = delete;

  // The delay steps now apply (0: every call passes through to the engine unchanged). While
  // auto's lanes connect in the background this is 1, the decided D from their take-over step on.
  int delay() const;
  // Handles this line answers carry this bit (the engine's never do: they count from 1).
  static constexpr uint64_t kHandleBit = uint64_t{1} << 63;
  static bool owns(uint64_t handle) { return (handle & kHandleBit) != 0; }

  // gradex_register_tensor: the line learns the tensor's size and type. InvalidArgument naming
  // GRADEX_DELAY for a CUDA tensor while a fixed D > 0 is set (the copies are host memory); under
  // auto a CUDA tensor keeps D at 0.
  // With lanes, the tensor is registered on each (after the delayed engine accepted it).
  void on_register(const std::string& key, uint64_t numel, DType dtype, bool cuda,
                   uint64_t rows = 0);
  void register_on_lanes(const std::string& key);
  // With delay() > 0: the delayed exchange of `data` (absent: this rank contributes zeros, as
  // Engine::submit_absent); `data` holds update_t on return and the handle is complete.
  uint64_t submit(const std::string& key, void* data, bool absent);
  // gradex_wait / gradex_test of a handle submit() returned: releases it (InvalidArgument when it
  // is unknown or already released).
  void release(uint64_t handle);
  // gradex_end_step, after the engine's: the lanes that carried this step end theirs; under auto,
  // the measurement and (once) the agreed decision (collective: lanes are made there).
  void on_end_step();
  // gradex_set_gradient_norm: for the engine that carries this step's exchanges.
  void set_gradient_norm(double norm);
  // The counters of the delayed engine and its lanes together.
  Stats stats(bool last_step) const;
  // gradex_engine_reconfigure: the lanes' store belongs to the first membership, so a D chosen
  // later is held at 1.
  void on_reconfigure();
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
    std::vector<uint8_t> local;      // x_s as submitted (zeros for an absent contribution)
    std::vector<uint8_t> exchanged;  // the engine's buffer: avg_s once `handle` is done
    uint64_t handle = 0;             // the engine's handle while in flight, else 0
    uint64_t step = 0;               // the tensor's submission count when it was submitted
    int32_t lane = -1;               // the lane that exchanges it (-1: the delayed engine)
    // With lanes: submitted to its lane at the step's end (flush_deferred), not yet; `absent` is
    // how it will be submitted.
    bool deferred = false;
    bool absent = false;
  };
  struct Line {
    std::string key;
    uint64_t numel = 0;
    DType dtype = DType::kFloat32;
    uint64_t rows = 0;
    std::vector<float> momentum;  // u, with lanes and GRADEX_MOMENTUM > 0
    std::vector<float> carry;     // a DGC residual moved here, added to the next x
    uint64_t submitted = 0;       // submissions so far
    std::deque<Slot> slots;       // oldest first: steps t-k..t-1
    std::vector<Slot> spare;
    std::mutex mutex;  // one submission of a tensor at a time
  };
  Line& line_of(const std::string& key);
  Engine& engine_of(const Slot& slot);
  // Waits for its exchange, if any (a deferred slot is submitted first, alone). Its line's mutex
  // held.
  void settle(Line& l, Slot& slot);
  // Submits every deferred slot to its lane, in submission order: a lane's exchange of a step then
  // starts with all of the step's tensors, in one negotiation round (submitted one by one as the
  // backward pass hands them over, the first round took what had arrived and a second round
  // followed for the rest: on a 50 ms round trip, ~90 ms more a step). mutex_ held, no line's.
  void flush_deferred_locked();
  // A slot of `bytes` for the next submission (a spare one when the line has it). Line mutex held.
  Slot take_slot(Line& l, size_t bytes);
  // Retires the held steps beyond the newest d, the last one retired correcting `data` (update_t
  // = x_t + avg_{t-d} - x_{t-d}) once d steps are held. Line mutex held.
  void retire_oldest(Line& l, int d, void* data);
  // Waits for every tensor's exchanges of steps before `step`: a step's first submission waits for
  // the whole previous step, so that its own submissions reach the engine together (one
  // negotiation round) instead of one by one between the previous step's completions. Only earlier
  // steps: every rank submitted those before starting this one, whatever its order within a step.
  void settle_before(uint64_t step);
  void drain_locked();
  // The submission of D >= 2 (lanes); `data` holds g_t on entry, update_t on return.
  void submit_to_lane(Line& l, const std::string& key, void* data, bool absent, int d);
  // Why D >= 2 cannot run here ("" when it can).
  std::string lanes_held() const;
  // Collective: the D lanes, each registered tensor on them, and (after undelayed steps) the
  // delayed engine's momentum and residuals moved into the lines.
  void make_lanes(int d, bool take_state);
  // Collective: auto's D >= 2 lanes start connecting on a thread of their own while the steps run
  // with D = 1; they take over at end_step count `from` (take_pending_lanes).
  void start_pending_lanes(int d, uint64_t from);
  // At end_step count lanes_.pending_from: waits for the pending lanes (when they are late), keeps
  // the decided D of them, then moves the delayed engine's momentum and residuals into the lines,
  // as make_lanes.
  void take_pending_lanes();
  // Collective, at an end_step count from agreed state only: under auto, once the link is known
  // and agreed latency-bound (only there can auto choose D >= 2), kAutoMaxDelay lanes start
  // connecting in the background while the undelayed steps are measured, so that a decision for
  // lanes does not wait their ~30 round trips each after it (on the race's short task at 50 ms
  // round trips: 6.2 s of connecting, 16 steps at D = 1 between the decision and the lanes).
  void maybe_start_early_lanes();
  // At the first registration, before the first exchange and its probe: the same lanes, where the
  // start's round trips already say latency-bound (Engine::start_latency_bound).
  void maybe_start_lanes_before_probe();
  // The conditions both share (auto undecided, no lanes yet, none held), and the start itself.
  bool may_start_early_lanes() const;
  void start_early_lanes(const char* because);
  // At the decision: D >= 2 takes the early lanes (or starts connecting lanes now) as the pending
  // lanes; after D <= 1 the early lanes close once connected.
  // `early_lanes_ready`: the agreed measurement says every rank's early lanes have connected, so
  // they take over now: the next step is theirs.
  void settle_lanes_at_decision(bool early_lanes_ready);
  // auto's decision from the agreed measurement (DelayRule::measurement, this host's ranks per
  // core, whether the early lanes connected: each averaged over ranks). Collective.
  void decide(const float measured[4]);
  // Waits for the early lanes' connection (a failure only logged: no step needs them) and closes
  // them. Collective.
  void close_early_lanes();
  // The lanes and the tensors registered on them (and the moved state with `take_state`).
  void install_lanes(bool take_state);
  bool lanes_active() const { return lanes_.active && lanes_.active->count() == rule_.delay(); }
  // A fixed GRADEX_DELAY=0: the line never delays (a fixed rule's D never changes), so a step's end
  // has nothing to do and the saved state is the engine's alone.
  bool never_delays() const { return !rule_.automatic() && rule_.delay() == 0; }

  // What the configuration fixes for the line's life, read once by the constructor.
  struct Settings {
    float momentum;  // the delayed engine's GRADEX_MOMENTUM / GRADEX_NESTEROV
    bool nesterov;
    bool stale;  // GRADEX_DELAY_RULE=stale: avg_{t-D} alone, for comparison
    // GRADEX_TEST_DELAY_LANES: auto takes the link as latency-bound, and its lanes take over two
    // steps after the decision (loopback has no round trip to size their start by).
    bool test_lanes;
    bool test_lanes_late;  // GRADEX_TEST_DELAY_LANES=late: no lanes ahead of the decision
    bool test_lanes_long;  // GRADEX_TEST_DELAY_LANES=long: a start that said a long path
  };
  static Settings settings_of(const Engine& engine);

  // The lane sets of D >= 2: the one that carries the exchanges, auto's while it connects, and
  // the early one that connects before auto's decision.
  struct LaneSets {
    std::unique_ptr<DelayLanes> active;
    // auto's lanes while they connect, and the end_step count from which they carry the exchanges.
    std::unique_ptr<DelayLanes> pending;
    uint64_t pending_from = 0;
    // Lanes connecting before auto's decision (maybe_start_early_lanes); after a decision for
    // D <= 1 they close at end_step count early_close_at, an agreed step by which they have
    // connected (closing is collective and waits for a connection still under way).
    std::unique_ptr<DelayLanes> early;
    uint64_t early_close_at = 0;
    bool early_checked = false;         // maybe_start_early_lanes asked once
    bool before_probe_checked = false;  // maybe_start_lanes_before_probe asked once
    int sets_made = 0;  // lane sets made so far: each set meets under store keys of its own
  };

  // Deferred slots (Slot::deferred) in submission order: their line and step count. Under
  // `mutex`, a leaf lock (taken under a line's mutex by submit_to_lane, nothing taken under it).
  struct DeferredSlots {
    std::vector<std::pair<Line*, uint64_t>> slots;
    std::mutex mutex;
  };

  Engine& engine_;
  DelayLanes::Factory make_lane_;
  const Settings settings_;
  LaneSets lanes_;
  bool reconfigured_ = false;
  uint64_t steps_ended_ = 0;  // end_step calls: step s's exchanges go to lane s mod D
  std::set<int> touched_;     // lanes that carried exchanges since the last end_step
  DeferredSlots deferred_;
  DelayRule rule_;
  mutable std::mutex mutex_;  // lines_ (the map), issued_, next_handle_
  std::map<std::string, std::unique_ptr<Line>> lines_;
  std::set<uint64_t> issued_;
  // auto's agreement of its measurement where it travels while the next step computes
  // (DelayRule::agrees_ahead): submitted when the window closed, waited for at the decision (or by
  // a checkpoint, which holds the agreed values: a resumed run decides from them at the same step).
  struct Agreement {
    bool held = false;    // values are agreed, or in flight under `handle`
    uint64_t handle = 0;  // the engine's average in flight (0: none)
    float values[4] = {0, 0, 0, 0};
  } agreement_;
  bool has_cuda_ = false;  // a CUDA tensor is registered: auto keeps D at 0
  uint64_t next_handle_ = 1;
};

}  // namespace gradex::sync::delay
