#include "sync/delay/delay_line.h"

#include <chrono>
#include <cstring>

#include "base/error.h"
#include "base/half.h"
#include "base/log.h"
#include "sync/byte_io.h"
#include "sync/engine.h"

namespace gradex::sync::delay {

namespace {

constexpr uint32_t kMagic = 0x4c445847;  // "GXDL": an engine state with a delay line's
constexpr uint32_t kVersion = 1;

// The tensor registered under auto for the one agreement of the measurement (Engine::average:
// its first average is fp32, the same bits on every rank).
constexpr const char* kAgreementKey = "gradex.delay.auto";

float load(const uint8_t* p, DType t, uint64_t i) {
  if (t == DType::kFloat32) {
    float v;
    std::memcpy(&v, p + 4 * i, 4);
    return v;
  }
  uint16_t h;
  std::memcpy(&h, p + 2 * i, 2);
  return t == DType::kFloat16 ? half_to_float(h) : bf16_to_float(h);
}

void store(uint8_t* p, DType t, uint64_t i, float v) {
  if (t == DType::kFloat32) {
    std::memcpy(p + 4 * i, &v, 4);
    return;
  }
  const uint16_t h = t == DType::kFloat16 ? float_to_half(v) : float_to_bf16(v);
  std::memcpy(p + 2 * i, &h, 2);
}

// out = g + (avg - g_old), element by element in fp32 (one rounding to a 16-bit type at the end).
// In place: `out` holds g on entry. `stale`: out = avg (GRADEX_DELAY_RULE=stale).
void correct(uint8_t* out, const uint8_t* avg, const uint8_t* old, DType t, uint64_t n,
             bool stale) {
  if (stale) {
    std::memcpy(out, avg, n * dtype_size(t));
    return;
  }
  if (t == DType::kFloat32) {
    float* o = reinterpret_cast<float*>(out);
    const float* a = reinterpret_cast<const float*>(avg);
    const float* g = reinterpret_cast<const float*>(old);
    for (uint64_t i = 0; i < n; ++i)
      o[i] = o[i] + (a[i] - g[i]);
    return;
  }
  for (uint64_t i = 0; i < n; ++i)
    store(out, t, i, load(out, t, i) + (load(avg, t, i) - load(old, t, i)));
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

DelayLine::DelayLine(Engine& engine)
    : engine_(engine),
      rule_(engine.config()),
      stale_(engine.config().get_string("GRADEX_DELAY_RULE") == "stale") {
  if (rule_.automatic()) engine_.register_tensor(kAgreementKey, 2, DType::kFloat32);
}

DelayLine::~DelayLine() = default;

int DelayLine::delay() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return rule_.delay();
}

void DelayLine::on_register(const std::string& key, uint64_t numel, DType dtype, bool cuda) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (cuda && !rule_.automatic() && rule_.delay() > 0)
    throw InvalidArgument("tensor '" + key +
                          "' is CUDA memory: GRADEX_DELAY=" + std::to_string(rule_.delay()) +
                          " keeps its copies in host memory and takes host tensors only; set "
                          "GRADEX_DELAY=0 for CUDA tensors");
  if (cuda) has_cuda_ = true;
  auto& l = lines_[key];
  if (!l) l = std::make_unique<Line>();
  std::lock_guard<std::mutex> line_lock(l->mutex);
  if (!l->slots.empty() && (l->numel != numel || l->dtype != dtype))
    throw InvalidArgument("tensor '" + key +
                          "' registered again with another size or type while "
                          "its delayed exchanges are held (GRADEX_DELAY)");
  l->numel = numel;
  l->dtype = dtype;
}

DelayLine::Line& DelayLine::line_of(const std::string& key) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = lines_.find(key);
  if (it == lines_.end())
    throw InvalidArgument("tensor '" + key + "' was never registered (gradex_register_tensor)");
  return *it->second;
}

void DelayLine::settle(Slot& slot) {
  if (slot.handle == 0) return;
  const uint64_t h = slot.handle;
  slot.handle = 0;  // released by wait() whether it succeeds or throws
  engine_.wait(h);
}

void DelayLine::settle_before(uint64_t step) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& [key, l] : lines_) {
    std::lock_guard<std::mutex> line_lock(l->mutex);
    for (Slot& s : l->slots)
      if (s.step < step) settle(s);
  }
}

uint64_t DelayLine::submit(const std::string& key, void* data, bool absent) {
  Line& l = line_of(key);
  const int d = delay();
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
    if (!l.slots.empty()) settle(l.slots.back());
    Slot s;
    if (!l.spare.empty()) {
      s = std::move(l.spare.back());
      l.spare.pop_back();
    }
    s.local.resize(bytes);
    s.exchanged.resize(bytes);
    if (absent)
      std::memset(s.local.data(), 0, bytes);
    else if (bytes > 0)
      std::memcpy(s.local.data(), data, bytes);
    if (bytes > 0) std::memcpy(s.exchanged.data(), s.local.data(), bytes);
    s.step = l.submitted;
    s.handle = absent ? engine_.submit_absent(key, s.exchanged.data())
                      : engine_.submit(key, s.exchanged.data());
    ++l.submitted;
    l.slots.push_back(std::move(s));
    // update_t: g_t, corrected by the oldest average held once D steps are.
    if (absent && bytes > 0) std::memset(data, 0, bytes);
    while (l.slots.size() > static_cast<size_t>(d)) {
      Slot old = std::move(l.slots.front());
      l.slots.pop_front();
      settle(old);
      if (l.slots.size() == static_cast<size_t>(d))
        correct(static_cast<uint8_t*>(data), old.exchanged.data(), old.local.data(), l.dtype,
                l.numel, stale_);
      l.spare.push_back(std::move(old));
    }
  }
  std::lock_guard<std::mutex> lock(mutex_);
  const uint64_t h = kHandleBit | next_handle_++;
  issued_.insert(h);
  return h;
}

