#include "sync/codec_planner.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <sstream>
#include <thread>

#include <time.h>

#include "base/cpu_time.h"
#include "base/error.h"
#include "base/log.h"
#include "comm/collectives.h"
#include "comm/host_identity.h"
#include "comm/reduce.h"
#include "compress/backend/adam_codec.h"
#include "compress/backend/backend.h"
#include "compress/backend/dct_adam_codec.h"
#include "compress/backend/dgc_codec.h"
#include "compress/backend/int8_codec.h"
#include "compress/dgc/schedule.h"
#include "sync/backend_path.h"
#include "sync/backend_tensor.h"
#include "sync/pipeline.h"
#include "sync/transport_cpu.h"

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

void CodecPlanner::adam_rungs(const EngineOptions& options, cost::ChoiceOptions& choice) {
  // GRADEX_OPTIMIZER=adam: the engine gives every sparse tensor the Adam codec, so the sparse
  // rung is that codec at its own sparsity (none with GRADEX_ADAM_SPARSITY=0: AdamW kept dense),
  // priced by its own measurements, not DGC at GRADEX_POLICY_LADDER's sparsities.
  choice.sparse_codec = cost::Codec::kAdam;
  choice.ladder.clear();
  if (options.adam_sparsity > 0) choice.ladder.push_back(options.adam_sparsity);
  // The fidelity ramp and the floors apply as to DGC. The horizon rule does not while the codec
  // decays what it has not sent (GRADEX_ADAM_DECAY < 1): an unsent value fades within ~1/(1-b)
  // steps instead of waiting in a residual to be sent later, so the end of training strands no
  // more of it than any other step does. With b = 1 (error feedback without decay) it does.
  if (options.adam_decay < 1.0f) choice.horizon_steps = 0;
}

std::unique_ptr<CodecPlanner> CodecPlanner::create(const config::Config& config,
                                                   const EngineOptions& options, int world_size) {
  if (config.get_string("GRADEX_POLICY") != "auto") return nullptr;
  PlannerOptions p;
  p.interval = static_cast<uint64_t>(config.get_int("GRADEX_POLICY_INTERVAL"));
  p.probe = config.get_bool("GRADEX_POLICY_PROBE");
  p.choice.ladder = parse_ladder(config.get_string("GRADEX_POLICY_LADDER"));
  p.choice.slack = config.get_float("GRADEX_POLICY_SLACK");
  p.choice.dense_steps = static_cast<uint64_t>(config.get_int("GRADEX_POLICY_DENSE_STEPS"));
  p.choice.ramp_steps = static_cast<uint64_t>(config.get_int("GRADEX_POLICY_RAMP_STEPS"));
  p.choice.horizon_steps = static_cast<uint64_t>(config.get_int("GRADEX_POLICY_HORIZON_STEPS"));
  p.choice.min_selected = static_cast<uint64_t>(config.get_int("GRADEX_POLICY_MIN_SELECTED"));
  p.choice.min_per_row = config.get_float("GRADEX_POLICY_MIN_PER_ROW");
  p.choice.int8_available = config.get_bool("GRADEX_POLICY_INT8");
  if (options.adam_codec) adam_rungs(options, p.choice);
  return std::make_unique<CodecPlanner>(config, options, world_size, std::move(p));
}

CodecPlanner::CodecPlanner(const config::Config& config, const EngineOptions& options,
                           int world_size, PlannerOptions planner)
    : config_(config), options_(options), world_size_(world_size), planner_(std::move(planner)) {
  planner_.choice.world_size = world_size;
  planner_.choice.sparse_ring = options.sparse_ring_for(world_size);
  planner_.choice.half_available = options.half_on_wire;
  horizon_steps_.store(planner_.choice.horizon_steps);
}

std::optional<cost::Rung> CodecPlanner::forced_rung(const std::string& key) const {
  for (const PolicyOverride& o : options_.overrides) {
    if (!pattern_matches(o.pattern, key)) continue;
    if (o.int8) return cost::Rung{cost::Codec::kInt8, 0};
    if (o.dense || o.sparsity == 0)
      return cost::Rung{options_.half_on_wire ? cost::Codec::kHalf : cost::Codec::kFp32, 0};
    return cost::Rung{planner_.choice.sparse_codec, o.sparsity};
  }
  return std::nullopt;
}

