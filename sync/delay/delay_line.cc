#include "sync/delay/delay_line.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <sstream>

#include "base/error.h"
#include "base/log.h"
#include "sync/data/byte_io.h"
#include "sync/delay/delay_arithmetic.h"
#include "sync/engine/engine.h"

namespace gradex::sync::delay {

namespace {

constexpr uint32_t kMagic = 0x4c445847;  // "GXDL": an engine state with a delay line's
// 1: the delayed engine's state and the held steps; 2: with the lanes' states, each line's
// momentum and carried residual, and each held step's lane.
// 3: with the end_step count from which auto's lanes, connecting when saved, take over.
// 4: with auto's agreed measurement when saved between its window and its decision.
constexpr uint32_t kVersion = 4;

// The tensor registered under auto for the one agreement of the measurement (Engine::average:
// its first average is fp32, the same bits on every rank).
constexpr const char* kAgreementKey = "gradex.delay.auto";

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

DelayLine::Settings DelayLine::settings_of(const Engine& engine) {
  const config::Config& config = engine.config();
  const std::string test_lanes = config.get_string("GRADEX_TEST_DELAY_LANES");
  Settings s;
  s.momentum = engine.options().momentum;
  s.nesterov = engine.options().nesterov;
  s.stale = config.get_string("GRADEX_DELAY_RULE") == "stale";
  s.test_lanes = test_lanes != "0";
  s.test_lanes_late = test_lanes == "late";
  s.test_lanes_long = test_lanes == "long";
  return s;
}

DelayLine::DelayLine(Engine& engine, DelayLanes::Factory make_lane)
    : engine_(engine),
      make_lane_(std::move(make_lane)),
      settings_(settings_of(engine)),
      rule_(engine.config()) {
  if (rule_.automatic()) engine_.register_tensor(kAgreementKey, 4, DType::kFloat32);
  if (!rule_.automatic() && rule_.delay() >= 2) {
    const std::string held = lanes_held();
    if (!held.empty())
      throw ConfigError("GRADEX_DELAY=" + std::to_string(rule_.delay()) +
                        " runs several exchanges of a tensor at once, which " + held +
                        "; set GRADEX_DELAY=1 or auto");
    make_lanes(rule_.delay(), false);
  }
}

DelayLine::~DelayLine() {
  // The lanes first: their exchanges in flight write into the lines' buffers until they end.
  lanes_.active.reset();
  lanes_.pending.reset();
  lanes_.early.reset();
}

int DelayLine::delay() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return lanes_.pending ? std::min(rule_.delay(), 1) : rule_.delay();
}

void DelayLine::on_register(const std::string& key, uint64_t numel, DType dtype, bool cuda,
                            uint64_t rows) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (cuda && !rule_.automatic() && rule_.delay() > 0)
    throw InvalidArgument("tensor '" + key +
                          "' is CUDA memory: GRADEX_DELAY=" + std::to_string(rule_.delay()) +
                          " keeps its copies in host memory and takes host tensors only; set "
                          "GRADEX_DELAY=0 for CUDA tensors");
  if (cuda) has_cuda_ = true;
  maybe_start_lanes_before_probe();
  auto& l = lines_[key];
  if (!l) {
    l = std::make_unique<Line>();
    l->key = key;
  }
  std::lock_guard<std::mutex> line_lock(l->mutex);
  if (!l->slots.empty() && (l->numel != numel || l->dtype != dtype))
    throw InvalidArgument("tensor '" + key +
                          "' registered again with another size or type while "
                          "its delayed exchanges are held (GRADEX_DELAY)");
  l->numel = numel;
  l->dtype = dtype;
  l->rows = rows;
}

void DelayLine::register_on_lanes(const std::string& key) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!lanes_.active) return;
  auto it = lines_.find(key);
  if (it == lines_.end()) return;
  lanes_.active->register_tensor(key, it->second->numel, it->second->dtype, it->second->rows);
}

