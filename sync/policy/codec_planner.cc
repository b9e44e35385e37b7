#include "sync/policy/codec_planner.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <sstream>
#include <thread>

#include <time.h>

#include "base/error.h"
#include "base/log.h"
#include "comm/collectives.h"
#include "comm/topology/host_identity.h"
#include "compress/dgc/schedule.h"
#include "sync/data/backend_path.h"
#include "sync/data/backend_tensor.h"
#include "sync/engine/pipeline.h"
#include "sync/negotiation/submission_timeline.h"

namespace gradex::sync {
namespace {

std::vector<double> parse_ladder(const std::string& text) {
  std::vector<double> ladder;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    char* end = nullptr;
    const double s = std::strtod(item.c_str(), &end);
    if (item.empty() || end == item.c_str() || *end != '\0' || !(s > 0) || !(s < 1))
      throw ConfigError("GRADEX_POLICY_LADDER entry '" + item +
                        "' is not a sparsity in (0, 1); expected e.g. '0.9,0.99,0.999'");
    if (!ladder.empty() && s <= ladder.back())
      throw ConfigError("GRADEX_POLICY_LADDER must be ascending ('" + text + "')");
    ladder.push_back(s);
  }
  return ladder;
}

std::string fmt(const char* format, double v) {
  char b[64];
  std::snprintf(b, sizeof b, format, v);
  return b;
}

// The plan's corrections: the step's calibration and each codec's measured-over-predicted factor.
std::string describe_factors(const cost::Snapshot& s) {
  std::string out =
      "calibration " + fmt("%.2f", s.calibration) + "; measured over predicted per codec:";
  for (int c = 0; c < kCodecs; ++c)
    out += std::string(c ? "," : "") + " " + codec_name(static_cast<Codec>(c)) + " " +
           fmt("%.2f", s.codec_factor[static_cast<size_t>(c)]);
  return out;
}

}  // namespace

void CodecPlanner::adam_rungs(const EngineOptions& options, cost::ChoiceOptions& choice) {
  // GRADEX_OPTIMIZER=adam: the engine gives every sparse tensor the Adam codec, so the sparse
  // rung is that codec at its own sparsity (none with GRADEX_ADAM_SPARSITY=0: AdamW kept dense),
  // priced by its own measurements, not DGC at GRADEX_POLICY_LADDER's sparsities.
  choice.sparse_codec = sparse_codec(options);
  choice.ladder.clear();
  if (options.adam.sparsity > 0) choice.ladder.push_back(options.adam.sparsity);
  // The fidelity ramp and the floors apply as to DGC. The horizon rule does not while the codec
  // decays what it has not sent (GRADEX_ADAM_DECAY < 1): an unsent value fades within ~1/(1-b)
  // steps instead of waiting in a residual to be sent later, so the end of training strands no
  // more of it than any other step does. With b = 1 (error feedback without decay) it does.
  if (options.adam.decay < 1.0f) choice.horizon_steps = 0;
}

AdamLadder adam_ladder(const config::Config& config) {
  AdamLadder a;
  const bool int8_given = config.source_of("GRADEX_POLICY_INT8") != config::Source::kDefault;
  a.int8 = int8_given ? config.get_bool("GRADEX_POLICY_INT8") : true;
  a.adam_codec = !a.int8 || config.source_of("GRADEX_ADAM_SPARSITY") != config::Source::kDefault ||
                 config.source_of("GRADEX_SPARSITY") != config::Source::kDefault;
  const bool int4_given = config.source_of("GRADEX_POLICY_INT4") != config::Source::kDefault;
  a.int4 = int4_given ? config.get_bool("GRADEX_POLICY_INT4") : a.int8 && !a.adam_codec;
  return a;
}

bool fidelity_int8_enabled(const config::Config& config, const EngineOptions& options) {
  if (config.source_of("GRADEX_POLICY_FIDELITY_INT8") != config::Source::kDefault)
    return config.get_bool("GRADEX_POLICY_FIDELITY_INT8");
  return !options.adam.codec && config.get_bool("GRADEX_POLICY_FIDELITY_INT8");
}

