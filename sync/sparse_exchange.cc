#include "sync/sparse_exchange.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>

#include "base/check.h"
#include "base/thread_pool.h"
#include "comm/collectives.h"
#include "compress/dgc/compressor.h"
#include "compress/wire/codec.h"

namespace gradex::sync {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Below this many elements in a call, the pool's hand-off costs more than it saves.
constexpr uint64_t kParallelMinElements = uint64_t{1} << 18;
// A tensor's sum is added in pieces of this many elements (1 MiB of fp32, about one L2: a piece's
// lines and pages stay cached while every rank's values are added to it).
constexpr uint64_t kSumPieceElements = uint64_t{1} << 18;

struct Part {
  size_t item;
  size_t begin, end;  // element range
};

// Sized once, reused by every call on this thread (the engine calls from one thread): nothing is
// allocated per call once the largest round has been seen.
struct ExchangeBuffers {
  std::vector<uint8_t> message;
  std::vector<comm::Bytes> all;
  std::vector<const uint8_t*> payload;  // slot r * n + i: rank r's payload of item i
  std::vector<size_t> length;
  std::vector<compress::wire::DecodeScratch> scratch;
  std::vector<compress::wire::PayloadView> views;
  std::vector<Part> parts;
};

ExchangeBuffers& exchange_buffers() {
  thread_local ExchangeBuffers buffers;
  return buffers;
}

template <typename T>
void put_le(std::vector<uint8_t>& out, T value) {
  const size_t at = out.size();
  out.resize(at + sizeof(T));
  std::memcpy(out.data() + at, &value, sizeof(T));
}

// Splits rank r's message into its n payloads (pointers into `message`), checking the framing.
void split_message(const comm::Bytes& message, int r, size_t n, const uint8_t** payload,
                   size_t* length) {
  const uint8_t* data = message.data();
  const size_t size = message.size();
  size_t pos = 0;
  auto need = [&](size_t bytes) {
    if (bytes > size - pos)
      throw CorruptPayload("sparse message from rank " + std::to_string(r) +
                           " is truncated: needs " + std::to_string(bytes) +
                           " more bytes at offset " + std::to_string(pos) + ", has " +
                           std::to_string(size - pos));
  };
  need(sizeof(uint32_t));
  uint32_t count;
  std::memcpy(&count, data, sizeof count);
  pos += sizeof count;
  if (count != n)
    throw CorruptPayload("sparse message from rank " + std::to_string(r) + " holds " +
                         std::to_string(count) + " tensors, expected " + std::to_string(n));
  for (size_t i = 0; i < n; ++i) {
    need(sizeof(uint64_t));
    uint64_t bytes;
    std::memcpy(&bytes, data + pos, sizeof bytes);
    pos += sizeof bytes;
    need(bytes);
    payload[i] = data + pos;
    length[i] = static_cast<size_t>(bytes);
    pos += bytes;
  }
  if (pos != size)
    throw CorruptPayload("sparse message from rank " + std::to_string(r) + ": " +
                         std::to_string(size - pos) + " unexpected trailing bytes");
}

}  // namespace

uint64_t tensor_key_id(const std::string& key) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : key)
    h = (h ^ c) * 1099511628211ull;
  return h;
}

struct SparseCodec::Impl {
  Impl(std::string k, uint64_t id, uint64_t numel, compress::DgcOptions o, compress::WireOptions w)
      : key(std::move(k)), key_id(id), dgc(numel, std::move(o)), wire(w) {}
  std::string key;
  uint64_t key_id;
  compress::DgcCompressor dgc;
  compress::WireOptions wire;
  std::vector<float> dense_out;
  std::vector<uint8_t> encoded;
  mutable compress::wire::DecodeScratch scratch;
};

SparseCodec::SparseCodec(const std::string& key, uint64_t key_id, uint64_t numel, double sparsity,
                         const config::Config& config, int world_size) {
  compress::DgcOptions o = compress::dgc_options_from_config(config, world_size);
  o.sparsity = sparsity;  // the policy's (a per-tensor override may differ from GRADEX_SPARSITY)
  o.clip_norm = 0;        // the engine clips (whole-step norm) and passes the factor per step
  impl_ = std::make_unique<Impl>(key, key_id, numel, std::move(o),
                                 compress::wire_options_from_config(config));
}

SparseCodec::~SparseCodec() = default;

uint64_t SparseCodec::numel() const {
  return impl_->dgc.numel();
}
uint64_t SparseCodec::steps_done() const {
  return impl_->dgc.steps_done();
}
const float* SparseCodec::residual() const {
  return impl_->dgc.residual();
}

void SparseCodec::set_step(uint64_t step) {
  impl_->dgc.set_step(step);
}