DelayLine::Line& DelayLine::line_of(const std::string& key) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = lines_.find(key);
  if (it == lines_.end())
    throw InvalidArgument("tensor '" + key + "' was never registered (gradex_register_tensor)");
  return *it->second;
}

Engine& DelayLine::engine_of(const Slot& slot) {
  if (slot.lane < 0) return engine_;
  if (!lanes_.active || slot.lane >= lanes_.active->count())
    throw InternalError("a delayed exchange's lane " + std::to_string(slot.lane) + " is gone");
  return lanes_.active->lane(slot.lane);
}

void DelayLine::settle(Line& l, Slot& slot) {
  if (slot.deferred) {  // alone, through the path flush_deferred_locked takes for a step
    slot.deferred = false;
    slot.handle =
        engine_of(slot).submit_together({{&l.key, slot.exchanged.data(), slot.absent}}).front();
  }
  if (slot.handle == 0) return;
  const uint64_t h = slot.handle;
  slot.handle = 0;  // released by wait() whether it succeeds or throws
  engine_of(slot).wait(h);
}

void DelayLine::settle_before(uint64_t step) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& [key, l] : lines_) {
    std::lock_guard<std::mutex> line_lock(l->mutex);
    for (Slot& s : l->slots)
      if (s.step < step) settle(*l, s);
  }
}

DelayLine::Slot DelayLine::take_slot(Line& l, size_t bytes) {
  Slot s;
  if (!l.spare.empty()) {
    s = std::move(l.spare.back());
    l.spare.pop_back();
  }
  s.local.resize(bytes);
  s.exchanged.resize(bytes);
  return s;
}

void DelayLine::retire_oldest(Line& l, int d, void* data) {
  while (l.slots.size() > static_cast<size_t>(d)) {
    Slot old = std::move(l.slots.front());
    l.slots.pop_front();
    settle(l, old);
    if (l.slots.size() == static_cast<size_t>(d))
      correct(static_cast<uint8_t*>(data), old.exchanged.data(), old.local.data(), l.dtype, l.numel,
              settings_.stale);
    l.spare.push_back(std::move(old));
  }
}

uint64_t DelayLine::submit(const std::string& key, void* data, bool absent) {
  Line& l = line_of(key);
  const int d = delay();
  bool lanes = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    lanes = lanes_active();
  }
  if (lanes) {
    submit_to_lane(l, key, data, absent, d);
    std::lock_guard<std::mutex> lock(mutex_);
    const uint64_t h = kHandleBit | next_handle_++;
    issued_.insert(h);
    return h;
  }
  uint64_t step = 0;
  {
    std::lock_guard<std::mutex> lock(l.mutex);
    step = l.submitted;
  }
  settle_before(step);
  {
    std::lock_guard<std::mutex> lock(l.mutex);
    const size_t bytes = l.numel * dtype_size(l.dtype);
    if (data == nullptr && bytes > 0)
      throw InvalidArgument("tensor '" + key + "' submitted with a null data pointer");
    // The engine holds one exchange of a tensor at a time: step t-1's must be done before step t's
    // starts (it has had this step's compute to run).
    if (!l.slots.empty()) settle(l, l.slots.back());
    Slot s = take_slot(l, bytes);
    if (absent) {
      std::memset(s.local.data(), 0, bytes);
      std::memset(s.exchanged.data(), 0, bytes);
    } else if (bytes > 0) {
      // The engine exchanges g_t (its momentum, on the copy, makes avg the averaged momentum).
      std::memcpy(s.exchanged.data(), data, bytes);
      if (settings_.momentum > 0) {
        // x_t is this rank's own momentum of its gradients, the engine's recursion: corrected with
        // it, the steps telescope to the averaged momentum of the steps before t plus x_t. With
        // x_t = g_t the model lagged a momentum step behind (measured: the held-out cnn task 5.3
        // points below DDP at equal steps, within 0.2 points with this x).
        if (l.momentum.size() != l.numel) l.momentum.assign(l.numel, 0.0f);
        make_x(static_cast<const uint8_t*>(data), s.local.data(), l.dtype, l.numel,
               l.momentum.data(), settings_.momentum, settings_.nesterov, nullptr);
        std::memcpy(data, s.local.data(), bytes);
      } else {
        std::memcpy(s.local.data(), data, bytes);
      }
    }
    s.step = l.submitted;
    s.handle = absent ? engine_.submit_absent(key, s.exchanged.data())
                      : engine_.submit(key, s.exchanged.data());
    ++l.submitted;
    l.slots.push_back(std::move(s));
    // update_t: x_t, corrected by the oldest average held once D steps are.
    if (absent && bytes > 0) std::memset(data, 0, bytes);
    retire_oldest(l, d, data);
  }
  std::lock_guard<std::mutex> lock(mutex_);
  const uint64_t h = kHandleBit | next_handle_++;
  issued_.insert(h);
  return h;
}