std::unique_ptr<CodecPlanner> CodecPlanner::create(const config::Config& config,
                                                   const EngineOptions& options, int world_size) {
  if (config.get_string("GRADEX_POLICY") != "auto") return nullptr;
  PlannerOptions p;
  p.interval = static_cast<uint64_t>(config.get_int("GRADEX_POLICY_INTERVAL"));
  p.probe = config.get_bool("GRADEX_POLICY_PROBE");
  p.learn_link = config.get_bool("GRADEX_POLICY_LEARN_LINK");
  p.choice.ladder = parse_ladder(config.get_string("GRADEX_POLICY_LADDER"));
  p.choice.slack = config.get_float("GRADEX_POLICY_SLACK");
  p.choice.dense_steps = static_cast<uint64_t>(config.get_int("GRADEX_POLICY_DENSE_STEPS"));
  p.choice.ramp_steps = static_cast<uint64_t>(config.get_int("GRADEX_POLICY_RAMP_STEPS"));
  p.choice.horizon_steps = static_cast<uint64_t>(config.get_int("GRADEX_POLICY_HORIZON_STEPS"));
  p.choice.min_selected = static_cast<uint64_t>(config.get_int("GRADEX_POLICY_MIN_SELECTED"));
  p.choice.min_per_row = config.get_float("GRADEX_POLICY_MIN_PER_ROW");
  p.choice.int8_available = config.get_bool("GRADEX_POLICY_INT8");
  p.choice.int4_available = config.get_bool("GRADEX_POLICY_INT4");
  p.choice.fidelity_int8 = fidelity_int8_enabled(config, options);
  if (options.adam.codec) {
    const AdamLadder adam = adam_ladder(config);
    p.choice.int8_available = adam.int8;
    p.choice.int4_available = adam.int4;
    adam_rungs(options, p.choice);
    if (!adam.adam_codec) p.choice.ladder.clear();
    static std::once_flag said;
    std::call_once(said, [&] {
      GX_LOG(kInfo) << "auto policy under GRADEX_OPTIMIZER=adam: rungs fp32, 16-bit"
                    << (adam.int8 ? ", 8-bit" : "") << (adam.int4 ? ", 4-bit" : "")
                    << (!adam.adam_codec ? " (the Adam codec only when GRADEX_ADAM_SPARSITY is set)"
                        : p.choice.ladder.empty()
                            ? " (GRADEX_ADAM_SPARSITY=0: no Adam codec rung)"
                            : ", the Adam codec at " + fmt("%g", options.adam.sparsity));
    });
  }
  return std::make_unique<CodecPlanner>(config, options, world_size, std::move(p));
}

CodecPlanner::CodecPlanner(const config::Config& config, const EngineOptions& options,
                           int world_size, PlannerOptions planner)
    : config_(config), options_(options), world_size_(world_size), planner_(std::move(planner)) {
  planner_.choice.world_size = world_size;
  planner_.choice.sparse_ring = options.sparse_ring_for(world_size);
  planner_.choice.half_available = options.half_on_wire;
  horizon_.steps.store(planner_.choice.horizon_steps);
}

std::optional<cost::Rung> CodecPlanner::forced_rung(const std::string& key) const {
  const std::optional<AppliedPolicy> o = override_policy(options_, key);
  if (!o) return std::nullopt;
  return o->rung;
}

AppliedPolicy CodecPlanner::initial_policy(const std::string& key) const {
  if (std::optional<AppliedPolicy> o = override_policy(options_, key)) return *o;
  return {default_dense_rung(options_),
          "GRADEX_POLICY=auto: dense until the first plan (at its first exchange)"};
}

uint64_t CodecPlanner::first_refine() const {
  return std::min<uint64_t>(kFirstRefineStep, planner_.interval);
}

std::vector<uint64_t> CodecPlanner::extra_starts() const {
  std::vector<uint64_t> starts = cost::ramp_stage_starts(planner_.choice);
  for (uint64_t s : cost::horizon_stage_starts(planner_.choice))
    starts.push_back(s);
  starts.push_back(first_refine());
  std::sort(starts.begin(), starts.end());
  starts.erase(std::unique(starts.begin(), starts.end()), starts.end());
  starts.erase(std::remove_if(starts.begin(), starts.end(),
                              [&](uint64_t s) { return s == 0 || s % planner_.interval == 0; }),
               starts.end());
  return starts;
}

