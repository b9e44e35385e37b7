// The per-tensor codec choice of GRADEX_POLICY=auto: a pure function of the
// agreed cost numbers (sync/policy/cost_model.h: rank 0's Snapshot), the shared options and an
// agreed step, so that every rank computes the same choices.
//
// Objective, fidelity first: the least compression whose communication stays hidden behind
// compute, compressing harder only as far as the link requires. The step is modelled as a timeline
// (as Espresso, EuroSys'23): tensors in the order they become ready; tensor i encodes on the worker
// pool (one lane: encodes queue) from max(ready_i, pool free), its transfer starts at max(link
// free, encoded_i), holds the link for its collective's time, then decodes; with one_lane (a
// machine with no more cores than ranks) encode, transfer and decode all queue on one lane. Its
// communication is hidden when the last tensor is done by the end of the backward pass plus
// `slack` x the step's compute (backward + the time to the next step's first submission). The
// next forward pass itself is not counted as cover: today's plugins wait for every average before
// the optimizer step, so communication past the backward pass delays the step, and the slack
// bounds that delay (5%: auto's step within 1.05x of the fastest fixed mode's).
//
// The ladder of rungs, least compression first: fp32, 16-bit (when GRADEX_FP16=1), 8-bit (dense
// with error feedback, ~1.03 bytes per element), 4-bit (the same at ~0.53 bytes per element, when
// int4_available), then DGC at each sparsity of the ladder (ascending). 8-bit and 4-bit count as
// dense rungs below (they only round, and their error is fed back).
// Every tensor starts at fp32. Raise: while the step is exposed, among the kCandidates raises (of
// any tensor to any higher rung it may take) to a DGC rung and the kCandidates to a dense rung that
// take most off the tensor's own encode + transfer + decode, the one that ends the step earliest on
// the timeline is taken; a raise to DGC must save 1% of what is still exposed (fidelity first: many
// small tensors each saving microseconds are left alone); when no single raise is, every tensor's
// largest-saving raise that alone ends the step earlier is taken at once if together they save 1%
// (a model's many mid-size layers, each worth little, together worth much). It stops once the step
// is hidden or nothing helps: with no compute to hide behind, as hard as the link requires. Relax:
// each raised tensor, smallest first, goes back to the least rung that ends the step no later than
// the deadline or the raised plan does. A tensor that becomes ready while the link is busy with its
// kind joins the fused unit (dense bucket, DGC group) and pays no latency of its own. A DGC rung is
// allowed only when its selected count k = (1 - s) * numel is at least min_selected and, for
// tensors registered with their output rows, min_per_row values per row; and not before dense_steps
// (a hard dense warm-up, opt-in). A tensor with a forced rung (an override) keeps it and still
// occupies the link in the timeline.
//
// Early training (the fidelity ramp, ramp_steps > 0): while the gradient changes fast, top-k with
// error feedback loses most (stale residuals, momentum built from few coordinates), so over the
// first ramp_steps agreed steps the most compression a plan may choose follows DGC's own warm-up
// (compress/dgc/schedule.h: density divided by 4 per quarter, 75% -> 93.75% -> 98.4% -> 99.6%,
// then the ladder's top). Every ladder sparsity above the step's cap is replaced by the cap; the
// choice stays cost-aware inside it: a link that hides a rung below the cap keeps it, and where
// even the cap is exposed the step pays that (fidelity first). The cap is a function of the
// agreed step alone, so every rank applies the same one; the planner re-plans at each quarter.
// Where a fidelity cap binds (the ramp's, or the horizon rule's below) and leaves no sparse rung
// that sends less than the 16-bit ring (every capped sparsity denser than 1/(2P)), the 8-bit rung
// (dense, 8-bit codes with error feedback: every coordinate moves every step, at about half of
// 16-bit's bytes, and its residual is a rounding error that the next step sends) is on the ladder
// even when int8_available is off (fidelity_int8): where the cost model says 16-bit cannot hide,
// such a step is not left to pay the dense ring (at 4 ranks DGC's 75% sends more than the 16-bit
// ring, so the ramp's first quarter had no cheaper rung, nor have the horizon rule's last dense
// steps), and where 16-bit hides, or the 8-bit route's CPU makes it no cheaper, the choice stays
// 16-bit. Elsewhere int8_available alone decides. On by default (GRADEX_POLICY_FIDELITY_INT8): an
// earlier, wider form (8-bit at every capped step) ran the race's 100-250-step trainings in 8-bit
// throughout and reached their targets later than DGC under the cap; this narrower rule took the
// race's dense-capped tasks at 100 Mbit/s to their targets 1.5-1.6x sooner than 16-bit, at the
// same steps and accuracy (docs/wan.md).
//
// The end of training (the horizon rule, horizon_steps > 0: the number of exchange steps the
// training will run, from the user or the plugin): error feedback delays a coordinate's update
// until its residual crosses the threshold, about 1 / density steps at a DGC rung, and what is
// still in the residuals when training ends is never applied. So the residual must drain at least
// kHorizonDrains times over the steps that remain: at step t the most sparsity allowed is
// 1 - kHorizonDrains / (horizon - t), and the last steps, where that density reaches 1/(2P), are
// dense. A short training is thus compressed little or not at all (on a 100-step task even the
// ramp's 93.75% cost a point of accuracy, measured), a long one is hardly touched until its end.
// Past the horizon nothing is capped (the horizon was an estimate). The cap in force is the lower
// of the ramp's and the horizon's; both are functions of the agreed step alone.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "sync/policy/cost_model.h"