void DelayLine::submit_to_lane(Line& l, const std::string& key, void* data, bool absent, int d) {
  uint64_t step = 0;
  int lane = 0;
  {
    std::lock_guard<std::mutex> lock(l.mutex);
    step = l.submitted;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    lane = static_cast<int>(steps_ended_ % static_cast<uint64_t>(d));
    touched_.insert(lane);
  }
  // Every tensor's exchanges of steps <= t - D: the step's first submission thereby waits for
  // what this step's corrections need, and its own submissions reach the lane together.
  if (step + 1 >= static_cast<uint64_t>(d)) settle_before(step + 1 - static_cast<uint64_t>(d));
  std::lock_guard<std::mutex> lock(l.mutex);
  const size_t bytes = l.numel * dtype_size(l.dtype);
  if (data == nullptr && bytes > 0)
    throw InvalidArgument("tensor '" + key + "' submitted with a null data pointer");
  // A lane holds one exchange of a tensor: the one it carried D steps ago (or fewer, when this
  // tensor skipped steps).
  for (Slot& s : l.slots)
    if (s.lane == lane) settle(l, s);
  Slot s = take_slot(l, bytes);
  uint8_t* x = s.local.data();
  // The steady state: the step this submission retires (the oldest of D + 1 held) is this lane's
  // of step t - D, settled above, so x and update_t come out of one pass.
  const bool fused = !absent && !settings_.stale && l.dtype == DType::kFloat32 && bytes > 0 &&
                     l.slots.size() == static_cast<size_t>(d) && l.slots.front().handle == 0 &&
                     !l.slots.front().deferred;
  if (absent) {
    // Zeros; momentum and the carried residual wait for a step with data (as the engine's).
    std::memset(x, 0, bytes);
  } else {
    if (settings_.momentum > 0 && l.momentum.size() != l.numel) l.momentum.assign(l.numel, 0.0f);
    const bool carry = l.carry.size() == l.numel && l.numel > 0;
    float* u = settings_.momentum > 0 ? l.momentum.data() : nullptr;
    const float* c = carry ? l.carry.data() : nullptr;
    if (fused) {
      const Slot& oldest = l.slots.front();
      make_x_and_correct(static_cast<float*>(data), reinterpret_cast<float*>(x),
                         reinterpret_cast<float*>(s.exchanged.data()), l.numel, u,
                         settings_.momentum, settings_.nesterov, c,
                         reinterpret_cast<const float*>(oldest.exchanged.data()),
                         reinterpret_cast<const float*>(oldest.local.data()));
    } else {
      make_x(static_cast<const uint8_t*>(data), x, l.dtype, l.numel, u, settings_.momentum,
             settings_.nesterov, c);
    }
    l.carry.clear();
  }
  if (bytes > 0 && !fused) {
    std::memcpy(s.exchanged.data(), x, bytes);
    std::memcpy(data, x, bytes);
  }
  s.step = l.submitted;
  s.lane = lane;
  s.handle = 0;
  s.deferred = true;
  s.absent = absent;
  ++l.submitted;
  l.slots.push_back(std::move(s));
  {
    std::lock_guard<std::mutex> lock(deferred_.mutex);
    deferred_.slots.emplace_back(&l, l.slots.back().step);
  }
  if (fused) {  // corrected above: the oldest only goes back to the spares
    l.spare.push_back(std::move(l.slots.front()));
    l.slots.pop_front();
    return;
  }
  retire_oldest(l, d, data);
}

