// Compiled with -ffp-contract=off: the outer step must round identically on every rank and in the
// reference computations of the tests.
#include "outer/fragment_exchange.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "base/error.h"
#include "outer/codecs.h"

namespace gradex::outer {
namespace {

uint64_t mix_seed(uint64_t seed, int rank, int64_t fragment, int role) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(rank) * 0xBF58476D1CE4E5B9ull +
               static_cast<uint64_t>(fragment) * 0x94D049BB133111EBull +
               static_cast<uint64_t>(role);
  return x ^ (x >> 29);
}

void put_floats(sync::ByteWriter& w, const std::vector<float>& v) {
  w.put<uint64_t>(v.size());
  if (!v.empty()) w.put_bytes(v.data(), 4 * v.size());
}

void get_floats(sync::ByteReader& r, std::vector<float>& v, const char* what) {
  const uint64_t n = r.get<uint64_t>();
  if (n != v.size())
    throw StateError(std::string("DiLoCo state: ") + what + " has " + std::to_string(n) +
                     " elements, this job has " + std::to_string(v.size()));
  if (n) std::memcpy(v.data(), r.get_bytes(4 * n), 4 * n);
}

}  // namespace

FragmentExchange::FragmentExchange(const OuterOptions& options, int64_t index, uint64_t numel,
                                   int rank, int world_size)
    : options_(options),
      index_(index),
      world_(world_size),
      global_(numel, 0.0f),
      next_(numel, 0.0f),
      momentum_(numel, 0.0f) {
  if (options_.topk) {
    topk_ = std::make_unique<TopkCodec>(options_.density, numel, static_cast<uint64_t>(index),
                                        options_.wire);
    sum_.resize(numel);
    return;
  }
  if (options_.bits == 32) {
    contribution_codec_ = std::make_unique<Fp32Codec>();
    result_codec_ = std::make_unique<Fp32Codec>();
    return;
  }
  make_quant_codecs(rank, world_size, nullptr);
}

void FragmentExchange::make_quant_codecs(int rank, int world_size, std::vector<float>* residual) {
  const uint64_t numel = global_.size();
  compress::quant::QuantOptions q = options_.quant;
  q.seed = mix_seed(options_.quant.seed, rank, index_, 0);
  contribution_codec_ = std::make_unique<QuantCodec>(q, true, 0, numel, numel);
  if (residual) static_cast<QuantCodec&>(*contribution_codec_).residual().swap(*residual);
  auto seg = comm::encoded_segment(numel, q.block, world_size, rank);
  q.seed = mix_seed(options_.quant.seed, rank, index_, 1);
  result_codec_ = std::make_unique<QuantCodec>(q, true, seg.begin, seg.count, numel);
}

void FragmentExchange::set_membership(int rank, int world_size) {
  world_ = world_size;
  if (topk_ || options_.bits == 32) return;
  std::vector<float> kept = static_cast<QuantCodec&>(*contribution_codec_).residual();
  make_quant_codecs(rank, world_size, &kept);
}

FragmentExchange::~FragmentExchange() = default;

std::vector<float> FragmentExchange::contribution(const std::vector<float>& local) const {
  if (options_.bits == 32) return local;
  std::vector<float> delta(local.size());
  for (size_t i = 0; i < local.size(); ++i)
    delta[i] = global_[i] - local[i];
  return delta;
}

std::vector<float> FragmentExchange::rebased_contribution(
    const std::vector<float>& now, const std::vector<float>& at_launch) const {
  if (now.size() != global_.size() || at_launch.size() != global_.size())
    throw InvalidArgument("DiLoCo: fragment " + std::to_string(index_) + " has " +
                          std::to_string(global_.size()) + " elements; rebased from " +
                          std::to_string(at_launch.size()) + " to " + std::to_string(now.size()));
  std::vector<float> out(now.size());
  if (options_.bits == 32) {
    for (size_t i = 0; i < now.size(); ++i)
      out[i] = global_[i] + (now[i] - at_launch[i]);
  } else {
    for (size_t i = 0; i < now.size(); ++i)
      out[i] = at_launch[i] - now[i];
  }
  return out;
}

