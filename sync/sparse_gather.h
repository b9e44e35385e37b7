// How the engine gathers a DGC unit's messages: one round trip while every
// payload is small, and above the inline maximum the direct exchange or the ring, whichever the
// cost model predicts faster for the sizes at hand.
//
// Agreement. The choice must be the same on every rank, or ranks would run different collectives.
// It depends only on numbers every rank holds identically: the link model (rank 0's probe,
// sync/link_probe.h, run once at the engine's first sparse unit; every rank receives rank 0's
// alpha and beta and every rank's host identity), the shared options (GRADEX_PORT_QUEUE_MS,
// GRADEX_ALLGATHER_INLINE_KB), the world size, and every rank's payload size, which every rank
// knows after the allgatherv's first round (comm/collectives.h: allgatherv_inline's ring_for).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "comm/collectives.h"
#include "sync/cost_model.h"
#include "sync/link_probe.h"
#include "sync/options.h"

namespace gradex::sync {

// The alpha-beta model of an allgatherv's payload round, on the link class the collective crosses.
// `following[q]` is the bytes of rank q's payload still to move (0: none).
//   direct: one message latency; the busiest link is the largest sender's uplink (P-1 copies of
//           its payload) or the busiest receiver's downlink (everything the others send), plus,
//           across hosts, the incast's cost (incast_seconds).
//   ring:   P-1 hops of latency; the busiest link carries every payload but its receiver's.
struct GatherModel {
  static constexpr double kIncastPenalty = 0.2;  // s: Linux's minimum TCP retransmission timeout
  cost::LinkParams link;
  bool crosses_hosts = false;
  double port_queue_s = 1e-3;
  int world_size = 1;
  // The link probe's incast bursts, ascending by size (sync/link_probe.h; none: not measured, or
  // GRADEX_PORT_QUEUE_MS set explicitly): each one's bytes arrived at once and took its extra_s
  // longer than the link's fit predicts for one sender.
  std::vector<cost::IncastBurst> bursts;

  // What `arriving` bytes sent to one rank at once cost beyond their transfer, across hosts. The
  // rule: a retransmission timeout when the bytes outlast port_queue_s at the link's rate (the
  // switch port drops the tail and TCP waits), else nothing. Up to a measured burst's size at
  // most what the smallest burst at least that large cost beyond its transfer (a smaller burst
  // overflows no more): a path that absorbed a burst lowers the rule's price to what was
  // measured, never raises it.
  double incast_seconds(double arriving) const;
  // The one-round inline burst's test (inline_max): true when `arriving` bytes at once cost no
  // more than one latency beyond their transfer.
  bool absorbs(double arriving) const { return incast_seconds(arriving) <= link.alpha_s; }

  double direct_seconds(const std::vector<uint64_t>& following) const;
  double ring_seconds(const std::vector<uint64_t>& following) const;
  // True when the ring is predicted strictly faster (a tie goes direct: fewer hops).
  bool ring_for(const std::vector<uint64_t>& following) const;
  // The inline maximum for this link: `configured` (on a latency-bound link, at least what the
  // link moves in one latency, up to kLatencyInlineMax), capped across hosts so that the one-round
  // exchange's burst ((P-1) inline payloads into one rank) is absorbed: it fits the port's queue
  // or measured bursts that each cost at most one latency (the smallest ones up to the first
  // that cost more).
  size_t inline_max(size_t configured) const;

  // A dense allreduce of `bytes` (the bucket on the wire). Both move 2(P-1)/P of it through each
  // rank; the ring pays 2(P-1) message latencies, the direct exchange (comm::direct_allreduce_sum)
  // 2, plus, across hosts, the incast's cost of each phase's (P-1) segments arriving at once; 1
  // between two ranks (a swap of whole buffers).
  double dense_ring_seconds(uint64_t bytes) const;
  double dense_direct_seconds(uint64_t bytes) const;
  // The direct exchange when predicted at least kDenseDirectGain faster (the results are the same
  // bits; the margin keeps a ring that the model prices within its error).
  static constexpr double kDenseDirectGain = 0.9;

