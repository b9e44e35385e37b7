// The engine's one link model: alpha (s per message) and beta (s per byte, at line rate) per tier
// of the network, probed once per membership (sync/policy/link_probe.h) and agreed on rank 0's
// numbers, and the price of every collective the engine runs on it. Every decision that depends on
// the link prices through it: the planner's codec choice (sync/policy/codec_planner.h), the DGC
// gather's direct-or-ring choice (sync/data/sparse_gather.h), the dense direct-or-ring rule, riders
// and the quantized one hop.
//
//   tier      kHost    two ranks on one host (shared memory or loopback)
//             kRegion  two hosts a LAN apart (rank 0's region)
//             kAcross  two hosts a WAN apart (another region): the farthest host from rank 0
//   flat      the tier a flat collective over every rank crosses: the widest one present, since a
//             flat ring or exchange waits on its slowest link.
//
// Agreement. Decisions taken from this model must be the same on every rank: every number in it
// is rank 0's (link_probe.cc broadcasts them, encode/decode carry them bit for bit), the rest
// (world size, the port queue) is agreed configuration.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "sync/policy/cost_model.h"

namespace gradex::sync {
namespace cost {
// One incast burst: `bytes` arrived at rank 0 from every other-host rank at once, and the fastest
// of its timed bursts took `seconds`, `extra_s` longer than the flat fit predicts for the same
// bytes from one sender (a start message's latency, then the data's; never below 0). A port that
// overflowed and waited for a retransmission shows here as that wait; a path that absorbed the
// burst as about 0.
struct IncastBurst {
  uint64_t bytes = 0;
  double extra_s = 0;
  double seconds = 0;  // 0: not known (a model built without the probe)
};
}  // namespace cost

enum class Tier : uint8_t { kHost = 0, kRegion = 1, kAcross = 2 };
constexpr int kTiers = 3;
const char* tier_name(Tier tier);

// What a collective delivers. `bytes` below is, per collective: allreduce and reduce-scatter the
// whole buffer of each rank; allgather each rank's payload; broadcast the root's buffer.
enum class Collective : uint8_t { kAllreduce, kReduceScatter, kAllgather, kBroadcast };
// How it travels: around a ring (P-1 steps per phase), directly (every rank to every rank, a
// phase per message round; an allgather's direct exchange adds a size round unless `unsized`), or
// in one hop (an allreduce whose every rank receives every rank's whole buffer and sums it).
enum class Algorithm : uint8_t { kRing, kDirect, kDirectUnsized, kOneHop };
const char* collective_name(Collective c);
const char* algorithm_name(Algorithm a);

// The one alpha-beta shape of each (collective, algorithm) over `ranks` ranks: messages on the
// critical path and bytes through the busiest rank's link (cost::Terms). InvalidArgument for a
// pair the comm layer does not run (a one-hop reduce-scatter or broadcast).
//   allreduce      ring 2(P-1), 2(P-1)/P B   direct 2 (1 at P=2), 2(P-1)/P B   one hop 1, (P-1) B
//   reduce-scatter ring P-1, (P-1)/P B       direct 1, (P-1)/P B
//   allgather      ring P-1, (P-1) B         direct 2, (P-1) B  (unsized: 1)
//   broadcast      ring P-1, B (a chain)     direct 1, (P-1) B (the root's uplink)
cost::Terms collective_terms(Collective c, Algorithm a, double bytes, int ranks);

class LinkModel {
 public:
  static constexpr double kIncastPenalty = 0.2;  // s: Linux's minimum TCP retransmission timeout
  // Latency-bound links (alpha at least this: across regions, not inside a data centre). There a
  // saved round trip outweighs by far what larger receives cost, and a unit's latency (10 ms and
  // more) what splitting a round's DGC tensors into groups overlaps.
  static constexpr double kLatencyBoundS = 5e-3;
  // The dense direct exchange is taken when predicted at least this much faster than the ring
  // (the results are the same bits; the margin keeps a ring the model prices within its error).
  static constexpr double kDenseDirectGain = 0.9;
  // The largest inline payload worth one round on a latency-bound link (receives of this size are
  // posted for every peer).
  static constexpr size_t kLatencyInlineMax = 1u << 20;
  // The most wire bytes of dense gradients per rank worth riding a DGC unit's gather.
  static constexpr uint64_t kRiderMaxBytes = uint64_t{64} << 20;
  // The share of a saved latency the quantized one hop's extra bytes may take (the rest is left to
  // the CPU it adds: every rank decodes P whole encodings instead of P segments).
  static constexpr double kOneHopLatencyShare = 0.5;