double SparseCodec::density_at(uint64_t step) const {
  return 1.0 - impl_->dgc.sparsity_at_step(step);
}

float* SparseCodec::momentum() {
  return impl_->dgc.mutable_momentum_buffer();
}

void SparseCodec::dense_step(float* grad, float grad_scale) {
  impl_->dense_out.resize(impl_->dgc.numel());
  impl_->dgc.step_dense(grad, impl_->dense_out.data(), grad_scale);
  std::memcpy(grad, impl_->dense_out.data(), impl_->dense_out.size() * sizeof(float));
}

void SparseCodec::compress(const float* grad, float grad_scale, std::vector<uint8_t>& out) {
  const compress::Selection& sel = impl_->dgc.step(grad, grad_scale);
  compress::wire::encode_append(compress::wire::sparse_ref(sel), impl_->key_id, impl_->wire, out);
}

const std::vector<uint8_t>& SparseCodec::compress_and_clear(float* grad, float grad_scale) {
  const compress::Selection& sel = impl_->dgc.step_and_clear(grad, grad_scale);
  compress::wire::encode(compress::wire::sparse_ref(sel), impl_->key_id, impl_->wire,
                         impl_->encoded);
  return impl_->encoded;
}

const std::vector<uint8_t>& SparseCodec::payload() const {
  return impl_->encoded;
}

compress::wire::PayloadView SparseCodec::view(const uint8_t* payload, size_t size,
                                              compress::wire::DecodeScratch& scratch) const {
  compress::wire::PayloadView v = compress::wire::decode_view(payload, size, scratch);
  if (v.header.key != impl_->key_id)
    throw CorruptPayload("payload for tensor '" + impl_->key + "' carries another tensor's key");
  if (v.header.numel != impl_->dgc.numel())
    throw InvalidArgument("wire::accumulate: buffer of " + std::to_string(impl_->dgc.numel()) +
                          " elements for a payload of " + std::to_string(v.header.numel));
  return v;
}

void SparseCodec::accumulate(const uint8_t* payload, size_t size, float scale, float* sum) const {
  const compress::wire::PayloadView v = view(payload, size, impl_->scratch);
  compress::wire::add_range(v, sum, impl_->dgc.numel(), scale, 0, impl_->dgc.numel());
}

void SparseCodec::save(ByteWriter& w) const {
  std::vector<uint8_t> blob = impl_->dgc.save_state();
  w.put<uint64_t>(blob.size());
  w.put_bytes(blob.data(), blob.size());
}

void SparseCodec::load(ByteReader& r) {
  uint64_t size = r.get<uint64_t>();
  const uint8_t* blob = r.get_bytes(size);
  impl_->dgc.load_state(blob, size);
}

