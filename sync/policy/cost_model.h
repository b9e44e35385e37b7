// The engine's measured cost model: what the link, the codecs and the training
// step cost, as the per-tensor codec choice (sync/policy/codec_choice.h) needs them.
//
//   link      per peer class (same host / other host): latency alpha (s) and inverse bandwidth
//             beta (s/byte), fitted by least squares to t = a*alpha + b*beta over every observed
//             transfer, where a (latency terms) and b (bytes on the critical link) follow from the
//             collective's algorithm (ring_allreduce_terms, allgatherv_terms); older samples fade
//             (forgetting factor), so the fit follows a link that changes;
//   codecs    seconds per element of each codec's encode (prepare stage) and decode (finish
//             stage), the least measured (alone at start-up, then large units), and the DGC
//             payload's bytes per selected element, as a moving average;
//   collective CPU  what a collective costs the host besides the wire, measured alone at
//             start-up: the dense ring's reduction per element summed (fp32, 16-bit) and the
//             transport's CPU per byte sent and received (socket copies and protocol work), with
//             the machine's CPU share (ranks per core when ranks outnumber cores);
//   training  per tensor, when it became ready (its submission, relative to the step's first);
//             per step, the backward span (first to last submission) and the time from the end of
//             one step to the next step's first submission (forward pass, optimizer, data).
//
// Every rank observes its own numbers; decisions use only rank 0's (Snapshot, agreed with
// sync/policy/link_probe.h's agree_snapshot), so they are identical on every rank.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "sync/policy/policy.h"

namespace gradex::sync::cost {

enum class PeerClass : uint8_t { kSameHost = 0, kOtherHost = 1 };
constexpr int kPeerClasses = 2;
const char* peer_class_name(PeerClass c);

// One message over one link takes alpha + bytes * beta seconds.
struct LinkParams {
  double alpha_s = 50e-6;              // default before any measurement: a LAN's latency
  double beta_s_per_byte = 1.0 / 1e9;  // and 8 Gbit/s
  bool measured = false;
  double seconds(double latency_terms, double byte_terms) const {
    return latency_terms * alpha_s + byte_terms * beta_s_per_byte;
  }
};

// A collective's cost as latency terms (messages on its critical path) and bytes on its critical
// link: t = latency * alpha + bytes * beta.
struct Terms {
  double latency = 0;
  double bytes = 0;
  double seconds(const LinkParams& link) const { return link.seconds(latency, bytes); }
};
// The ring allreduce of `bytes` over P ranks: 2(P-1) steps of bytes/P each.
Terms ring_allreduce_terms(double bytes, int world_size);
// The dense allreduce of `bytes`: up to `direct_max_bytes` the direct reduce-scatter + allgather's
// terms (comm::direct_allreduce_sum: 2 message latencies, 1 between two ranks, the same
// 2(P-1)/P of the bytes through each rank), beyond it the ring's.
Terms dense_allreduce_terms(double bytes, int world_size, uint64_t direct_max_bytes);
// An allgatherv in which every rank contributes `payload_bytes`: each rank's link carries the P-1
// payloads of the others; the ring takes P-1 steps, the direct exchange a size round and a data
// round, or the data round alone when receives learn the sizes on arrival (`unsized`:
// comm::allgatherv_unsized).
Terms allgatherv_terms(double payload_bytes, int world_size, bool ring, bool unsized = false);
// The quantized route's direct reduce-scatter + allgather of `elements` at `bits` (8 or 4;
// sync/data/int8_exchange.h): two rounds of P-1 concurrent messages, each rank's link carrying
// 2(P-1)/P of the encoding; `one_hop`: one round, each rank's link carrying P-1 encodings.
Terms int8_allreduce_terms(double elements, int world_size, int bits = 8, bool one_hop = false);

// Weighted least squares of t = a*alpha + b*beta with exponential forgetting: each new sample
// multiplies the weight of the older ones by `forget` (1: plain least squares).
class LinkFit {
 public:
  explicit LinkFit(double forget = 1.0) : forget_(forget) {}
  void add(double latency_terms, double byte_terms, double seconds);
  uint64_t samples() const { return samples_; }
  // The fitted parameters. When the samples cannot separate alpha from beta (all of one shape),
  // alpha is taken from `prior` and only beta is fitted; a negative alpha is clamped to 0 and beta
  // refitted, a non-positive beta is the prior's and alpha refitted. `prior` is returned unchanged
  // without samples.
  LinkParams params(const LinkParams& prior) const;

