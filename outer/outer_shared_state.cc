// OuterOptimizer::save_shared_state / load_shared_state: the outer state that every member of a
// DiLoCo job holds identically, in a form that a member of any membership can load (a replica
// that joins a running job takes it from a healthy peer, e.g. through torchft's recovery).
//
// Layout (little-endian): magic "GRXS", format version, payload length, CRC-32C of the payload,
// then the payload: the settings that shape the state (period, fragments, delay, bits, top-k),
// the step count, the tensor set (key, element count, buffer flag, in registration order), and
// per fragment its last merge, round, global copy and outer momentum. No residuals: they are a
// rank's own error feedback (a peer's would be sent twice) or depend on rank and world size.
#include <cstring>

#include "compress/wire/checksum.h"
#include "outer/fragment_exchange.h"
#include "outer/outer_optimizer.h"
#include "sync/data/byte_io.h"

namespace gradex::outer {
namespace {

constexpr uint32_t kSharedMagic = 0x53585247;  // "GRXS"
constexpr uint32_t kSharedVersion = 1;
constexpr size_t kHeaderBytes = 4 + 4 + 8 + 4;

void put_floats(sync::ByteWriter& w, const std::vector<float>& v) {
  w.put<uint64_t>(v.size());
  if (!v.empty()) w.put_bytes(v.data(), 4 * v.size());
}

std::vector<float> get_floats(sync::ByteReader& r, uint64_t expected, int64_t fragment,
                              const char* what) {
  const uint64_t n = r.get<uint64_t>();
  if (n != expected)
    throw StateError("DiLoCo shared state: fragment " + std::to_string(fragment) + "'s " + what +
                     " has " + std::to_string(n) + " elements, this job's has " +
                     std::to_string(expected));
  std::vector<float> v(n);
  if (n) std::memcpy(v.data(), r.get_bytes(4 * n), 4 * n);
  return v;
}

}  // namespace

std::vector<uint8_t> OuterOptimizer::save_shared_state() {
  require_started("save_shared_state()");
  // After a failure a fragment's momentum may be ahead of its global copy (an exchange that
  // computed its outer step and then failed): such a state is not what the others hold.
  check_failed();
  if (!pending_.empty())
    throw StateError("DiLoCo: save_shared_state() with " + std::to_string(pending_.size()) +
                     " exchange(s) in flight; it is taken between exchanges");
  sync::ByteWriter p;
  p.put<int64_t>(options_.period);
  p.put<int64_t>(options_.fragments);
  p.put<int64_t>(options_.delay);
  p.put<int32_t>(options_.bits);
  p.put<uint8_t>(options_.topk ? 1 : 0);
  p.put<uint64_t>(step_);
  write_tensor_list(p);
  for (size_t f = 0; f < fragments_.size(); ++f) {
    p.put<uint64_t>(last_merge_[f]);
    p.put<uint64_t>(fragments_[f]->rounds());
    put_floats(p, fragments_[f]->global());
    put_floats(p, fragments_[f]->momentum());
  }
  const std::vector<uint8_t>& payload = p.bytes();
  sync::ByteWriter w;
  w.put<uint32_t>(kSharedMagic);
  w.put<uint32_t>(kSharedVersion);
  w.put<uint64_t>(payload.size());
  w.put<uint32_t>(compress::wire::crc32c(payload.data(), payload.size()));
  w.put_bytes(payload.data(), payload.size());
  return std::move(w.bytes());
}

void OuterOptimizer::load_shared_state(const uint8_t* data, size_t size) {
  require_started("load_shared_state()");
  check_failed();
  if (!pending_.empty())
    throw StateError("DiLoCo: load_shared_state() with " + std::to_string(pending_.size()) +
                     " exchange(s) in flight; it is loaded between exchanges");
  if (data == nullptr && size > 0) throw InvalidArgument("DiLoCo shared state: NULL buffer");
  sync::ByteReader h(data, size, "DiLoCo shared state");
  if (size < kHeaderBytes || h.get<uint32_t>() != kSharedMagic)
    throw StateError("DiLoCo shared state: not a DiLoCo shared state blob (" +
                     std::to_string(size) + " bytes, bad magic or too short)");
  const uint32_t version = h.get<uint32_t>();
  if (version != kSharedVersion)
    throw StateError("DiLoCo shared state: format version " + std::to_string(version) +
                     ", this build reads version " + std::to_string(kSharedVersion));
  const uint64_t length = h.get<uint64_t>();
  const uint32_t crc = h.get<uint32_t>();
  if (length != size - kHeaderBytes)
    throw CorruptPayload("DiLoCo shared state: payload of " + std::to_string(size - kHeaderBytes) +
                         " bytes, the header says " + std::to_string(length));
  const uint8_t* payload = data + kHeaderBytes;
  if (compress::wire::crc32c(payload, length) != crc)
    throw CorruptPayload("DiLoCo shared state: checksum mismatch (the blob is corrupt)");

  sync::ByteReader r(payload, length, "DiLoCo shared state");
  auto expect = [](int64_t got, int64_t want, const char* what) {
    if (got != want)
      throw StateError(std::string("DiLoCo shared state: saved with ") + what + " " +
                       std::to_string(got) + ", this job has " + std::to_string(want));
  };
  expect(r.get<int64_t>(), options_.period, "GRADEX_OUTER_PERIOD");
  expect(r.get<int64_t>(), options_.fragments, "GRADEX_OUTER_FRAGMENTS");
  expect(r.get<int64_t>(), options_.delay, "GRADEX_OUTER_DELAY");
  expect(r.get<int32_t>(), options_.bits, "GRADEX_OUTER_BITS");
  expect(r.get<uint8_t>(), options_.topk ? 1 : 0, "top-k (GRADEX_OUTER_BITS=topk)");
  const uint64_t step = r.get<uint64_t>();
  check_tensor_list(r, "DiLoCo shared state");
  // Everything is read and checked before anything changes.
  struct Fragment {
    uint64_t last_merge, round;
    std::vector<float> global, momentum;
  };
  std::vector<Fragment> loaded;
  for (size_t f = 0; f < fragments_.size(); ++f) {
    Fragment x;
    x.last_merge = r.get<uint64_t>();
    x.round = r.get<uint64_t>();
    const auto index = static_cast<int64_t>(f);
    x.global = get_floats(r, fragments_[f]->numel(), index, "global copy");
    x.momentum = get_floats(r, fragments_[f]->numel(), index, "outer momentum");
    loaded.push_back(std::move(x));
  }
  r.expect_end();
  for (size_t f = 0; f < fragments_.size(); ++f) {
    last_merge_[f] = loaded[f].last_merge;
    fragments_[f]->set_shared(loaded[f].round, std::move(loaded[f].global),
                              std::move(loaded[f].momentum));
  }
  step_ = step;
}

}  // namespace gradex::outer
