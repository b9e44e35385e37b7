// OuterOptimizer::save_state / load_state: a versioned blob of the global copies, outer momenta,
// quantization residuals and the step count, checked against this job's shape on load.
#include <cstring>

#include "outer/fragment_exchange.h"
#include "outer/outer_optimizer.h"
#include "sync/data/byte_io.h"

namespace gradex::outer {
namespace {
constexpr uint32_t kMagic = 0x4f585247;  // "GRXO"
constexpr uint32_t kVersion = 1;
}  // namespace

void OuterOptimizer::write_tensor_list(sync::ByteWriter& w) const {
  w.put<uint64_t>(tensors_.size());
  for (const auto& t : tensors_) {
    w.put_string(t.key);
    w.put<uint64_t>(t.numel);
    w.put<uint8_t>(t.is_buffer ? 1 : 0);
  }
}

void OuterOptimizer::check_tensor_list(sync::ByteReader& r, const std::string& what) const {
  const uint64_t count = r.get<uint64_t>();
  if (count != tensors_.size())
    throw StateError(what + ": saved with a tensor count of " + std::to_string(count) +
                     ", this job has " + std::to_string(tensors_.size()));
  for (const auto& t : tensors_) {
    std::string key = r.get_string();
    const uint64_t numel = r.get<uint64_t>();
    const bool is_buffer = r.get<uint8_t>() != 0;
    if (key != t.key || numel != t.numel || is_buffer != t.is_buffer)
      throw StateError(what + ": tensor '" + key + "' (" + std::to_string(numel) +
                       " elements) where this job has '" + t.key + "' (" + std::to_string(t.numel) +
                       ")");
  }
}

std::vector<uint8_t> OuterOptimizer::save_state() {
  require_started("save_state()");
  check_failed();
  while (!pending_.empty()) {  // merged now rather than later: the blob has no exchanges in flight
    auto job = pending_.front();
    pending_.pop_front();
    finish(job);
  }
  sync::ByteWriter w;
  w.put<uint32_t>(kMagic);
  w.put<uint32_t>(kVersion);
  w.put<int32_t>(world_);
  w.put<int64_t>(options_.fragments);
  w.put<int32_t>(options_.bits);
  w.put<uint64_t>(step_);
  write_tensor_list(w);
  for (uint64_t s : last_merge_)
    w.put<uint64_t>(s);
  for (const auto& f : fragments_)
    f->save(w);
  return std::move(w.bytes());
}

void OuterOptimizer::load_state(const uint8_t* data, size_t size) {
  require_started("load_state()");
  bool failed;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    failed = failed_code_ != ErrorCode::kOk;
  }
  if (!pending_.empty() && !failed)
    throw StateError("DiLoCo: load_state() with exchanges in flight; call synchronize() first");
  sync::ByteReader r(data, size, "DiLoCo state");
  if (r.get<uint32_t>() != kMagic) throw StateError("DiLoCo state: not a DiLoCo state blob");
  const uint32_t version = r.get<uint32_t>();
  if (version != kVersion)
    throw StateError("DiLoCo state: format version " + std::to_string(version) +
                     ", this build reads version " + std::to_string(kVersion));
  auto expect = [](int64_t got, int64_t want, const char* what) {
    if (got != want)
      throw StateError(std::string("DiLoCo state: saved with ") + what + " " + std::to_string(got) +
                       ", this job has " + std::to_string(want));
  };
  expect(r.get<int32_t>(), world_, "world size");
  expect(r.get<int64_t>(), options_.fragments, "GRADEX_OUTER_FRAGMENTS");
  expect(r.get<int32_t>(), options_.bits, "GRADEX_OUTER_BITS");
  const uint64_t step = r.get<uint64_t>();
  check_tensor_list(r, "DiLoCo state");
  std::vector<uint64_t> merges(last_merge_.size());
  for (auto& s : merges)
    s = r.get<uint64_t>();
  // Parse into copies first: a blob that fails half-way leaves the optimizer as it was.
  std::vector<std::unique_ptr<FragmentExchange>> loaded;
  for (size_t f = 0; f < fragments_.size(); ++f) {
    loaded.push_back(std::make_unique<FragmentExchange>(options_, static_cast<int64_t>(f),
                                                        fragments_[f]->numel(), rank_, world_));
    loaded.back()->load(r);
  }
  r.expect_end();
  if (failed) drop_pending_after_failure();  // a rollback: what was in flight never happened
  fragments_ = std::move(loaded);
  last_merge_ = merges;
  step_ = step;
}

}  // namespace gradex::outer