  // Per tier: rank 0's fit (alpha from round trips, beta from a stream at line rate) and whether
  // the job has that tier at all (a link that does not exist is never priced).
  std::array<cost::LinkParams, kTiers> tiers;
  std::array<bool, kTiers> present{};
  Tier flat = Tier::kHost;
  int world_size = 1;
  // The switch port's queue (GRADEX_PORT_QUEUE_MS) and the incast bursts measured into rank 0,
  // ascending by size (none: not measured, or the queue was set explicitly).
  double port_queue_s = 1e-3;
  std::vector<cost::IncastBurst> bursts;

  // A model of `world` ranks whose flat collectives cross `flat` with `link`: tests and callers
  // that price one link.
  static LinkModel single(const cost::LinkParams& link, Tier flat, int world);

  const cost::LinkParams& link(Tier t) const { return tiers[static_cast<size_t>(t)]; }
  const cost::LinkParams& link() const { return link(flat); }  // the flat collectives'
  bool crosses_hosts() const { return flat != Tier::kHost; }
  bool latency_bound() const { return link().alpha_s >= kLatencyBoundS; }

  // Seconds of `c` by `a` over every rank on the flat tier, with the incast's cost where
  // concurrent senders converge on one rank across hosts (the direct exchanges' phases).
  double seconds(Collective c, Algorithm a, uint64_t bytes) const;
  // Seconds of `c` by `a` among `ranks` ranks over tier `t` (alpha-beta only).
  double seconds(Tier t, Collective c, Algorithm a, uint64_t bytes, int ranks) const;

  // What `arriving` bytes sent to one rank at once cost beyond their transfer, across hosts: a
  // retransmission timeout when they outlast port_queue_s at the link's rate, else nothing; up
  // to a measured burst's size at most what the smallest burst at least that large cost.
  double incast_seconds(double arriving) const;
  bool absorbs(double arriving) const { return incast_seconds(arriving) <= link().alpha_s; }

  // The DGC allgatherv's payload round, `following[q]` the bytes of rank q still to move: direct
  // (one latency; the busiest link is the largest sender's uplink or the busiest receiver's
  // downlink, plus the incast) or ring (P-1 latencies; every payload but the receiver's).
  double gather_direct_seconds(const std::vector<uint64_t>& following) const;
  double gather_ring_seconds(const std::vector<uint64_t>& following) const;
  bool gather_ring_for(const std::vector<uint64_t>& following) const;  // ties go direct
  // The inline maximum: `configured`, on a latency-bound link at least what the link moves in one
  // latency (up to kLatencyInlineMax), capped across hosts so that the one-round burst ((P-1)
  // inline payloads into one rank) is absorbed.
  size_t inline_max(size_t configured) const;

  // The dense direct-or-ring rule for a flat allreduce of `bytes`: direct when priced at least
  // kDenseDirectGain faster than the ring.
  bool dense_direct_for(uint64_t bytes) const;
  // The largest bucket (below 2^40) dense_direct_for sends directly, the direct buckets being the
  // smaller ones; 0: none.
  uint64_t dense_direct_max_bytes() const;
  // Riders: while (P-1)(P-2)/P * bytes * beta <= 2 alpha (what riding costs in extra arrivals
  // against the direct exchange's two latencies it saves), at most kRiderMaxBytes.
  uint64_t rider_bytes() const;
  // The time per byte of bulk transfers: the flat link's beta, or the measured incast bursts'
  // where lower ((seconds - 2 alpha) / bytes).
  double bulk_beta_s_per_byte() const;
  // The largest 8-bit or 4-bit unit (one rank's encoding) summed in one hop: only on a
  // latency-bound link, while its extra arrivals take at most kOneHopLatencyShare of the latency.
  uint64_t quantized_one_hop_max_bytes() const;

  // One line per present tier, for the log and gx.explain.
  std::string describe() const;
  std::vector<uint8_t> encode() const;
  // CorruptPayload on a malformed buffer.
  static LinkModel decode(const uint8_t* data, size_t size);
  bool operator==(const LinkModel& o) const { return encode() == o.encode(); }
};

// What the routes do on the agreed link (route::link_paths, from the agreed model, so the same on
// every rank), for the planner's pricing: how close to a step's first submission the others must
// come to share its negotiation round on a latency-bound link
// (Engine::ProgressLoop::coalesce_submissions), the largest dense bucket summed by the direct
// exchange (route::dense_direct_max_bytes: the dense routes' own rule), whether a DGC gather skips
// its size round (SparseGather), and the largest 8-bit or 4-bit unit summed in one hop
// (route::quantized_one_hop_max_bytes, one rank's encoding), and how many wire bytes of a round's
// dense gradients ride its DGC gather (route::rider_bytes).
struct LinkPaths {
  double coalesce_window_s = 0;
  uint64_t dense_direct_max_bytes = 0;
  bool sparse_unsized = false;
  uint64_t quantized_one_hop_max_bytes = 0;
  uint64_t rider_bytes = 0;
};

}  // namespace gradex::sync