namespace gradex::sync::cost {

// Rungs are the policy vocabulary's (sync/policy/policy.h).
using sync::Rung;
using sync::rung_name;

struct ChoiceOptions {
  int world_size = 2;
  PeerClass link_class = PeerClass::kSameHost;  // the class whose link bounds the collectives
  bool sparse_ring = false;                     // how DGC payloads travel (allgatherv_terms)
  bool sparse_unsized = false;                  // ... and without their size round
  // Dense tensors of up to this many wire bytes are summed by the direct reduce-scatter +
  // allgather (dense_allreduce_terms), larger ones around the ring: the engine's choice on a
  // latency-bound link (LinkModel::dense_direct_max_bytes). 0: the ring.
  uint64_t dense_direct_max_bytes = 0;
  // 8-bit and 4-bit tensors whose encoding (one rank's) is at most this many bytes are priced in
  // one hop (int8_allreduce_terms), as the engine sums a unit of that size on a latency-bound
  // link (LinkModel::quantized_one_hop_max_bytes); each is priced as if alone in its unit.
  // 0: the two phases.
  uint64_t quantized_one_hop_max_bytes = 0;
  // Riders (LinkPaths::rider_bytes): where the plan sends some tensor by DGC, its fp32 and 16-bit
  // tensors, a prefix in key order of at most this many wire bytes, travel inside the DGC gather
  // and pay no latency of their own (sync/route/select.cc: pack). 0: none.
  uint64_t rider_bytes = 0;
  bool half_available = true;   // GRADEX_FP16=1
  bool int8_available = true;   // GRADEX_POLICY_INT8: the 8-bit rung
  bool int4_available = false;  // GRADEX_POLICY_INT4 as applied (codec_planner.h): the 4-bit rung
  // GRADEX_POLICY_FIDELITY_INT8: the 8-bit rung while a fidelity cap binds, even without
  // int8_available (see "Early training" above).
  bool fidelity_int8 = true;
  std::vector<double> ladder{0.9, 0.99, 0.999};  // DGC sparsities, ascending
  double slack = 0.05;                           // GRADEX_POLICY_SLACK
  uint64_t dense_steps = 0;                      // GRADEX_POLICY_DENSE_STEPS
  uint64_t ramp_steps = 0;                       // GRADEX_POLICY_RAMP_STEPS
  uint64_t horizon_steps = 0;                    // GRADEX_POLICY_HORIZON_STEPS (0: unknown)
  uint64_t min_selected = 128;                   // GRADEX_POLICY_MIN_SELECTED
  double min_per_row = 1;                        // GRADEX_POLICY_MIN_PER_ROW
  // The machine's cores are no more than the ranks on it (network namespaces and containers
  // included): encodes, transfers (whose copies, sockets and shaping use the same cores) and
  // decodes then queue on one lane instead of overlapping.
  bool one_lane = false;
  // The codec of the sparse rungs: DGC, or with GRADEX_OPTIMIZER=adam the Adam codec, whose ladder
  // is then its one sparsity (GRADEX_ADAM_SPARSITY; none when that is 0): CodecPlanner::adam_rungs;
  // by default auto leaves it off and takes the 8-bit rung instead (sync/policy/codec_planner.h:
  // adam_ladder).
  Codec sparse_codec = Codec::kDgc;
};

struct TensorInput {
  std::string key;
  uint64_t numel = 0;
  uint64_t rows = 0;           // 0: unknown
  double ready_s = 0;          // relative to the step's first submission
  std::optional<Rung> forced;  // an override: kept as it is
  std::string forced_reason;
  // No rung below this one (the plan in force's, when the measured step was exposed: a refinement
  // then compresses no less than what the link was measured to need).
  std::optional<Rung> at_least;
};

struct TensorChoice {
  std::string key;
  uint64_t numel = 0;
  Rung rung;
  double ready_s = 0;
  double encode_s = 0, comm_s = 0, decode_s = 0;  // predicted
  double latency_s = 0;            // the latency part of comm_s, not paid again inside a fused unit
  double start_s = 0, done_s = 0;  // predicted, on the step's timeline
  std::string reason;
};

struct Plan {
  std::vector<TensorChoice> tensors;  // in the inputs' order
  double backward_end_s = 0;          // the last tensor's ready time
  double deadline_s = 0;              // backward end + slack x compute
  double finish_s = 0;                // predicted end of the last decode
  double exposed_s() const { return finish_s > deadline_s ? finish_s - deadline_s : 0; }
  // One line per tensor and a summary: what gradex-bench plan and gradex_explain print.
  // `measured`: seconds per tensor measured on this rank (prepare + transfer + finish, its share
  // of its unit's), shown beside the prediction.
  std::string describe(const std::map<std::string, double>* measured = nullptr) const;
};

// The most sparsity the fidelity ramp allows at agreed step `step` (1: no cap, past the ramp or
// with ramp_steps 0). Non-decreasing in `step`.
double ramp_cap(const ChoiceOptions& options, uint64_t step);
// How many times a residual must be able to drain over the steps that remain (the horizon rule).
constexpr double kHorizonDrains = 10;
// The most sparsity the horizon rule allows at agreed step `step`: 1 - kHorizonDrains / (horizon -
// step), at least 0 (dense); 1 (no cap) without a horizon or past it. Non-increasing in `step`
// up to the horizon.
double horizon_cap(const ChoiceOptions& options, uint64_t step);
// The steps where the horizon rule's cap crosses a ladder rung or 1/(2P) (where the plan's rung
// must drop), ascending, none without a horizon: the planner re-plans there.
std::vector<uint64_t> horizon_stage_starts(const ChoiceOptions& options);
// The cap in force: min(ramp_cap, horizon_cap).
double sparsity_cap(const ChoiceOptions& options, uint64_t step);
// The steps where the ramp's cap changes (the starts of its quarters and its end), ascending,
// none when ramp_steps is 0: the planner re-plans there.
std::vector<uint64_t> ramp_stage_starts(const ChoiceOptions& options);
// The ladder in force at `step`: every sparsity above sparsity_cap replaced by it, ascending,
// without repeats (none when the cap is 0). Idempotent.
std::vector<double> ramped_ladder(const ChoiceOptions& options, uint64_t step);

// Whether the 8-bit rung is on the ladder at agreed step `step`: int8_available, or with
// fidelity_int8 where sparsity_cap is below the ladder's top (the ramp, the horizon rule) and every
// sparsity of ramped_ladder is denser than 1/(2P).
bool int8_allowed(const ChoiceOptions& options, uint64_t step);

// The rungs a tensor may take under `options` at agreed step `step`, least compression first,
// with the reason any DGC rung was left out ("" when none was).
std::vector<Rung> allowed_rungs(const TensorInput& t, const ChoiceOptions& options, uint64_t step,
                                std::string* excluded_reason = nullptr);

// CPU seconds that one rank spends in the collective of a tensor of `numel` elements at `rung`,
// measured alone (before Snapshot::cpu_share): a dense ring sums (P-1)/P of the elements
// (CodecCosts::reduce_s of its wire codec) and sends and receives 2(P-1)/P of its bytes; a DGC
// allgatherv sends and receives P-1 payloads; every byte costs CodecCosts::transport_s_per_byte.
double collective_cpu_s(uint64_t numel, const Rung& rung, const Snapshot& numbers,
                        const ChoiceOptions& options);

// Predicted encode / transfer / decode seconds of one tensor at `rung`. Every CPU cost is
// multiplied by Snapshot::cpu_share, every time by Snapshot::calibration and the codec's
// Snapshot::codec_factor; the transfer takes the longer of its wire time and its CPU
// time (collective_cpu_s: the ring reduces and copies one chunk while the next is on the wire, so
// the slower of the two bounds it; on a CPU-bound host a dense ring runs at the CPU's pace
// whatever the link), and with one_lane it queues on the lane with every encode and decode.
// `latency_s` (optional): the part of comm_s that is the collective's latency.
void rung_costs(const TensorInput& t, const Rung& rung, const Snapshot& numbers,
                const ChoiceOptions& options, double& encode_s, double& comm_s, double& decode_s,
                double* latency_s = nullptr);

// One unit measured under the plan in force (CodecPlanner::observe_unit): its codec, its tensors'
// sizes and DGC sparsities (0 for dense codecs), and its measured prepare + transfer + finish.
struct UnitRecord {
  Codec codec = Codec::kFp32;
  std::vector<std::pair<uint64_t, double>> tensors;  // (elements, sparsity)
  double measured_s = 0;
  // The part of measured_s spent in the unit's prepare and finish stages (its encode and decode);
  // negative: not measured apart.
  double stages_s = -1;
};
// The fewest records of a codec that set its factor (fewer: the common factor below).
constexpr size_t kMinFactorRecords = 2;
// Snapshot::codec_factor from `records`: per codec with at least kMinFactorRecords records, the
// sum of their measured seconds over the sum of what rung_costs predicts for them from `numbers`
// with every factor 1 and no calibration (a unit pays its collective's latency once), clamped to
// [1/4, 16]. A codec without enough records is priced from the others' (pricing it at 1 would make
// it look cheap only because it was not used): a dense ring codec (fp32, 16-bit) takes the other
// dense ring's factor when that one is measured (the same collective on the same link), and the
// quantized route's 8 and 4 bits each other's (the same collective, encode and sums); any other
// takes the least of 1 and two means over the codecs with enough records: of their factors, and of
// what their encode and decode stages measured over what was predicted for those stages. A loaded
// CPU inflates the stages, a CPU-bound ring or quantized route its transfers, and neither says
// much about another codec's collective: on 4 ranks sharing 2 cores the 16-bit rings measured
// 2.4x their prediction in their loopback transfers, and DGC, never measured, inherited the 2.4x
// and stayed unchosen; later the 4-bit route measured 1.4x, DGC inherited it on top of a start-up
// encode 3x its steady cost, and every tensor stayed 4-bit at twice DGC's step. Priced above its
// own numbers, an unmeasured codec might never be chosen, so never measured; priced at them, it is
// tried when they say it is cheaper, measured, and corrected by the next plan, which remembers it
// (remember_unit_records). 1 when no codec has records.
std::array<double, kCodecs> measured_codec_factors(const std::vector<UnitRecord>& records,
                                                   const Snapshot& numbers,
                                                   const ChoiceOptions& options);

// Per codec, the records of the last interval between plans that had enough of them
// (kMinFactorRecords) to set its factor.
using UnitMemory = std::array<std::vector<UnitRecord>, kCodecs>;
// Updates `memory` with the records of the interval just ended (`fresh`: a codec with enough of
// them replaces its remembered ones; one with too few keeps them) and returns every remembered
// record, for measured_codec_factors. A codec the plan in force does not use keeps the factor its
// own units measured when it was used, instead of inheriting the codecs in use: a plan that moves
// every tensor off a codec would otherwise forget what that codec cost, price it from the others,
// and move back.
std::vector<UnitRecord> remember_unit_records(UnitMemory& memory, std::vector<UnitRecord> fresh);

// The choice for every tensor of `inputs` (any order; the timeline orders by ready time, then
// key). Deterministic: equal inputs give equal plans on every rank.
Plan choose_codecs(const std::vector<TensorInput>& inputs, const Snapshot& numbers,
                   const ChoiceOptions& options, uint64_t step);

}  // namespace gradex::sync::cost
