#include "sync/policy/codec_choice.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <optional>

#include "compress/backend/block_codec.h"

namespace gradex::sync::cost {
namespace {

// Selected count of DGC at `sparsity`, as compress/dgc's target_count rounds it.
uint64_t selected_count(uint64_t numel, double sparsity) {
  if (numel == 0) return 0;
  const double k = std::round((1.0 - sparsity) * static_cast<double>(numel));
  return std::max<uint64_t>(1, static_cast<uint64_t>(k));
}

// A sparse codec's payload bytes per selected value.
double sparse_bytes_per_selected(Codec codec, const CodecCosts& c) {
  return codec == Codec::kAdam ? c.adam_bytes_per_selected : c.dgc_bytes_per_selected;
}

constexpr double kMinSaving = 0.01;
// Raises tried on the timeline per step of the choice (the largest savings first).
constexpr size_t kCandidates = 12;

struct Timeline {
  double finish = 0;
  size_t busy_from = 0;  // index (in timeline order) where the last busy period of the link starts
};

// Which tensors ride the DGC gather under the choice `c` (in key order): the engine's rule
// (sync/route/select.cc: choose_riders), from the rungs alone.
std::vector<bool> riders(const std::vector<TensorChoice>& c, const ChoiceOptions& o) {
  std::vector<bool> rides(c.size(), false);
  if (o.rider_bytes == 0 || std::none_of(c.begin(), c.end(), [](const TensorChoice& t) {
        return is_sparse(t.rung.codec);
      }))
    return rides;
  uint64_t bytes = 0;
  for (size_t i = 0; i < c.size(); ++i) {
    const Codec codec = c[i].rung.codec;
    if (codec != Codec::kFp32 && codec != Codec::kHalf) continue;
    const uint64_t b = c[i].numel * (codec == Codec::kFp32 ? 4 : 2);
    if (bytes + b > o.rider_bytes) break;  // a prefix rides, as in the engine
    bytes += b;
    rides[i] = true;
  }
  return rides;
}

// Walks the tensors in `order` and fills start/done; returns the finish and the last busy period.
Timeline simulate(std::vector<TensorChoice>& c, const std::vector<size_t>& order,
                  const ChoiceOptions& o) {
  const bool one_lane = o.one_lane;
  const std::vector<bool> rides = riders(c, o);
  Timeline tl;
  double link_free = 0;
  // Codecs already on the link in the current busy period: the engine packs the dense tensors of
  // one wire type into shared buckets and DGC tensors into groups, whatever their order.
  std::array<bool, kCodecs> in_period{};
  // The encode stage is one lane too: the worker pool (the measured per-element costs are wall
  // times of the pool's prepare stages), so encodes queue behind each other.
  double encoder_free = 0;
  for (size_t pos = 0; pos < order.size(); ++pos) {
    TensorChoice& t = c[order[pos]];
    if (one_lane) encoder_free = std::max(encoder_free, link_free);
    encoder_free = std::max(encoder_free, t.ready_s) + t.encode_s;
    const double can_start = encoder_free;
    // The link was idle before it: a new busy period. On one lane the encode itself keeps the
    // lane busy, so what counts is whether the tensor was ready before the lane freed: then the
    // engine packs it into the same round's units as the tensors before it (its dense bucket, its
    // DGC group), which pay the collective's latency once.
    const bool idle_before = one_lane ? t.ready_s > link_free : can_start > link_free;
    if (pos == 0 || idle_before) {
      tl.busy_from = pos;
      in_period.fill(false);
    }
    // Ready while the link is busy with its kind: it joins that fused unit, which pays the
    // collective's latency once. A rider joins the DGC gather and pays none.
    const auto kind = static_cast<size_t>(t.rung.codec);
    const bool fused = rides[order[pos]] || in_period[kind];
    if (!rides[order[pos]]) in_period[kind] = true;
    t.start_s = std::max(link_free, can_start);
    link_free = t.start_s + t.comm_s - (fused ? t.latency_s : 0.0);
    t.done_s = link_free + t.decode_s;
    if (one_lane) link_free = t.done_s;
    tl.finish = std::max(tl.finish, t.done_s);
  }
  return tl;
}

// A rung's place on the ladder (fp32, 16-bit, 8-bit, 4-bit, DGC sparsities ascending); a DGC
// sparsity not on the ladder sits by its sparsity among them.
size_t ladder_rank(const Rung& r, const ChoiceOptions& o) {
  if (r.codec == Codec::kFp32) return 0;
  if (r.codec == Codec::kHalf) return 1;
  if (r.codec == Codec::kInt8) return 2;
  if (r.codec == Codec::kInt4) return 3;
  size_t l = 4;  // a sparse codec (a run has one: DGC or Adam)
  for (double s : o.ladder)
    if (s < r.sparsity) ++l;
  return l;
}

std::string format_number(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.3g", v);
  return b;
}

std::string format_ms(double s) {
  char b[32];
  std::snprintf(b, sizeof b, "%.3f", s * 1e3);
  return b;
}

// Whether the engine sums an 8-bit or 4-bit tensor alone in its unit in one hop.
bool quantized_one_hop(double numel, Codec codec, const ChoiceOptions& o) {
  return o.quantized_one_hop_max_bytes > 0 &&
         compress::backend::block_codec(quantized_bits(codec))
                 .encoded_size(static_cast<size_t>(numel)) <= o.quantized_one_hop_max_bytes;
}

}  // namespace

std::vector<Rung> allowed_rungs(const TensorInput& t, const ChoiceOptions& o, uint64_t step,
                                std::string* excluded_reason) {
  std::vector<Rung> rungs{{Codec::kFp32, 0}};
  if (o.half_available) rungs.push_back({Codec::kHalf, 0});
  if (int8_allowed(o, step)) rungs.push_back({Codec::kInt8, 0});
  if (o.int4_available) rungs.push_back({Codec::kInt4, 0});
  std::string why;
  const std::string sparse = o.sparse_codec == Codec::kDgc ? "DGC" : "the Adam codec";
  const double cap = ramp_cap(o, step);
  const double end_cap = horizon_cap(o, step);
  if (step < o.dense_steps) {
    why = "early training (step " + std::to_string(step) + " < GRADEX_POLICY_DENSE_STEPS)";
  } else {
    if (!o.ladder.empty() && end_cap < o.ladder.back() && end_cap <= cap)
      why = "end of training: the horizon rule caps " + sparse + " at " +
            rung_name({Codec::kDgc, end_cap}).substr(4) + " with " +
            std::to_string(o.horizon_steps - step) + " steps left (GRADEX_POLICY_HORIZON_STEPS)";
    else if (!o.ladder.empty() && cap < o.ladder.back())
      why = "early training: the fidelity ramp caps " + sparse + " at " +
            rung_name({Codec::kDgc, cap}).substr(4) + " until step " +
            std::to_string(o.ramp_steps) + " (GRADEX_POLICY_RAMP_STEPS)";
    for (double s : ramped_ladder(o, step)) {
      const uint64_t k = selected_count(t.numel, s);
      const double per_row = t.rows > 0 ? static_cast<double>(k) / static_cast<double>(t.rows) : 0;
      if ((1.0 - s) * 2.0 * o.world_size >= 1.0) {
        // The engine sends a DGC step this dense (sync/policy/policy.h: sparse_is_cheaper).
        if (why.empty()) why = rung_name({o.sparse_codec, s}) + " is denser than 1/(2P)";
        continue;
      }
      if (k < o.min_selected) {
        if (why.empty())
          why = rung_name({o.sparse_codec, s}) + " would keep " + std::to_string(k) +
                " < GRADEX_POLICY_MIN_SELECTED values";
        continue;
      }
      if (t.rows > 0 && per_row < o.min_per_row) {
        if (why.empty())
          why = rung_name({o.sparse_codec, s}) + " would keep " + format_number(per_row) +
                " < GRADEX_POLICY_MIN_PER_ROW values per row";
        continue;
      }
      rungs.push_back({o.sparse_codec, s});
    }
  }
  // A floor that excluded every sparse rung (they come last) says so: too small to compress.
  if (!is_sparse(rungs.back().codec) && why.find(" would keep ") != std::string::npos)
    why = "too small for any sparse rung: " + why;
  if (excluded_reason) *excluded_reason = why;
  return rungs;
}

double collective_cpu_s(uint64_t numel, const Rung& rung, const Snapshot& numbers,
                        const ChoiceOptions& o) {
  if (o.world_size < 2 || numel == 0) return 0;
  const double n = static_cast<double>(numel);
  const double p = o.world_size;
  const CodecCosts& c = numbers.codecs;
  switch (rung.codec) {
    case Codec::kFp32:
    case Codec::kHalf: {
      const double elem = rung.codec == Codec::kFp32 ? 4.0 : 2.0;
      const double reduced = (p - 1) / p * n;
      return reduced * c.reduce_s[static_cast<size_t>(rung.codec)] +
             ring_allreduce_terms(elem * n, o.world_size).bytes * c.transport_s_per_byte;
    }
    case Codec::kDgc:
    case Codec::kAdam: {
      const double k = static_cast<double>(selected_count(numel, rung.sparsity));
      return allgatherv_terms(k * sparse_bytes_per_selected(rung.codec, c), o.world_size,
                              o.sparse_ring, o.sparse_unsized)
                 .bytes *
             c.transport_s_per_byte;
    }
    case Codec::kInt8:  // the owner's sums are in its encode cost; here only the transport
    case Codec::kInt4:
      return int8_allreduce_terms(n, o.world_size, quantized_bits(rung.codec),
                                  quantized_one_hop(n, rung.codec, o))
                 .bytes *
             c.transport_s_per_byte;
  }
  return 0;
}

void rung_costs(const TensorInput& t, const Rung& rung, const Snapshot& numbers,
                const ChoiceOptions& o, double& encode_s, double& comm_s, double& decode_s,
                double* latency_s) {
  const auto c = static_cast<size_t>(rung.codec);
  const double n = static_cast<double>(t.numel);
  const LinkParams& link = numbers.link[static_cast<size_t>(o.link_class)];
  // Both measured per element of the tensor (prepare and finish stages,
  // sync/policy/codec_planner.cc); the Adam codec's decode too (its finish stage zeroes and
  // transforms the whole tensor).
  encode_s = numbers.codecs.encode_s[c] * n;
  decode_s = numbers.codecs.decode_s[c] * n;
  if (rung.codec == Codec::kDgc)  // per received value: k from each of the P ranks
    decode_s = numbers.codecs.decode_s[c] *
               static_cast<double>(selected_count(t.numel, rung.sparsity)) * o.world_size;
  Terms terms;
  switch (rung.codec) {
    case Codec::kFp32:
    case Codec::kHalf: {
      const double bytes = (rung.codec == Codec::kFp32 ? 4.0 : 2.0) * n;
      terms = dense_allreduce_terms(bytes, o.world_size, o.dense_direct_max_bytes);
      break;
    }
    case Codec::kInt8:
    case Codec::kInt4:
      terms = int8_allreduce_terms(n, o.world_size, quantized_bits(rung.codec),
                                   quantized_one_hop(n, rung.codec, o));
      break;
    case Codec::kDgc:
    case Codec::kAdam: {
      const double k = static_cast<double>(selected_count(t.numel, rung.sparsity));
      terms = allgatherv_terms(k * sparse_bytes_per_selected(rung.codec, numbers.codecs),
                               o.world_size, o.sparse_ring, o.sparse_unsized);
      break;
    }
  }
  // CPU work measured alone takes cpu_share longer while every rank of the machine works.
  const double share = std::max(1.0, numbers.cpu_share);
  const double k = numbers.calibration * numbers.codec_factor[c];
  encode_s *= share * k;
  decode_s *= share * k;
  const double wire_s = terms.seconds(link);
  const double cpu_s = collective_cpu_s(t.numel, rung, numbers, o) * share;
  comm_s = std::max(wire_s, cpu_s) * k;
  if (latency_s) *latency_s = terms.latency * link.alpha_s * k;
}

std::array<double, kCodecs> measured_codec_factors(const std::vector<UnitRecord>& records,
                                                   const Snapshot& numbers,
                                                   const ChoiceOptions& options) {
  Snapshot raw = numbers;
  raw.calibration = 1.0;
  raw.codec_factor.fill(1.0);
  std::array<double, kCodecs> measured{}, predicted{};
  std::array<double, kCodecs> stages_measured{}, stages_predicted{};
  std::array<size_t, kCodecs> count{};
  for (const UnitRecord& r : records) {
    double unit = 0, stages = 0;
    bool first = true;
    for (const auto& [numel, sparsity] : r.tensors) {
      TensorInput t;
      t.numel = numel;
      double e = 0, m = 0, d = 0, latency = 0;
      rung_costs(t, Rung{r.codec, is_sparse(r.codec) ? sparsity : 0.0}, raw, options, e, m, d,
                 &latency);
      unit += e + m + d - (first ? 0.0 : latency);  // one collective: its latency paid once
      stages += e + d;
      first = false;
    }
    if (!(unit > 0) || !(r.measured_s > 0) || !std::isfinite(r.measured_s)) continue;
    const auto c = static_cast<size_t>(r.codec);
    measured[c] += r.measured_s;
    predicted[c] += unit;
    // (Not the 8-bit route's: its owner's sums, priced in its encode, run inside its transfer.)
    if (!is_quantized(r.codec) && r.stages_s >= 0 && std::isfinite(r.stages_s) && stages > 0) {
      stages_measured[c] += r.stages_s;
      stages_predicted[c] += stages;
    }
    ++count[c];
  }
  auto enough = [&](Codec c) { return count[static_cast<size_t>(c)] >= kMinFactorRecords; };
  std::array<double, kCodecs> factor;
  factor.fill(1.0);
  double sum = 0, stage_sum = 0;
  size_t measured_codecs = 0, stage_codecs = 0;
  for (size_t c = 0; c < factor.size(); ++c) {
    if (!enough(static_cast<Codec>(c))) continue;
    factor[c] = std::clamp(measured[c] / predicted[c], 0.25, 16.0);
    sum += factor[c];
    ++measured_codecs;
    if (stages_predicted[c] > 0) {
      stage_sum += std::clamp(stages_measured[c] / stages_predicted[c], 0.25, 16.0);
      ++stage_codecs;
    }
  }
  if (measured_codecs == 0) return factor;
  // The lesser of the two evidences, and never above 1: priced above its own numbers, an
  // unmeasured codec might never be chosen, so never measured (loaded CPUs inflate the stages,
  // CPU-bound rings and routes the transfers).
  double inherited = sum / static_cast<double>(measured_codecs);
  if (stage_codecs > 0)
    inherited = std::min(inherited, stage_sum / static_cast<double>(stage_codecs));
  inherited = std::min(inherited, 1.0);
  for (size_t c = 0; c < factor.size(); ++c) {
    const auto codec = static_cast<Codec>(c);
    if (enough(codec)) continue;
    factor[c] = inherited;
    // The same collective at the other width: the dense rings, the quantized route's 8 and 4 bits.
    std::optional<Codec> sibling;
    if (codec == Codec::kFp32 || codec == Codec::kHalf)
      sibling = codec == Codec::kFp32 ? Codec::kHalf : Codec::kFp32;
    if (is_quantized(codec)) sibling = codec == Codec::kInt8 ? Codec::kInt4 : Codec::kInt8;
    if (sibling && enough(*sibling)) factor[c] = factor[static_cast<size_t>(*sibling)];
  }
  return factor;
}

std::vector<UnitRecord> remember_unit_records(UnitMemory& memory, std::vector<UnitRecord> fresh) {
  std::array<size_t, kCodecs> count{};
  for (const UnitRecord& r : fresh)
    ++count[static_cast<size_t>(r.codec)];
  for (size_t c = 0; c < memory.size(); ++c)
    if (count[c] >= kMinFactorRecords) memory[c].clear();
  for (UnitRecord& r : fresh) {
    const auto c = static_cast<size_t>(r.codec);
    if (count[c] >= kMinFactorRecords) memory[c].push_back(std::move(r));
  }
  std::vector<UnitRecord> all;
  for (const std::vector<UnitRecord>& records : memory)
    all.insert(all.end(), records.begin(), records.end());
  return all;
}

namespace {

// The order the timeline walks: ready time, then key.
std::vector<size_t> timeline_order(const std::vector<TensorInput>& inputs) {
  std::vector<size_t> order(inputs.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (inputs[a].ready_s != inputs[b].ready_s) return inputs[a].ready_s < inputs[b].ready_s;
    return inputs[a].key < inputs[b].key;
  });
  return order;
}

// The raise-and-relax search below, on the options as given.
Plan search_codecs(const std::vector<TensorInput>& inputs, const Snapshot& numbers,
                   const ChoiceOptions& options, uint64_t step);

}  // namespace