void DelayLine::flush_deferred_locked() {
  std::vector<std::pair<Line*, uint64_t>> deferred;
  {
    std::lock_guard<std::mutex> lock(deferred_.mutex);
    deferred.swap(deferred_.slots);
  }
  // Per lane, in submission order: the slots and what they submit.
  std::map<Engine*,
           std::pair<std::vector<std::pair<Line*, Slot*>>, std::vector<Engine::HostSubmission>>>
      batches;
  for (const auto& [line, step] : deferred) {
    std::lock_guard<std::mutex> line_lock(line->mutex);
    for (Slot& s : line->slots) {
      if (s.step != step || !s.deferred) continue;
      auto& batch = batches[&engine_of(s)];
      batch.first.emplace_back(line, &s);
      batch.second.push_back({&line->key, s.exchanged.data(), s.absent});
    }
  }
  // The slots stay where they are meanwhile: a tensor is not submitted again before its step ends.
  for (auto& [engine, batch] : batches) {
    const std::vector<uint64_t> handles = engine->submit_together(batch.second);
    for (size_t i = 0; i < handles.size(); ++i) {
      auto [line, slot] = batch.first[i];
      std::lock_guard<std::mutex> line_lock(line->mutex);
      slot->deferred = false;
      slot->handle = handles[i];
    }
  }
}

void DelayLine::release(uint64_t handle) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (issued_.erase(handle) == 0)
    throw InvalidArgument("unknown or already released handle " +
                          std::to_string(handle & ~kHandleBit) + " (of GRADEX_DELAY)");
}

void DelayLine::on_end_step() {
  if (never_delays()) return;  // no lanes, no deferred slots, no measurement
  bool agree = false, decide_now = false;
  // Exposed and compute seconds a step (DelayRule::measurement), this host's ranks per core, and
  // 1 where this rank's early lanes have connected (0 else): their average is 1 only when every
  // rank's have.
  float measured[4] = {0, 0, 0, 0};
  {
    std::lock_guard<std::mutex> lock(mutex_);
    flush_deferred_locked();
    for (int lane : touched_)
      lanes_.active->lane(lane).end_step();
    touched_.clear();
    ++steps_ended_;
    if (lanes_.pending && steps_ended_ >= lanes_.pending_from) take_pending_lanes();
    if (lanes_.early && lanes_.early_close_at != 0 && steps_ended_ >= lanes_.early_close_at)
      close_early_lanes();
    maybe_start_early_lanes();
    agree = rule_.observe(engine_.stats(false).exposed_seconds, now_s());
    if (agree) {
      rule_.measurement(measured);
      measured[2] = static_cast<float>(engine_.cpu_share());
      measured[3] = lanes_.early && lanes_.early->ready() ? 1.0f : 0.0f;
    }
    decide_now = agreement_.held && rule_.at_decision();
    if (agree && rule_.agrees_ahead()) {
      // Collective: every rank closes the window at the same step count. The average travels
      // while the next step computes (two latencies and a negotiation round: at 25 ms one way
      // ~80 ms that the step ending here waited for before), and that step's end decides.
      std::copy(measured, measured + 4, agreement_.values);
      agreement_.held = true;
      agreement_.handle = engine_.average(kAgreementKey, agreement_.values);
      return;
    }
  }
  if (agree) {
    // Collective: every rank closes the window at the same step count.
    engine_.wait(engine_.average(kAgreementKey, measured));
    decide(measured);
    return;
  }
  if (!decide_now) return;
  uint64_t handle = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    handle = agreement_.handle;
  }
  if (handle != 0) engine_.wait(handle);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    std::copy(agreement_.values, agreement_.values + 4, measured);
    agreement_ = Agreement{};
  }
  decide(measured);
}

