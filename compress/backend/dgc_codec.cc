#include "compress/backend/dgc_codec.h"

#include <algorithm>

#include "base/error.h"
#include "base/thread_pool.h"

namespace gradex::compress::backend {
namespace {

// Below this many elements, the pool's hand-off costs more than it saves.
constexpr uint64_t kParallelMinElements = uint64_t{1} << 18;
// The sum is added in pieces of this many elements (1 MiB of fp32, about one L2: a piece's lines
// stay cached while every rank's values are added to it); also the pool's unit of work.
constexpr uint64_t kSumPieceElements = uint64_t{1} << 18;

std::string from_rank(const std::string& key, size_t rank, const std::exception& e) {
  return "tensor '" + key + "' from rank " + std::to_string(rank) + ": " + e.what();
}

}  // namespace

uint64_t tensor_key_id(const std::string& key) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : key)
    h = (h ^ c) * 1099511628211ull;
  return h;
}

DgcCodec::DgcCodec(Backend& backend, std::string key, size_t numel, const DgcOptions& options,
                   const WireOptions& wire)
    : backend_(backend),
      key_(std::move(key)),
      key_id_(tensor_key_id(key_)),
      wire_(wire),
      state_(backend.create_dgc(numel, options)),
      stager_(backend),
      applier_(backend) {}

void DgcCodec::encode_step(float* grad, float grad_scale, Stream& stream,
                           std::vector<uint8_t>& out) {
  const DgcStepInfo info = state_->step_and_clear(grad, grad_scale, backend_, stream);
  wire::encode_append(stager_.stage(*state_, info, stream), key_id_, wire_, out);
}

void DgcCodec::encode_empty(std::vector<uint8_t>& out) {
  wire::SparseRef empty;
  empty.numel = state_->numel();
  empty.value_dtype = state_->options().value_dtype;
  wire::encode_append(empty, key_id_, wire_, out);
}

void DgcCodec::dense_step(float* grad, float grad_scale, Stream& stream) {
  const size_t n = state_->numel();
  if (!dense_out_) dense_out_ = backend_.allocate(std::max<size_t>(n, 1) * 4);
  state_->step_dense(grad, dense_out_->as<float>(), grad_scale, stream);
  backend_.copy(grad, dense_out_->data(), n * 4, stream);
}

void DgcCodec::return_to_residual(const wire::DecodedPayload& dropped, Stream& stream) {
  if (dropped.indices.empty()) return;
  // residual() is the state's own writable memory (backend.h).
  applier_.apply(dropped, const_cast<float*>(state_->residual()), state_->numel(), 1.0f, stream);
}

void DgcCodec::sum_payloads(const std::vector<wire::PayloadSpan>& payloads, float scale, float* out,
                            Stream& stream) {
  if (backend_.type() == DeviceType::kCpu) {
    sum_on_host(payloads, scale, out);
    return;
  }
  for (size_t r = 0; r < payloads.size(); ++r) {
    try {
      wire::decode(payloads[r].first, payloads[r].second, decoded_);
      if (decoded_.header.key != key_id_)
        throw CorruptPayload("payload for tensor '" + key_ + "' carries another tensor's key");
      applier_.apply(decoded_, out, state_->numel(), scale, stream);
    } catch (const CorruptPayload& e) {
      throw CorruptPayload(from_rank(key_, r, e));
    }
  }
}

void DgcCodec::sum_on_host(const std::vector<wire::PayloadSpan>& payloads, float scale,
                           float* out) {
  // Per calling thread (the pipeline finishes units on the progress thread or a worker); the
  // lambdas below run on other threads too, so they capture these by reference, never by name.
  thread_local std::vector<wire::DecodeScratch> scratch_of_thread;
  thread_local std::vector<wire::PayloadView> views_of_thread;
  std::vector<wire::DecodeScratch>& scratch = scratch_of_thread;
  std::vector<wire::PayloadView>& views = views_of_thread;
  const size_t ranks = payloads.size();
  if (scratch.size() < ranks) scratch.resize(ranks);
  views.resize(ranks);
  const uint64_t numel = state_->numel();
  const bool parallel = numel >= kParallelMinElements && shared_pool().threads() > 1;
  auto view_rank = [&](int r) {
    const size_t i = static_cast<size_t>(r);
    try {
      views[i] = wire::decode_view(payloads[i].first, payloads[i].second, scratch[i]);
      if (views[i].header.key != key_id_)
        throw CorruptPayload("payload for tensor '" + key_ + "' carries another tensor's key");
    } catch (const CorruptPayload& e) {
      throw CorruptPayload(from_rank(key_, i, e));
    }
    if (views[i].header.numel != numel)
      throw InvalidArgument("wire::accumulate: buffer of " + std::to_string(numel) +
                            " elements for a payload of " + std::to_string(views[i].header.numel));
  };
  // The lowest failing rank is reported, as a serial loop would.
  if (parallel && ranks > 1)
    shared_pool().parallel_for(static_cast<int>(ranks), view_rank);
  else
    for (size_t r = 0; r < ranks; ++r)
      view_rank(static_cast<int>(r));
  const int pieces = static_cast<int>((numel + kSumPieceElements - 1) / kSumPieceElements);
  auto add_piece = [&](int k) {
    const uint64_t begin = static_cast<uint64_t>(k) * kSumPieceElements;
    const uint64_t end = std::min(numel, begin + kSumPieceElements);
    for (size_t r = 0; r < ranks; ++r)
      wire::add_range(views[r], out, numel, scale, begin, end);
  };
  if (parallel && pieces > 1)
    shared_pool().parallel_for(pieces, add_piece);
  else
    for (int k = 0; k < pieces; ++k)
      add_piece(k);
}

}  // namespace gradex::compress::backend