uint64_t CodecPlanner::epoch_of(uint64_t step) const {
  const std::vector<uint64_t> extra = extra_starts();
  return step / planner_.interval +
         static_cast<uint64_t>(std::upper_bound(extra.begin(), extra.end(), step) - extra.begin());
}

uint64_t CodecPlanner::epoch_start(uint64_t epoch) const {
  // The least step of the epoch: epoch_of is non-decreasing and epoch_of(epoch * interval) is at
  // least `epoch`.
  uint64_t low = 0, high = epoch * planner_.interval;
  while (low < high) {
    const uint64_t mid = low + (high - low) / 2;
    if (epoch_of(mid) >= epoch)
      high = mid;
    else
      low = mid + 1;
  }
  return low;
}

AppliedPolicy CodecPlanner::policy_for(const Rung& rung) const {
  return {canonical_rung(rung, options_), "GRADEX_POLICY=auto: " + rung_name(rung)};
}

void CodecPlanner::on_register(const std::string& key, uint64_t numel, uint64_t rows) {
  model_.on_register(key, numel, rows);
}

void CodecPlanner::on_submit(const std::string& key) {
  model_.on_submit(
      key,
      std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count());
}

void CodecPlanner::on_end_step() {
  model_.on_end_step(
      std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count());
}

std::vector<cost::TensorInput> CodecPlanner::inputs_of(
    const cost::Snapshot& numbers, const std::map<std::string, cost::Rung>* rungs) const {
  std::vector<cost::TensorInput> inputs;
  inputs.reserve(numbers.tensors.size());
  // On a latency-bound link the engine negotiates the submissions that come within its window of
  // a step's first in one round, and they travel in one unit: the timeline plans them ready
  // together.
  std::vector<double> ready;
  for (const cost::TensorTiming& t : numbers.tensors)
    ready.push_back(t.ready_s);
  coalesce_ready_times(ready, link_paths_.coalesce_window_s);
  size_t index = 0;
  for (const cost::TensorTiming& t : numbers.tensors) {
    cost::TensorInput in;
    in.key = t.key;
    in.numel = t.numel;
    in.rows = t.rows;
    in.ready_s = ready[index++];
    in.forced = forced_rung(t.key);
    if (in.forced) in.forced_reason = "GRADEX_SPARSITY_OVERRIDES";
    if (rungs) {  // the plan in force: every tensor as it is
      auto it = rungs->find(t.key);
      in.forced = it != rungs->end() ? std::optional<cost::Rung>(it->second)
                                     : std::optional<cost::Rung>(cost::Rung{});
    }
    inputs.push_back(std::move(in));
  }
  return inputs;
}

cost::ChoiceOptions CodecPlanner::choice_options(const cost::Snapshot& numbers) const {
  cost::ChoiceOptions o = planner_.choice;
  o.dense_direct_max_bytes = link_paths_.dense_direct_max_bytes;
  o.sparse_unsized = link_paths_.sparse_unsized;
  o.quantized_one_hop_max_bytes = link_paths_.quantized_one_hop_max_bytes;
  o.rider_bytes = link_paths_.rider_bytes;
  o.link_class = startup_.link_class;
  o.one_lane = numbers.one_lane;
  return o;
}

