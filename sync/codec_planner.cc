#include "sync/codec_planner.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <sstream>

#include "base/error.h"
#include "base/log.h"
#include "comm/collectives.h"
#include "comm/host_identity.h"
#include "compress/backend/backend.h"
#include "compress/backend/dgc_codec.h"
#include "compress/dgc/schedule.h"
#include "sync/backend_path.h"
#include "sync/backend_tensor.h"
#include "sync/pipeline.h"

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

}  // namespace

std::unique_ptr<CodecPlanner> CodecPlanner::create(const config::Config& config,
                                                   const EngineOptions& options, int world_size) {
  if (config.get_string("GRADEX_POLICY") != "auto") return nullptr;
  PlannerOptions p;
  p.interval = static_cast<uint64_t>(config.get_int("GRADEX_POLICY_INTERVAL"));
  p.probe = config.get_bool("GRADEX_POLICY_PROBE");
  p.choice.ladder = parse_ladder(config.get_string("GRADEX_POLICY_LADDER"));
  p.choice.slack = config.get_float("GRADEX_POLICY_SLACK");
  p.choice.dense_steps = static_cast<uint64_t>(config.get_int("GRADEX_POLICY_DENSE_STEPS"));
  p.choice.min_selected = static_cast<uint64_t>(config.get_int("GRADEX_POLICY_MIN_SELECTED"));
  p.choice.min_per_row = config.get_float("GRADEX_POLICY_MIN_PER_ROW");
  return std::make_unique<CodecPlanner>(config, options, world_size, std::move(p));
}

CodecPlanner::CodecPlanner(const config::Config& config, const EngineOptions& options,
                           int world_size, PlannerOptions planner)
    : config_(config), options_(options), world_size_(world_size), planner_(std::move(planner)) {
  planner_.choice.world_size = world_size;
  planner_.choice.sparse_ring = options.sparse_ring_for(world_size);
  planner_.choice.half_available = options.half_on_wire;
}

std::optional<cost::Rung> CodecPlanner::forced_rung(const std::string& key) const {
  for (const PolicyOverride& o : options_.overrides) {
    if (!pattern_matches(o.pattern, key)) continue;
    if (o.dense || o.sparsity == 0)
      return cost::Rung{options_.half_on_wire ? cost::Codec::kHalf : cost::Codec::kFp32, 0};
    return cost::Rung{cost::Codec::kDgc, o.sparsity};
  }
  return std::nullopt;
}

TensorPolicy CodecPlanner::initial_policy(const std::string& key, uint64_t numel) const {
  if (forced_rung(key)) return choose_policy(options_, key, numel);  // the override's
  TensorPolicy p;
  p.reason = "GRADEX_POLICY=auto: dense until the first plan (step " +
             std::to_string(planner_.interval) + ")";
  return p;
}