  // Latency-bound links (alpha at least kLatencyBoundS: across regions, not inside a data centre).
  // There a saved round trip outweighs by far what the one-round gather's larger receives cost
  // (UCX's unexpected-message path, tens of microseconds), and a unit's latency (one or two
  // rounds: 10 ms and more) outweighs what splitting a round's DGC tensors into groups overlaps
  // (a GRADEX_SPARSE_GROUP_MB group's DGC encode, ~3 ns per element on one core: ~12 ms for
  // 16 MB, hidden only behind the previous group's transfer).
  static constexpr double kLatencyBoundS = 5e-3;
  bool latency_bound() const { return link.alpha_s >= kLatencyBoundS; }
  // The largest inline payload worth one round on a latency-bound link: what the link moves in
  // one latency, at most kLatencyInlineMax (receives of this size are posted for every peer).
  static constexpr size_t kLatencyInlineMax = 1u << 20;
  // The most wire bytes of dense gradients per rank worth riding a DGC unit's gather
  // (sync/gather_rider.h): riding, each rank receives (P-1) times their bytes where an allreduce
  // moves 2(P-1)/P times them, and saves at least the direct exchange's 2 message latencies; so
  // while (P-1)(P-2)/P * bytes * beta <= 2 alpha (no limit below three ranks, where the bytes are
  // the same), at most kRiderMaxBytes.
  static constexpr uint64_t kRiderMaxBytes = uint64_t{64} << 20;
  uint64_t rider_bytes() const;
  // The time per byte of bulk transfers: the measured incast bursts' (megabytes into one rank, a
  // start message's latency and the data's: (seconds - 2 alpha) / bytes, the least of them) where
  // that is below the link's fit. On a long path the fit's ping-pongs (at most 256 KiB) still
  // wait on TCP's window: 75-90 ns per byte at 1 Gbit/s and 25 ms one way, where the bursts
  // measure about the line rate. The fit's beta without bursts.
  double bulk_beta_s_per_byte() const;
  // The largest unit of the 8-bit or 4-bit route (one rank's encoding of it, bytes) summed in one
  // hop (sync/int8_exchange.h) rather than by the direct reduce-scatter + allgather: only on a
  // latency-bound link, where the hop saves one message latency and each rank's link carries
  // (P-1)(P-2)/P times the encoding more, at the bulk rate. The extra bytes may take at most
  // kOneHopLatencyShare of the saved latency; the rest is left to the CPU the hop adds (every rank
  // decodes P whole encodings instead of P segments and one whole average: ~2 N more decoded
  // elements at 4 ranks, some milliseconds per million elements with several ranks on a core).
  // Unlimited between two ranks (the same bytes), 0 where the link is not latency-bound.
  static constexpr double kOneHopLatencyShare = 0.5;
  uint64_t quantized_one_hop_max_bytes() const;
  bool dense_direct_for(uint64_t bytes) const {
    return world_size > 1 &&
           dense_direct_seconds(bytes) < kDenseDirectGain * dense_ring_seconds(bytes);
  }
  // The largest bucket (wire bytes, below 2^40) that dense_direct_for sends directly, taking the
  // direct buckets to be the smaller ones (the ring's latencies weigh most on them, the incast's
  // price on the larger); 0: none.
  uint64_t dense_direct_max_bytes() const;
};

class SparseGather {
 public:
  // `port_queue_explicit`: GRADEX_PORT_QUEUE_MS was set, so the model takes it as written and
  // the probe measures no incast burst.
  SparseGather(EngineOptions::SparseCollective mode, double port_queue_s, bool port_queue_explicit)
      : mode_(mode), port_queue_s_(port_queue_s), port_queue_explicit_(port_queue_explicit) {}
  // The bytes each other-host rank sends in the probe's incast bursts (at most 16 MiB in all,
  // and what the link moves in 0.5 s). The first: at 4 ranks 3 MiB, four times what a ResNet-50
  // DGC 99.9% gather brings into one rank. The second: at 4 ranks 12 MiB, what a phase of the
  // direct dense allreduce brings into one rank from a 16-bit bucket of up to 8M elements ((P-1)/P
  // of it at once), such as a few-million-parameter model's dense early steps; left unmeasured,
  // such a phase was priced at the rule's retransmission timeout and went around the ring (its
  // 2(P-1) latencies across regions).
  static constexpr size_t kBurstBytesPerSender[] = {size_t{1} << 20, size_t{4} << 20};

  // Collective (the progress thread, every rank in the same unit order): every rank's `message`
  // into `received`, by rank. GRADEX_SPARSE_COLLECTIVE=ring: the two-round ring_allgatherv;
  // direct: comm::allgatherv_unsized's direct exchange where the communicator receives messages
  // of unknown length, else allgatherv_inline, the payloads above the inline maximum directly;
  // auto: allgatherv_inline with the model's inline maximum and ring_for (the first call agrees the
  // model first: the link probe); on a latency-bound link whose communicator receives messages
  // of unknown length, every gather after the first is comm::allgatherv_unsized (no size round),
  // direct or around the ring as ring_for prices the previous gather's sizes.
  comm::AllgathervPath gather(comm::Communicator& comm, const std::vector<uint8_t>& message,
                              std::vector<comm::Bytes>& received);

  // Collective, auto only, once (later calls return at once): the link probe whose rank-0 numbers
  // make the model. gather() calls it; the engine calls it first so that the probe's bytes are
  // not counted as the unit's.
  void agree(comm::Communicator& comm);
  // The same probe whatever GRADEX_SPARSE_COLLECTIVE says (GRADEX_DENSE_COLLECTIVE=auto's model).
  // `incast`: the caller prices arrivals (DGC gathers, dense buckets), so the model must hold the
  // measured incast bursts; without it (the 8-bit and 4-bit routes, which only need to know
  // whether the link is latency-bound) the bursts are timed only on a latency-bound link, where
  // the engine's paths need them, and a later call that needs them measures them then.
  void agree_model(comm::Communicator& comm, bool incast = true);

  // Forgets the agreed model: a new membership (Engine::connect) probes its own links again.
  void reset() {
    model_.reset();
    model_lacks_bursts_ = false;
    last_sizes_.clear();
  }

  // The agreed model (auto, after the first gather); null before.
  const GatherModel* model() const { return model_.get(); }

 private:
  // Whether this gather skips the size round (comm::allgatherv_unsized), and then whether around
  // the ring: always directly under GRADEX_SPARSE_COLLECTIVE=direct; under auto on a latency-bound
  // link once a gather's sizes are known. nullopt: the sized collectives. Collective under auto
  // (the first call agrees the model).
  std::optional<bool> unsized_ring(comm::Communicator& comm);
  void remember_sizes(const std::vector<comm::Bytes>& received);

  EngineOptions::SparseCollective mode_;
  double port_queue_s_;
  bool port_queue_explicit_;
  std::unique_ptr<GatherModel> model_;
  // The model was agreed without the incast bursts (agree_model(comm, false) on a link that is
  // not latency-bound): the next call that prices incast probes again.
  bool model_lacks_bursts_ = false;
  // Every rank's payload size in the last gather (identical on every rank: an allgatherv's
  // result), the prediction an unsized gather is chosen by.
  std::vector<uint64_t> last_sizes_;
};

}  // namespace gradex::sync