Plan choose_codecs(const std::vector<TensorInput>& inputs, const Snapshot& numbers,
                   const ChoiceOptions& options, uint64_t step) {
  Plan plan = search_codecs(inputs, numbers, options, step);
  // Riders need a sparse tensor: where no tensor may take a sparse rung (no ladder at this step,
  // as under an Adam-family optimizer by default or before GRADEX_POLICY_DENSE_STEPS, and no
  // override to one), both searches below are the same search.
  const bool sparse_possible =
      (step >= options.dense_steps && !ramped_ladder(options, step).empty()) ||
      std::any_of(inputs.begin(), inputs.end(),
                  [](const TensorInput& t) { return t.forced && is_sparse(t.forced->codec); });
  if (options.rider_bytes == 0 || !sparse_possible) return plan;
  // With riders the timeline is not monotonic in single raises: the first tensor raised to DGC
  // makes every small dense tensor free, after which no single raise of another pays (each would
  // leave the gather for a unit of its own), and the search stopped at DGC plus 16-bit riders
  // (107 ms predicted on the race's mlp lane) where every tensor on 4-bit in one unit takes 68 ms
  // (CodecChoice.RidersNeverMakeThePlanEndLater). So the search also runs as if nothing rode, its
  // plan is timed with the riders the engine will give it, and the sooner finish wins; where both
  // hide the step, the search that saw the riders (its relaxing then knew what riding costs).
  ChoiceOptions alone = options;
  alone.rider_bytes = 0;
  Plan without = search_codecs(inputs, numbers, alone, step);
  without.finish_s = simulate(without.tensors, timeline_order(inputs), options).finish;
  const bool both_hidden = plan.exposed_s() == 0 && without.exposed_s() == 0;
  return !both_hidden && without.finish_s < plan.finish_s ? without : plan;
}