void sparse_average(comm::Communicator& comm, std::vector<SparseItem>& items,
                    SparseCounters& counters, bool ring) {
  const int world = comm.size();
  const size_t n = items.size();
  ExchangeBuffers& b = exchange_buffers();
  uint64_t total_numel = 0;
  for (const SparseItem& item : items)
    total_numel += item.codec->numel();
  const bool parallel = total_numel >= kParallelMinElements && shared_pool().threads() > 1;

  // Compression leaves every item's buffer zeroed (it receives the sum below). Items are
  // independent: several are compressed at once; a large one also splits its own passes.
  auto t0 = Clock::now();
  auto compress_item = [&](int i) {
    SparseItem& item = items[static_cast<size_t>(i)];
    item.codec->compress_and_clear(item.values, item.grad_scale);
  };
  if (parallel && n > 1)
    shared_pool().parallel_for(static_cast<int>(n), compress_item);
  else
    for (size_t i = 0; i < n; ++i)
      compress_item(static_cast<int>(i));
  // This rank's message: [u32 item count] then per item [u64 length][payload].
  b.message.clear();
  put_le(b.message, static_cast<uint32_t>(n));
  for (SparseItem& item : items) {
    const std::vector<uint8_t>& payload = item.codec->payload();
    put_le(b.message, static_cast<uint64_t>(payload.size()));
    b.message.insert(b.message.end(), payload.begin(), payload.end());
  }
  counters.compress_seconds += seconds_since(t0);

  auto t1 = Clock::now();
  uint64_t sent_before = comm.bytes_sent();
  try {
    if (ring)
      comm::ring_allgatherv(comm, b.message.data(), b.message.size(), b.all);
    else
      comm::allgatherv(comm, b.message.data(), b.message.size(), b.all);
  } catch (const Error& e) {
    std::string keys;
    for (size_t i = 0; i < items.size() && i < 8; ++i)
      keys += (keys.empty() ? "'" : ", '") + *items[i].key + "'";
    if (items.size() > 8) keys += ", ...";
    throw Error(e.code(), "sparse exchange of [" + keys + "]: " + e.what());
  }
  counters.wire_bytes += comm.bytes_sent() - sent_before;
  counters.communicate_seconds += seconds_since(t1);

  // Every rank adds the same payloads in rank order into every element, so the averages are
  // bit-identical everywhere, however the work is split: payloads are validated and their
  // indices decoded in parallel, then each tensor's element range is split over the pool and
  // each part adds rank 0's values, then rank 1's, and so on.
  auto t2 = Clock::now();
  const size_t slots = static_cast<size_t>(world) * n;  // slot r * n + i: rank r, item i
  b.payload.resize(slots);
  b.length.resize(slots);
  if (b.scratch.size() < slots) b.scratch.resize(slots);
  b.views.resize(slots);
  for (int r = 0; r < world; ++r)
    split_message(b.all[static_cast<size_t>(r)], r, n, &b.payload[static_cast<size_t>(r) * n],
                  &b.length[static_cast<size_t>(r) * n]);
  auto view_slot = [&](int s) {
    const size_t slot = static_cast<size_t>(s);
    SparseItem& item = items[slot % n];
    try {
      b.views[slot] = item.codec->view(b.payload[slot], b.length[slot], b.scratch[slot]);
    } catch (const CorruptPayload& e) {
      throw CorruptPayload("tensor '" + *item.key + "' from rank " + std::to_string(slot / n) +
                           ": " + e.what());
    }
  };
  // The lowest failing slot is reported: the first failure in rank order, as a serial loop would.
  if (parallel && slots > 1)
    shared_pool().parallel_for(static_cast<int>(slots), view_slot);
  else
    for (size_t s = 0; s < slots; ++s)
      view_slot(static_cast<int>(s));

  const float scale = 1.0f / static_cast<float>(world);
  // Pieces of at most kSumPieceElements: while one piece takes rank 0's values, then rank 1's
  // and so on, its cache lines and pages stay cached (each rank's additions would otherwise sweep
  // the whole tensor again); they are also the pool's unit of work.
  b.parts.clear();
  for (size_t i = 0; i < n; ++i) {
    const uint64_t numel = items[i].codec->numel();
    for (uint64_t begin = 0; begin < numel; begin += kSumPieceElements)
      b.parts.push_back({i, begin, std::min(numel, begin + kSumPieceElements)});
  }
  auto add_part = [&](int k) {
    const Part& part = b.parts[static_cast<size_t>(k)];
    SparseItem& item = items[part.item];
    const size_t numel = item.codec->numel();
    for (int r = 0; r < world; ++r)
      compress::wire::add_range(b.views[static_cast<size_t>(r) * n + part.item], item.values, numel,
                                scale, part.begin, part.end);
  };
  if (parallel && b.parts.size() > 1)
    shared_pool().parallel_for(static_cast<int>(b.parts.size()), add_part);
  else
    for (size_t k = 0; k < b.parts.size(); ++k)
      add_part(static_cast<int>(k));
  counters.decode_seconds += seconds_since(t2);
}

void sum_payloads(const SparseCodec& codec, const std::string& key,
                  const std::vector<std::pair<const uint8_t*, size_t>>& payloads, float scale,
                  float* sum) {
  // Per calling thread (the pipeline finishes units on the progress thread or a worker); the
  // lambdas below run on other threads too, so they capture these by reference, never by name.
  thread_local std::vector<compress::wire::DecodeScratch> scratch_of_thread;
  thread_local std::vector<compress::wire::PayloadView> views_of_thread;
  std::vector<compress::wire::DecodeScratch>& scratch = scratch_of_thread;
  std::vector<compress::wire::PayloadView>& views = views_of_thread;
  const size_t ranks = payloads.size();
  if (scratch.size() < ranks) scratch.resize(ranks);
  views.resize(ranks);
  const uint64_t numel = codec.numel();
  const bool parallel = numel >= kParallelMinElements && shared_pool().threads() > 1;
  auto view_rank = [&](int r) {
    const size_t i = static_cast<size_t>(r);
    try {
      views[i] = codec.view(payloads[i].first, payloads[i].second, scratch[i]);
    } catch (const CorruptPayload& e) {
      throw CorruptPayload("tensor '" + key + "' from rank " + std::to_string(r) + ": " + e.what());
    }
  };
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
      compress::wire::add_range(views[r], sum, numel, scale, begin, end);
  };
  if (parallel && pieces > 1)
    shared_pool().parallel_for(pieces, add_piece);
  else
    for (int k = 0; k < pieces; ++k)
      add_piece(k);
}

}  // namespace gradex::sync
