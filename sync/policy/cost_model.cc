#include "sync/policy/cost_model.h"

#include <algorithm>
#include <cmath>

#include "base/error.h"
#include "compress/backend/block_codec.h"
#include "sync/data/byte_io.h"
#include "sync/policy/link_model.h"

namespace gradex::sync::cost {
namespace {

constexpr uint32_t kSnapshotMagic = 0x47584353;  // "GXCS"
// 3: the dense rings' CPU; 4: the 8-bit codec's costs; 5: the measured per-codec factors; 6: the
// Adam codec's costs and bytes.
constexpr uint32_t kSnapshotVersion = 6;
// The smallest beta a fit may return (a 10 Tbit/s link): keeps predictions positive.
constexpr double kMinBeta = 1e-13;

}  // namespace

const char* peer_class_name(PeerClass c) {
  return c == PeerClass::kSameHost ? "same-host" : "other-host";
}

// Each shape below is the link model's (sync/policy/link_model.h: collective_terms), named for the
// codec choice's callers.
Terms int8_allreduce_terms(double elements, int world_size, int bits, bool one_hop) {
  const double encoded = elements * compress::backend::block_codec(bits).bytes_per_element();
  if (one_hop)
    return collective_terms(Collective::kAllreduce, Algorithm::kOneHop, encoded, world_size);
  // The direct reduce-scatter of the encodings, then the owners' re-encoded segments gathered
  // (their sizes known): two rounds even between two ranks (each owner re-encodes its sum).
  const Terms scatter =
      collective_terms(Collective::kReduceScatter, Algorithm::kDirect, encoded, world_size);
  const Terms gather = collective_terms(Collective::kAllgather, Algorithm::kDirectUnsized,
                                        encoded / std::max(1, world_size), world_size);
  return {scatter.latency + gather.latency, scatter.bytes + gather.bytes};
}

Terms ring_allreduce_terms(double bytes, int world_size) {
  return collective_terms(Collective::kAllreduce, Algorithm::kRing, bytes, world_size);
}

Terms dense_allreduce_terms(double bytes, int world_size, uint64_t direct_max_bytes) {
  const bool direct = bytes <= static_cast<double>(direct_max_bytes);
  return collective_terms(Collective::kAllreduce, direct ? Algorithm::kDirect : Algorithm::kRing,
                          bytes, world_size);
}

Terms allgatherv_terms(double payload_bytes, int world_size, bool ring, bool unsized) {
  const Algorithm a = ring      ? Algorithm::kRing
                      : unsized ? Algorithm::kDirectUnsized
                                : Algorithm::kDirect;
  return collective_terms(Collective::kAllgather, a, payload_bytes, world_size);
}

void LinkFit::add(double a, double b, double t) {
  if (!(t >= 0) || !std::isfinite(t) || !(a >= 0) || !(b >= 0)) return;
  saa_ = saa_ * forget_ + a * a;
  sab_ = sab_ * forget_ + a * b;
  sbb_ = sbb_ * forget_ + b * b;
  sat_ = sat_ * forget_ + a * t;
  sbt_ = sbt_ * forget_ + b * t;
  ++samples_;
}

LinkParams LinkFit::params(const LinkParams& prior) const {
  if (samples_ == 0) return prior;
  LinkParams p = prior;
  p.measured = true;
  const double det = saa_ * sbb_ - sab_ * sab_;
  // Relative conditioning: samples of one shape (a/b constant) make det vanish against its terms.
  const bool separable = det > 1e-9 * saa_ * sbb_ && saa_ > 0 && sbb_ > 0;
  if (separable) {
    const double alpha = (sat_ * sbb_ - sab_ * sbt_) / det;
    const double beta = (saa_ * sbt_ - sab_ * sat_) / det;
    if (alpha >= 0 && beta > 0) {
      p.alpha_s = alpha;
      p.beta_s_per_byte = std::max(beta, kMinBeta);
      return p;
    }
    if (alpha < 0) {
      p.alpha_s = 0;
      p.beta_s_per_byte = std::max(sbt_ / sbb_, kMinBeta);
      return p;
    }
    // beta <= 0: latency-bound samples whose jitter outweighs the bytes' time (a far, fast link
    // probed with small messages). The bytes' time is unmeasured, so beta is the prior's; the
    // latency was measured and is refitted with that beta (the prior's LAN latency would price
    // every message of a WAN step at a LAN's cost).
    p.alpha_s = std::max((sat_ - prior.beta_s_per_byte * sab_) / saa_, 0.0);
    return p;
  }
  if (sbb_ > 0) {
    // beta given alpha = prior's: minimize sum (t - a*alpha - b*beta)^2 over beta.
    p.beta_s_per_byte = std::max((sbt_ - prior.alpha_s * sab_) / sbb_, kMinBeta);
  } else if (saa_ > 0) {
    p.alpha_s = std::max(sat_ / saa_, 0.0);  // latency-only samples
  }
  return p;
}

std::vector<uint8_t> Snapshot::encode() const {
  ByteWriter w;
  w.put<uint32_t>(kSnapshotMagic);
  w.put<uint32_t>(kSnapshotVersion);
  for (const LinkParams& l : link) {
    w.put<double>(l.alpha_s);
    w.put<double>(l.beta_s_per_byte);
    w.put<uint8_t>(l.measured ? 1 : 0);
  }
  for (int c = 0; c < kCodecs; ++c) {
    w.put<double>(codecs.encode_s[c]);
    w.put<double>(codecs.decode_s[c]);
  }
  w.put<double>(codecs.dgc_bytes_per_selected);
  w.put<double>(codecs.adam_bytes_per_selected);
  for (int c = 0; c < kCodecs; ++c)
    w.put<double>(codecs.reduce_s[c]);
  w.put<double>(codecs.transport_s_per_byte);
  w.put<double>(cpu_share);
  w.put<double>(backward_s);
  w.put<double>(forward_s);
  w.put<uint64_t>(steps_seen);
  w.put<double>(calibration);
  w.put<uint8_t>(one_lane ? 1 : 0);
  w.put<double>(tail_s);
  for (int c = 0; c < kCodecs; ++c)
    w.put<double>(codec_factor[c]);
  w.put<uint32_t>(static_cast<uint32_t>(tensors.size()));
  for (const TensorTiming& t : tensors) {
    w.put_string(t.key);
    w.put<uint64_t>(t.numel);
    w.put<uint64_t>(t.rows);
    w.put<double>(t.ready_s);
  }
  return std::move(w.bytes());
}

Snapshot Snapshot::decode(const uint8_t* data, size_t size) {
  ByteReader r(data, size, "cost model snapshot");
  if (r.get<uint32_t>() != kSnapshotMagic) throw CorruptPayload("cost model snapshot: bad magic");
  const uint32_t version = r.get<uint32_t>();
  if (version != kSnapshotVersion)
    throw CorruptPayload("cost model snapshot: version " + std::to_string(version) +
                         " (this gradex reads " + std::to_string(kSnapshotVersion) + ")");
  Snapshot s;
  for (LinkParams& l : s.link) {
    l.alpha_s = r.get<double>();
    l.beta_s_per_byte = r.get<double>();
    l.measured = r.get<uint8_t>() != 0;
  }
  for (int c = 0; c < kCodecs; ++c) {
    s.codecs.encode_s[c] = r.get<double>();
    s.codecs.decode_s[c] = r.get<double>();
  }
  s.codecs.dgc_bytes_per_selected = r.get<double>();
  s.codecs.adam_bytes_per_selected = r.get<double>();
  for (int c = 0; c < kCodecs; ++c)
    s.codecs.reduce_s[c] = r.get<double>();
  s.codecs.transport_s_per_byte = r.get<double>();
  s.cpu_share = r.get<double>();
  s.backward_s = r.get<double>();
  s.forward_s = r.get<double>();
  s.steps_seen = r.get<uint64_t>();
  s.calibration = r.get<double>();
  s.one_lane = r.get<uint8_t>() != 0;
  s.tail_s = r.get<double>();
  for (int c = 0; c < kCodecs; ++c)
    s.codec_factor[c] = r.get<double>();
  const uint32_t n = r.get<uint32_t>();
  for (uint32_t i = 0; i < n; ++i) {
    TensorTiming t;
    t.key = r.get_string();
    t.numel = r.get<uint64_t>();
    t.rows = r.get<uint64_t>();
    t.ready_s = r.get<double>();
    s.tensors.push_back(std::move(t));
  }
  r.expect_end();
  return s;
}

CostModel::CostModel(CostModelOptions options)
    : options_(options), fit_{LinkFit(options.link_forget), LinkFit(options.link_forget)} {}

double CostModel::average(double old_value, double new_value, bool first) const {
  return first ? new_value : old_value + options_.average_weight * (new_value - old_value);
}

void CostModel::set_link(PeerClass c, const LinkParams& params) {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto i = static_cast<size_t>(c);
  prior_[i] = params;
  fit_[i] = LinkFit(options_.link_forget);
}

void CostModel::observe_transfer(PeerClass c, const Terms& terms, double seconds, double cpu_s) {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto k = static_cast<size_t>(c);
  if (cpu_s > 0 && terms.bytes * fit_[k].params(prior_[k]).beta_s_per_byte < cpu_s) return;
  fit_[k].add(terms.latency, terms.bytes, seconds);
}

CodecCosts CostModel::codecs() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return codecs_;
}