void DelayLine::decide(const float measured[4]) {
  std::lock_guard<std::mutex> lock(mutex_);
  std::string lanes_why = lanes_held();
  const bool not_latency_bound = !settings_.test_lanes && engine_.link_latency_bound() == 0;
  if (lanes_why.empty() && not_latency_bound)
    lanes_why = "overlap round trips, not bytes or CPU, and the agreed link is not latency-bound";
  std::string held = has_cuda_ ? "CUDA tensors (the delay's copies are host memory)" : "";
  // Where the link is not latency-bound, what one exchange in flight overlaps is the exchange's
  // bytes and CPU; on hosts whose ranks outnumber their cores the compute holds every core, and
  // the overlap only moves that CPU into the steps (measured on a 1 Gbit/s LAN, 4 ranks on 2
  // cores, SGD MLP: D=1 at 0.91x and 0.94x of D=0's steps per second, 10 more steps to the
  // target). The average over ranks is agreed, so every rank holds or none does.
  if (held.empty() && not_latency_bound && measured[2] > 1.0f) {
    std::ostringstream why;
    why.precision(3);
    why << "the ranks share cores (" << measured[2]
        << " ranks a core, averaged over ranks) on a link that is not latency-bound: one exchange "
           "in flight would move its CPU work into the steps' compute";
    held = why.str();
  }
  rule_.decide(measured[0], measured[1], held, lanes_why);
  // The steps with one exchange in flight continue the undelayed engine's momentum in x_t.
  if (rule_.delay() >= 1 && settings_.momentum > 0) {
    for (auto& [key, l] : lines_) {
      std::lock_guard<std::mutex> line_lock(l->mutex);
      l->momentum = engine_.momentum_of(key);
    }
  }
  // Collective as well: the decision is the same on every rank, at the same step. The lanes
  // (connecting since the link was agreed latency-bound, or from now on) take over at a step
  // computed from agreed numbers only (the same on every rank and in a resumed run), the steps
  // before it running with one exchange in flight.
  // Lanes started before the probe take its agreed model now, while this engine is idle (no step
  // has had an exchange in flight yet), and adopt it before their first exchange.
  if (lanes_.early && !lanes_.early->has_link())
    lanes_.early->adopt_later(engine_.link_model_copy());
  settle_lanes_at_decision(measured[3] == 1.0f);
}

void DelayLine::set_gradient_norm(double norm) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (lanes_active())
    lanes_.active->lane(static_cast<int>(steps_ended_ % static_cast<uint64_t>(rule_.delay())))
        .set_gradient_norm(norm);
  else
    engine_.set_gradient_norm(norm);
}

Stats DelayLine::stats(bool last_step) const {
  std::lock_guard<std::mutex> lock(mutex_);
  const Stats own = engine_.stats(last_step);
  return lanes_.active ? own.plus(lanes_.active->stats(last_step)) : own;
}

void DelayLine::on_reconfigure() {
  std::lock_guard<std::mutex> lock(mutex_);
  reconfigured_ = true;
  // auto's measurement belongs to the old membership; an agreement of it in flight is aborted
  // with the old membership's work (its buffer stays in agreement_, which the engine may write
  // until then), so no decision waits for it: the window restarts.
  agreement_.held = false;
  agreement_.handle = 0;
  rule_.restart_window();
  // Lanes of the old membership (every rank reconfigures at the same point).
  if (lanes_.early) close_early_lanes();
}

void DelayLine::drain_locked() {
  flush_deferred_locked();
  for (auto& [key, l] : lines_) {
    std::lock_guard<std::mutex> line_lock(l->mutex);
    for (Slot& s : l->slots)
      settle(*l, s);
  }
}

