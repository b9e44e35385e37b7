// UcxCommunicator's sealed messages (comm/seal/seal.h): every message to another rank travels as
// a frame sealed with its connection's key, and a received frame is opened, in the order its tag's
// receives were posted, into the caller's buffer. A frame that fails a check fails the
// communicator like a dead peer does: every rank learns it at once (abort notice), and the
// collective that received it throws before anything of it is used.
#include <cstring>

#include "base/check.h"
#include "base/log.h"
#include "comm/rendezvous/auth.h"
#include "comm/ucx/ucx_communicator.h"

namespace gradex::comm::ucx {

void UcxCommunicator::install_seals(const std::vector<seal::Handshake>& handshakes,
                                    const std::vector<std::unique_ptr<seal::EphemeralKey>>& keys,
                                    const std::vector<bool>& peer_has_aes) {
  seals_.clear();
  seals_.resize(static_cast<size_t>(size_));
  const bool mine = seal::cpu_has_aes();
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) continue;  // messages to itself never leave the process
    const auto pi = static_cast<size_t>(p);
    const seal::Key shared = keys[pi]->agree(handshakes[pi].peer_public);
    const seal::DirectionKeys k = seal::derive_keys(shared, handshakes[pi]);
    seals_[pi] = std::make_unique<PeerSeal>(seal::pair_cipher(mine, peer_has_aes[pi]), k, p);
  }
  const seal::Cipher cipher = seal::pair_cipher(mine, mine);
  GX_LOG(kInfo) << "sealed data plane: " << seal::cipher_name(cipher)
                << " per connection, keys from ephemeral X25519 bound to the job secret";
}

void UcxCommunicator::seal_send(UcxRequest& r, PeerSeal& s, uint64_t tag, const void* data,
                                size_t bytes) {
  r.sealed_ = true;
  r.frame_bytes_ = bytes + seal::kOverheadBytes;
  r.frame_ = frame_pool_.acquire(r.frame_bytes_);
  s.sealer.seal(tag, data, bytes, r.frame_.get());
  ++frames_sealed_;
  if (tamper_.kind != seal::Tamper::Kind::kNone)
    apply_tamper(s, r.frame_, r.frame_bytes_, tag, data, bytes);
}