namespace {

Plan search_codecs(const std::vector<TensorInput>& inputs, const Snapshot& numbers,
                   const ChoiceOptions& options, uint64_t step) {
  // The ladder in force at this step (the fidelity ramp's cap applied): raises, ranks and the
  // floors below all work on it.
  ChoiceOptions o = options;
  o.ladder = ramped_ladder(options, step);
  Plan plan;
  const size_t n = inputs.size();
  std::vector<std::vector<Rung>> rungs(n);
  std::vector<std::string> excluded(n);
  plan.tensors.resize(n);
  auto set_rung = [&](size_t i, const Rung& r) {
    TensorChoice& c = plan.tensors[i];
    c.rung = r;
    rung_costs(inputs[i], r, numbers, o, c.encode_s, c.comm_s, c.decode_s, &c.latency_s);
  };
  for (size_t i = 0; i < n; ++i) {
    const TensorInput& t = inputs[i];
    TensorChoice& c = plan.tensors[i];
    c.key = t.key;
    c.numel = t.numel;
    c.ready_s = t.ready_s;
    if (t.forced) {
      rungs[i] = {*t.forced};
      c.reason = t.forced_reason;
    } else {
      rungs[i] = allowed_rungs(t, options, step, &excluded[i]);  // it applies the ramp itself
    }
    if (t.at_least && !t.forced) {
      const size_t floor = ladder_rank(*t.at_least, o);
      std::vector<Rung> kept;
      for (const Rung& r : rungs[i])
        if (ladder_rank(r, o) >= floor) kept.push_back(r);
      // A floor above every allowed rung (the ramp's cap, a fidelity floor): the most allowed.
      if (kept.empty()) kept.push_back(rungs[i].back());
      rungs[i] = std::move(kept);
    }
    set_rung(i, rungs[i][0]);
  }
  const std::vector<size_t> order = timeline_order(inputs);
  for (const TensorInput& t : inputs)
    plan.backward_end_s = std::max(plan.backward_end_s, t.ready_s);
  const double compute = std::max(numbers.backward_s, plan.backward_end_s) + numbers.forward_s;
  plan.deadline_s = plan.backward_end_s + o.slack * compute;

  // The ladder's rungs in order (the union over tensors, which share one order).
  std::vector<Rung> ladder{{Codec::kFp32, 0}};
  if (o.half_available) ladder.push_back({Codec::kHalf, 0});
  // (From the options as given: `o`'s ladder is already capped, so no cap binds below its top.)
  if (int8_allowed(options, step)) ladder.push_back({Codec::kInt8, 0});
  if (o.int4_available) ladder.push_back({Codec::kInt4, 0});
  for (double s : o.ladder)
    ladder.push_back({o.sparse_codec, s});
  auto rank_of = [&](const Rung& r) {
    for (size_t l = 0; l < ladder.size(); ++l)
      if (ladder[l] == r) return l;
    return ladder.size();
  };

  // Raise: while the step is exposed, the one raise (a tensor to any higher rung it may take)
  // that ends the step earliest. Candidates are the kCandidates raises that take most off the
  // tensor's own encode + transfer + decode; each is tried on the timeline (encodes overlap
  // earlier transfers, so only the timeline tells what a raise saves). A step that compute cannot
  // hide (none measured, or less than the exchange) is thus compressed as hard as the link
  // requires: raises continue while any still shortens the step.
  Timeline tl = simulate(plan.tensors, order, o);
  while (tl.finish > plan.deadline_s) {
    struct Candidate {
      double saving;
      size_t tensor;
      size_t rung;  // index into `ladder`
    };
    std::vector<Candidate> candidates;
    for (size_t i = 0; i < n; ++i) {
      if (inputs[i].forced) continue;
      const TensorChoice& c = plan.tensors[i];
      const size_t now = rank_of(c.rung);
      for (const Rung& r : rungs[i]) {
        const size_t l = rank_of(r);
        if (l <= now) continue;
        double e, m, d;
        rung_costs(inputs[i], r, numbers, o, e, m, d, nullptr);
        const double saving = (c.encode_s + c.comm_s + c.decode_s) - (e + m + d);
        if (saving > 0) candidates.push_back({saving, i, l});
      }
    }
    std::sort(candidates.begin(), candidates.end(), [&](const Candidate& a, const Candidate& b) {
      if (a.saving != b.saving) return a.saving > b.saving;
      if (inputs[a.tensor].key != inputs[b.tensor].key)
        return inputs[a.tensor].key < inputs[b.tensor].key;
      return a.rung < b.rung;
    });
    // Every tensor's largest-saving raise (for the group raise below).
    std::vector<Candidate> per_tensor;
    {
      std::vector<bool> seen(n, false);
      for (const Candidate& cand : candidates)
        if (!seen[cand.tensor]) {
          seen[cand.tensor] = true;
          per_tensor.push_back(cand);
        }
    }
    {  // the kCandidates best raises to a DGC rung and the kCandidates best to a dense one
      std::vector<Candidate> kept;
      size_t lossy = 0, dense = 0;
      for (const Candidate& cand : candidates) {
        size_t& count = is_sparse(ladder[cand.rung].codec) ? lossy : dense;
        if (count < kCandidates) {
          ++count;
          kept.push_back(cand);
        }
      }
      candidates = std::move(kept);
    }
    // Fidelity first: a raise that removes less than kMinSaving of what is still exposed is not
    // worth its loss (many small tensors, each saving microseconds).
    const double needed = kMinSaving * (tl.finish - plan.deadline_s);
    // A dense rung (16-bit) only rounds: any raise to it that ends the step earlier is taken.
    const Candidate* best = nullptr;
    double best_finish = tl.finish;
    for (const Candidate& cand : candidates) {
      const TensorChoice keep = plan.tensors[cand.tensor];
      set_rung(cand.tensor, ladder[cand.rung]);
      const double finish = simulate(plan.tensors, order, o).finish;
      plan.tensors[cand.tensor] = keep;
      const bool lossy = is_sparse(ladder[cand.rung].codec);
      if (finish < (lossy ? tl.finish - needed : tl.finish) && finish < best_finish) {
        best = &cand;
        best_finish = finish;
      }
    }
    if (best == nullptr) {
      // Group raise. The rule above holds back one tensor at a time; a model's many mid-size
      // tensors (ResNet-50's 17 of 16-128 k elements, the floors' DGC 99 %) may each save less
      // than kMinSaving of the exposure and together save far more (their 16-bit rings were
      // ~25 ms of a 300 ms step exposed by the link, measured). So when no single raise is worth
      // its loss, every tensor's largest-saving raise that alone ends the step earlier is taken at
      // once, if together they remove kMinSaving of what is exposed: as hard as the link requires
      // for the step as a whole, still never for microseconds.
      std::vector<const Candidate*> group;
      for (const Candidate& cand : per_tensor) {
        const TensorChoice keep = plan.tensors[cand.tensor];
        set_rung(cand.tensor, ladder[cand.rung]);
        const double finish = simulate(plan.tensors, order, o).finish;
        plan.tensors[cand.tensor] = keep;
        if (finish < tl.finish) group.push_back(&cand);
      }
      if (group.size() >= 2) {
        std::vector<TensorChoice> keep = plan.tensors;
        for (const Candidate* cand : group)
          set_rung(cand->tensor, ladder[cand->rung]);
        const Timeline grouped = simulate(plan.tensors, order, o);
        if (grouped.finish < tl.finish - needed) {
          tl = grouped;
          continue;
        }
        plan.tensors = std::move(keep);
      }
      // Rung raise. Tensors fused into one unit share its latencies, so on a latency-bound link
      // moving any one of them to another codec adds a unit with latencies of its own and ends the
      // step no earlier, however many bytes it saves: every raise above fails one at a time. (The
      // WAN race's `tfm`, 25 ms one way: 30 tensors in one fp32 ring of 6 latencies, each alone
      // on 4-bit's 2 latencies no sooner; the job ran fp32, 9.6 MB a step, to its end.) So every
      // tensor that may take a rung moves to it at once, the rung that ends the step earliest, if
      // that removes kMinSaving of what is exposed; the relax pass below takes back what the step
      // does not need.
      std::vector<TensorChoice> before = plan.tensors;
      std::vector<TensorChoice> best_rung;  // with the times its simulation set
      Timeline best_tl;
      best_tl.finish = tl.finish - needed;
      for (size_t l = 0; l < ladder.size(); ++l) {
        bool moved = false;
        for (size_t i = 0; i < n; ++i) {
          if (inputs[i].forced || rank_of(before[i].rung) >= l) continue;
          if (std::find(rungs[i].begin(), rungs[i].end(), ladder[l]) == rungs[i].end()) continue;
          set_rung(i, ladder[l]);
          moved = true;
        }
        if (moved) {
          const Timeline raised = simulate(plan.tensors, order, o);
          if (raised.finish < best_tl.finish) {
            best_tl = raised;
            best_rung = plan.tensors;
          }
        }
        plan.tensors = before;
      }
      if (best_rung.empty()) break;
      plan.tensors = std::move(best_rung);
      tl = best_tl;
      continue;
    }
    set_rung(best->tensor, ladder[best->rung]);
    tl = simulate(plan.tensors, order, o);
  }
  // Relax (fidelity first): the raises above take the largest savings, which may compress a
  // tensor harder than the step needs; each raised tensor, smallest first, goes back to the least
  // rung that does not end the step later than the deadline or than the raised plan does.
  const double limit = std::max(plan.deadline_s, tl.finish);
  std::vector<size_t> by_size(n);
  std::iota(by_size.begin(), by_size.end(), 0);
  std::sort(by_size.begin(), by_size.end(), [&](size_t a, size_t b) {
    if (inputs[a].numel != inputs[b].numel) return inputs[a].numel < inputs[b].numel;
    return inputs[a].key < inputs[b].key;
  });
  for (size_t i : by_size) {
    if (inputs[i].forced || plan.tensors[i].rung == rungs[i][0]) continue;
    const TensorChoice keep = plan.tensors[i];
    const size_t now = rank_of(keep.rung);
    bool relaxed = false;
    for (const Rung& r : rungs[i]) {
      if (rank_of(r) >= now) break;
      set_rung(i, r);
      if (simulate(plan.tensors, order, o).finish <= limit) {
        relaxed = true;
        break;
      }
    }
    if (!relaxed) plan.tensors[i] = keep;
  }
  tl = simulate(plan.tensors, order, o);  // the times of the final choice
  plan.finish_s = tl.finish;

  for (size_t i = 0; i < n; ++i) {
    TensorChoice& c = plan.tensors[i];
    if (inputs[i].forced) continue;
    const bool least = c.rung == rungs[i][0];
    if (least) {
      c.reason = plan.exposed_s() > 0
                     ? "least compression: not on the exposed tail, or no rung is cheaper"
                     : "least compression: the step is hidden";
    } else {
      c.reason = plan.exposed_s() > 0 ? "the link requires it (step still exposed)"
                                      : "compressed as far as the link requires";
    }
    if (!excluded[i].empty() && !is_sparse(c.rung.codec)) c.reason += "; dense: " + excluded[i];
  }
  return plan;
}

}  // namespace