 private:
  double forget_;
  double saa_ = 0, sab_ = 0, sbb_ = 0, sat_ = 0, sbt_ = 0;
  uint64_t samples_ = 0;
};

// The codecs are the policy vocabulary's (sync/policy/policy.h).
using sync::Codec;
using sync::codec_name;
using sync::is_quantized;
using sync::is_sparse;
using sync::kCodecs;
using sync::quantized_bits;

struct CodecCosts {
  // Seconds per element of the tensor, except DGC's decode: seconds per received selected value
  // (its finish stage sums every rank's payload, k values each, whatever the tensor's size, so a
  // sparser rung decodes proportionally less). Defaults before any measurement (this machine's
  // order of magnitude).
  // kInt8's and kInt4's encode: the contribution's encode and the owner's sum and re-encode (the
  // route does both in its transfer); their decode: the allgather's decode.
  // kAdam's decode is per element of the tensor, for P payloads: its finish stage zeroes and, with
  // the DCT, transforms the whole tensor back, which outweighs the sum of the received values
  // (measured with the world's P payloads at start-up, then from the units).
  std::array<double, kCodecs> encode_s{0.0, 0.6e-9, 4e-9, 3e-9, 20e-9, 3e-9};
  std::array<double, kCodecs> decode_s{0.0, 0.6e-9, 5e-9, 1e-9, 20e-9, 1e-9};
  double dgc_bytes_per_selected = 6.0;  // fp32 value + ~2 bytes of coded index
  // The Adam codec's payload bytes per selected value (what its units send: fp16 values and
  // Golomb-Rice indices by default, about 3).
  double adam_bytes_per_selected = 3.0;
  // The collectives' own CPU work (comm/collectives/ring_allreduce.cc,
  // comm/collectives/allgatherv.cc), measured alone at start-up from large samples
  // (CodecPlanner::measure_codecs): seconds per element that the ring's reduce-scatter sums, per
  // dense wire codec (fp32, 16-bit; unused for DGC), and seconds of the transport per byte that a
  // rank sends and receives (one of each: the ring and the allgatherv receive what they send). A
  // dense ring is CPU-bound where this exceeds the wire time (cost::collective_cpu_s). 0: not
  // priced (nothing measured).
  std::array<double, kCodecs> reduce_s{0.0, 0.0, 0.0, 0.0, 0.0, 0.0};
  double transport_s_per_byte = 0.0;
};

// Per tensor: rank 0's view of it.
struct TensorTiming {
  std::string key;
  uint64_t numel = 0;
  uint64_t rows = 0;   // output rows when the plugin gave the shape (0: unknown)
  double ready_s = 0;  // submission time relative to the step's first submission (moving avg)
};

// What every rank decides from: rank 0's numbers.
struct Snapshot {
  std::array<LinkParams, kPeerClasses> link;
  CodecCosts codecs;
  double backward_s = 0;  // first to last submission of a step (moving average)
  double forward_s = 0;   // end of a step to the next step's first submission (moving average)
  uint64_t steps_seen = 0;
  // The measured step tail under the plan in force (CostModel::tail_s: last submission to the end
  // of the step) over that plan's tail predicted from the numbers above, clamped to [1/4, 16]:
  // every predicted time is multiplied by it, which closes the loop on what the terms leave out
  // (the engine's own copies, waiting for threads). It decides how much compute hides, not
  // which codec is cheaper (it scales every cost alike).
  double calibration = 1.0;
  // Rank 0's host has no more cores than ranks (ChoiceOptions::one_lane).
  bool one_lane = false;
  // Wall seconds per CPU second of a rank's work while every rank on rank 0's machine works at
  // once: max(1, ranks there / cores). The CPU costs above are measured alone; in a synchronous
  // step every rank computes at the same time, so on a machine with more ranks than cores each
  // one's CPU work takes this much longer.
  double cpu_share = 1.0;
  // Rank 0's measured step tail under the plan in force (CostModel::tail_s; 0: none measured).
  double tail_s = 0;
  // Per codec: the measured seconds of its units (prepare + transfer + finish) under the plan in
  // force over what the numbers above predict for them (cost::measured_codec_factors), clamped to
  // [1/4, 16]; 1 until measured. It multiplies every prediction of that codec (rung_costs), so a
  // codec whose start-up numbers were read on the wrong side of the load is corrected by what its
  // collectives cost in the steps since: a tensor put on a dense ring by a low first estimate of
  // the ring's CPU moves back to DGC once the rings are measured dearer.
  std::array<double, kCodecs> codec_factor{1.0, 1.0, 1.0, 1.0, 1.0, 1.0};
  std::vector<TensorTiming> tensors;  // sorted by key