TensorPolicy CodecPlanner::initial_policy(const std::string& key, uint64_t numel) const {
  if (forced_rung(key)) return choose_policy(options_, key, numel);  // the override's
  TensorPolicy p;
  p.reason = "GRADEX_POLICY=auto: dense until the first plan (at its first exchange)";
  return p;
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

TensorPolicy CodecPlanner::policy_of(const cost::Rung& rung) const {
  TensorPolicy p;
  p.reason = "GRADEX_POLICY=auto: " + cost::rung_name(rung);
  if (cost::is_sparse(rung.codec)) {  // the engine's sparse codec (DGC, or Adam's)
    p.kind = ExchangeKind::kSparse;
    p.sparsity = rung.sparsity;
  } else {
    // fp32 on a 16-bit default wire travels in fp32 buckets of its own.
    p.full_precision = rung.codec == cost::Codec::kFp32 && options_.half_on_wire;
    p.int8 = rung.codec == cost::Codec::kInt8;
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

std::vector<cost::TensorInput> CodecPlanner::inputs_of(
    const cost::Snapshot& numbers, const std::map<std::string, cost::Rung>* rungs) const {
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
  o.link_class = link_class_;
  o.one_lane = numbers.one_lane;
  return o;
}

void CodecPlanner::replan(comm::Communicator& comm, uint64_t epoch) {
  cost::Snapshot local = model_.snapshot();
  local.one_lane = one_lane_;
  local.cpu_share = cpu_share_;
  local.calibration = 1.0;
  {
    // What each codec's units measured under the plan in force, against what these numbers
    // predict for them: corrects start-up numbers that the load moved (Snapshot::codec_factor).
    std::vector<cost::UnitRecord> records;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      records.swap(unit_records_);
    }
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
    if (tails > 0 && measured > 1e-3 && predicted > 1e-3)
      local.calibration = std::clamp(measured / predicted, 0.25, 16.0);
  }
  if (plans_made_ > 0) local.tail_s = model_.tail_s();
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
  GX_LOG(kInfo) << "GRADEX_POLICY=auto: plan for step " << epoch_start(epoch) << "\n"
                << plan.describe();
  std::lock_guard<std::mutex> lock(mutex_);
  plan_ = std::move(plan);
  agreed_ = numbers;
  ++plans_made_;
}

void CodecPlanner::measure_codecs() {
  // Measured alone, at start-up, on ~2^18 elements on the host backend: gradex's momentum, the
  // fp32 bucket's copies, the 16-bit cast there and back, the rings' sums, the 8-bit codec, and
  // DGC's step (at the ladder's highest sparsity) with the decode of its payload. The units'
  // measured times correct them later (observe_unit, Snapshot::codec_factor).
  //
  // Each is this thread's CPU time (CLOCK_THREAD_CPUTIME_ID), on a tensor small enough to stay on
  // this thread (the kernels split work over the pool from 2^18 elements): the cost of the work
  // itself, not the time other programs took the core. Wall time read up to 10x too high on a
  // shared 2-core host. Even CPU time moves with the load (caches and memory bandwidth shared
  // with other programs: DGC's encode read 0.66-1.95 ns per element between runs), and which
  // codec looked cheap then depended on which measurement the load fell on. So every measurement
  // runs once per round, kRounds interleaved rounds, and each codec's number is the median of its
  // rounds: the codecs are compared over the same stretch of time, and a round that a burst of
  // load hit moves no median.
  namespace be = compress::backend;
  // Just under the codec's parallel threshold (2^18): one thread, fixed costs amortised.
  constexpr size_t kN = (1u << 18) - 1024;
  constexpr int kRounds = 7;
  const be::BackendPtr backend = be::get_backend(be::DeviceType::kCpu);
  const be::StreamPtr stream = backend->create_stream();
  std::vector<float> g(kN), values(kN), u(kN, 0.0f), bucket(kN);
  uint32_t x = 0x12345678u;
  for (float& v : g) {
    x = x * 1664525u + 1013904223u;
    v = static_cast<float>(static_cast<int32_t>(x)) * 4.6566e-10f;
  }
  const DType half_type = options_.half_on_wire ? options_.half_type : DType::kFloat16;
  const float divisor = static_cast<float>(std::max(world_size_, 1));
  std::vector<uint16_t> half(kN), half_acc(kN);
  backend->to_half(g.data(), half_acc.data(), kN, half_type, 0.25f, *stream);
  namespace q8 = be::int8;
  std::vector<uint8_t> int8_bytes(q8::encoded_size(kN));
  std::vector<float> int8_residual(kN, 0.0f);
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

  enum Measure {
    kMomentum,
    kGather,
    kDivide,
    kToHalf,
    kFromHalf,
    kSumFp32,
    kSumHalf,
    kInt8Encode,
    kInt8Sum,
    kInt8Decode,
    kDgcEncode,
    kDgcDecode,
    kMeasures
  };
  auto run = [&](int m) {
    switch (m) {
      case kMomentum:  // gradex's momentum: part of every dense unit's prepare stage
        if (options_.momentum > 0)
          backend->apply_momentum(values.data(), u.data(), kN, options_.momentum, options_.nesterov,
                                  1.0f, *stream);
        break;
      case kGather:  // an fp32 bucket: gathered into the ring's buffer (prepare) ...
        std::copy(g.begin(), g.end(), bucket.begin());
        break;
      case kDivide:  // ... and divided back into the tensor (sync/dense_exchange.cc)
        for (size_t j = 0; j < kN; ++j)
          values[j] = bucket[j] / divisor;
        break;
      case kToHalf:
        backend->to_half(g.data(), half.data(), kN, half_type, 0.5f, *stream);
        break;
      case kFromHalf:
        backend->from_half(half.data(), values.data(), kN, half_type, 1.0f, false, *stream);
        break;
      case kSumFp32:  // the rings' reduce-scatter sums on each wire type (comm/reduce.h)
        comm::sum_into(bucket.data(), values.data(), kN, DType::kFloat32);
        break;
      case kSumHalf:
        comm::sum_into(half_acc.data(), half.data(), kN, half_type);
        break;
      case kInt8Encode:
        q8::encode(g.data(), int8_residual.data(), kN, int8_bytes.data());
        break;
      case kInt8Sum:
        q8::decode_add(int8_bytes.data(), kN, values.data());
        break;
      case kInt8Decode:
        q8::decode(int8_bytes.data(), kN, values.data());
        break;
      case kDgcEncode:
        payload.clear();
        values = g;
        codec.encode_step(values.data(), 1.0f, *stream, payload);
        break;
      case kDgcDecode:
        codec.sum_payloads({{payload.data(), payload.size()}}, 1.0f, values.data(), *stream);
        break;
    }
  };
  std::array<std::vector<double>, kMeasures> samples;
  for (int round = 0; round < kRounds; ++round) {
    for (int m = 0; m < kMeasures; ++m) {
      if (m == kMomentum) values = g;
      const double a = thread_cpu_seconds();
      run(m);
      samples[static_cast<size_t>(m)].push_back(thread_cpu_seconds() - a);
    }
  }
  auto median = [&](int m) {
    std::vector<double>& v = samples[static_cast<size_t>(m)];
    std::nth_element(v.begin(), v.begin() + static_cast<long>(v.size() / 2), v.end());
    return v[v.size() / 2];
  };
  const double momentum_s = options_.momentum > 0 ? median(kMomentum) : 0.0;
  model_.observe_codec(cost::Codec::kFp32, kN, momentum_s + median(kGather), median(kDivide));
  model_.observe_codec(cost::Codec::kHalf, kN, momentum_s + median(kToHalf), median(kFromHalf));
  model_.observe_reduce(cost::Codec::kFp32, kN, median(kSumFp32));
  model_.observe_reduce(cost::Codec::kHalf, kN, median(kSumHalf));
  // The 8-bit route: encode, the owner's sum of P pieces (N values in all) and re-encode of 1/P,
  // then the decode of every segment.
  const double owner = 1.0 / static_cast<double>(std::max(world_size_, 1));
  model_.observe_codec(cost::Codec::kInt8, kN,
                       momentum_s + median(kInt8Encode) * (1.0 + owner) + median(kInt8Sum),
                       median(kInt8Decode));
  model_.observe_codec(cost::Codec::kDgc, kN, median(kDgcEncode), median(kDgcDecode),
                       compress::dgc::target_count(kN, sparsity));
}

void CodecPlanner::measure_adam_codec() {
  // The Adam codec as the engine builds it (BackendPath::make_codec: the chunked DCT unless
  // GRADEX_ADAM_TRANSFORM=none), at its sparsity, measured as measure_codecs measures DGC: this
  // thread's CPU time, the least of kRepeats runs. On 255 x 256 elements (blocks of 51 x 64 at
  // the default chunk, as a weight's): under 2^16, where the DCT would spread its blocks over
  // the pool and this thread's clock would miss the pool's share. The decode sums the world's P
  // payloads and, with the DCT, transforms the tensor back: priced per element of the tensor.
  if (planner_.choice.ladder.empty()) return;  // GRADEX_ADAM_SPARSITY=0: no sparse rung
  namespace be = compress::backend;
  constexpr uint64_t kRows = 255;
  constexpr size_t kN = kRows * 256;
  const be::BackendPtr backend = be::get_backend(be::DeviceType::kCpu);
  const be::StreamPtr stream = backend->create_stream();
  std::vector<float> g(kN), values(kN);
  uint32_t x = 0x9e3779b9u;
  for (float& v : g) {
    x = x * 1664525u + 1013904223u;
    v = static_cast<float>(static_cast<int32_t>(x)) * 4.6566e-10f;
  }
  const double sparsity = planner_.choice.ladder.back();
  compress::DgcOptions dgc = compress::dgc_options_from_config(config_, world_size_);
  dgc.sparsity = sparsity;
  dgc.clip_norm = 0;
  dgc.momentum = 0;  // the optimizer keeps its moments
  dgc.residual_dct_chunk = options_.adam_dct_chunk;
  const compress::WireOptions wire = compress::wire_options_from_config(config_);
  std::unique_ptr<be::DgcCodec> codec;
  if (options_.adam_dct_chunk > 0)
    codec = std::make_unique<be::DctAdamCodec>(*backend, "gradex.probe.adam", kN, kRows, dgc, wire,
                                               options_.adam_decay);
  else
    codec = std::make_unique<be::AdamCodec>(*backend, "gradex.probe.adam", kN, dgc, wire,
                                            options_.adam_decay);
  constexpr int kRepeats = 5;
  auto least = [&](auto&& body) {
    double best = 0;
    for (int r = 0; r < kRepeats; ++r) {
      const double a = thread_cpu_seconds();
      body();
      const double s = thread_cpu_seconds() - a;
      if (r == 0 || s < best) best = s;
    }
    return best;
  };
  std::vector<uint8_t> payload;
  values = g;
  codec->encode_step(values.data(), 1.0f, *stream, payload);  // warms buffers and the threshold
  const double encode_s = least([&] {
    payload.clear();
    values = g;
    codec->encode_step(values.data(), 1.0f, *stream, payload);
  });
  const std::vector<compress::wire::PayloadSpan> received(
      static_cast<size_t>(std::max(world_size_, 1)), {payload.data(), payload.size()});
  const float scale = 1.0f / static_cast<float>(std::max(world_size_, 1));
  const double decode_s = least([&] {
    std::fill(values.begin(), values.end(), 0.0f);
    codec->sum_payloads(received, scale, values.data(), *stream);
  });
  model_.observe_codec(cost::Codec::kAdam, kN, encode_s, decode_s);
  model_.observe_adam_payload(compress::dgc::target_count(kN, sparsity), payload.size());
  GX_LOG(kDebug) << "GRADEX_POLICY=auto: adam codec " << encode_s / kN * 1e9 << " ns encode, "
                 << decode_s / kN * 1e9 << " ns decode per element, "
                 << static_cast<double>(payload.size()) /
                        static_cast<double>(compress::dgc::target_count(kN, sparsity))
                 << " bytes per value";
}

void CodecPlanner::measure_transport_cpu(const cost::ProbeResult* probe) {
  // The transport's CPU per byte sent and received: rank 0's thread over the probe's largest
  // round trips through this communicator (its copies, protocol and progress work: what a ring
  // pays per byte besides the wire), else a TCP loopback connection driven by this thread alone
  // (the kernel's share only: reads low where the transport copies again in user space).
  if (probe != nullptr && probe->transport_bytes > 0) {
    model_.observe_transport(probe->transport_bytes, probe->transport_cpu_s);
    GX_LOG(kDebug) << "GRADEX_POLICY=auto: transport CPU "
                   << probe->transport_cpu_s / static_cast<double>(probe->transport_bytes) * 1e9
                   << " ns per byte (link probe)";
    return;
  }
  const cost::TransportSample t = cost::measure_transport();
  model_.observe_transport(t.bytes, t.seconds);
  GX_LOG(kDebug) << "GRADEX_POLICY=auto: transport CPU over " << t.via << ": "
                 << (t.bytes ? t.seconds / static_cast<double>(t.bytes) * 1e9 : 0.0)
                 << " ns per byte ("
                 << (t.bytes ? t.wall_seconds / static_cast<double>(t.bytes) * 1e9 : 0.0)
                 << " ns wall)";
}

void CodecPlanner::on_reconfigure(int world_size) {
  world_size_ = world_size;
  planner_.choice.world_size = world_size;
  probed_ = false;
  plan_epoch_ = 0;
  applied_epoch_.clear();
  std::lock_guard<std::mutex> lock(mutex_);
  unit_records_.clear();  // measured with another membership
}

void CodecPlanner::set_horizon(uint64_t steps) {
  pending_horizon_.store(static_cast<int64_t>(std::min<uint64_t>(steps, uint64_t{1} << 62)));
}

uint64_t CodecPlanner::horizon() const {
  return horizon_steps_.load();
}

void CodecPlanner::before_routes(comm::Communicator& comm, std::vector<pipeline::Job>& jobs,
                                 BackendPath& path, std::mutex& state_mutex) {
  if (!probed_) {
    probed_ = true;
    measure_codecs();
    if (planner_.choice.sparse_codec == cost::Codec::kAdam) measure_adam_codec();
    if (world_size_ > 1) {
      std::vector<std::string> hosts;
      if (planner_.probe) {
        cost::ProbeResult r = cost::probe_links(comm, comm::host_identity(comm.options().host_id),
                                                planner_.probe_options);
        for (int c = 0; c < cost::kPeerClasses; ++c)
          if (r.link[static_cast<size_t>(c)].measured)
            model_.set_link(static_cast<cost::PeerClass>(c), r.link[static_cast<size_t>(c)]);
        measure_transport_cpu(&r);
        hosts = std::move(r.hosts);
      } else {
        measure_transport_cpu(nullptr);
        const std::string me = comm::host_identity(comm.options().host_id);
        for (const comm::Bytes& b : comm::allgatherv(comm, me.data(), me.size()))
          hosts.emplace_back(b.begin(), b.end());
      }
      link_class_ = cost::collective_class(hosts);
      // Ranks on this machine: host identities without their network namespace (emulated hosts
      // in namespaces, and containers, share the machine's cores).
      auto machine = [](const std::string& id) { return id.substr(0, id.rfind('|')); };
      const std::string me = machine(comm::host_identity());
      const auto here = static_cast<unsigned>(std::count_if(
          hosts.begin(), hosts.end(), [&](const std::string& h) { return machine(h) == me; }));
      const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
      one_lane_ = here >= cores;
      cpu_share_ = std::max(1.0, static_cast<double>(here) / cores);
    }
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
    const int64_t pending = pending_horizon_.exchange(-1);
    if (pending >= 0) {
      planner_.choice.horizon_steps = pending == 0 ? 0 : now + static_cast<uint64_t>(pending);
      horizon_steps_.store(planner_.choice.horizon_steps);
      plan_epoch_ = 0;
      planned_ = false;
      applied_epoch_.clear();
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
  if (gradients && (!planned_ || epoch > plan_epoch_)) {
    replan(comm, epoch);
    plan_epoch_ = epoch;
    planned_ = true;
  }
  std::lock_guard<std::mutex> lock(state_mutex);
  for (pipeline::Job& job : jobs) {
    if (job.id.kind != WorkKind::kGradient || job.tensor->backend->cuda) continue;
    const uint64_t e = epoch_of(job.step);
    // A tensor takes the newest plan at its first exchange and then when it enters a new epoch.
    auto [applied, first] = applied_epoch_.try_emplace(job.id.key, e);
    if (!first && e <= applied->second) continue;
    applied->second = e;
    auto it = choice_.find(job.id.key);
    if (it == choice_.end() || forced_rung(job.id.key)) continue;  // overrides win
    const TensorPolicy to = policy_of(it->second);
    TensorState& t = *job.tensor;
    if (to.kind != t.policy.kind || to.sparsity != t.policy.sparsity ||
        to.full_precision != t.policy.full_precision || to.int8 != t.policy.int8) {
      GX_LOG(kDebug) << "'" << t.key << "' at step " << job.step << ": " << to.reason;
      path.switch_policy(t, to);
      // Leaving the 8-bit route for DGC: its residuals join DGC's (a dense route takes them
      // along in its transfer, Engine::transfer).
      if (to.kind == ExchangeKind::kSparse) path.int8_to_dgc_residual(t, world_size_);
    }
  }
}

void CodecPlanner::observe_unit(const pipeline::Unit& unit, bool half_on_wire) {
  if (unit.jobs.empty()) return;
  const uint64_t elements = unit.elements();
  const pipeline::UnitCounters& c = unit.counters;
  cost::Codec codec = cost::Codec::kFp32;
  uint64_t decoded = 0;  // DGC: the values its finish stage summed
  cost::Terms terms;
  const double p = world_size_;
  if (unit.route == pipeline::Route::kSparse) {
    const bool adam = planner_.choice.sparse_codec == cost::Codec::kAdam;
    codec = planner_.choice.sparse_codec;
    terms = {planner_.choice.sparse_ring ? p - 1 : 2.0, static_cast<double>(c.received_bytes)};
    uint64_t selected = 0;
    for (const pipeline::Job* j : unit.jobs)
      selected += compress::dgc::target_count(j->tensor->numel, j->tensor->policy.sparsity);
    // DGC's decode is per received value; the Adam codec's per element (cost::CodecCosts).
    decoded = adam ? 0 : selected * static_cast<uint64_t>(world_size_);
    const size_t framing = 4 + 8 * unit.jobs.size();
    if (unit.message.size() > framing) {
      if (adam)
        model_.observe_adam_payload(selected, unit.message.size() - framing);
      else
        model_.observe_dgc_payload(selected, unit.message.size() - framing);
    }
  } else if (unit.jobs.front()->int8) {
    codec = cost::Codec::kInt8;
    terms = cost::int8_allreduce_terms(static_cast<double>(elements), world_size_);
  } else {
    const bool half =
        unit.route == pipeline::Route::kDense && half_on_wire && !unit.jobs.front()->full_precision;
    codec = half ? cost::Codec::kHalf : cost::Codec::kFp32;
    terms = cost::ring_allreduce_terms(static_cast<double>(elements) * (half ? 2 : 4), world_size_);
  }
  if (unit.route != pipeline::Route::kFirstAverage)
    model_.observe_codec(codec, elements, c.prepare_seconds, c.finish_seconds, decoded);
  if (world_size_ > 1 && c.transfer_seconds > 0)
    model_.observe_transfer(link_class_, terms, c.transfer_seconds);
  const double total = c.prepare_seconds + c.transfer_seconds + c.finish_seconds;
  std::lock_guard<std::mutex> lock(mutex_);
  if (world_size_ > 1 && unit.route != pipeline::Route::kFirstAverage &&
      elements >= cost::CostModel::kMinCodecSample && unit_records_.size() < kMaxUnitRecords) {
    cost::UnitRecord record;
    record.codec = codec;
    record.measured_s = total;
    for (const pipeline::Job* j : unit.jobs)
      record.tensors.emplace_back(j->tensor->numel, j->tensor->policy.sparsity);
    unit_records_.push_back(std::move(record));
  }
  for (const pipeline::Job* j : unit.jobs) {
    if (j->id.kind != WorkKind::kGradient || elements == 0) continue;
    const double share = total * static_cast<double>(j->tensor->numel) / elements;
    auto [it, fresh] = measured_s_.try_emplace(j->id.key, share);
    if (!fresh) it->second += 0.2 * (share - it->second);
  }
}

std::string CodecPlanner::explain() const {
  std::lock_guard<std::mutex> lock(mutex_);
  const uint64_t horizon = horizon_steps_.load();
  std::string out = "GRADEX_POLICY=auto: re-evaluated every " + std::to_string(planner_.interval) +
                    " steps; " + std::to_string(plans_made_) + " plan(s) made; training horizon " +
                    (horizon > 0 ? std::to_string(horizon) + " steps" : std::string("unknown")) +
                    " (GRADEX_POLICY_HORIZON_STEPS)\n";
  if (plans_made_ == 0) {
    out += "no plan yet: every tensor is dense (or as overridden) until its first exchange\n";
    return out;
  }
  const cost::LinkParams& l = agreed_.link[static_cast<size_t>(link_class_)];
  out += std::string("agreed numbers (rank 0's): ") + cost::peer_class_name(link_class_) +
         " link alpha " + fmt("%.1f", l.alpha_s * 1e6) + " us, " +
         fmt("%.3g", 8e-9 / l.beta_s_per_byte) + " Gbit/s" + (l.measured ? "" : " (default)") +
         "; per element: 16-bit cast " + fmt("%.2f", agreed_.codecs.encode_s[1] * 1e9) +
         " ns, dgc encode " + fmt("%.2f", agreed_.codecs.encode_s[2] * 1e9) + " ns, dgc decode " +
         fmt("%.2f", agreed_.codecs.decode_s[2] * 1e9) + " ns per received value; dgc " +
         fmt("%.2f", agreed_.codecs.dgc_bytes_per_selected) + " bytes per value; ring sum " +
         fmt("%.2f", agreed_.codecs.reduce_s[0] * 1e9) + " ns (fp32), " +
         fmt("%.2f", agreed_.codecs.reduce_s[1] * 1e9) + " ns (16-bit) per element; transport " +
         fmt("%.2f", agreed_.codecs.transport_s_per_byte * 1e9) + " ns per byte; " +
         (planner_.choice.sparse_codec == cost::Codec::kAdam
              ? "adam encode " + fmt("%.2f", agreed_.codecs.encode_s[4] * 1e9) + " ns, decode " +
                    fmt("%.2f", agreed_.codecs.decode_s[4] * 1e9) + " ns per element, " +
                    fmt("%.2f", agreed_.codecs.adam_bytes_per_selected) + " bytes per value; "
              : std::string()) +
         "cpu share " + fmt("%.2f", agreed_.cpu_share) + "; backward " +
         fmt("%.3f", agreed_.backward_s * 1e3) + " ms, forward " +
         fmt("%.3f", agreed_.forward_s * 1e3) + " ms; calibration " +
         fmt("%.2f", agreed_.calibration) + "; measured over predicted per codec: fp32 " +
         fmt("%.2f", agreed_.codec_factor[0]) + ", 16-bit " + fmt("%.2f", agreed_.codec_factor[1]) +
         ", dgc " + fmt("%.2f", agreed_.codec_factor[2]) + ", 8-bit " +
         fmt("%.2f", agreed_.codec_factor[3]) + ", adam " + fmt("%.2f", agreed_.codec_factor[4]) +
         "\n";
  out += plan_.describe(&measured_s_);
  out +=
      "(ms per step; predicted from the agreed numbers, meas_ms = this rank's prepare + "
      "transfer + finish, the tensor's share of its unit)\n";
  return out;
}

}  // namespace gradex::sync