void CostModel::observe_codec(Codec codec, uint64_t elements, double encode_s, double decode_s,
                              uint64_t decoded) {
  if (elements == 0) return;
  if (decoded == 0) decoded = elements;
  std::lock_guard<std::mutex> lock(mutex_);
  const auto c = static_cast<size_t>(codec);
  // The least seconds per element over the samples large enough to amortise a unit's fixed cost
  // (the start-up measurement is one): a stage's wall time also holds waiting for the worker pool
  // and for cores that other units and other ranks use, which is contention, not the codec's cost;
  // the link's fit and the step-tail calibration (Snapshot::calibration) see that contention.
  const auto n = static_cast<double>(elements);
  const auto d = static_cast<double>(decoded);
  if (codec_seen_[c] && elements < kMinCodecSample) return;
  if (!codec_seen_[c] || encode_s / n < codecs_.encode_s[c]) codecs_.encode_s[c] = encode_s / n;
  if (!codec_seen_[c] || decode_s / d < codecs_.decode_s[c]) codecs_.decode_s[c] = decode_s / d;
  codec_seen_[c] = true;
}

void CostModel::observe_dgc_payload(uint64_t selected, uint64_t bytes) {
  if (selected == 0) return;
  std::lock_guard<std::mutex> lock(mutex_);
  const double per = static_cast<double>(bytes) / static_cast<double>(selected);
  codecs_.dgc_bytes_per_selected = average(codecs_.dgc_bytes_per_selected, per, !payload_seen_);
  payload_seen_ = true;
}

