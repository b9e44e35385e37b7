// UcxCommunicator: the control plane. Control messages use the tags with bit 63 set; one receive
// for them is always posted and is serviced by progress(), so any rank that is inside a
// communicator call answers liveness probes and learns about other ranks' failures.
//   ping(seq)          -> pong(seq): "I am alive and progressing"
//   abort(rank, code, text): "I failed with `code` because of `rank` (myself: an error of my own,
//                        Communicator::abort), and `text` says what happened": the receiver
//                        fails too, naming the same rank and carrying the text, instead of
//                        waiting for its own timeout.
#include <algorithm>
#include <cstring>

#include "base/log.h"
#include "comm/ucx/ucx_communicator.h"

namespace gradex::comm::ucx {

void UcxCommunicator::post_control_recv() {
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FLAG_NO_IMM_CMPL;  // see UcxCommunicator::irecv
  ucs_status_ptr_t st = ucp_tag_recv_nbx(worker_->get(), control_in_.data(), control_in_.size(),
                                         kControlBit, kControlBit, &param);
  if (UCS_PTR_IS_ERR(st) || st == nullptr) {
    GX_LOG(kWarn) << "cannot post the control receive: " << ucs_status_string(UCS_PTR_STATUS(st));
    return;
  }
  control_recv_ = st;
}

void UcxCommunicator::handle_control(const ControlMessage& m, size_t length, int source) {
  if (length < kControlHeaderBytes || m.magic != kControlMagic || source < 0 || source >= size_ ||
      m.text_length > kAbortMessageMax || length != kControlHeaderBytes + m.text_length) {
    GX_LOG(kWarn) << "ignoring a malformed control message (source " << source << ")";
    return;
  }
  switch (m.kind) {
    case kControlPing:
      send_control(source, kControlPong, m.subject, 0);
      break;
    case kControlPong:
      pong_seq_[static_cast<size_t>(source)] =
          std::max(pong_seq_[static_cast<size_t>(source)], m.subject);
      break;
    case kControlAbort:
      if (abort_from_ < 0) {
        abort_from_ = source;
        abort_blamed_ = m.subject;
        abort_code_ = static_cast<ErrorCode>(m.code);
        abort_text_.assign(m.text, m.text_length);
        abort_seen_ = Clock::now();
        abort_grace_until_ = abort_seen_ + kAbortGrace;
        GX_LOG(kInfo) << "rank " << source << " aborted because of rank " << m.subject << ": "
                      << abort_text_;
      }
      break;
    default:
      GX_LOG(kWarn) << "ignoring a control message of unknown kind " << m.kind;
  }
}

void UcxCommunicator::send_control(int peer, uint32_t kind, int32_t subject, int32_t code,
                                   const std::string& text) {
  if (endpoints_.size() != static_cast<size_t>(size_)) return;  // not connected yet
  Endpoint& ep = endpoints_[static_cast<size_t>(peer)];
  if (!ep.open() || peers_[static_cast<size_t>(peer)]->error != UCS_OK) return;
  control_sends_.push_back({ControlMessage{}, nullptr, {}});
  ControlSend& cs = control_sends_.back();
  cs.message.magic = kControlMagic;
  cs.message.kind = kind;
  cs.message.subject = subject;
  cs.message.code = code;
  cs.message.text_length = static_cast<uint32_t>(std::min(text.size(), kAbortMessageMax));
  std::memcpy(cs.message.text, text.data(), cs.message.text_length);
  const void* wire = &cs.message;
  size_t wire_bytes = kControlHeaderBytes + cs.message.text_length;
  if (PeerSeal* s = seal_for(peer)) {
    // Sealed like any message, under the control tag (its own user tag for the frame's AAD).
    cs.frame.resize(wire_bytes + seal::kOverheadBytes);
    s->sealer.seal(kControlBit, &cs.message, wire_bytes, cs.frame.data());
    wire = cs.frame.data();
    wire_bytes = cs.frame.size();
  }
  ucp_request_param_t param{};
  ucs_status_ptr_t st = ucp_tag_send_nbx(ep.get(), wire, wire_bytes,
                                         kControlBit | static_cast<uint64_t>(rank_), &param);
  if (st == nullptr || UCS_PTR_IS_ERR(st)) {
    control_sends_.pop_back();  // done (or failed: the peer is gone, nothing to tell it)
    return;
  }
  cs.handle = st;
}

void UcxCommunicator::reap_control_sends(bool all, Clock::time_point deadline) {
  while (true) {
    for (auto it = control_sends_.begin(); it != control_sends_.end();) {
      if (ucp_request_check_status(it->handle) != UCS_INPROGRESS) {
        ucp_request_free(it->handle);
        it = control_sends_.erase(it);
      } else {
        ++it;
      }
    }
    if (!all || control_sends_.empty()) return;
    if (Clock::now() >= deadline) {
      // Release what is left to UCX (the endpoint close completes it). The message buffers must
      // then outlive the worker: keep them in the list, they are freed with the communicator.
      for (auto& cs : control_sends_)
        if (cs.handle != nullptr) ucp_request_free(cs.handle);
      for (auto& cs : control_sends_)
        cs.handle = nullptr;
      abandoned_control_.splice(abandoned_control_.end(), control_sends_);
      return;
    }
    ucp_worker_progress(worker_->get());
  }
}

void UcxCommunicator::notify_abort(int32_t blamed, ErrorCode code, const std::string& text) {
  if (notified_peers_ || abort_from_ >= 0) return;  // announced already, or a peer's failure
  notified_peers_ = true;
  for (int p = 0; p < size_; ++p)
    if (p != rank_) send_control(p, kControlAbort, blamed, static_cast<int32_t>(code), text);
}

void UcxCommunicator::abort(ErrorCode code, const std::string& message) {
  if (code == ErrorCode::kOk) code = ErrorCode::kInternal;
  try {
    progress();  // a notice that already arrived names the first failure: do not announce another
  } catch (const std::exception&) {
  }
  if (failure_code_ == ErrorCode::kOk && abort_from_ < 0) {
    failure_code_ = code;
    failure_peer_ = rank_;
    failure_what_ = message;
  }
  if (size_ == 1) return;
  notify_abort(rank_, code, message);
  reap_control_sends(true, Clock::now() + Millis(200));
}

void UcxCommunicator::interrupt(ErrorCode code, const std::string& message) {
  std::lock_guard<std::mutex> lock(interrupt_mutex_);
  if (interrupted_.load()) return;  // the first reason is the one reported
  interrupt_code_ = code == ErrorCode::kOk ? ErrorCode::kAborted : code;
  interrupt_text_ = message;
  interrupted_.store(true, std::memory_order_release);
}

void UcxCommunicator::take_interrupt(const char* operation,
                                     const std::vector<UcxRequest*>& pending) {
  if (!interrupted_.load(std::memory_order_acquire)) return;
  ErrorCode code;
  std::string text;
  {
    std::lock_guard<std::mutex> lock(interrupt_mutex_);
    code = interrupt_code_;
    text = interrupt_text_;
  }
  abort(code, text);  // the peers learn it now (once); later calls find the communicator failed
  abandon(pending);
  throw Error(code, std::string(operation) + ": " + text);
}

std::vector<int> UcxCommunicator::unresponsive_peers() {
  static const char* const kOperation = "liveness probe";
  take_interrupt(kOperation, {});
  check_usable(kOperation, rank_);
  std::vector<int> silent = probe_unresponsive();
  throw_if_failed(kOperation, {});  // a notice or an endpoint error may have come meanwhile
  return silent;
}

std::vector<int> UcxCommunicator::probe_unresponsive() {
  int32_t seq = ++probe_seq_;
  for (int p = 0; p < size_; ++p)
    if (p != rank_) send_control(p, kControlPing, seq, 0);
  auto grace = std::clamp<Millis>(options_.timeout / 4, Millis(200), Millis(2000));
  auto deadline = Clock::now() + grace;
  auto silent = [&] {
    std::vector<int> out;
    for (int p = 0; p < size_; ++p)
      if (p != rank_ && pong_seq_[static_cast<size_t>(p)] < seq) out.push_back(p);
    return out;
  };
  while (Clock::now() < deadline && !silent().empty() && abort_from_ < 0)
    progress();
  return silent();
}

}  // namespace gradex::comm::ucx
