#include "sync/sparse_exchange.h"

#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>

#include "base/check.h"
#include "comm/collectives.h"
#include "compress/dgc/compressor.h"
#include "compress/wire/codec.h"

namespace gradex::sync {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
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
  mutable compress::wire::DecodedPayload decoded;
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
  compress::wire::encode(compress::wire::sparse_ref(sel), impl_->key_id, impl_->wire,
                         impl_->encoded);
  out.insert(out.end(), impl_->encoded.begin(), impl_->encoded.end());
}

void SparseCodec::accumulate(const uint8_t* payload, size_t size, float scale, float* sum) const {
  compress::wire::decode(payload, size, impl_->decoded);
  if (impl_->decoded.header.key != impl_->key_id)
    throw CorruptPayload("payload for tensor '" + impl_->key + "' carries another tensor's key");
  compress::wire::accumulate(impl_->decoded, sum, impl_->dgc.numel(), scale);
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
  // This rank's message: [u32 item count] then per item [u64 length][payload].
  auto t0 = Clock::now();
  ByteWriter message;
  message.put<uint32_t>(static_cast<uint32_t>(items.size()));
  std::vector<uint8_t> payload;
  for (SparseItem& item : items) {
    payload.clear();
    item.codec->compress(item.values, item.grad_scale, payload);
    message.put<uint64_t>(payload.size());
    message.put_bytes(payload.data(), payload.size());
  }
  counters.compress_seconds += seconds_since(t0);

  auto t1 = Clock::now();
  uint64_t sent_before = comm.bytes_sent();
  std::vector<comm::Bytes> all;
  try {
    all = ring ? comm::ring_allgatherv(comm, message.bytes().data(), message.bytes().size())
               : comm::allgatherv(comm, message.bytes().data(), message.bytes().size());
  } catch (const Error& e) {
    std::string keys;
    for (size_t i = 0; i < items.size() && i < 8; ++i)
      keys += (keys.empty() ? "'" : ", '") + *items[i].key + "'";
    if (items.size() > 8) keys += ", ...";
    throw Error(e.code(), "sparse exchange of [" + keys + "]: " + e.what());
  }
  counters.wire_bytes += comm.bytes_sent() - sent_before;
  counters.communicate_seconds += seconds_since(t1);

  // Every rank accumulates the same payloads in rank order, so the averages are bit-identical.
  auto t2 = Clock::now();
  for (SparseItem& item : items)
    std::fill(item.values, item.values + item.codec->numel(), 0.0f);
  const float scale = 1.0f / static_cast<float>(world);
  for (int r = 0; r < world; ++r) {
    ByteReader reader(all[r].data(), all[r].size(),
                      "sparse message from rank " + std::to_string(r));
    uint32_t count = reader.get<uint32_t>();
    if (count != items.size())
      throw CorruptPayload("sparse message from rank " + std::to_string(r) + " holds " +
                           std::to_string(count) + " tensors, expected " +
                           std::to_string(items.size()));
    for (SparseItem& item : items) {
      uint64_t length = reader.get<uint64_t>();
      const uint8_t* data = reader.get_bytes(length);
      try {
        item.codec->accumulate(data, length, scale, item.values);
      } catch (const CorruptPayload& e) {
        throw CorruptPayload("tensor '" + *item.key + "' from rank " + std::to_string(r) + ": " +
                             e.what());
      }
    }
    reader.expect_end();
  }
  counters.decode_seconds += seconds_since(t2);
}

}  // namespace gradex::sync
