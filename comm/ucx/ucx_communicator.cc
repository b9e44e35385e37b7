// UcxCommunicator: construction (addresses through the store, endpoints, a hello round) and
// teardown (bounded endpoint close).
#include "comm/ucx/ucx_communicator.h"

#include "comm/auth.h"
#include "comm/host_identity.h"

#include <cstring>
#include <exception>

#include "base/check.h"
#include "base/log.h"

namespace gradex::comm::ucx {
namespace {

constexpr uint32_t kHelloMagic = 0x4c484758;  // "XGHL"
// User tags below 2^16 are reserved: next_collective_tag() starts at 2^16.
constexpr uint64_t kHelloTag = 0;    // the hello round after connecting
constexpr uint64_t kGoodbyeTag = 1;  // the barrier before closing endpoints
constexpr uint64_t kProofTag = 2;    // the challenge-response round (with a job secret)

constexpr const char* kAddressLabel = "gradex ucx address";
constexpr const char* kPeerLabel = "gradex ucx peer";

struct Hello {
  uint32_t magic;
  uint32_t world_size;
  uint32_t rank;
  uint32_t has_secret;  // 1 when this rank holds a job secret
  auth::Nonce nonce;    // fresh per connection: the challenge the peer must answer
};

// The proof that `from` knows the secret, answering `to`'s challenge in a world of `world`.
auth::Mac peer_proof(const std::string& secret, uint32_t from, uint32_t to, uint32_t world,
                     const auth::Nonce& challenge, const auth::Nonce& own) {
  return auth::hmac(
      secret, kPeerLabel,
      {auth::Part(&from, 4), auth::Part(&to, 4), auth::Part(&world, 4), challenge, own});
}

// Binds a published address entry to the rank and world size it claims, under the secret.
auth::Mac address_proof(const std::string& secret, uint32_t rank, uint32_t world,
                        const std::string& host, const uint8_t* address, size_t size) {
  return auth::hmac(secret, kAddressLabel,
                    {auth::Part(&rank, 4), auth::Part(&world, 4), host, auth::Part(address, size)});
}

[[noreturn]] void refuse(int self, int peer, const std::string& host, const std::string& why) {
  std::string where = host.substr(0, host.find('|'));
  std::string msg = "connect: authentication failed: rank " + std::to_string(peer) +
                    (where.empty() ? "" : " (host " + where + ")") + " " + why;
  GX_LOG(kWarn) << "rank " << self << " refuses a peer: " << msg.substr(9);
  throw ConfigError(msg);
}

std::string address_key(int rank) {
  return "gradex/ucx/address/" + std::to_string(rank);
}

Millis left_until(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<Millis>(deadline - Clock::now());
  return left.count() > 0 ? left : Millis(0);
}

}  // namespace

UcxCommunicator::UcxCommunicator(std::shared_ptr<Store> store, int rank, int world_size,
                                 const CommOptions& options)
    : rank_(rank), size_(world_size), options_(options) {
  GX_CHECK(store != nullptr);
  if (world_size < 1 || static_cast<uint64_t>(world_size) > kRankMask)
    throw InvalidArgument("world size " + std::to_string(world_size) + " is out of range [1, " +
                          std::to_string(kRankMask) + "]");
  if (rank < 0 || rank >= world_size)
    throw InvalidArgument("rank " + std::to_string(rank) + " is not in [0, " +
                          std::to_string(world_size) + ")");
  if (options_.ring_chunk_bytes == 0)
    throw InvalidArgument("CommOptions::ring_chunk_bytes must be positive");
  log::set_rank(rank);
  // GRADEX_IFACE goes to UCX through its config object: setting UCX_NET_DEVICES in the
  // environment would leak into other UCX users of the process.
  if (!options_.iface.empty()) config_.modify("NET_DEVICES", options_.iface);
  context_ = std::make_unique<Context>(config_);
  for (int p = 0; p < size_; ++p)
    peers_.push_back(std::unique_ptr<PeerSlot>(new PeerSlot{this, p}));
  worker_ = std::make_unique<Worker>(*context_);
  if (ucp_worker_get_efd(worker_->get(), &event_fd_) != UCS_OK) event_fd_ = -1;
  pong_seq_.assign(static_cast<size_t>(size_), 0);
  try {
    post_control_recv();
    connect_endpoints(*store);
    exchange_hello();
    bytes_sent_ = bytes_received_ = 0;  // the counters report collective traffic only
  } catch (...) {
    shutdown();  // the destructor does not run for a half-built object
    throw;
  }
  GX_LOG(kInfo) << "UCX communicator ready: rank " << rank_ << " of " << size_;
}

void UcxCommunicator::connect_endpoints(Store& store) {
  auto deadline = Clock::now() + options_.timeout;
  {
    // Published as [u32 world size][u32 n][host identity, n bytes][u32 m][m-byte HMAC][worker
    // address]: a rank started with another world size is caught by the first peer that reads its
    // entry, peers on the same host can choose shared memory, and with a job secret the HMAC
    // (m = 32) binds the address to this rank, so an address written by someone without the
    // secret is refused before any endpoint is created (m = 0 without a secret).
    WorkerAddress address(*worker_);
    const std::string host = host_identity();
    const std::string& secret = options_.job_secret;
    Bytes mac;
    if (!secret.empty()) {
      auth::Mac m =
          address_proof(secret, static_cast<uint32_t>(rank_), static_cast<uint32_t>(size_), host,
                        static_cast<const uint8_t*>(address.data()), address.size());
      mac.assign(m.begin(), m.end());
    }
    Bytes entry(12 + host.size() + mac.size() + address.size());
    uint32_t world = static_cast<uint32_t>(size_);
    uint32_t host_len = static_cast<uint32_t>(host.size());
    uint32_t mac_len = static_cast<uint32_t>(mac.size());
    uint8_t* p = entry.data();
    std::memcpy(p, &world, 4);
    std::memcpy(p + 4, &host_len, 4);
    std::memcpy(p + 8, host.data(), host.size());
    std::memcpy(p + 8 + host.size(), &mac_len, 4);
    if (!mac.empty()) std::memcpy(p + 12 + host.size(), mac.data(), mac.size());
    std::memcpy(p + 12 + host.size() + mac.size(), address.data(), address.size());
    store.set(address_key(rank_), entry);
  }
  endpoints_.resize(static_cast<size_t>(size_));
  shared_memory_peer_.assign(static_cast<size_t>(size_), false);
  for (int i = 0; i < size_; ++i) {
    // Start with the next rank so that ranks do not all wait for rank 0's key first.
    int p = (rank_ + i) % size_;
    Bytes remote = store.get(address_key(p), left_until(deadline));
    uint32_t world = 0, host_len = 0, mac_len = 0;
    if (remote.size() >= 12) std::memcpy(&host_len, remote.data() + 4, 4);
    if (remote.size() < 12 || host_len > remote.size() - 12)
      throw CorruptPayload("connect: malformed address entry for rank " + std::to_string(p));
    std::memcpy(&mac_len, remote.data() + 8 + host_len, 4);
    const size_t address_at = 12 + size_t{host_len} + mac_len;
    if ((mac_len != 0 && mac_len != auth::kMacBytes) || address_at >= remote.size())
      throw CorruptPayload("connect: malformed address entry for rank " + std::to_string(p));
    std::memcpy(&world, remote.data(), 4);
    const std::string remote_host(reinterpret_cast<const char*>(remote.data() + 8), host_len);
    const bool same_host = remote_host == host_identity();
    const std::string& secret = options_.job_secret;
    if (!secret.empty()) {
      if (mac_len == 0)
        refuse(rank_, p, remote_host,
               "published a UCX address without proof of the job secret: it was started without "
               "GRADEX_JOB_SECRET, or someone without the secret wrote it");
      auth::Mac want = address_proof(secret, static_cast<uint32_t>(p), world, remote_host,
                                     remote.data() + address_at, remote.size() - address_at);
      if (!auth::equal(want, remote.data() + 12 + host_len, mac_len))
        refuse(rank_, p, remote_host,
               "published a UCX address with a wrong proof of the job secret: it has a different "
               "GRADEX_JOB_SECRET, or someone without the secret wrote it");
    } else if (mac_len != 0) {
      refuse(rank_, p, remote_host,
             "was started with a job secret (GRADEX_JOB_SECRET) and this rank without one");
    }
    if (static_cast<int>(world) != size_)
      throw MismatchError("connect: rank " + std::to_string(p) + " was started with world size " +
                          std::to_string(world) + ", this rank with " + std::to_string(size_));
    ucp_ep_params_t params{};
    params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                        UCP_EP_PARAM_FIELD_ERR_HANDLER;
    params.address = reinterpret_cast<const ucp_address_t*>(remote.data() + address_at);
    // UCX 1.13 offers no shared-memory transport with peer failure handling: a same-host peer gets
    // shared memory (GRADEX_SHM=1) and its death is caught by the liveness pings and the timeout
    // instead of at once; other peers get immediate failure detection.
    params.err_mode = same_host && options_.shared_memory ? UCP_ERR_HANDLING_MODE_NONE
                                                          : UCP_ERR_HANDLING_MODE_PEER;
    shared_memory_peer_[static_cast<size_t>(p)] = params.err_mode == UCP_ERR_HANDLING_MODE_NONE;
    GX_LOG(kDebug) << "endpoint to rank " << p << ": "
                   << (params.err_mode == UCP_ERR_HANDLING_MODE_NONE ? "same host, shared memory"
                                                                     : "peer failure detection");
    params.err_handler.cb = &UcxCommunicator::on_endpoint_error;
    params.err_handler.arg = peers_[static_cast<size_t>(p)].get();
    try {
      endpoints_[static_cast<size_t>(p)] = Endpoint(worker_->get(), params, p);
    } catch (const TransportError& e) {
      if (options_.iface.empty()) throw;
      throw TransportError(std::string(e.what()) + " (GRADEX_IFACE='" + options_.iface +
                           "': UCX found no usable transport on these devices)");
    }
  }
}

// One small message each way between every pair proves that the transport works before the first
// collective, and catches ranks launched with a different world size. With a job secret each hello
// carries a fresh nonce and a second round answers the peer's nonce with an HMAC (both directions),
// so a peer that cannot prove the secret now, on this connection, is refused before any data.
void UcxCommunicator::exchange_hello() {
  const std::string& secret = options_.job_secret;
  std::vector<Hello> in(static_cast<size_t>(size_));
  Hello out{kHelloMagic, static_cast<uint32_t>(size_), static_cast<uint32_t>(rank_),
            secret.empty() ? 0u : 1u, auth::Nonce{}};
  if (!secret.empty()) out.nonce = auth::random_nonce();
  std::vector<RequestPtr> requests;
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    requests.push_back(irecv(p, kHelloTag, &in[static_cast<size_t>(p)], sizeof(Hello)));
    requests.push_back(isend(p, kHelloTag, &out, sizeof(Hello)));
  }
  wait_all(requests, "connect");
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    const Hello& h = in[static_cast<size_t>(p)];
    if (h.magic != kHelloMagic || static_cast<int>(h.rank) != p || h.has_secret > 1)
      throw CorruptPayload("connect: malformed hello from rank " + std::to_string(p));
    if (static_cast<int>(h.world_size) != size_)
      throw MismatchError("connect: rank " + std::to_string(p) + " was started with world size " +
                          std::to_string(h.world_size) + ", this rank with " +
                          std::to_string(size_));
    if ((h.has_secret != 0) != !secret.empty())
      refuse(rank_, p, "",
             h.has_secret ? "was started with a job secret and this rank without one"
                          : "has no job secret and this rank requires one");
  }
  if (secret.empty()) return;
  std::vector<auth::Mac> proofs_in(static_cast<size_t>(size_));
  std::vector<auth::Mac> proofs_out(static_cast<size_t>(size_));
  requests.clear();
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    const size_t i = static_cast<size_t>(p);
    proofs_out[i] = peer_proof(secret, static_cast<uint32_t>(rank_), static_cast<uint32_t>(p),
                               static_cast<uint32_t>(size_), in[i].nonce, out.nonce);
    requests.push_back(irecv(p, kProofTag, &proofs_in[i], sizeof(auth::Mac)));
    requests.push_back(isend(p, kProofTag, &proofs_out[i], sizeof(auth::Mac)));
  }
  wait_all(requests, "connect");
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    const size_t i = static_cast<size_t>(p);
    auth::Mac want = peer_proof(secret, static_cast<uint32_t>(p), static_cast<uint32_t>(rank_),
                                static_cast<uint32_t>(size_), out.nonce, in[i].nonce);
    if (!auth::equal(want, proofs_in[i].data(), proofs_in[i].size()))
      refuse(rank_, p, "",
             "did not prove knowledge of the job secret on its connection (a different "
             "GRADEX_JOB_SECRET)");
  }
  GX_LOG(kDebug) << "every peer proved knowledge of the job secret";
}