void CodecPlanner::replan(comm::Communicator& comm, uint64_t epoch) {
  cost::Snapshot local = model_.snapshot();
  local.one_lane = startup_.one_lane;
  local.cpu_share = startup_.cpu_share.load();
  local.calibration = 1.0;
  {
    // What each codec's units measured under the plan in force, against what these numbers
    // predict for them: corrects start-up numbers that the load moved (Snapshot::codec_factor).
    std::vector<cost::UnitRecord> records;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      records.swap(unit_records_);
    }
    records = cost::remember_unit_records(unit_memory_, std::move(records));
    local.codec_factor = cost::measured_codec_factors(records, local, choice_options(local));
  }
  if (plans_made_ > 0) {
    // The measured step tail under the plan in force over that plan's tail predicted from
    // today's numbers (this rank's; rank 0's is the one used). Tails under a millisecond are
    // noise of the clock and the threads.
    uint64_t tails = 0;
    const double measured = model_.tail_s(&tails);
    const cost::Plan in_force =
        cost::choose_codecs(inputs_of(local, &choice_), local, choice_options(local), 0);
    const double predicted = in_force.finish_s - in_force.backward_end_s;
    // Not without learning (GRADEX_POLICY_LEARN_LINK=0): a delayed-exchange lane's step ends
    // before its exchange does, so its measured tail says nothing of the plan (measured: 0.25,
    // the floor, every lane's predictions cut by 4 and fp32 chosen for a 4M-element tensor).
    if (planner_.learn_link && tails > 0 && measured > 1e-3 && predicted > 1e-3)
      local.calibration = std::clamp(measured / predicted, 0.25, 16.0);
    // No step ended since the last plan (a plan at a ramp quarter or a horizon rung right after
    // a regular one): what that plan knew still holds. Dropped, the floor below fell away with
    // it, and the WAN race's `tfm` re-planned from the bare model one step after a plan that had
    // measured its steps 3x the prediction.
    if (tails == 0) {
      local.calibration = agreed_.calibration;
      local.tail_s = agreed_.tail_s;
    } else {
      local.tail_s = model_.tail_s();
    }
  }
  model_.restart_tail();
  const cost::Snapshot numbers = cost::agree_snapshot(comm, local);
  std::vector<cost::TensorInput> inputs = inputs_of(numbers, nullptr);
  cost::ChoiceOptions o = choice_options(numbers);
  // Measured, not predicted: when the steps under the plan in force ended more than the slack
  // after their backward pass, the link needed at least that plan's compression, whatever the
  // model now predicts; only a step measured hidden may take compression back (fidelity first).
  const double compute = numbers.backward_s + numbers.forward_s;
  if (plans_made_ > 0 && numbers.tail_s > o.slack * compute + 1e-3) {
    for (cost::TensorInput& in : inputs) {
      auto it = choice_.find(in.key);
      if (it != choice_.end()) in.at_least = it->second;
    }
  }
  cost::Plan plan = cost::choose_codecs(inputs, numbers, o, epoch_start(epoch));
  choice_.clear();
  for (cost::TensorChoice& c : plan.tensors) {
    if (choice_hook_ && !forced_rung(c.key)) {
      if (std::optional<cost::Rung> r = choice_hook_(c.key, epoch)) {
        c.rung = *r;
        c.reason = "test hook";
      }
    }
    choice_[c.key] = c.rung;
  }
  GX_LOG(kInfo) << "GRADEX_POLICY=auto: plan for step " << epoch_start(epoch)
                << " (agreed numbers: " << describe_numbers(numbers) << ")\n"
                << plan.describe();
  std::lock_guard<std::mutex> lock(mutex_);
  plan_ = std::move(plan);
  agreed_ = numbers;
  ++plans_made_;
}

CalibrationSettings CodecPlanner::calibration() const {
  CalibrationSettings s{config_, options_, world_size_, options_.sparsity, options_.adam.sparsity};
  if (!planner_.choice.ladder.empty()) {
    s.dgc_sparsity = planner_.choice.ladder.back();
    s.adam_sparsity = planner_.choice.ladder.back();
  }
  return s;
}

void CodecPlanner::on_reconfigure(int world_size) {
  world_size_ = world_size;
  planner_.choice.world_size = world_size;
  startup_.probed = false;
  startup_.calibrated = false;  // measured for a world size (the owner's share, DGC's k)
  epochs_.plan = 0;
  epochs_.applied.clear();
  std::lock_guard<std::mutex> lock(mutex_);
  unit_records_.clear();  // measured with another membership
  for (std::vector<cost::UnitRecord>& records : unit_memory_)
    records.clear();
}

void CodecPlanner::set_horizon(uint64_t steps) {
  horizon_.pending.store(static_cast<int64_t>(std::min<uint64_t>(steps, uint64_t{1} << 62)));
}

uint64_t CodecPlanner::horizon() const {
  return horizon_.steps.load();
}