void UcxCommunicator::apply_tamper(PeerSeal& s, seal::FramePool::Buffer& frame, size_t& frame_bytes,
                                   uint64_t tag, const void* data, size_t bytes) {
  using Kind = seal::Tamper::Kind;
  const bool now = frames_sealed_ == tamper_.at;
  if (tamper_.kind == Kind::kReplay && !now) {
    s.last_frame.assign(frame.get(), frame.get() + frame_bytes);
    return;
  }
  if (!now) return;
  GX_LOG(kWarn) << "GRADEX_TEST_SEAL_TAMPER: altering sealed message " << frames_sealed_;
  switch (tamper_.kind) {
    case Kind::kFlip: {
      const uint64_t bit = (tamper_.at * 2654435761u) % (frame_bytes * 8);
      frame.get()[bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
      break;
    }
    case Kind::kTruncate:
      frame_bytes -= 1;
      break;
    case Kind::kReplay:
      if (s.last_frame.empty()) {
        // Nothing sent to this peer before: the next frame is the one replaced.
        ++tamper_.at;
        s.last_frame.assign(frame.get(), frame.get() + frame_bytes);
        break;
      }
      frame = frame_pool_.acquire(s.last_frame.size());
      std::memcpy(frame.get(), s.last_frame.data(), s.last_frame.size());
      frame_bytes = s.last_frame.size();
      break;
    case Kind::kForge: {
      // Someone without the keys: a well-formed frame with a plausible sequence number, sealed
      // under a key of its own.
      seal::Key stranger{};
      const auth::Nonce random = auth::random_nonce();
      std::memcpy(stranger.data(), random.data(), stranger.size());
      seal::Sealer forger(s.sealer.cipher(), stranger);
      seal::FramePool::Buffer forged = frame_pool_.acquire(frame_bytes);
      forger.seal(tag, data, bytes, forged.get());
      std::memcpy(forged.get() + 4, frame.get() + 4, 8);  // the genuine frame's sequence number
      frame_pool_.release(std::move(frame));
      frame = std::move(forged);
      break;
    }
    case Kind::kNone:
      break;
  }
}

bool UcxCommunicator::poll_sealed_receive(UcxRequest& r) {
  PeerSeal* s = seal_for(r.peer_);
  GX_CHECK(s != nullptr);
  auto& queue = s->open_queue[r.user_tag_];
  // Earlier receives of this (peer, tag) first: UCX gave them the earlier frames.
  while (true) {
    GX_CHECK(!queue.empty());
    UcxRequest* first = queue.front();
    if (!poll_transport(*first)) return false;
    open_frame(*first);  // dequeues it
    if (first == &r) return true;
  }
}

void UcxCommunicator::open_frame(UcxRequest& r) {
  unqueue(r);
  PeerSeal* s = seal_for(r.peer_);
  if (r.status_ == UCS_ERR_MESSAGE_TRUNCATED && r.frame_ && r.frame_bytes_ >= seal::kHeaderBytes) {
    // Longer than expected: an earlier (longer) frame replayed, an altered one, or ranks that
    // disagree on sizes. UCX hands over nothing of a message it could not deliver whole, so which
    // cannot be told; on a sealed connection each is a refusal that fails the job.
    r.seal_failure_ = std::string(seal::check_name(seal::SealViolation::Check::kFrame)) +
                      " check failed: a sealed message from rank " + std::to_string(r.peer_) +
                      " is longer than the " + std::to_string(r.posted_bytes_) +
                      " bytes expected: a replayed or altered message, or ranks that disagree on "
                      "this collective's sizes";
    r.status_ = UCS_OK;
  }
  if (r.status_ != UCS_OK || !r.seal_failure_.empty()) return;  // reported as such
  const size_t frame_bytes = r.info_.length;
  try {
    const size_t n = s->opener.payload_bytes(frame_bytes);
    uint8_t* out = nullptr;
    if (r.any_length_out_ != nullptr) {
      r.any_length_out_->resize(n);
      out = r.any_length_out_->data();
    } else {
      out = static_cast<uint8_t*>(r.user_data_);
    }
    s->opener.open(r.user_tag_, r.frame_.get(), frame_bytes, out);
    r.payload_length_ = n;
    bytes_received_ += n;
  } catch (const seal::SealViolation& v) {
    r.seal_failure_ = std::string(seal::check_name(v.check())) + " check failed: " + v.what();
  }
  recycle_frame(r);
}

void UcxCommunicator::unqueue(UcxRequest& r) {
  if (!r.queued_) return;
  r.queued_ = false;
  PeerSeal* s = seal_for(r.peer_);
  if (s == nullptr) return;
  auto it = s->open_queue.find(r.user_tag_);
  if (it == s->open_queue.end()) return;
  auto& queue = it->second;
  for (auto q = queue.begin(); q != queue.end(); ++q) {
    if (*q == &r) {
      queue.erase(q);
      break;
    }
  }
  if (queue.empty()) s->open_queue.erase(it);
}

void UcxCommunicator::fail_sealed(const UcxRequest& r, const char* operation,
                                  const std::vector<UcxRequest*>& pending) {
  const std::string detail = "refused a sealed message: " + r.seal_failure_;
  record_failure(ErrorCode::kCorrupt, r.peer_,
                 PeerFailure(ErrorCode::kCorrupt, operation, r.peer_, detail).what(), true);
  abandon(pending);
  reap_control_sends(true, Clock::now() + Millis(200));
  throw PeerFailure(ErrorCode::kCorrupt, operation, r.peer_, detail);
}

bool UcxCommunicator::open_control(size_t length, int source, ControlMessage* out,
                                   size_t* out_length) {
  if (source < 0 || source >= size_) {
    GX_LOG(kWarn) << "ignoring a control message from unknown rank " << source;
    return false;
  }
  PeerSeal* s = seal_for(source);
  if (s == nullptr) {
    if (length > sizeof(ControlMessage)) return false;
    std::memcpy(out, control_in_.data(), length);
    *out_length = length;
    return true;
  }
  uint32_t magic = 0;
  if (length >= 4) std::memcpy(&magic, control_in_.data(), 4);
  if (magic == kControlMagic) {
    // A plain notice from a peer whose keys this rank has: it may have failed before deriving
    // them (its endpoint error or the timeout then tells), or someone forged it. Not acted on.
    GX_LOG(kWarn) << "ignoring an unsealed control message claiming to come from rank " << source;
    return false;
  }
  try {
    s->opener.open(kControlBit, control_in_.data(), length, reinterpret_cast<uint8_t*>(out));
    *out_length = s->opener.payload_bytes(length);
    return true;
  } catch (const seal::SealViolation& v) {
    record_failure(ErrorCode::kCorrupt, source,
                   "control: rank " + std::to_string(rank_) +
                       " refused a sealed control message from rank " + std::to_string(source) +
                       ": " + seal::check_name(v.check()) + " check failed: " + v.what(),
                   true);
    return false;
  }
}

}  // namespace gradex::comm::ucx
