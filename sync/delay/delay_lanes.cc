#include "sync/delay/delay_lanes.h"

#include <algorithm>
#include <chrono>

#include "base/error.h"
#include "base/log.h"
#include "sync/engine/engine.h"
#include "sync/policy/agreed_link.h"

namespace gradex::sync::delay {

DelayLanes::DelayLanes(const Factory& make, Engine& delayed, int count, int first_slot,
                       Start start) {
  if (!make) throw InternalError("the delayed exchange's lanes need an engine factory");
  config::Config lane_config = delayed.config();
  if (delayed.layout_description().rfind("regions", 0) != 0)
    lane_config.set("GRADEX_HIERARCHY_TIER", "host");
  // The lanes are parallel flows already: under GRADEX_STRIPES=auto each keeps one connection to
  // a peer (no round trip timed for striping, one wire-up instead of several per lane).
  if (lane_config.get_string("GRADEX_STRIPES") == "auto") lane_config.set("GRADEX_STRIPES", "1");
  // The lanes' collectives share the link with each other's: their timings would read it slower
  // than the probe found it, and each lane's plan would drift on its own.
  if (lane_config.get_string("GRADEX_POLICY") == "auto")
    lane_config.set("GRADEX_POLICY_LEARN_LINK", "0");
  lane_config.set("GRADEX_DELAY", "0");
  lane_config.set("GRADEX_MOMENTUM", "0");
  lane_config.set("GRADEX_NESTEROV", "0");
  // GRADEX_TIMELINE stays: each lane writes its own rank<r>.<n>.json beside the delayed engine's
  // (n = 2.. in the order the lanes are made, the same on every rank), so a lane whose exchanges
  // hold steps up shows in the merged trace as a process of its own.
  // Each lane plans as if its exchange had one step's compute and the whole link: it has `count`
  // steps (GRADEX_POLICY_SLACK is not widened) but shares the link with the other count - 1 lanes
  // in flight (the rate is not divided), and for the bytes the two cancel. A lane's own compute,
  // measured between its submissions, holds the steps' waits: a deadline grown from it would
  // loosen the plan as the steps slow (measured: fp32 chosen for a 4M-element tensor, 1-2 s
  // transfers, half the steps/s).
  link_ = delayed.link_model_copy();
  const int rank = delayed.rank();
  if (start == Start::kNow) {
    connect(make, lane_config, count, first_slot, rank);
    return;
  }
  starter_ = std::thread([this, make, lane_config, count, first_slot, rank] {
    try {
      connect(make, lane_config, count, first_slot, rank);
    } catch (...) {
      failure_ = std::current_exception();
    }
    ready_ = true;
  });
}

void DelayLanes::connect(const Factory& make, const config::Config& lane_config, int count,
                         int first_slot, int rank) {
  // One after another: the lanes meet through one store client, whose blocking reads are served
  // one at a time (a lane waiting there for a peer's key would hold up the lane that must write
  // the key that peer waits for).
  const auto started = std::chrono::steady_clock::now();
  for (int i = 0; i < count; ++i) {
    lanes_.push_back(make(first_slot + i, lane_config, link_.get()));
    // Off the steps' path (measured at 25 ms one way: ~50 ms of CPU inside each lane's first
    // exchange, on every rank at once, when the lanes took over).
    lanes_.back()->calibrate_policy();
  }
  connect_seconds_ =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  if (rank == 0) {
    GX_LOG(kInfo) << "delay: " << count << " lanes connected in " << connect_seconds_ * 1e3
                  << " ms";
  }
  ready_ = true;
}

DelayLanes::~DelayLanes() {
  if (starter_.joinable()) starter_.join();
}

bool DelayLanes::ready() const {
  return ready_;
}

void DelayLanes::wait_ready() {
  if (starter_.joinable()) starter_.join();
  if (failure_) std::rethrow_exception(failure_);
  if (!later_) return;
  for (auto& lane : lanes_)
    lane->adopt_link_model(*later_);
  later_.reset();
}

bool DelayLanes::has_link() const {
  return link_ != nullptr && link_->model() != nullptr;
}

void DelayLanes::adopt_later(std::unique_ptr<AgreedLink> link) {
  later_ = std::move(link);
}

double DelayLanes::connect_seconds() const {
  return ready_ ? connect_seconds_ : 0.0;
}

void DelayLanes::keep_first(int n) {
  while (static_cast<int>(lanes_.size()) > std::max(n, 0))
    lanes_.pop_back();
}

void DelayLanes::register_tensor(const std::string& key, uint64_t numel, DType dtype,
                                 uint64_t rows) {
  for (auto& lane : lanes_)
    lane->register_tensor(key, numel, dtype, false, rows);
}

Stats DelayLanes::stats(bool last_step) const {
  Stats sum;
  for (const auto& lane : lanes_)
    sum = sum.plus(lane->stats(last_step));
  return sum;
}

std::vector<std::vector<uint8_t>> DelayLanes::save_states() {
  std::vector<std::vector<uint8_t>> states;
  for (auto& lane : lanes_)
    states.push_back(lane->save_state());
  return states;
}

void DelayLanes::load_states(const std::vector<std::pair<const uint8_t*, size_t>>& states) {
  if (states.size() != lanes_.size())
    throw StateError("gradex delay state holds " + std::to_string(states.size()) +
                     " lanes, this engine runs " + std::to_string(lanes_.size()));
  for (size_t i = 0; i < lanes_.size(); ++i)
    lanes_[i]->load_state(states[i].first, states[i].second);
}

std::string DelayLanes::explain() const {
  std::string out;
  for (size_t i = 0; i < lanes_.size(); ++i)
    out += "lane " + std::to_string(i) + " (steps s with s mod " + std::to_string(lanes_.size()) +
           " = " + std::to_string(i) + "):\n" + lanes_[i]->explain() + "\n";
  return out;
}

}  // namespace gradex::sync::delay