void UcxCommunicator::on_endpoint_error(void* arg, ucp_ep_h, ucs_status_t status) {
  auto* slot = static_cast<PeerSlot*>(arg);
  if (slot->error != UCS_OK) return;
  slot->error = status;
  UcxCommunicator* self = slot->self;
  if (self->closing_) {
    GX_LOG(kDebug) << "endpoint to rank " << slot->rank
                   << " reported an error while closing: " << ucs_status_string(status);
  } else {
    GX_LOG(kWarn) << "endpoint to rank " << slot->rank << " failed: " << ucs_status_string(status);
  }
}

uint64_t UcxCommunicator::next_collective_tag() {
  // A 23-bit sequence number in bits 16..38 of the user tag; the low 16 bits are the
  // collective's own sub-tags. Sequence 0 is skipped so tag 0 stays reserved for the hello.
  constexpr uint64_t kSeqMask = (uint64_t{1} << 23) - 1;
  collective_seq_ = (collective_seq_ + 1) & kSeqMask;
  if (collective_seq_ == 0) collective_seq_ = 1;
  return collective_seq_ << 16;
}

void UcxCommunicator::close_endpoints() {
  auto deadline = Clock::now() + std::min<Millis>(options_.timeout, Millis(5000));
  std::vector<void*> closing;
  bool broken = failure_code_ != ErrorCode::kOk;
  for (int p = 0; p < size_; ++p) {
    Endpoint& ep = endpoints_[static_cast<size_t>(p)];
    if (!ep.open()) continue;
    // A failed peer cannot acknowledge a flush: skip straight to releasing the endpoint.
    bool force = broken || peers_[static_cast<size_t>(p)]->error != UCS_OK;
    if (void* req = ep.start_close(force)) closing.push_back(req);
  }
  while (!closing.empty() && Clock::now() < deadline) {
    ucp_worker_progress(worker_->get());
    for (size_t i = 0; i < closing.size();) {
      if (ucp_request_check_status(closing[i]) != UCS_INPROGRESS) {
        ucp_request_free(closing[i]);
        closing[i] = closing.back();
        closing.pop_back();
      } else {
        ++i;
      }
    }
  }
  if (!closing.empty()) {
    GX_LOG(kWarn) << closing.size() << " endpoint(s) did not finish closing in time";
  }
  for (void* req : closing)
    ucp_request_free(req);  // released by UCX when the worker is destroyed
}