  std::vector<uint8_t> encode() const;
  // CorruptPayload on a malformed or foreign buffer.
  static Snapshot decode(const uint8_t* data, size_t size);
  bool operator==(const Snapshot& o) const { return encode() == o.encode(); }
};

struct CostModelOptions {
  double link_forget = 0.98;    // per collective sample
  double average_weight = 0.2;  // weight of a new value in the moving averages
};

// One rank's observations. Thread-safe (submissions arrive on framework threads, transfers on the
// progress thread).
class CostModel {
 public:
  explicit CostModel(CostModelOptions options = {});

  // A probe's result: replaces the prior of that class and restarts its fit.
  void set_link(PeerClass c, const LinkParams& params);
  // A collective's measured transfer. `cpu_s` (0: none): CPU work inside it that the link's
  // terms do not price, at the machine's CPU share (the quantized route's owner sums and
  // re-encodes, and the transport, CodecPlanner::observe_unit). A sample whose bytes take less time
  // at the class's current beta than that was paced by the CPU and is not fitted: neither its
  // bytes nor its latencies say what the link costs. Fitted, the 4-bit route's units on the
  // loopback's 4 ranks on 2 cores read a 16.5-26.8 Gbit/s probe as 2.2 Gbit/s with 1-2.5 ms of
  // latency, and every rung was then priced on that link. What such a codec costs is its own
  // factor's to say (Snapshot::codec_factor).
  void observe_transfer(PeerClass c, const Terms& terms, double seconds, double cpu_s = 0);
  // The codec and collective costs measured so far (Snapshot::codecs alone).
  CodecCosts codecs() const;
  // `decoded`: what the decode rate is per (0: `elements`); DGC's decode is per received value
  // (CodecCosts).
  void observe_codec(Codec codec, uint64_t elements, double encode_s, double decode_s,
                     uint64_t decoded = 0);
  void observe_dgc_payload(uint64_t selected, uint64_t bytes);
  // The Adam codec's payload (CodecCosts::adam_bytes_per_selected), as observe_dgc_payload.
  void observe_adam_payload(uint64_t selected, uint64_t bytes);
  // The collectives' CPU (CodecCosts::reduce_s, transport_s_per_byte), measured alone: the least
  // per element (per byte) of the samples is kept.
  void observe_reduce(Codec codec, uint64_t elements, double seconds);
  void observe_transport(uint64_t bytes, double seconds);

  void on_register(const std::string& key, uint64_t numel, uint64_t rows);
  // `t` in seconds on any monotonic clock (the same for every call). A key submitted again before
  // on_end_step starts a new step (callers that never end steps still get step timings).
  void on_submit(const std::string& key, double t);
  void on_end_step(double t);

  Snapshot snapshot() const;
  // From the last submission of a step to its end (moving average): the part of the exchange
  // that compute did not hide. `steps`: how many steps it averages (0: none ended yet).
  double tail_s(uint64_t* steps = nullptr) const;
  // Starts the tail's average afresh with the next step that begins (a new plan's steps).
  void restart_tail();

  // Units smaller than this do not refine a codec's cost per element (their fixed cost would).
  static constexpr uint64_t kMinCodecSample = 1u << 16;

 private:
  struct TensorSeen {
    uint64_t numel = 0;
    uint64_t rows = 0;
    double ready_s = 0;
    bool seen = false;
  };
  double average(double old_value, double new_value, bool first) const;

  CostModelOptions options_;
  mutable std::mutex mutex_;
  std::array<LinkParams, kPeerClasses> prior_;
  std::array<LinkFit, kPeerClasses> fit_;
  CodecCosts codecs_;
  std::array<bool, kCodecs> codec_seen_{};
  std::array<bool, kCodecs> reduce_seen_{};
  bool transport_seen_ = false;
  bool payload_seen_ = false;
  bool adam_payload_seen_ = false;
  std::map<std::string, TensorSeen> tensors_;
  // The framework's step as the submissions show it: the step in progress (its keys, its first
  // and last submission), the last end of a step, and the averaged backward, forward and tail.
  struct StepTiming {
    std::set<std::string> submitted;  // keys submitted in the step in progress
    bool in_step = false;
    double first = 0, last = 0, last_end = -1;
    double backward_s = 0, forward_s = 0, tail_s = 0;
    uint64_t tails = 0;
    bool skip_tail = false;  // the step in progress began under the previous plan
    uint64_t count = 0;      // steps seen
  };
  StepTiming step_;
};

}  // namespace gradex::sync::cost