void CostModel::observe_adam_payload(uint64_t selected, uint64_t bytes) {
  if (selected == 0) return;
  std::lock_guard<std::mutex> lock(mutex_);
  const double per = static_cast<double>(bytes) / static_cast<double>(selected);
  codecs_.adam_bytes_per_selected =
      average(codecs_.adam_bytes_per_selected, per, !adam_payload_seen_);
  adam_payload_seen_ = true;
}

void CostModel::observe_reduce(Codec codec, uint64_t elements, double seconds) {
  if (elements == 0 || !(seconds >= 0)) return;
  std::lock_guard<std::mutex> lock(mutex_);
  const auto c = static_cast<size_t>(codec);
  const double per = seconds / static_cast<double>(elements);
  if (!reduce_seen_[c] || per < codecs_.reduce_s[c]) codecs_.reduce_s[c] = per;
  reduce_seen_[c] = true;
}

void CostModel::observe_transport(uint64_t bytes, double seconds) {
  if (bytes == 0 || !(seconds >= 0)) return;
  std::lock_guard<std::mutex> lock(mutex_);
  const double per = seconds / static_cast<double>(bytes);
  if (!transport_seen_ || per < codecs_.transport_s_per_byte) codecs_.transport_s_per_byte = per;
  transport_seen_ = true;
}

void CostModel::on_register(const std::string& key, uint64_t numel, uint64_t rows) {
  std::lock_guard<std::mutex> lock(mutex_);
  TensorSeen& t = tensors_[key];
  t.numel = numel;
  t.rows = rows;
}

void CostModel::on_submit(const std::string& key, double t) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (step_.in_step && step_.submitted.count(key)) {
    // Submitted again before an end of step: a caller that never ends steps; a new step begins.
    step_.backward_s = average(step_.backward_s, step_.last - step_.first, step_.count == 0);
    ++step_.count;
    step_.in_step = false;
    step_.last = 0;
  }
  if (!step_.in_step) {
    step_.submitted.clear();
    step_.in_step = true;
    step_.first = t;
    if (step_.last_end >= 0)
      step_.forward_s = average(step_.forward_s, t - step_.last_end, step_.count <= 1);
  }
  step_.last = std::max(step_.last, t);
  step_.submitted.insert(key);
  auto it = tensors_.find(key);
  if (it == tensors_.end()) return;
  it->second.ready_s = average(it->second.ready_s, t - step_.first, !it->second.seen);
  it->second.seen = true;
}

void CostModel::on_end_step(double t) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!step_.in_step) return;  // a step without submissions (LocalSGD's local phase) says nothing
  step_.backward_s = average(step_.backward_s, step_.last - step_.first, step_.count == 0);
  if (!step_.skip_tail) {
    step_.tail_s = average(step_.tail_s, std::max(t - step_.last, 0.0), step_.tails == 0);
    ++step_.tails;
  }
  step_.skip_tail = false;
  ++step_.count;
  step_.in_step = false;
  step_.last = 0;
  step_.last_end = t;
}

void CostModel::restart_tail() {
  std::lock_guard<std::mutex> lock(mutex_);
  step_.tail_s = 0;
  step_.tails = 0;
  step_.skip_tail = step_.in_step;
}

double CostModel::tail_s(uint64_t* steps) const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (steps) *steps = step_.tails;
  return step_.tail_s;
}

Snapshot CostModel::snapshot() const {
  std::lock_guard<std::mutex> lock(mutex_);
  Snapshot s;
  for (size_t c = 0; c < s.link.size(); ++c)
    s.link[c] = fit_[c].params(prior_[c]);
  s.codecs = codecs_;
  s.backward_s = step_.backward_s;
  s.forward_s = step_.forward_s;
  s.steps_seen = step_.count;
  for (const auto& [key, t] : tensors_)
    if (t.seen) s.tensors.push_back({key, t.numel, t.rows, t.ready_s});
  return s;
}

}  // namespace gradex::sync::cost