void CodecPlanner::calibrate_now() {
  if (startup_.calibrated) return;
  calibrate_codecs(model_, calibration());
  // GRADEX_ADAM_SPARSITY=0 leaves no sparse rung to price.
  if (planner_.choice.sparse_codec == cost::Codec::kAdam && !planner_.choice.ladder.empty())
    calibrate_adam_codec(model_, calibration());
  startup_.calibrated = true;
}

void CodecPlanner::measure_startup(comm::Communicator& comm, AgreedLink& link) {
  {
    calibrate_now();
    if (world_size_ > 1) {
      std::vector<std::string> hosts;
      if (planner_.probe) {
        link.agree(comm);
        const cost::ProbeResult& r = *link.probe();
        for (int c = 0; c < cost::kPeerClasses; ++c) {
          const cost::LinkParams params = r.class_link(static_cast<cost::PeerClass>(c));
          if (params.measured) model_.set_link(static_cast<cost::PeerClass>(c), params);
        }
        calibrate_transport(model_, &r);
        hosts = r.hosts;
      } else {
        calibrate_transport(model_, nullptr);
        const std::string me = comm::host_identity(comm.options().host_id);
        for (const comm::Bytes& b : comm::allgatherv(comm, me.data(), me.size()))
          hosts.emplace_back(b.begin(), b.end());
      }
      startup_.link_class = cost::collective_class(hosts);
      // Ranks on this machine: host identities without their network namespace (emulated hosts
      // in namespaces, and containers, share the machine's cores).
      auto machine = [](const std::string& id) { return id.substr(0, id.rfind('|')); };
      const std::string me = machine(comm::host_identity());
      const auto here = static_cast<unsigned>(std::count_if(
          hosts.begin(), hosts.end(), [&](const std::string& h) { return machine(h) == me; }));
      const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
      startup_.one_lane = here >= cores;
      startup_.cpu_share.store(std::max(1.0, static_cast<double>(here) / cores));
    }
  }
}

RoundDecision CodecPlanner::plan_round(comm::Communicator& comm, AgreedLink& link,
                                       const std::vector<pipeline::Job>& jobs) {
  if (!startup_.probed) {
    startup_.probed = true;
    measure_startup(comm, link);
  }
  bool gradients = false;
  uint64_t now = 0;  // the round's agreed step
  for (const pipeline::Job& job : jobs) {
    if (job.id.kind != WorkKind::kGradient || job.tensor->backend->cuda) continue;
    gradients = true;
    now = std::max(now, job.step);
  }
  // A horizon learnt after creation (set_horizon), from this round's agreed step on: the plan
  // epochs restart (the horizon rule's stage starts moved) and every tensor takes the new plan at
  // its next exchange, on every rank in this same round.
  if (gradients) {
    const int64_t pending = horizon_.pending.exchange(-1);
    if (pending >= 0) {
      planner_.choice.horizon_steps = pending == 0 ? 0 : now + static_cast<uint64_t>(pending);
      horizon_.steps.store(planner_.choice.horizon_steps);
      epochs_.plan = 0;
      epochs_.planned = false;
      epochs_.applied.clear();
      GX_LOG(kInfo) << "GRADEX_POLICY=auto: training horizon " << planner_.choice.horizon_steps
                    << " exchange steps (set at step " << now << ")";
    }
  }
  uint64_t epoch = 0;
  for (const pipeline::Job& job : jobs) {
    if (job.id.kind != WorkKind::kGradient || job.tensor->backend->cuda) continue;
    epoch = std::max(epoch, epoch_of(job.step));
  }
  // The first plan comes with the first gradients (the registered sizes and rows, the probe's
  // link, no compute measured yet); later ones at each new epoch.
  if (gradients && (!epochs_.planned || epoch > epochs_.plan)) {
    replan(comm, epoch);
    epochs_.plan = epoch;
    epochs_.planned = true;
  }
  RoundDecision decision;
  for (const pipeline::Job& job : jobs) {
    if (job.id.kind != WorkKind::kGradient || job.tensor->backend->cuda) continue;
    const uint64_t e = epoch_of(job.step);
    // A tensor takes the newest plan at its first exchange and then when it enters a new epoch.
    auto [applied, first] = epochs_.applied.try_emplace(job.id.key, e);
    if (first) first_exchanges_.mark(job.id.key, job.step);
    if (!first && e <= applied->second) continue;
    applied->second = e;
    auto it = choice_.find(job.id.key);
    if (it == choice_.end() || forced_rung(job.id.key)) continue;  // overrides win
    AppliedPolicy to = policy_for(it->second);
    if (to.rung != job.tensor->policy.rung) {
      first_exchanges_.mark(job.id.key, job.step);
      GX_LOG(kDebug) << "'" << job.tensor->key << "' at step " << job.step << ": " << to.reason;
      decision.switches.push_back({job.tensor, std::move(to)});
    }
  }
  return decision;
}