void DelayLine::release(uint64_t handle) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (issued_.erase(handle) == 0)
    throw InvalidArgument("unknown or already released handle " +
                          std::to_string(handle & ~kHandleBit) + " (of GRADEX_DELAY)");
}

void DelayLine::on_end_step() {
  bool agree = false;
  float measured[2] = {0, 0};
  {
    std::lock_guard<std::mutex> lock(mutex_);
    agree = rule_.observe(engine_.stats(false).exposed_seconds, now_s());
    if (agree) rule_.measurement(measured);
  }
  if (!agree) return;
  // Collective: every rank closes the window at the same step count.
  engine_.wait(engine_.average(kAgreementKey, measured));
  std::lock_guard<std::mutex> lock(mutex_);
  rule_.decide(measured[0], measured[1],
               has_cuda_ ? "CUDA tensors (the delay's copies are host memory)" : "");
}

void DelayLine::drain_locked() {
  for (auto& [key, l] : lines_) {
    std::lock_guard<std::mutex> line_lock(l->mutex);
    for (Slot& s : l->slots)
      settle(s);
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

std::vector<uint8_t> DelayLine::save_state() {
  std::lock_guard<std::mutex> lock(mutex_);
  drain_locked();
  std::vector<uint8_t> engine_state = engine_.save_state();
  if (!rule_.automatic() && rule_.delay() == 0) return engine_state;
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
  uint32_t held = 0;
  for (auto& [key, l] : lines_)
    held += l->slots.empty() ? 0 : 1;
  w.put<uint32_t>(held);
  for (auto& [key, l] : lines_) {
    std::lock_guard<std::mutex> line_lock(l->mutex);
    if (l->slots.empty()) continue;
    w.put_string(key);
    w.put<uint64_t>(l->numel);
    w.put<uint8_t>(static_cast<uint8_t>(l->dtype));
    w.put<uint32_t>(static_cast<uint32_t>(l->slots.size()));
    for (const Slot& s : l->slots) {
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
    for (auto& [key, l] : lines_)
      l->slots.clear();
    return;
  }
  ByteReader r(data, size, "saved gradex state (GRADEX_DELAY)");
  r.get<uint32_t>();
  const uint32_t version = r.get<uint32_t>();
  if (version != kVersion)
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
  // Parse everything before changing anything: a bad state leaves the line and the engine intact.
  struct Parsed {
    Line* line;
    uint32_t slots;
    const uint8_t* bytes;
  };
  std::vector<Parsed> parsed;
  const uint32_t held = r.get<uint32_t>();
  for (uint32_t i = 0; i < held; ++i) {
    const std::string key = r.get_string();
    const uint64_t numel = r.get<uint64_t>();
    const uint8_t dtype = r.get<uint8_t>();
    const uint32_t slots = r.get<uint32_t>();
    auto it = lines_.find(key);
    if (it == lines_.end())
      throw StateError("gradex delay state holds tensor '" + key +
                       "', which is not registered here (register every tensor first)");
    if (it->second->numel != numel || static_cast<uint8_t>(it->second->dtype) != dtype)
      throw StateError("gradex delay state's tensor '" + key + "' has another size or type");
    if (slots > static_cast<uint32_t>(kMaxDelay))
      throw StateError("gradex delay state's tensor '" + key + "' holds " + std::to_string(slots) +
                       " steps, more than GRADEX_DELAY's maximum");
    const uint64_t bytes = numel * dtype_size(static_cast<DType>(dtype));
    parsed.push_back({it->second.get(), slots, r.get_bytes(2 * bytes * slots)});
  }
  engine_.load_state(engine_state, engine_size);
  drain_locked();
  for (auto& [key, l] : lines_)
    l->slots.clear();
  rule_.restore(saved);
  for (const Parsed& p : parsed) {
    const size_t bytes = p.line->numel * dtype_size(p.line->dtype);
    for (uint32_t k = 0; k < p.slots; ++k) {
      Slot s;
      s.local.assign(p.bytes + 2 * bytes * k, p.bytes + 2 * bytes * k + bytes);
      s.exchanged.assign(p.bytes + 2 * bytes * k + bytes, p.bytes + 2 * bytes * (k + 1));
      p.line->slots.push_back(std::move(s));
    }
  }
}

std::string DelayLine::explain() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return rule_.why();
}

}  // namespace gradex::sync::delay
