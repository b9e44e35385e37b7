// The engine's link model for the current membership (sync/policy/link_model.h): probed once, the
// first time a decision needs it (the auto policy's first plan, a route that chooses its collective
// by it; on a path its start measured as long, the start itself: Engine::connect), and agreed on
// rank 0's numbers. The probe runs before a unit's bytes are counted (a
// route's plan step, route::Transfer::plan), so no unit pays for it.
#pragma once

#include <algorithm>
#include <memory>
#include <utility>
#include <vector>

#include "comm/communicator.h"
#include "sync/policy/link_model.h"
#include "sync/policy/link_probe.h"

namespace gradex::sync {

class AgreedLink {
 public:
  // The incast bursts each other-host rank sends into rank 0 (at most 16 MiB in all, and what
  // the link moves in 0.5 s). The first: at 4 ranks 3 MiB, four times what a ResNet-50 DGC 99.9%
  // gather brings into one rank. The second: at 4 ranks 12 MiB, what a phase of the direct dense
  // allreduce brings into one rank from a 16-bit bucket of up to 8M elements; left unmeasured,
  // such a phase was priced at the rule's retransmission timeout and went around the ring.
  static constexpr size_t kBurstBytesPerSender[] = {size_t{1} << 20, size_t{4} << 20};

  // `port_queue_explicit`: GRADEX_PORT_QUEUE_MS was set, so the model takes it as written and the
  // probe measures no incast burst.
  AgreedLink(double port_queue_s, bool port_queue_explicit)
      : port_queue_s_(port_queue_s), port_queue_explicit_(port_queue_explicit) {}
  // A copy of the agreed model (none when `other` has not probed): what another membership over
  // the same ranks adopts later, taken while `other`'s engine is idle.
  AgreedLink(const AgreedLink& other)
      : port_queue_s_(other.port_queue_s_), port_queue_explicit_(other.port_queue_explicit_) {
    adopt(other);
  }
  AgreedLink& operator=(const AgreedLink&) = delete;

  // Collective (every rank at the same point of the same round): the model, probed on the first
  // call of a membership. `incast`: the caller prices arrivals (DGC gathers, dense buckets), so
  // the model must hold the measured incast bursts; without it (the 8-bit and 4-bit routes, which
  // only need to know whether the link is latency-bound) the bursts are timed only on a
  // latency-bound link, and a later call that needs them probes again (the only second probe).
  const LinkModel& agree(comm::Communicator& comm, bool incast = true);
  // The agreed model; null before the first agree() of the membership.
  const LinkModel* model() const { return model_.get(); }
  // Changes whenever model() does (a probe, reset, adopt): what a caller derived from the model at
  // another generation is stale.
  uint64_t generation() const { return generation_; }
  // The probe behind the model (hosts, the transport's CPU); null before, or with one rank.
  const cost::ProbeResult* probe() const { return probe_.get(); }
  // Takes `other`'s agreed model and probe (when it has one), so that no probe runs here: another
  // membership over the same ranks and hosts (the delayed exchange's lanes). Every rank adopts
  // the same numbers, so decisions stay agreed.
  void adopt(const AgreedLink& other) {
    if (!other.model_) return;
    replace_model(std::make_unique<LinkModel>(*other.model_));
    probe_ = other.probe_ ? std::make_unique<cost::ProbeResult>(*other.probe_) : nullptr;
    lacks_bursts_ = other.lacks_bursts_;
  }
  // The longest of the round trips the membership's start measured from rank 0 to the other hosts
  // (reset's; the same on every rank), 0 when none was measured: what the probe will take as the
  // flat tier's latency on a long path (sync/policy/link_probe.h), known before it runs.
  double known_farthest_round_trip_s() const {
    double farthest = 0;
    for (const auto& rank_and_seconds : rank0_round_trips_s_)
      farthest = std::max(farthest, rank_and_seconds.second);
    return farthest;
  }
  // A new membership (Engine::connect) probes its own links again; `rank0_round_trips_s`: what its
  // start measured already (ProbeOptions::rank0_round_trips_s; the same on every rank).
  void reset(std::vector<std::pair<int, double>> rank0_round_trips_s = {}) {
    replace_model(nullptr);
    probe_.reset();
    lacks_bursts_ = false;
    rank0_round_trips_s_ = std::move(rank0_round_trips_s);
  }

 private:
  // Every change of the model goes through here, so that generation() follows it.
  void replace_model(std::unique_ptr<LinkModel> model) {
    model_ = std::move(model);
    ++generation_;
  }

  double port_queue_s_;
  bool port_queue_explicit_;
  std::unique_ptr<LinkModel> model_;
  uint64_t generation_ = 0;
  std::unique_ptr<cost::ProbeResult> probe_;
  bool lacks_bursts_ = false;
  std::vector<std::pair<int, double>> rank0_round_trips_s_;
};

}  // namespace gradex::sync