UcxCommunicator::~UcxCommunicator() {
  if (std::uncaught_exceptions() > 0 && failure_code_ == ErrorCode::kOk && size_ > 1) {
    // Destroyed by an exception from outside the communicator: tell the peers, which would
    // otherwise wait for this rank until their timeout.
    GX_LOG(kWarn) << "communicator destroyed during an exception; notifying the other ranks";
    failure_code_ = ErrorCode::kPeer;
    failure_peer_ = rank_;
    failure_what_ = "rank " + std::to_string(rank_) + " left after an error";
    for (int p = 0; p < size_; ++p)
      if (p != rank_) send_control(p, kControlAbort, rank_, static_cast<int32_t>(ErrorCode::kPeer));
  }
  if (failure_code_ == ErrorCode::kOk && size_ > 1) goodbye_barrier();
  shutdown();
}

// A barrier before closing: a rank that closes its endpoints while a peer still finishes its
// last collective would make that peer's endpoint fail (tcp reports the disconnect). Bounded; on
// failure the endpoints are simply force-closed.
void UcxCommunicator::goodbye_barrier() {
  CommOptions saved = options_;
  options_.timeout = std::min<Millis>(options_.timeout, Millis(30000));
  try {
    uint8_t token = 0;
    for (int distance = 1; distance < size_; distance *= 2) {
      uint8_t in = 0;
      std::vector<RequestPtr> requests;
      requests.push_back(irecv((rank_ - distance + size_) % size_, kGoodbyeTag, &in, 1));
      requests.push_back(isend((rank_ + distance) % size_, kGoodbyeTag, &token, 1));
      wait_all(requests, "close");
    }
  } catch (const std::exception& e) {
    GX_LOG(kWarn) << "closing without every rank: " << e.what();
  }
  options_ = saved;
}

void UcxCommunicator::shutdown() {
  closing_ = true;
  // Let abort notices and pongs leave before the endpoints go away.
  reap_control_sends(true, Clock::now() + Millis(500));
  if (control_recv_ != nullptr) {
    ucp_request_cancel(worker_->get(), control_recv_);
    auto deadline = Clock::now() + Millis(500);
    while (ucp_request_check_status(control_recv_) == UCS_INPROGRESS && Clock::now() < deadline)
      ucp_worker_progress(worker_->get());
    ucp_request_free(control_recv_);
    control_recv_ = nullptr;
  }
  close_endpoints();
  reap_control_sends(true, Clock::now());  // anything left was completed by the close
}

}  // namespace gradex::comm::ucx

namespace gradex::comm {

std::unique_ptr<Communicator> create_ucx_communicator(std::shared_ptr<Store> store, int rank,
                                                      int world_size, const CommOptions& options) {
  return std::make_unique<ucx::UcxCommunicator>(std::move(store), rank, world_size, options);
}

}  // namespace gradex::comm
