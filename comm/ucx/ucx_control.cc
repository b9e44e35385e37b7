// UcxCommunicator: the control plane. Control messages use the tags with bit 63 set; one receive
// for them is always posted and is serviced by progress(), so any rank that is inside a
// communicator call answers liveness probes and learns about other ranks' failures.
//   ping(seq)          -> pong(seq): "I am alive and progressing"
//   abort(rank, code)  : "I failed with `code` because of `rank`": the receiver fails too, naming
//                        the same rank, instead of waiting for its own timeout.
#include <algorithm>

#include "base/log.h"
#include "comm/ucx/ucx_communicator.h"

namespace gradex::comm::ucx {

void UcxCommunicator::post_control_recv() {
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FLAG_NO_IMM_CMPL;  // see UcxCommunicator::irecv
  ucs_status_ptr_t st = ucp_tag_recv_nbx(worker_->get(), &control_in_, sizeof(control_in_),
                                         kControlBit, kControlBit, &param);
  if (UCS_PTR_IS_ERR(st) || st == nullptr) {
    GX_LOG(kWarn) << "cannot post the control receive: " << ucs_status_string(UCS_PTR_STATUS(st));
    return;
  }
  control_recv_ = st;
}

void UcxCommunicator::handle_control(const ControlMessage& m, int source) {
  if (m.magic != kControlMagic || source < 0 || source >= size_) {
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
        GX_LOG(kInfo) << "rank " << source << " aborted because of rank " << m.subject;
      }
      break;
    default:
      GX_LOG(kWarn) << "ignoring a control message of unknown kind " << m.kind;
  }
}

void UcxCommunicator::send_control(int peer, uint32_t kind, int32_t subject, int32_t code) {
  Endpoint& ep = endpoints_[static_cast<size_t>(peer)];
  if (!ep.open() || peers_[static_cast<size_t>(peer)]->error != UCS_OK) return;
  control_sends_.push_back({ControlMessage{kControlMagic, kind, subject, code}, nullptr});
  ControlSend& cs = control_sends_.back();
  ucp_request_param_t param{};
  ucs_status_ptr_t st = ucp_tag_send_nbx(ep.get(), &cs.message, sizeof(cs.message),
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