std::string Plan::describe(const std::map<std::string, double>* measured) const {
  std::string out;
  char line[512];
  std::snprintf(line, sizeof line, "%-32s %12s %-10s %9s %9s %9s %9s %9s  %s\n", "tensor",
                "elements", "codec", "ready_ms", "enc_ms", "comm_ms", "done_ms", "meas_ms", "why");
  out += line;
  for (const TensorChoice& t : tensors) {
    std::string meas = "-";
    if (measured) {
      auto it = measured->find(t.key);
      if (it != measured->end()) meas = format_ms(it->second);
    }
    std::snprintf(line, sizeof line, "%-32s %12llu %-10s %9s %9s %9s %9s %9s  %s\n", t.key.c_str(),
                  static_cast<unsigned long long>(t.numel), rung_name(t.rung).c_str(),
                  format_ms(t.ready_s).c_str(), format_ms(t.encode_s).c_str(),
                  format_ms(t.comm_s).c_str(), format_ms(t.done_s).c_str(), meas.c_str(),
                  t.reason.c_str());
    out += line;
  }
  std::snprintf(line, sizeof line,
                "predicted: backward ends at %s ms, deadline %s ms, last average at %s ms, "
                "exposed %s ms\n",
                format_ms(backward_end_s).c_str(), format_ms(deadline_s).c_str(),
                format_ms(finish_s).c_str(), format_ms(exposed_s()).c_str());
  out += line;
  return out;
}

}  // namespace gradex::sync::cost