uint64_t FragmentExchange::exchange_topk(comm::Communicator& comm,
                                         const std::vector<float>& delta) {
  std::vector<uint8_t> payload;
  const uint64_t nonfinite = topk_->encode(delta.data(), payload);
  std::vector<comm::Bytes> all = comm::ring_allgatherv(comm, payload.data(), payload.size());
  std::fill(sum_.begin(), sum_.end(), 0.0f);
  for (const auto& p : all)  // rank order
    topk_->decode_add(p.data(), p.size(), sum_.data());
  const float P = static_cast<float>(world_);
  for (float& x : sum_)
    x = x / P;
  outer_step(sum_.data());
  ++round_;
  return nonfinite;
}

uint64_t FragmentExchange::exchange(comm::Communicator& comm, std::vector<float>& values) {
  if (topk_) return exchange_topk(comm, values);
  for (auto* codec : {contribution_codec_.get(), result_codec_.get()})
    if (auto* q = dynamic_cast<QuantCodec*>(codec)) q->set_round(round_);
  auto before = [&] {
    uint64_t n = 0;
    for (auto* codec : {contribution_codec_.get(), result_codec_.get()})
      if (auto* q = dynamic_cast<QuantCodec*>(codec)) n += q->nonfinite();
    return n;
  };
  const uint64_t nonfinite_before = before();
  const float P = static_cast<float>(world_);
  comm::encoded_allreduce(comm, *contribution_codec_, *result_codec_, values.data(), values.data(),
                          values.size(), [P](float* v, size_t n, size_t) {
                            for (size_t i = 0; i < n; ++i)
                              v[i] = v[i] / P;
                          });
  outer_step(values.data());
  ++round_;
  return before() - nonfinite_before;
}

void FragmentExchange::outer_step(const float* x) {
  const float lr = static_cast<float>(options_.lr);
  const float mu = static_cast<float>(options_.momentum);
  const bool exact = options_.bits == 32;
  for (size_t i = 0; i < global_.size(); ++i) {
    const float delta = exact ? global_[i] - x[i] : x[i];
    const float m = mu * momentum_[i] + delta;
    momentum_[i] = m;
    const float u = options_.nesterov ? delta + mu * m : m;
    next_[i] = exact ? x[i] + (delta - lr * u) : global_[i] - lr * u;
  }
}

void FragmentExchange::save(sync::ByteWriter& w) const {
  w.put<uint64_t>(round_);
  put_floats(w, global_);
  put_floats(w, momentum_);
  if (topk_) {  // same layout: the contribution residual, then an empty result residual
    put_floats(w, topk_->residual());
    put_floats(w, std::vector<float>{});
    return;
  }
  for (auto* codec : {contribution_codec_.get(), result_codec_.get()}) {
    auto* q = dynamic_cast<QuantCodec*>(codec);
    put_floats(w, q ? q->residual() : std::vector<float>{});
  }
}

void FragmentExchange::set_shared(uint64_t round, std::vector<float> global,
                                  std::vector<float> momentum) {
  round_ = round;
  global_ = std::move(global);
  momentum_ = std::move(momentum);
  if (auto* q = dynamic_cast<QuantCodec*>(result_codec_.get()))
    std::fill(q->residual().begin(), q->residual().end(), 0.0f);
}

void FragmentExchange::load(sync::ByteReader& r) {
  round_ = r.get<uint64_t>();
  get_floats(r, global_, "a global copy");
  get_floats(r, momentum_, "an outer momentum");
  if (topk_) {
    std::vector<float> empty;
    get_floats(r, topk_->residual(), "a top-k residual");
    get_floats(r, empty, "a quantization residual");
    return;
  }
  for (auto* codec : {contribution_codec_.get(), result_codec_.get()}) {
    auto* q = dynamic_cast<QuantCodec*>(codec);
    std::vector<float> empty;
    get_floats(r, q ? q->residual() : empty, "a quantization residual");
  }
}

}  // namespace gradex::outer
