// Engine::save_state / load_state: the checkpointable part of the engine (step counter, DGC
// residuals, momenta and step counters, LocalSGD anchors), versioned and checked against this job
// on load.
#include <cstring>

#include "sync/data/backend_path.h"
#include "sync/data/backend_tensor.h"
#include "sync/data/byte_io.h"
#include "sync/engine/engine.h"
#include "sync/engine/engine_executor.h"

namespace gradex::sync {
namespace {

constexpr uint32_t kStateMagic = 0x54535847;  // "GXST"
// Version 2 added per tensor: the exchange counter and gradex's momentum of dense-policy tensors.
// Version 3 added per tensor the 8-bit route's two residuals (sync/data/int8_exchange.h; empty:
// none); a state without any is still written as version 2, so that builds before it read it.
// Versions 1 and 2 load (counter from DGC's own step count, momentum and residuals empty).
constexpr uint32_t kStateVersion = 3;

void put_floats(ByteWriter& w, const std::vector<float>& v) {
  w.put<uint64_t>(v.size());
  w.put_bytes(v.data(), v.size() * sizeof(float));
}

}  // namespace

std::vector<float> Engine::residual_of(const std::string& key) {
  auto lock = wait_until_idle();
  BackendPath& path = executor_->path();
  auto it = table_.tensors.find(key);
  if (it == table_.tensors.end())
    throw InvalidArgument("tensor '" + key + "' was never registered");
  return path.residual(it->second);  // host copy of v
}

void Engine::adopt_link_model(const AgreedLink& model) {
  auto lock = wait_until_idle();
  executor_->link().adopt(model);
}

void Engine::calibrate_policy() {
  auto lock = wait_until_idle();
  policy_->calibrate_now();
}

std::unique_ptr<AgreedLink> Engine::link_model_copy() {
  auto lock = wait_until_idle();
  return std::make_unique<AgreedLink>(executor_->link());
}

double Engine::link_round_trip_s() {
  auto lock = wait_until_idle();
  const LinkModel* model = executor_->link().model();
  return model == nullptr ? 0.0 : 2 * model->link().alpha_s;
}

double Engine::cpu_share() const {
  return policy_->cpu_share();
}

int Engine::link_latency_bound() {
  auto lock = wait_until_idle();
  const LinkModel* model = executor_->link().model();
  if (model == nullptr) return -1;
  return model->latency_bound() ? 1 : 0;
}

int Engine::start_latency_bound() {
  auto lock = wait_until_idle();
  return start_says_latency_bound() ? 1 : 0;
}

std::vector<float> Engine::momentum_of(const std::string& key) {
  auto lock = wait_until_idle();
  BackendPath& path = executor_->path();
  auto it = table_.tensors.find(key);
  if (it == table_.tensors.end())
    throw InvalidArgument("tensor '" + key + "' was never registered");
  return path.momentum(it->second);  // host copy of u
}

std::vector<uint8_t> Engine::save_state() {
  auto lock = wait_until_idle();
  BackendPath& path = executor_->path();
  // After a fatal error some tensors' residuals, momenta or counters may have advanced on this
  // rank and not on others: such a state would resume ranks out of step, so none is written.
  if (fatal_.code != ErrorCode::kOk)
    throw StateError("save_state refused: the engine failed earlier (" + fatal_.message +
                     "), so its state may be partly updated");
  bool int8 = false;
  for (const auto& [key, t] : table_.tensors)
    int8 |= !t.int8_residual.empty();
  const uint32_t version = int8 ? kStateVersion : 2;
  ByteWriter w;
  w.put<uint32_t>(kStateMagic);
  w.put<uint32_t>(version);
  w.put<uint32_t>(static_cast<uint32_t>(world_size_));
  w.put<uint32_t>(static_cast<uint32_t>(rank_));
  w.put<uint64_t>(steps_.completed);
  w.put<uint32_t>(static_cast<uint32_t>(table_.tensors.size()));
  for (auto& [key, t] : table_.tensors) {
    // u and v are copied to host and written in DgcCompressor's format (a state saved on one
    // backend restores on any other).
    const bool has_dgc = path.has_dgc(t);
    w.put_string(key);
    w.put<uint64_t>(t.numel);
    w.put<uint8_t>(static_cast<uint8_t>(t.dtype));
    w.put<uint8_t>(has_dgc ? 1 : 0);
    if (has_dgc) {
      // The DGC blob inside its own length (format 1's codec framing).
      ByteWriter codec;
      const std::vector<uint8_t> blob = path.save_dgc(t);
      codec.put<uint64_t>(blob.size());
      codec.put_bytes(blob.data(), blob.size());
      w.put<uint64_t>(codec.bytes().size());
      w.put_bytes(codec.bytes().data(), codec.bytes().size());
    }
    w.put<uint64_t>(t.anchor.size());
    w.put_bytes(t.anchor.data(), t.anchor.size() * sizeof(float));
    w.put<uint64_t>(t.step);
    const std::vector<float> u = has_dgc ? std::vector<float>() : path.momentum(t);
    w.put<uint64_t>(u.size());
    w.put_bytes(u.data(), u.size() * sizeof(float));
    if (version >= 3) {
      put_floats(w, t.int8_residual);
      put_floats(w, t.int8_owner_residual);
    }
  }
  return std::move(w.bytes());
}

void Engine::load_state(const uint8_t* data, size_t size) {
  auto lock = wait_until_idle();
  BackendPath& path = executor_->path();
  ByteReader r(data, size, "saved gradex state");
  if (r.get<uint32_t>() != kStateMagic) throw StateError("not a gradex state (bad magic)");
  uint32_t version = r.get<uint32_t>();
  if (version < 1 || version > kStateVersion)
    throw StateError("gradex state version " + std::to_string(version) +
                     " is not supported (this "
                     "build reads versions 1 to " +
                     std::to_string(kStateVersion) + ")");
  uint32_t world = r.get<uint32_t>();
  if (world != static_cast<uint32_t>(world_size_))
    throw StateError("gradex state was saved with world size " + std::to_string(world) +
                     ", this job has " + std::to_string(world_size_) + " ranks");
  r.get<uint32_t>();  // the saving rank: informative only (residuals are per rank, see docs)
  uint64_t steps = r.get<uint64_t>();
  uint32_t count = r.get<uint32_t>();
  if (count != table_.tensors.size())
    throw StateError("gradex state holds " + std::to_string(count) + " tensors, this engine has " +
                     std::to_string(table_.tensors.size()) +
                     " registered (register every tensor first)");

  // Parse and validate everything before changing anything, so a bad state leaves the engine
  // intact.
  struct Parsed {
    TensorState* tensor;
    const uint8_t* codec = nullptr;
    uint64_t codec_size = 0;
    const uint8_t* anchor = nullptr;
    uint64_t anchor_size = 0;
    bool has_step = false;
    uint64_t step = 0;
    const uint8_t* momentum = nullptr;
    uint64_t momentum_size = 0;
    bool adopt = false;
    const uint8_t* int8[2] = {nullptr, nullptr};  // residual, owner residual
    uint64_t int8_size = 0;
  };
  std::vector<Parsed> parsed;
  for (uint32_t i = 0; i < count; ++i) {
    std::string key = r.get_string();
    uint64_t numel = r.get<uint64_t>();
    uint8_t dtype = r.get<uint8_t>();
    auto it = table_.tensors.find(key);
    if (it == table_.tensors.end())
      throw StateError("gradex state holds tensor '" + key + "', which is not registered here");
    TensorState& t = it->second;
    if (t.numel != numel || static_cast<uint8_t>(t.dtype) != dtype)
      throw StateError("tensor '" + key + "' was saved as " + std::to_string(numel) +
                       " elements, is registered as " + std::to_string(t.numel));
    Parsed p{&t};
    bool has_codec = r.get<uint8_t>() != 0;
    // GRADEX_POLICY=auto starts every host tensor dense: a saved DGC state is restored into it (its
    // dense steps flush the residual until a plan makes it DGC again).
    p.adopt = has_codec && !path.has_dgc(t) && policy_->adopts_saved_codec(t.backend->cuda);
    if (has_codec != path.has_dgc(t) && !p.adopt)
      throw StateError("tensor '" + key + "' was saved with a different policy (" +
                       (has_codec ? "DGC" : "dense") + ") than it has now");
    if (has_codec) {
      p.codec_size = r.get<uint64_t>();
      p.codec = r.get_bytes(p.codec_size);
    }
    p.anchor_size = r.get<uint64_t>();
    if (p.anchor_size != 0 && p.anchor_size != numel)
      throw StateError("tensor '" + key + "' has a LocalSGD anchor of the wrong size");
    p.anchor = r.get_bytes(p.anchor_size * sizeof(float));
    if (version >= 2) {
      p.has_step = true;
      p.step = r.get<uint64_t>();
      p.momentum_size = r.get<uint64_t>();
      if (p.momentum_size != 0 && (p.momentum_size != numel || has_codec))
        throw StateError("tensor '" + key + "' has a momentum buffer of the wrong size");
      p.momentum = r.get_bytes(p.momentum_size * sizeof(float));
    }
    if (version >= 3) {
      for (int k = 0; k < 2; ++k) {
        const uint64_t n = r.get<uint64_t>();
        if (n != 0 && n != numel)
          throw StateError("tensor '" + key + "' has an 8-bit residual of " + std::to_string(n) +
                           " elements (" + std::to_string(numel) + " or none expected)");
        if (k == 1 && n != p.int8_size)
          throw StateError("tensor '" + key + "' has only one of its two 8-bit residuals");
        p.int8_size = n;
        p.int8[k] = r.get_bytes(n * sizeof(float));
      }
    }
    parsed.push_back(p);
  }
  r.expect_end();
  // DGC states are validated on the host first (all or nothing), then loaded.
  struct DgcBlob {
    const uint8_t* data = nullptr;
    uint64_t size = 0, steps = 0;
  };
  std::vector<DgcBlob> blobs(parsed.size());
  for (size_t i = 0; i < parsed.size(); ++i) {
    TensorState& t = *parsed[i].tensor;
    if (!path.has_dgc(t) && !parsed[i].adopt) continue;
    ByteReader cr(parsed[i].codec, parsed[i].codec_size, "DGC state of tensor '" + t.key + "'");
    const uint64_t size = cr.get<uint64_t>();
    const uint8_t* blob = cr.get_bytes(size);
    cr.expect_end();
    blobs[i] = {blob, size, path.validate_dgc(t, blob, size)};
  }
  for (size_t i = 0; i < parsed.size(); ++i) {
    TensorState& t = *parsed[i].tensor;
    t.anchor.resize(parsed[i].anchor_size);
    if (parsed[i].anchor_size)
      std::memcpy(t.anchor.data(), parsed[i].anchor, parsed[i].anchor_size * sizeof(float));
    uint64_t dgc_steps = 0;
    if (blobs[i].data) {
      path.load_dgc(t, blobs[i].data, blobs[i].size);
      dgc_steps = blobs[i].steps;
    } else {
      std::vector<float> u(parsed[i].momentum_size);
      if (!u.empty()) std::memcpy(u.data(), parsed[i].momentum, u.size() * sizeof(float));
      path.load_momentum(t, u.data(), u.size());
    }
    t.step = parsed[i].has_step ? parsed[i].step : dgc_steps;
    // The 8-bit residuals: saved at this world size (checked above), so the owned segments match.
    const uint64_t n8 = parsed[i].int8_size;
    t.int8_residual.resize(n8);
    t.int8_owner_residual.resize(n8);
    if (n8) {
      std::memcpy(t.int8_residual.data(), parsed[i].int8[0], n8 * sizeof(float));
      std::memcpy(t.int8_owner_residual.data(), parsed[i].int8[1], n8 * sizeof(float));
    }
    t.int8_world = n8 ? world_size_ : 0;
    t.int8_layout = 0;  // a checkpoint does not record it (sync/data/int8_path.cc: ready_residuals)
  }
  steps_.completed = steps;
  steps_.stats.steps = steps;
}

}  // namespace gradex::sync