void CodecPlanner::observe_unit(const pipeline::Unit& unit) {
  if (unit.jobs.empty()) return;
  // A unit holding a tensor's first exchange on its codec is no record of the codec's steady cost
  // (sync/engine/first_exchanges.h); its stages still refine the per-element costs (the least is
  // kept).
  const bool first_on_codec = first_exchanges_.take(unit);
  // Riders (dense gradients in a DGC unit's gather, sync/data/gather_rider.h) are not the codec's
  // work: their bytes count as the link's, their tensors and payloads are left out of the codec's
  // samples (their encode and sum, a copy and an add per value, stay in the stage times).
  std::vector<const pipeline::Job*> jobs;
  uint64_t elements = 0;
  for (const pipeline::Job* j : unit.jobs) {
    if (j->rider) continue;
    jobs.push_back(j);
    elements += j->tensor->numel;
  }
  if (jobs.empty()) return;
  const pipeline::UnitCounters& c = unit.counters;
  // What the unit's route ran (pipeline::UnitSample): its codec and the terms of the collective
  // it actually took.
  const pipeline::UnitSample& sample = unit.sample;
  const cost::Codec codec = sample.codec;
  const cost::Terms terms = sample.terms;
  uint64_t decoded = 0;  // DGC: the values its finish stage summed
  if (is_sparse(codec)) {
    const bool adam = codec == cost::Codec::kAdam;
    uint64_t selected = 0;
    for (const pipeline::Job* j : jobs)
      selected += compress::dgc::target_count(j->tensor->numel, j->tensor->policy.rung.sparsity);
    // DGC's decode is per received value; the Adam codec's per element (cost::CodecCosts).
    decoded = adam ? 0 : selected * static_cast<uint64_t>(world_size_);
    const size_t framing = 4 + 8 * jobs.size();
    const size_t message = unit.message.size() - unit.rider_message_bytes;
    if (message > framing) {
      if (adam)
        model_.observe_adam_payload(selected, message - framing);
      else
        model_.observe_dgc_payload(selected, message - framing);
    }
  }
  if (sample.codec_work)
    model_.observe_codec(codec, elements, c.prepare_seconds, c.finish_seconds, decoded);
  if (planner_.learn_link && world_size_ > 1 && c.transfer_seconds > 0 && !first_on_codec) {
    // The quantized route's transfer also holds the owners' sums and re-encodes, which the model
    // prices in the codec's encode cost, not in the link's terms: where that CPU and the
    // transport's outweigh its bytes' wire time, its time is not the link's (CostModel::
    // observe_transfer). The whole encode cost bounds the owners' part from above. (A dense ring
    // or a DGC gather paced by the CPU is paced per byte, as the link's terms price it.)
    double cpu_s = 0;
    if (sample.codec_cpu_in_transfer) {
      const cost::CodecCosts costs = model_.codecs();
      cpu_s = (terms.bytes * costs.transport_s_per_byte +
               static_cast<double>(elements) * costs.encode_s[static_cast<size_t>(codec)]) *
              startup_.cpu_share.load();
    }
    model_.observe_transfer(startup_.link_class, terms, c.transfer_seconds, cpu_s);
  }
  const double total = c.prepare_seconds + c.transfer_seconds + c.finish_seconds;
  std::lock_guard<std::mutex> lock(mutex_);
  // Without learning (GRADEX_POLICY_LEARN_LINK=0) the units' times calibrate no codec either: a
  // unit's time is mostly its transfer, which is the link's.
  if (planner_.learn_link && world_size_ > 1 && !first_on_codec && sample.codec_work &&
      elements >= cost::CostModel::kMinCodecSample && unit_records_.size() < kMaxUnitRecords) {
    cost::UnitRecord record;
    record.codec = codec;
    record.measured_s = total;
    record.stages_s = c.prepare_seconds + c.finish_seconds;
    for (const pipeline::Job* j : jobs)
      record.tensors.emplace_back(j->tensor->numel, j->tensor->policy.rung.sparsity);
    unit_records_.push_back(std::move(record));
  }
  for (const pipeline::Job* j : jobs) {
    if (j->id.kind != WorkKind::kGradient || elements == 0) continue;
    const double share = total * static_cast<double>(j->tensor->numel) / elements;
    auto [it, fresh] = measured_s_.try_emplace(j->id.key, share);
    if (!fresh) it->second += 0.2 * (share - it->second);
  }
}

