// UcxCommunicator: tagged messages, progress, completion, timeouts and failure handling.
#include <algorithm>
#include <thread>

#include "base/check.h"
#include "base/log.h"

#include "comm/topology/host_identity.h"
#include "comm/topology/tcp_pacing.h"
#include "comm/ucx/ucx_communicator.h"

namespace gradex::comm::ucx {
namespace {

uint64_t wire_tag(uint64_t user_tag, int source) {
  return (user_tag << kRankBits) | static_cast<uint64_t>(source);
}

std::string seconds(Millis t) {
  return format_seconds(static_cast<double>(t.count()) / 1000.0);
}

std::string status_detail(ucs_status_t st) {
  return std::string("UCX reported: ") + ucs_status_string(st);
}

}  // namespace

UcxRequest::~UcxRequest() {
  if (handle_ != nullptr && owner_ != nullptr) owner_->abandon({this});
  if (queued_ && owner_ != nullptr) owner_->unqueue(*this);
  if (frame_ && owner_ != nullptr) owner_->recycle_frame(*this);
}

void UcxCommunicator::check_usable(const char* operation, int peer) const {
  GX_CHECK(peer >= 0 && peer < size_);
  if (failure_code_ != ErrorCode::kOk) {
    std::string detail = "the communicator is unusable after an earlier failure: " + failure_what_;
    if (failure_code_ == ErrorCode::kTimeout) throw TimeoutError(operation, failure_peer_, detail);
    if (failure_code_ == ErrorCode::kPeer) throw PeerError(operation, failure_peer_, detail);
    // A failure of the job itself (Communicator::abort here or on a peer): its own kind.
    throw Error(failure_code_, std::string(operation) + ": " + detail);
  }
  if (!endpoints_[static_cast<size_t>(peer)].open())
    throw PeerError(operation, peer, "the endpoint to this rank was closed");
}

RequestPtr UcxCommunicator::isend(int peer, uint64_t tag, const void* data, size_t bytes) {
  take_interrupt("send", {});
  check_usable("send", peer);
  GX_CHECK_LT(tag, kUserTagLimit);
  std::unique_ptr<UcxRequest> req(new UcxRequest(this, peer, false));
  const void* wire = data;
  size_t wire_bytes = bytes;
  if (PeerSeal* s = seal_for(peer)) {
    seal_send(*req, *s, tag, data, bytes);
    wire = req->frame_.get();
    wire_bytes = req->frame_bytes_;
  }
  ucp_request_param_t param{};
  ucs_status_ptr_t st =
      ucp_tag_send_nbx(endpoint_for(peer, tag), wire, wire_bytes, wire_tag(tag, rank_), &param);
  if (st == nullptr) {
    req->status_ = UCS_OK;
  } else if (UCS_PTR_IS_ERR(st)) {
    req->status_ = UCS_PTR_STATUS(st);  // reported by test / wait_all, with the operation name
  } else {
    req->handle_ = st;
  }
  bytes_sent_ += bytes;
  return req;
}

RequestPtr UcxCommunicator::irecv(int peer, uint64_t tag, void* data, size_t bytes) {
  take_interrupt("receive", {});
  check_usable("receive", peer);
  GX_CHECK_LT(tag, kUserTagLimit);
  std::unique_ptr<UcxRequest> req(new UcxRequest(this, peer, true));
  req->posted_bytes_ = bytes;
  void* landing = data;
  size_t landing_bytes = bytes;
  if (PeerSeal* s = seal_for(peer)) {
    // The frame lands in a buffer of its own and is opened into `data` (ucx_seal.cc).
    req->sealed_ = true;
    req->user_data_ = data;
    req->user_tag_ = tag;
    req->frame_bytes_ = bytes + seal::kOverheadBytes;
    req->frame_ = frame_pool_.acquire(req->frame_bytes_);
    landing = req->frame_.get();
    landing_bytes = req->frame_bytes_;
    s->open_queue[tag].push_back(req.get());
    req->queued_ = true;
  }
  ucp_request_param_t param{};
  // No immediate completion: UCX 1.13 does not fill recv_info when it completes a receive inside
  // ucp_tag_recv_nbx, so the length always comes from ucp_tag_recv_request_test.
  param.op_attr_mask = UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
  // Full mask: the source rank in the low bits selects exactly one peer.
  ucs_status_ptr_t st = ucp_tag_recv_nbx(worker_->get(), landing, landing_bytes,
                                         wire_tag(tag, peer), ~uint64_t{0}, &param);
  GX_CHECK(st != nullptr);  // NO_IMM_CMPL: UCX always hands back a request or an error
  if (UCS_PTR_IS_ERR(st)) {
    req->status_ = UCS_PTR_STATUS(st);
  } else {
    req->handle_ = st;
  }
  return req;
}

RequestPtr UcxCommunicator::irecv_any_length(int peer, uint64_t tag, Bytes& out, size_t max_bytes) {
  take_interrupt("receive", {});
  check_usable("receive", peer);
  GX_CHECK_LT(tag, kUserTagLimit);
  std::unique_ptr<UcxRequest> req(new UcxRequest(this, peer, true));
  req->probing_ = true;
  req->probe_tag_ = wire_tag(tag, peer);
  req->any_length_out_ = &out;
  req->any_length_max_ = max_bytes;
  if (PeerSeal* s = seal_for(peer)) {
    req->sealed_ = true;
    req->user_tag_ = tag;
    s->open_queue[tag].push_back(req.get());
    req->queued_ = true;
  }
  return req;
}

bool UcxCommunicator::take_probed_message(UcxRequest& r) {
  ucp_tag_recv_info_t info{};
  // Full mask: exactly this peer's message with this tag; removed from UCX's unexpected queue, so
  // it is this request's alone.
  ucp_tag_message_h message =
      ucp_tag_probe_nb(worker_->get(), r.probe_tag_, ~uint64_t{0}, /*remove=*/1, &info);
  if (message == nullptr) return false;
  r.probing_ = false;
  // A longer message than the caller allows is received truncated (UCX consumes it whole and
  // reports UCS_ERR_MESSAGE_TRUNCATED: the MismatchError of a short buffer).
  void* landing = nullptr;
  size_t bytes = 0;
  if (r.sealed_) {
    // The frame lands in a buffer of its own; the caller's is sized when it is opened.
    r.frame_bytes_ = std::min(info.length, r.any_length_max_ + seal::kOverheadBytes);
    r.frame_ = frame_pool_.acquire(r.frame_bytes_);
    r.posted_bytes_ = r.frame_bytes_ - std::min(r.frame_bytes_, seal::kOverheadBytes);
    landing = r.frame_.get();
    bytes = r.frame_bytes_;
  } else {
    bytes = std::min(info.length, r.any_length_max_);
    r.any_length_out_->resize(bytes);
    r.posted_bytes_ = bytes;
    landing = r.any_length_out_->data();
  }
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FLAG_NO_IMM_CMPL;  // the length comes from the request test
  ucs_status_ptr_t st = ucp_tag_msg_recv_nbx(worker_->get(), landing, bytes, message, &param);
  GX_CHECK(st != nullptr);  // NO_IMM_CMPL: UCX always hands back a request or an error
  if (UCS_PTR_IS_ERR(st)) {
    r.status_ = UCS_PTR_STATUS(st);
  } else {
    r.handle_ = st;
  }
  return true;
}

bool UcxCommunicator::poll_request(UcxRequest& r) {
  return r.queued_ ? poll_sealed_receive(r) : poll_transport(r);
}

bool UcxCommunicator::poll_transport(UcxRequest& r) {
  if (r.probing_ && !take_probed_message(r)) return false;
  if (r.handle_ == nullptr) return true;
  ucs_status_t st = r.is_recv_ ? ucp_tag_recv_request_test(r.handle_, &r.info_)
                               : ucp_request_check_status(r.handle_);
  if (st == UCS_INPROGRESS) return false;
  r.status_ = st;
  ucp_request_free(r.handle_);
  r.handle_ = nullptr;
  if (!r.is_recv_ && r.frame_) recycle_frame(r);  // UCX no longer reads the sent frame
  if (r.is_recv_ && st == UCS_OK && !r.sealed_) bytes_received_ += r.info_.length;
  return true;
}

void UcxCommunicator::pace_late_sockets() {
  if (!late_pacing_) return;
  const auto now = Clock::now();
  if (now >= late_pacing_until_) {
    late_pacing_ = false;
    return;
  }
  if (now < late_pacing_next_) return;
  late_pacing_next_ = now + kLatePacingEvery;
  paced_flows_ += pace_new_tcp_flows(sockets_paced_, kPacingNoCapBytesPerS, &sockets_paced_);
}

bool UcxCommunicator::progress() {
  bool any = ucp_worker_progress(worker_->get()) != 0;
  if (!stripe_hello_.empty()) settle_stripe_hello();
  if (stripe_hello_.empty()) pace_late_sockets();
  if (control_recv_ != nullptr) {
    ucs_status_t st = ucp_tag_recv_request_test(control_recv_, &control_info_);
    if (st != UCS_INPROGRESS) {
      ucp_request_free(control_recv_);
      control_recv_ = nullptr;
      ControlMessage message;
      size_t length = 0;
      const int source = static_cast<int>(control_info_.sender_tag & kRankMask);
      if (st == UCS_OK && open_control(control_info_.length, source, &message, &length))
        handle_control(message, length, source);
      if (!closing_) post_control_recv();
      any = true;
    }
  }
  if (!control_sends_.empty()) reap_control_sends(false, Clock::now());
  return any;
}

void UcxCommunicator::idle(int* idle_rounds, Clock::time_point deadline) {
  // Several ranks may share a core (e.g. 4 ranks on 2 cores; ranks as threads in tests): spin
  // briefly, then sleep in the kernel until the worker has an event, so a waiting rank hands its
  // core to the rank it waits for. Completions and control messages are worker events; the sleep
  // is still capped (kEventSleepMax) so that a completion a transport does not signal costs
  // latency, never a hang. Without an event fd: yield, then short sleeps.
  constexpr Millis kEventSleepMax(10);
  ++*idle_rounds;
  if (*idle_rounds < 64) return;
  auto left = std::chrono::ceil<Millis>(deadline - Clock::now());
  if (sleep_on_events(-1, std::clamp(left, Millis(1), kEventSleepMax))) return;
  if (*idle_rounds < 4096) {
    std::this_thread::yield();
  } else {
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

void UcxCommunicator::throw_truncated(const UcxRequest& r, const char* operation) const {
  // The peer sent more than the caller expects: ranks disagree on what this collective holds.
  // The message was consumed whole, so the streams stay in step.
  throw MismatchError(std::string(operation) + ": rank " + std::to_string(rank_) +
                      " received a message from rank " + std::to_string(r.peer_) +
                      " longer than the " + std::to_string(r.posted_bytes_) +
                      " bytes expected: ranks " + std::to_string(r.peer_) + " and " +
                      std::to_string(rank_) + " disagree on the collective's sizes");
}

bool UcxCommunicator::test(Request& request, const char* operation) {
  auto& r = static_cast<UcxRequest&>(request);
  GX_CHECK(r.owner_ == this);
  take_interrupt(operation, {&r});
  if (!poll_request(r)) return false;
  if (r.is_recv_ && r.status_ == UCS_ERR_MESSAGE_TRUNCATED) throw_truncated(r, operation);
  if (!r.seal_failure_.empty()) fail_sealed(r, operation, {});
  if (r.status_ != UCS_OK) {
    std::vector<UcxRequest*> none;
    fail(ErrorCode::kPeer, operation, r.peer_, status_detail(r.status_), none, true);
  }
  return true;
}

size_t UcxCommunicator::recv_length(const Request& request) const {
  const auto& r = static_cast<const UcxRequest&>(request);
  GX_CHECK(r.is_recv_);
  GX_CHECK(r.handle_ == nullptr && r.status_ == UCS_OK);
  return r.sealed_ ? r.payload_length_ : r.info_.length;
}

void UcxCommunicator::wait_all(std::vector<RequestPtr>& requests, const char* operation) {
  std::vector<UcxRequest*> pending;
  for (auto& r : requests) {
    if (!r) continue;
    auto* u = static_cast<UcxRequest*>(r.get());
    GX_CHECK(u->owner_ == this);
    pending.push_back(u);
  }
  // The timeout measures time without progress: any completion restarts it.
  auto deadline = Clock::now() + options_.timeout;
  int idle_rounds = 0;
  while (true) {
    size_t before = pending.size();
    for (size_t i = 0; i < pending.size();) {
      UcxRequest* r = pending[i];
      if (!poll_request(*r)) {
        ++i;
        continue;
      }
      if (r->is_recv_ && r->status_ == UCS_ERR_MESSAGE_TRUNCATED) {
        // The peer sent more than the caller expects: ranks disagree on what this collective
        // holds. The message was consumed whole, so the streams stay in step.
        pending.erase(pending.begin() + static_cast<std::ptrdiff_t>(i));
        abandon(pending);
        throw_truncated(*r, operation);
      }
      if (!r->seal_failure_.empty()) {
        pending.erase(pending.begin() + static_cast<std::ptrdiff_t>(i));
        fail_sealed(*r, operation, pending);
      }
      if (r->status_ != UCS_OK) {
        int peer = r->peer_;
        ucs_status_t ep_error = peers_[static_cast<size_t>(peer)]->error;
        pending.erase(pending.begin() + static_cast<std::ptrdiff_t>(i));
        std::string detail = status_detail(r->status_);
        if (ep_error != UCS_OK)
          detail += " (its endpoint failed: " + std::string(ucs_status_string(ep_error)) + ")";
        // The root cause may be in a notice just behind the failure: raise it if it comes (no
        // grace: what it overtook is this failed request).
        await_abort_notice();
        if (abort_from_ >= 0) {
          abort_grace_until_ = Clock::now();
          throw_if_failed(operation, pending);
        }
        fail(ErrorCode::kPeer, operation, peer, detail, pending, true);
      }
      pending.erase(pending.begin() + static_cast<std::ptrdiff_t>(i));
    }
    if (pending.empty()) return;
    if (pending.size() != before) {
      deadline = Clock::now() + options_.timeout;
      if (abort_from_ >= 0)
        abort_grace_until_ = std::min(abort_seen_ + kAbortGraceMax, Clock::now() + kAbortGrace);
    }
    throw_if_failed(operation, pending);
    if (progress()) {
      idle_rounds = 0;
      continue;
    }
    idle(&idle_rounds, deadline);
    if (Clock::now() < deadline) continue;

    int waited = pending.front()->peer_;
    std::vector<int> silent = probe_unresponsive();
    throw_if_failed(operation, pending);  // a notice or endpoint error may have come meanwhile
    int blamed = waited;
    if (!silent.empty() && std::find(silent.begin(), silent.end(), waited) == silent.end())
      blamed = silent.front();
    std::string detail = "no progress for " + seconds(options_.timeout) + " waiting for rank " +
                         std::to_string(waited) + " (" + std::to_string(pending.size()) +
                         " request(s) pending)";
    if (silent.empty()) {
      detail += "; every rank answered a liveness probe (ranks calling different collectives?)";
    } else {
      detail += "; ranks not answering a liveness probe (stopped, hung or dead):";
      for (int s : silent)
        detail += " " + std::to_string(s);
    }
    fail(ErrorCode::kTimeout, operation, blamed, detail, pending, true);
  }
}

void UcxCommunicator::throw_if_failed(const char* operation,
                                      const std::vector<UcxRequest*>& pending) {
  take_interrupt(operation, pending);
  if (failure_code_ != ErrorCode::kOk) {
    abandon(pending);
    check_usable(operation, rank_);
  }
  check_shared_memory_peers();
  int failed_peer = -1;
  for (int p = 0; p < size_ && failed_peer < 0; ++p)
    if (peers_[static_cast<size_t>(p)]->error != UCS_OK) failed_peer = p;
  if (failed_peer >= 0) await_abort_notice();
  if (abort_from_ >= 0 && !pending.empty() && Clock::now() < abort_grace_until_)
    return;  // kAbortGrace: what the notice overtook may still arrive
  if (abort_from_ >= 0 && abort_blamed_ == abort_from_ && !abort_text_.empty()) {
    // The sender's own error (Communicator::abort): every rank raises it, naming that rank.
    const ErrorCode code = abort_code_ == ErrorCode::kOk ? ErrorCode::kInternal : abort_code_;
    std::string what = "rank " + std::to_string(abort_from_) + " failed (" + error_code_name(code) +
                       "): " + abort_text_;
    if (failure_code_ == ErrorCode::kOk) {
      failure_code_ = code;
      failure_peer_ = abort_from_;
      failure_what_ = what;  // logged by the failing rank and by whoever handles this error
    }
    abandon(pending);
    if (code == ErrorCode::kTimeout) throw TimeoutError(operation, abort_from_, what);
    if (code == ErrorCode::kPeer) throw PeerError(operation, abort_from_, what);
    throw Error(code, std::string(operation) + ": " + what);
  }
  if (abort_from_ >= 0) {
    std::string detail =
        abort_blamed_ == abort_from_
            ? "rank " + std::to_string(abort_from_) + " left after an error of its own"
            : "rank " + std::to_string(abort_from_) + " aborted: it saw a " +
                  error_code_name(abort_code_) + " involving rank " + std::to_string(abort_blamed_);
    fail(abort_code_ == ErrorCode::kTimeout ? ErrorCode::kTimeout : ErrorCode::kPeer, operation,
         abort_blamed_, detail, pending, false);
  }
  if (failed_peer >= 0) {
    fail(ErrorCode::kPeer, operation, failed_peer,
         failed_peer == peer_process_gone_
             ? std::string("this rank's process on the same host (shared memory) has exited")
             : std::string("the endpoint to this rank failed (process died or network failed): ") +
                   ucs_status_string(peers_[static_cast<size_t>(failed_peer)]->error),
         pending, true);
  }
}

void UcxCommunicator::await_abort_notice() {
  const auto until = Clock::now() + Millis(100);
  while (abort_from_ < 0 && Clock::now() < until)
    progress();
}

void UcxCommunicator::check_shared_memory_peers() {
  const auto now = Clock::now();
  if (now < next_process_check_) return;
  next_process_check_ = now + Millis(100);
  for (int p = 0; p < size_; ++p) {
    const auto pi = static_cast<size_t>(p);
    if (p == rank_ || !shared_memory_peer_[pi] || peers_[pi]->error != UCS_OK) continue;
    if (!process_alive(rank_processes_[pi])) {
      GX_LOG(kWarn) << "rank " << p << " (same host, shared memory) no longer exists";
      peers_[pi]->error = UCS_ERR_CONNECTION_RESET;
      peer_process_gone_ = p;
    }
  }
}

void UcxCommunicator::fail(ErrorCode code, const std::string& operation, int peer,
                           const std::string& detail, const std::vector<UcxRequest*>& pending,
                           bool notify_peers) {
  std::string what;
  if (code == ErrorCode::kTimeout) {
    what = TimeoutError(operation, peer, detail).what();
  } else {
    what = PeerError(operation, peer, detail).what();
  }
  record_failure(code, peer, what, notify_peers);
  abandon(pending);
  reap_control_sends(true, Clock::now() + Millis(200));
  if (code == ErrorCode::kTimeout) throw TimeoutError(operation, peer, detail);
  throw PeerError(operation, peer, detail);
}

void UcxCommunicator::record_failure(ErrorCode code, int peer, const std::string& what,
                                     bool notify_peers) {
  if (failure_code_ != ErrorCode::kOk) return;  // the first failure is the one every rank reports
  failure_code_ = code;
  failure_peer_ = peer;
  failure_what_ = what;
  GX_LOG(kError) << what;  // logged once, where first detected
  if (notify_peers) notify_abort(peer, code, what);
}

void UcxCommunicator::abandon(const std::vector<UcxRequest*>& requests) {
  std::vector<UcxRequest*> live;
  for (UcxRequest* r : requests) {
    if (r->handle_ == nullptr) continue;
    ucp_request_cancel(worker_->get(), r->handle_);
    live.push_back(r);
  }
  auto start = Clock::now();
  bool forced = false;
  while (!live.empty() && Clock::now() < start + Millis(2000)) {
    ucp_worker_progress(worker_->get());
    live.erase(
        std::remove_if(live.begin(), live.end(), [&](UcxRequest* r) { return poll_transport(*r); }),
        live.end());
    if (!forced && !live.empty() && Clock::now() > start + Millis(100)) {
      // A send already handed to the transport (e.g. a rendezvous the peer never fetched) cannot
      // be cancelled: force-closing its endpoint completes it. That peer's message stream is out
      // of step from now on, so the communicator is marked failed.
      forced = true;
      for (UcxRequest* r : live) {
        Endpoint& ep = endpoints_[static_cast<size_t>(r->peer_)];
        if (r->is_recv_ || !ep.open()) continue;
        std::vector<void*> closing;
        close_stripes(r->peer_, true, &closing);
        if (void* req = ep.start_close(true)) closing.push_back(req);
        for (void* req : closing)
          ucp_request_free(req);
        if (failure_code_ == ErrorCode::kOk) {
          failure_code_ = ErrorCode::kPeer;
          failure_peer_ = r->peer_;
          failure_what_ = "a send to rank " + std::to_string(r->peer_) + " was abandoned";
        }
      }
    }
    if (forced && std::all_of(live.begin(), live.end(), [&](UcxRequest* r) {
          return shared_memory_peer_[static_cast<size_t>(r->peer_)];
        }))
      break;  // nothing completes these: release them below instead of waiting
  }
  for (UcxRequest* r : live) {
    GX_LOG(kError) << "a request with rank " << r->peer_
                   << " is still in flight after cancellation; releasing it to UCX";
    ucp_request_free(r->handle_);
    r->handle_ = nullptr;
    r->status_ = UCS_ERR_CANCELED;
    // UCX may still write or read a frame it was handed: never reused (left to the process).
    if (r->frame_) static_cast<void>(r->frame_.data.release());
  }
}

}  // namespace gradex::comm::ucx
