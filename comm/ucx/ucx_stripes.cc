// UcxCommunicator's striping: several endpoints (each its own TCP connection, hence its own flow
// and window) to one peer, chosen per message by the tag's lane (comm/communicator.h,
// kTagLaneShift). The receiver needs no part in it: UCX matches tags per worker, whichever
// connection a message came over, and the source rank is in the tag.
#include <algorithm>
#include <cmath>
#include <limits>

#include "base/log.h"
#include "comm/topology/regions.h"
#include "comm/topology/tcp_limits.h"
#include "comm/topology/tcp_pacing.h"
#include "comm/ucx/ucx_communicator.h"

namespace gradex::comm::ucx {
namespace {

// User tags below 2^16 are reserved (ucx_communicator.cc, ucx_hello.cc: 0, 1, 2).
constexpr uint64_t kStripeProbeTag = 3;  // rank 0's round-trip probe (auto)
constexpr uint64_t kStripeCountTag = 4;  // rank 0's decision (auto)
constexpr uint64_t kStripeHelloTag = 5;  // + tag_lane(s): one message each way on connection s
constexpr int kProbeRounds = 4;          // the first one untimed
// A probe ping's byte: another round follows, or this one is the last. Where the first round
// took kLongPathRoundTripMs or more, rank 0 times one more only: across a WAN each round costs the
// start-up a round trip, and the window's rule needs the round trip, not its jitter.
constexpr uint8_t kMoreRounds = 1, kLastRound = 0;

}  // namespace

int UcxCommunicator::agree_auto_stripes() {
  const std::string& host0 = rank_hosts_[0];
  const bool crosses = std::any_of(rank_hosts_.begin(), rank_hosts_.end(),
                                   [&](const std::string& h) { return h != host0; });
  if (!crosses) return 1;  // every rank sees the same hosts: nobody probes
  int32_t count = 1;
  const uint8_t answer = 0;
  if (rank_ == 0) {
    std::vector<int> far;
    for (int p = 1; p < size_; ++p)
      if (rank_hosts_[static_cast<size_t>(p)] != host0) far.push_back(p);
    std::vector<uint8_t> in(static_cast<size_t>(size_));
    double rtt_s = std::numeric_limits<double>::infinity();
    int rounds = kProbeRounds;
    for (int round = 0; round < rounds; ++round) {
      const uint8_t out = round + 1 < rounds ? kMoreRounds : kLastRound;
      const auto t0 = Clock::now();
      std::vector<RequestPtr> requests;
      for (int p : far) {
        requests.push_back(irecv(p, kStripeProbeTag, &in[static_cast<size_t>(p)], 1));
        requests.push_back(isend(p, kStripeProbeTag, &out, 1));
      }
      wait_all(requests, "connect");
      const double s = std::chrono::duration<double>(Clock::now() - t0).count();
      if (round > 0) rtt_s = std::min(rtt_s, s);  // the farthest peer's round trip, at best
      if (round == 0 && s * 1e3 >= kLongPathRoundTripMs) rounds = 2;
    }
    const TcpLimits limits = read_tcp_limits();
    count = stripes_for_path(limits, rtt_s, kStripeTargetBits, kAutoStripesMax);
    GX_LOG(kInfo) << "striping: round trip to the farthest peer " << rtt_s * 1e3 << " ms, one "
                  << "flow's window " << static_cast<uint64_t>(flow_window_bytes(limits))
                  << " B: " << count << " connection(s) to each peer on another host";
    std::vector<RequestPtr> requests;
    for (int p = 1; p < size_; ++p)
      requests.push_back(isend(p, kStripeCountTag, &count, sizeof(count)));
    wait_all(requests, "connect");
  } else {
    if (rank_hosts_[static_cast<size_t>(rank_)] != host0) {
      for (int round = 0; round < kProbeRounds; ++round) {
        uint8_t in = kLastRound;
        std::vector<RequestPtr> requests;
        requests.push_back(irecv(0, kStripeProbeTag, &in, 1));
        wait_all(requests, "connect");
        requests.clear();
        requests.push_back(isend(0, kStripeProbeTag, &answer, 1));
        wait_all(requests, "connect");
        if (in != kMoreRounds) break;  // rank 0's last round
      }
    }
    std::vector<RequestPtr> requests;
    requests.push_back(irecv(0, kStripeCountTag, &count, sizeof(count)));
    wait_all(requests, "connect");
    if (count < 1 || count > kStripesMax)
      throw CorruptPayload("connect: rank 0 sent a connection count of " + std::to_string(count));
  }
  return count;
}

void UcxCommunicator::connect_stripes() {
  const int wanted = options_.stripes;
  if (wanted < 0 || wanted > kStripesMax)
    throw InvalidArgument("CommOptions::stripes is " + std::to_string(wanted) + ", not in [0, " +
                          std::to_string(kStripesMax) + "] (0: auto)");
  stripe_endpoints_.clear();
  stripe_endpoints_.resize(static_cast<size_t>(size_));
  if (size_ == 1) return;
  const auto agree_from = Clock::now();
  stripes_ = wanted == 0 ? agree_auto_stripes() : wanted;
  GX_LOG(kDebug) << "stripes: " << stripes_ << " agreed in "
                 << log::ms_between(agree_from, Clock::now()) << " ms";
  if (stripes_ <= 1) return;
  const std::string& my_host = rank_hosts_[static_cast<size_t>(rank_)];
  std::vector<int> striped;
  for (int p = 0; p < size_; ++p) {
    const auto pi = static_cast<size_t>(p);
    // Both ends of a pair take the same decision: hosts and shared memory are symmetric.
    if (p == rank_ || shared_memory_peer_[pi]) continue;
    if (wanted == 0 && rank_hosts_[pi] == my_host) continue;  // auto stripes across hosts only
    ucp_ep_params_t params{};
    params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                        UCP_EP_PARAM_FIELD_ERR_HANDLER;
    params.address = reinterpret_cast<const ucp_address_t*>(peer_addresses_[pi].data());
    params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    params.err_handler.cb = &UcxCommunicator::on_endpoint_error;
    params.err_handler.arg = peers_[pi].get();
    for (int s = 1; s < stripes_; ++s)
      stripe_endpoints_[pi].emplace_back(worker_->get(), params, p);
    striped.push_back(p);
  }
  // One message each way on every extra connection, so that UCX wires each up (its TCP handshake
  // and UCX's own) while the next collectives run on the first connection; settled by progress().
  stripe_hello_in_.assign(striped.size() * static_cast<size_t>(stripes_), 0);
  stripes_started_ = Clock::now();
  for (size_t i = 0; i < striped.size(); ++i) {
    for (int s = 1; s < stripes_; ++s) {
      const uint64_t tag = kStripeHelloTag + tag_lane(static_cast<size_t>(s));
      stripe_hello_.push_back(
          irecv(striped[i], tag, &stripe_hello_in_[i * static_cast<size_t>(stripes_) + s], 1));
      stripe_hello_.push_back(isend(striped[i], tag, &stripe_hello_out_, 1));
    }
  }
  GX_LOG(kDebug) << stripes_ << " connections to each of " << striped.size() << " peer(s)";
}

void UcxCommunicator::settle_stripe_hello() {
  for (const RequestPtr& r : stripe_hello_)
    if (r && !poll_request(static_cast<UcxRequest&>(*r))) return;
  stripe_hello_.clear();
  const int paced = options_.tcp_pacing
                        ? pace_new_tcp_flows(sockets_paced_, kPacingNoCapBytesPerS, &sockets_paced_)
                        : 0;
  paced_flows_ += paced;
  GX_LOG(kDebug) << "the extra connections answered "
                 << log::ms_between(stripes_started_, Clock::now()) << " ms after they opened"
                 << (paced > 0 ? " (" + std::to_string(paced) + " more TCP flows paced)" : "");
}

ucp_ep_h UcxCommunicator::endpoint_for(int peer, uint64_t tag) const {
  const auto pi = static_cast<size_t>(peer);
  if (pi >= stripe_endpoints_.size() || stripe_endpoints_[pi].empty()) return endpoints_[pi].get();
  const std::vector<Endpoint>& extra = stripe_endpoints_[pi];
  const uint64_t lane = (tag >> kTagLaneShift) & (kTagLanes - 1);
  const size_t s = static_cast<size_t>(lane % (extra.size() + 1));
  return s == 0 ? endpoints_[pi].get() : extra[s - 1].get();
}

void UcxCommunicator::close_stripes(int peer, bool force, std::vector<void*>* closing) {
  const auto pi = static_cast<size_t>(peer);
  if (pi >= stripe_endpoints_.size()) return;
  for (Endpoint& ep : stripe_endpoints_[pi]) {
    if (!ep.open()) continue;
    if (void* req = ep.start_close(force)) closing->push_back(req);
  }
}

}  // namespace gradex::comm::ucx