void DelayLine::drain() {
  std::lock_guard<std::mutex> lock(mutex_);
  drain_locked();
  for (auto& [key, l] : lines_) {
    std::lock_guard<std::mutex> line_lock(l->mutex);
    while (!l->slots.empty()) {
      l->spare.push_back(std::move(l->slots.front()));
      l->slots.pop_front();
    }
  }
}

namespace {

void put_floats(ByteWriter& w, const std::vector<float>& v) {
  w.put<uint64_t>(v.size());
  w.put_bytes(reinterpret_cast<const uint8_t*>(v.data()), v.size() * sizeof(float));
}

std::vector<float> get_floats(ByteReader& r, uint64_t numel, const std::string& key) {
  const uint64_t n = r.get<uint64_t>();
  if (n != 0 && n != numel)
    throw StateError("gradex delay state's tensor '" + key + "' holds " + std::to_string(n) +
                     " momentum or residual values for " + std::to_string(numel) + " elements");
  std::vector<float> v(n);
  if (n > 0) std::memcpy(v.data(), r.get_bytes(n * sizeof(float)), n * sizeof(float));
  return v;
}

}  // namespace

std::vector<uint8_t> DelayLine::save_state() {
  std::lock_guard<std::mutex> lock(mutex_);
  drain_locked();
  // The measurement's agreement in flight: every rank submitted it, so it ends; the state holds the
  // agreed values and the decision stays at its step.
  if (agreement_.handle != 0) {
    engine_.wait(agreement_.handle);
    agreement_.handle = 0;
  }
  std::vector<uint8_t> engine_state = engine_.save_state();
  if (never_delays()) return engine_state;
  ByteWriter w;
  w.put<uint32_t>(kMagic);
  w.put<uint32_t>(kVersion);
  w.put<uint64_t>(engine_state.size());
  w.put_bytes(engine_state.data(), engine_state.size());
  const DelayRule::Saved r = rule_.saved();
  w.put<uint64_t>(r.steps);
  w.put<int32_t>(r.delay);
  w.put<uint8_t>(r.decided);
  w.put<double>(r.exposed_at_start);
  w.put<double>(r.exposed_at_end);
  w.put<double>(r.wall_s);
  w.put<float>(r.exposed);
  w.put<float>(r.compute);
  const std::vector<std::vector<uint8_t>> lane_states =
      lanes_.active ? lanes_.active->save_states() : std::vector<std::vector<uint8_t>>{};
  w.put<uint64_t>(steps_ended_);
  w.put<uint64_t>(lanes_.pending ? lanes_.pending_from : 0);
  w.put<uint8_t>(agreement_.held ? 1 : 0);
  for (float v : agreement_.values)
    w.put<float>(v);
  w.put<uint32_t>(static_cast<uint32_t>(lane_states.size()));
  for (const auto& state : lane_states) {
    w.put<uint64_t>(state.size());
    w.put_bytes(state.data(), state.size());
  }
  uint32_t held = 0;
  for (auto& [key, l] : lines_)
    held += (l->slots.empty() && l->momentum.empty() && l->carry.empty()) ? 0 : 1;
  w.put<uint32_t>(held);
  for (auto& [key, l] : lines_) {
    std::lock_guard<std::mutex> line_lock(l->mutex);
    if (l->slots.empty() && l->momentum.empty() && l->carry.empty()) continue;
    w.put_string(key);
    w.put<uint64_t>(l->numel);
    w.put<uint8_t>(static_cast<uint8_t>(l->dtype));
    w.put<uint64_t>(l->submitted);
    put_floats(w, l->momentum);
    put_floats(w, l->carry);
    w.put<uint32_t>(static_cast<uint32_t>(l->slots.size()));
    for (const Slot& s : l->slots) {
      w.put<uint64_t>(s.step);
      w.put<int32_t>(s.lane);
      w.put_bytes(s.local.data(), s.local.size());
      w.put_bytes(s.exchanged.data(), s.exchanged.size());
    }
  }
  return std::move(w.bytes());
}