TensorPolicy CodecPlanner::policy_of(const cost::Rung& rung) const {
  TensorPolicy p;
  p.reason = "GRADEX_POLICY=auto: " + cost::rung_name(rung);
  if (rung.codec == cost::Codec::kDgc) {
    p.kind = ExchangeKind::kSparse;
    p.sparsity = rung.sparsity;
  } else {
    // fp32 on a 16-bit default wire travels in fp32 buckets of its own.
    p.full_precision = rung.codec == cost::Codec::kFp32 && options_.half_on_wire;
  }
  return p;
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

void CodecPlanner::replan(comm::Communicator& comm, uint64_t epoch) {
  cost::Snapshot local = model_.snapshot();
  {
    // Measured over predicted under the plan in force (this rank's; rank 0's is the one used).
    std::lock_guard<std::mutex> lock(mutex_);
    double measured = 0, predicted = 0;
    for (const cost::TensorChoice& c : plan_.tensors) {
      auto it = measured_s_.find(c.key);
      if (it == measured_s_.end()) continue;
      measured += it->second;
      predicted += c.encode_s + c.comm_s + c.decode_s;
    }
    local.calibration = agreed_.calibration;
    if (plans_made_ > 0 && measured > 0 && predicted > 0)
      local.calibration = std::clamp(agreed_.calibration * measured / predicted, 0.25, 8.0);
  }
  const cost::Snapshot numbers = cost::agree_snapshot(comm, local);
  std::vector<cost::TensorInput> inputs;
  inputs.reserve(numbers.tensors.size());
  for (const cost::TensorTiming& t : numbers.tensors) {
    cost::TensorInput in;
    in.key = t.key;
    in.numel = t.numel;
    in.rows = t.rows;
    in.ready_s = t.ready_s;
    in.forced = forced_rung(t.key);
    if (in.forced) in.forced_reason = "GRADEX_SPARSITY_OVERRIDES";
    inputs.push_back(std::move(in));
  }
  cost::ChoiceOptions o = planner_.choice;
  o.link_class = link_class_;
  cost::Plan plan = cost::choose_codecs(inputs, numbers, o, epoch * planner_.interval);
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
  GX_LOG(kInfo) << "GRADEX_POLICY=auto: plan for step " << epoch * planner_.interval << "\n"
                << plan.describe();
  std::lock_guard<std::mutex> lock(mutex_);
  plan_ = std::move(plan);
  agreed_ = numbers;
  ++plans_made_;
}

void CodecPlanner::measure_codecs() {
  // Measured alone, at start-up, on 2^20 elements on the host backend: gradex's momentum (dense
  // units), the 16-bit cast there and back, and DGC's step (at the ladder's highest sparsity) with
  // the decode of its payload. The units' own stage times refine these (observe_unit).
  namespace be = compress::backend;
  constexpr size_t kN = 1u << 20;
  using Clock = std::chrono::steady_clock;
  auto seconds = [](Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration<double>(b - a).count();
  };
  const be::BackendPtr backend = be::get_backend(be::DeviceType::kCpu);
  const be::StreamPtr stream = backend->create_stream();
  std::vector<float> g(kN), values(kN);
  uint32_t x = 0x12345678u;
  for (float& v : g) {
    x = x * 1664525u + 1013904223u;
    v = static_cast<float>(static_cast<int32_t>(x)) * 4.6566e-10f;
  }
  // gradex's momentum: part of every dense unit's prepare stage (as observe_unit measures them).
  double momentum_s = 0;
  if (options_.momentum > 0) {
    std::vector<float> u(kN, 0.0f);
    values = g;
    const auto m0 = Clock::now();
    backend->apply_momentum(values.data(), u.data(), kN, options_.momentum, options_.nesterov, 1.0f,
                            *stream);
    momentum_s = seconds(m0, Clock::now());
  }
  model_.observe_codec(cost::Codec::kFp32, kN, momentum_s, 0.0);
  std::vector<uint16_t> half(kN);
  const DType half_type = options_.half_on_wire ? options_.half_type : DType::kFloat16;
  const auto t0 = Clock::now();
  backend->to_half(g.data(), half.data(), kN, half_type, 0.5f, *stream);
  const auto t1 = Clock::now();
  backend->from_half(half.data(), values.data(), kN, half_type, 1.0f, false, *stream);
  const auto t2 = Clock::now();
  model_.observe_codec(cost::Codec::kHalf, kN, momentum_s + seconds(t0, t1), seconds(t1, t2));
  const double sparsity =
      planner_.choice.ladder.empty() ? options_.sparsity : planner_.choice.ladder.back();
  compress::DgcOptions dgc = compress::dgc_options_from_config(config_, world_size_);
  dgc.sparsity = sparsity;
  dgc.clip_norm = 0;
  be::DgcCodec codec(*backend, "gradex.probe", kN, dgc,
                     compress::wire_options_from_config(config_));
  std::vector<uint8_t> payload;
  values = g;
  codec.encode_step(values.data(), 1.0f, *stream, payload);  // warms buffers and the threshold
  payload.clear();
  values = g;
  const auto t3 = Clock::now();
  codec.encode_step(values.data(), 1.0f, *stream, payload);
  const auto t4 = Clock::now();
  codec.sum_payloads({{payload.data(), payload.size()}}, 1.0f, values.data(), *stream);
  const auto t5 = Clock::now();
  model_.observe_codec(cost::Codec::kDgc, kN, seconds(t3, t4), seconds(t4, t5));
}

void CodecPlanner::on_reconfigure(int world_size) {
  world_size_ = world_size;
  probed_ = false;
  plan_epoch_ = 0;
  applied_epoch_.clear();
}

void CodecPlanner::before_routes(comm::Communicator& comm, std::vector<pipeline::Job>& jobs,
                                 BackendPath& path, std::mutex& state_mutex) {
  if (!probed_) {
    probed_ = true;
    measure_codecs();
    if (world_size_ > 1) {
      std::vector<std::string> hosts;
      if (planner_.probe) {
        cost::ProbeResult r =
            cost::probe_links(comm, comm::host_identity(), planner_.probe_options);
        for (int c = 0; c < cost::kPeerClasses; ++c)
          if (r.link[static_cast<size_t>(c)].measured)
            model_.set_link(static_cast<cost::PeerClass>(c), r.link[static_cast<size_t>(c)]);
        hosts = std::move(r.hosts);
      } else {
        const std::string me = comm::host_identity();
        for (const comm::Bytes& b : comm::allgatherv(comm, me.data(), me.size()))
          hosts.emplace_back(b.begin(), b.end());
      }
      link_class_ = cost::collective_class(hosts);
    }
  }
  uint64_t epoch = 0;
  for (const pipeline::Job& job : jobs)
    if (job.id.kind == WorkKind::kGradient && !job.tensor->backend->cuda)
      epoch = std::max(epoch, job.step / planner_.interval);
  if (epoch > plan_epoch_) {
    replan(comm, epoch);
    plan_epoch_ = epoch;
  }
  std::lock_guard<std::mutex> lock(state_mutex);
  for (pipeline::Job& job : jobs) {
    if (job.id.kind != WorkKind::kGradient || job.tensor->backend->cuda) continue;
    const uint64_t e = job.step / planner_.interval;
    uint64_t& applied = applied_epoch_[job.id.key];
    if (e == 0 || e <= applied) continue;
    applied = e;
    auto it = choice_.find(job.id.key);
    if (it == choice_.end() || forced_rung(job.id.key)) continue;  // overrides win
    const TensorPolicy to = policy_of(it->second);
    TensorState& t = *job.tensor;
    if (to.kind != t.policy.kind || to.sparsity != t.policy.sparsity ||
        to.full_precision != t.policy.full_precision) {
      GX_LOG(kDebug) << "'" << t.key << "' at step " << job.step << ": " << to.reason;
      path.switch_policy(t, to);
    }
  }
}

void CodecPlanner::observe_unit(const pipeline::Unit& unit, bool half_on_wire) {
  if (unit.jobs.empty()) return;
  const uint64_t elements = unit.elements();
  const pipeline::UnitCounters& c = unit.counters;
  cost::Codec codec = cost::Codec::kFp32;
  cost::Terms terms;
  const double p = world_size_;
  if (unit.route == pipeline::Route::kSparse) {
    codec = cost::Codec::kDgc;
    terms = {planner_.choice.sparse_ring ? p - 1 : 2.0, static_cast<double>(c.received_bytes)};
    uint64_t selected = 0;
    for (const pipeline::Job* j : unit.jobs)
      selected += compress::dgc::target_count(j->tensor->numel, j->tensor->policy.sparsity);
    const size_t framing = 4 + 8 * unit.jobs.size();
    if (unit.message.size() > framing)
      model_.observe_dgc_payload(selected, unit.message.size() - framing);
  } else {
    const bool half =
        unit.route == pipeline::Route::kDense && half_on_wire && !unit.jobs.front()->full_precision;
    codec = half ? cost::Codec::kHalf : cost::Codec::kFp32;
    terms = cost::ring_allreduce_terms(static_cast<double>(elements) * (half ? 2 : 4), world_size_);
  }
  if (unit.route != pipeline::Route::kFirstAverage)
    model_.observe_codec(codec, elements, c.prepare_seconds, c.finish_seconds);
  if (world_size_ > 1 && c.transfer_seconds > 0)
    model_.observe_transfer(link_class_, terms, c.transfer_seconds);
  const double total = c.prepare_seconds + c.transfer_seconds + c.finish_seconds;
  std::lock_guard<std::mutex> lock(mutex_);
  for (const pipeline::Job* j : unit.jobs) {
    if (j->id.kind != WorkKind::kGradient || elements == 0) continue;
    const double share = total * static_cast<double>(j->tensor->numel) / elements;
    auto [it, fresh] = measured_s_.try_emplace(j->id.key, share);
    if (!fresh) it->second += 0.2 * (share - it->second);
  }
}

std::string CodecPlanner::explain() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::string out = "GRADEX_POLICY=auto: re-evaluated every " + std::to_string(planner_.interval) +
                    " steps; " + std::to_string(plans_made_) + " plan(s) made\n";
  if (plans_made_ == 0) {
    out += "no plan yet: every tensor is dense (or as overridden) until step " +
           std::to_string(planner_.interval) + "\n";
    return out;
  }
  const cost::LinkParams& l = agreed_.link[static_cast<size_t>(link_class_)];
  out += std::string("agreed numbers (rank 0's): ") + cost::peer_class_name(link_class_) +
         " link alpha " + fmt("%.1f", l.alpha_s * 1e6) + " us, " +
         fmt("%.3g", 8e-9 / l.beta_s_per_byte) + " Gbit/s" + (l.measured ? "" : " (default)") +
         "; per element: 16-bit cast " + fmt("%.2f", agreed_.codecs.encode_s[1] * 1e9) +
         " ns, dgc encode " + fmt("%.2f", agreed_.codecs.encode_s[2] * 1e9) + " ns, decode " +
         fmt("%.2f", agreed_.codecs.decode_s[2] * 1e9) + " ns; dgc " +
         fmt("%.2f", agreed_.codecs.dgc_bytes_per_selected) + " bytes per value; backward " +
         fmt("%.3f", agreed_.backward_s * 1e3) + " ms, forward " +
         fmt("%.3f", agreed_.forward_s * 1e3) + " ms; calibration " +
         fmt("%.2f", agreed_.calibration) + "\n";
  out += plan_.describe(&measured_s_);
  out +=
      "(ms per step; predicted from the agreed numbers, meas_ms = this rank's prepare + "
      "transfer + finish, the tensor's share of its unit)\n";
  return out;
}

}  // namespace gradex::sync