std::string CodecPlanner::describe_numbers(const cost::Snapshot& n) const {
  const cost::LinkParams& l = n.link[static_cast<size_t>(startup_.link_class)];
  return std::string(cost::peer_class_name(startup_.link_class)) + " link alpha " +
         fmt("%.1f", l.alpha_s * 1e6) + " us, " + fmt("%.3g", 8e-9 / l.beta_s_per_byte) +
         " Gbit/s" + (l.measured ? "" : " (default)") + "; per element: 16-bit cast " +
         fmt("%.2f", n.codecs.encode_s[1] * 1e9) + " ns, dgc encode " +
         fmt("%.2f", n.codecs.encode_s[2] * 1e9) + " ns, dgc decode " +
         fmt("%.2f", n.codecs.decode_s[2] * 1e9) + " ns per received value; dgc " +
         fmt("%.2f", n.codecs.dgc_bytes_per_selected) + " bytes per value; 4-bit encode and sum " +
         fmt("%.2f", n.codecs.encode_s[static_cast<size_t>(Codec::kInt4)] * 1e9) + " ns, decode " +
         fmt("%.2f", n.codecs.decode_s[static_cast<size_t>(Codec::kInt4)] * 1e9) +
         " ns; ring sum " + fmt("%.2f", n.codecs.reduce_s[0] * 1e9) + " ns (fp32), " +
         fmt("%.2f", n.codecs.reduce_s[1] * 1e9) + " ns (16-bit) per element; transport " +
         fmt("%.2f", n.codecs.transport_s_per_byte * 1e9) + " ns per byte; " +
         (planner_.choice.sparse_codec == cost::Codec::kAdam
              ? "adam encode " + fmt("%.2f", n.codecs.encode_s[4] * 1e9) + " ns, decode " +
                    fmt("%.2f", n.codecs.decode_s[4] * 1e9) + " ns per element, " +
                    fmt("%.2f", n.codecs.adam_bytes_per_selected) + " bytes per value; "
              : std::string()) +
         "cpu share " + fmt("%.2f", n.cpu_share) + "; backward " + fmt("%.3f", n.backward_s * 1e3) +
         " ms, forward " + fmt("%.3f", n.forward_s * 1e3) + " ms; " + describe_factors(n);
}

std::string CodecPlanner::explain() const {
  std::lock_guard<std::mutex> lock(mutex_);
  const uint64_t horizon = horizon_.steps.load();
  std::string out = "GRADEX_POLICY=auto: re-evaluated every " + std::to_string(planner_.interval) +
                    " steps; " + std::to_string(plans_made_) + " plan(s) made; training horizon " +
                    (horizon > 0 ? std::to_string(horizon) + " steps" : std::string("unknown")) +
                    " (GRADEX_POLICY_HORIZON_STEPS)\n";
  if (plans_made_ == 0) {
    out += "no plan yet: every tensor is dense (or as overridden) until its first exchange; ";
    out += startup_.calibrated ? "codecs calibrated already\n"
                               : "codecs calibrated at the first plan\n";
    return out;
  }
  out += "agreed numbers (rank 0's): " + describe_numbers(agreed_) + "\n";
  out += plan_.describe(&measured_s_);
  out +=
      "(ms per step; predicted from the agreed numbers, meas_ms = this rank's prepare + "
      "transfer + finish, the tensor's share of its unit)\n";
  return out;
}

}  // namespace gradex::sync