void DelayLine::load_state(const uint8_t* data, size_t size) {
  std::lock_guard<std::mutex> lock(mutex_);
  uint32_t magic = 0;
  if (size >= 4) std::memcpy(&magic, data, 4);
  if (magic != kMagic) {
    engine_.load_state(data, size);
    drain_locked();
    for (auto& [key, l] : lines_) {
      l->slots.clear();
      l->momentum.clear();
      l->carry.clear();
    }
    return;
  }
  ByteReader r(data, size, "saved gradex state (GRADEX_DELAY)");
  r.get<uint32_t>();
  const uint32_t version = r.get<uint32_t>();
  if (version < 2 || version > kVersion)
    throw StateError("gradex delay state version " + std::to_string(version) +
                     " is not supported (this build reads version " + std::to_string(kVersion) +
                     ")");
  const uint64_t engine_size = r.get<uint64_t>();
  const uint8_t* engine_state = r.get_bytes(engine_size);
  DelayRule::Saved saved;
  saved.steps = r.get<uint64_t>();
  saved.delay = r.get<int32_t>();
  saved.decided = r.get<uint8_t>();
  saved.exposed_at_start = r.get<double>();
  saved.exposed_at_end = r.get<double>();
  saved.wall_s = r.get<double>();
  saved.exposed = r.get<float>();
  saved.compute = r.get<float>();
  const uint64_t steps_ended = r.get<uint64_t>();
  const uint64_t lanes_from = version >= 3 ? r.get<uint64_t>() : 0;
  Agreement agreement;
  if (version >= 4) {
    agreement.held = r.get<uint8_t>() != 0;
    for (float& v : agreement.values)
      v = r.get<float>();
  }
  if (agreement.held && saved.decided)
    throw StateError("gradex delay state holds an agreed measurement and a decision taken");
  if (lanes_from != 0 && lanes_from <= steps_ended)
    throw StateError("gradex delay state's lanes take over at step " + std::to_string(lanes_from) +
                     ", which is not after its step " + std::to_string(steps_ended));
  const uint32_t lane_count = r.get<uint32_t>();
  if (lane_count > static_cast<uint32_t>(kMaxDelay))
    throw StateError("gradex delay state holds " + std::to_string(lane_count) +
                     " lanes, more than GRADEX_DELAY's maximum");
  std::vector<std::pair<const uint8_t*, size_t>> lane_states;
  for (uint32_t i = 0; i < lane_count; ++i) {
    const uint64_t n = r.get<uint64_t>();
    lane_states.emplace_back(r.get_bytes(n), static_cast<size_t>(n));
  }
  // Parse everything before changing anything: a bad state leaves the line and the engine intact.
  struct Parsed {
    Line* line;
    uint64_t submitted;
    std::vector<float> momentum, carry;
    std::vector<std::pair<uint64_t, int32_t>> steps;  // per held slot: step, lane
    std::vector<const uint8_t*> bytes;                // per held slot: local, then exchanged
  };
  std::vector<Parsed> parsed;
  const uint32_t held = r.get<uint32_t>();
  for (uint32_t i = 0; i < held; ++i) {
    const std::string key = r.get_string();
    const uint64_t numel = r.get<uint64_t>();
    const uint8_t dtype = r.get<uint8_t>();
    auto it = lines_.find(key);
    if (it == lines_.end())
      throw StateError("gradex delay state holds tensor '" + key +
                       "', which is not registered here (register every tensor first)");
    if (it->second->numel != numel || static_cast<uint8_t>(it->second->dtype) != dtype)
      throw StateError("gradex delay state's tensor '" + key + "' has another size or type");
    Parsed p;
    p.line = it->second.get();
    p.submitted = r.get<uint64_t>();
    p.momentum = get_floats(r, numel, key);
    p.carry = get_floats(r, numel, key);
    const uint32_t slots = r.get<uint32_t>();
    if (slots > static_cast<uint32_t>(kMaxDelay))
      throw StateError("gradex delay state's tensor '" + key + "' holds " + std::to_string(slots) +
                       " steps, more than GRADEX_DELAY's maximum");
    const uint64_t bytes = numel * dtype_size(static_cast<DType>(dtype));
    for (uint32_t k = 0; k < slots; ++k) {
      const uint64_t step = r.get<uint64_t>();
      const int32_t lane = r.get<int32_t>();
      if (lane >= static_cast<int32_t>(lane_count) || lane < -1)
        throw StateError("gradex delay state's tensor '" + key + "' names lane " +
                         std::to_string(lane) + " of " + std::to_string(lane_count));
      p.steps.emplace_back(step, lane);
      p.bytes.push_back(r.get_bytes(2 * bytes));
    }
    parsed.push_back(std::move(p));
  }
  // An agreement of this run's still in flight writes into agreement_ until it ends.
  if (agreement_.handle != 0) engine_.wait(agreement_.handle);
  engine_.load_state(engine_state, engine_size);
  drain_locked();
  for (auto& [key, l] : lines_) {
    l->slots.clear();
    l->momentum.clear();
    l->carry.clear();
  }
  const bool window_closed = rule_.restore(saved, agreement.held);
  steps_ended_ = steps_ended;
  agreement_ = window_closed ? agreement : Agreement{};
  // Lanes connecting ahead of a decision that the state has taken: one lane set connects at a time.
  if (lanes_.early && rule_.decided()) close_early_lanes();
  touched_.clear();
  if (lane_count == 0 && lanes_from != 0) {
    // The saved run's lanes were connecting: they connect again and take over at the same step.
    lanes_.active.reset();
    if (!lanes_.pending) {
      const std::string held_here = lanes_held();
      if (!held_here.empty())
        throw StateError("gradex delay state connects " + std::to_string(rule_.delay()) +
                         " lanes, which this engine cannot: it " + held_here);
      start_pending_lanes(rule_.delay(), lanes_from);
    }
    lanes_.pending_from = lanes_from;
  } else {
    lanes_.pending.reset();
  }
  if (lane_count > 0) {
    // The saved run ran lanes: this one runs the same (a fixed D made them at the start; auto's
    // decision, restored above, makes them now: collective, as every rank loads the same state).
    if (!lanes_.active || lanes_.active->count() != static_cast<int>(lane_count)) {
      const std::string held_here = lanes_held();
      if (!held_here.empty())
        throw StateError("gradex delay state runs " + std::to_string(lane_count) +
                         " lanes, which this engine cannot: it " + held_here);
      lanes_.active.reset();
      make_lanes(static_cast<int>(lane_count), false);
    }
    lanes_.active->load_states(lane_states);
  }
  for (Parsed& p : parsed) {
    const size_t bytes = p.line->numel * dtype_size(p.line->dtype);
    p.line->submitted = p.submitted;
    p.line->momentum = std::move(p.momentum);
    p.line->carry = std::move(p.carry);
    for (size_t k = 0; k < p.steps.size(); ++k) {
      const uint8_t* at = p.bytes[k];
      Slot s;
      s.step = p.steps[k].first;
      s.lane = p.steps[k].second;
      s.local.assign(at, at + bytes);
      s.exchanged.assign(at + bytes, at + 2 * bytes);
      p.line->slots.push_back(std::move(s));
    }
  }
}

std::string DelayLine::explain() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::string out = rule_.why();
  if (lanes_.early && !rule_.decided())
    out += "; " + std::to_string(lanes_.early->count()) +
           " lanes connect meanwhile (the agreed link is latency-bound), to take over if D >= 2 "
           "is chosen";
  if (lanes_.pending)
    out += "; D=1 while its lanes connect in the background, D=" + std::to_string(rule_.delay()) +
           " from step " + std::to_string(lanes_.pending_from);
  if (lanes_active())
    out += "; " + std::to_string(lanes_.active->count()) +
           " lanes, one exchange of each tensor in flight on each, gradex's momentum applied "
           "before them\n" +
           lanes_.active->explain();
  return out;
}

}  // namespace gradex::sync::delay
