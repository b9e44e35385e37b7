// UcxCommunicator: construction (addresses through the store, endpoints, a hello round: see
// ucx_hello.cc) and teardown (bounded endpoint close).
#include "comm/ucx/ucx_communicator.h"

#include "base/wall_time.h"
#include "comm/rendezvous/launch.h"
#include "comm/rendezvous/store_gather.h"
#include "comm/topology/host_identity.h"
#include "comm/topology/tcp_pacing.h"
#include "comm/ucx/ucx_peer_auth.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <set>

#include "base/check.h"
#include "base/log.h"

namespace gradex::comm::ucx {
namespace {

// User tags below 2^16 are reserved: next_collective_tag() starts at 2^16.
constexpr uint64_t kGoodbyeTag = 1;  // the barrier before closing endpoints (the hello round: 0, 2)

// Under torchrun's elastic agent the store outlives a failed attempt: the incarnation in the key
// keeps a restarted rank from reading (and connecting to) a dead predecessor's address.
std::string address_key(int rank) {
  static const std::string incarnation = [] {
    std::string i = launch_incarnation();
    return i.empty() ? i : i + "/";
  }();
  return "gradex/ucx/address/" + incarnation + std::to_string(rank);
}

// Every rank's address entry, combined by rank 0 (comm/rendezvous/store_gather.h).
std::string address_combined_key() {
  return address_key(0) + "+";
}

std::string host_key(int rank) {
  static const std::string incarnation = [] {
    std::string i = launch_incarnation();
    return i.empty() ? i : i + "/";
  }();
  return "gradex/ucx/host/" + incarnation + std::to_string(rank);
}

// Whether the launcher's variables say this process is the only rank on its host (an unreadable
// launcher environment says nothing).
bool launcher_counts_one_rank_here() {
  try {
    const LaunchInfo info = launch_info_from_environment();
    return info.launcher != "none" && info.local_size == 1;
  } catch (const Error&) {
    return false;
  }
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
  // UCX's tcp transport connects each endpoint with a blocking connect() by default: one round
  // trip per endpoint, one after another (measured across a 50 ms WAN: 50 ms for each of the 3
  // endpoints and 9 extra striped connections of a rank, 0.6 s of its start; three times that at
  // 150 ms). Non-blocking, the handshakes overlap each other and what follows, and the first
  // message to a peer waits for its connection. A UCX_TCP_CONN_NB in the environment is the user's.
  // (UCX applies the unprefixed name to the tcp transport's configuration; "TCP_CONN_NB" is
  // accepted here and does not reach it.)
  if (std::getenv("UCX_TCP_CONN_NB") == nullptr) config_.modify("CONN_NB", "y");
  // Large messages go eager when no endpoint of this rank can be shared memory: UCX's rendezvous
  // spends a round trip (request, then the data) on every message above its threshold, a whole
  // round trip per ring chunk or payload across regions, and measured up to 2x slower than eager
  // sends on loopback tcp; over shared memory it is the single-copy path (eager through shared
  // memory measured 25x slower). A UCX_RNDV_THRESH in the environment is the user's and wins.
  if (std::getenv("UCX_RNDV_THRESH") == nullptr && !may_use_shared_memory(*store)) {
    config_.modify("RNDV_THRESH", "inf");
    context_rndv_eager_ = true;
  }
  context_ = std::make_unique<Context>(config_);
  for (int p = 0; p < size_; ++p)
    peers_.push_back(std::unique_ptr<PeerSlot>(new PeerSlot{this, p}));
  worker_ = std::make_unique<Worker>(*context_);
  if (!options_.use_event_fd || ucp_worker_get_efd(worker_->get(), &event_fd_) != UCS_OK)
    event_fd_ = -1;
  pong_seq_.assign(static_cast<size_t>(size_), 0);
  // UCX opens its sockets inside connect_endpoints/connect_stripes: those not here yet are ours.
  const std::set<uint64_t> sockets_before =
      options_.tcp_pacing ? tcp_socket_inodes() : std::set<uint64_t>{};
  // Each part's milliseconds, for the log: across a WAN each is a chain of round trips.
  std::string took;
  try {
    auto part = [&took, since = std::chrono::steady_clock::now()](const char* name) mutable {
      const auto now = std::chrono::steady_clock::now();
      took +=
          std::string(took.empty() ? "" : ", ") + name + " " + log::ms_between(since, now) + " ms";
      since = now;
    };
    post_control_recv();
    connect_endpoints(*store);
    part("endpoints");
    exchange_hello();
    part("hello");
    connect_stripes();
    part("stripes");
    if (options_.tcp_pacing) {
      // The extra connections' sockets may still be connecting, or not yet accepted:
      // settle_stripe_hello paces what is neither here before nor paced now.
      sockets_paced_ = sockets_before;
      paced_flows_ = pace_new_tcp_flows(sockets_before, kPacingNoCapBytesPerS, &sockets_paced_);
      late_pacing_until_ = Clock::now() + kLatePacingFor;
      late_pacing_ = true;
    }
    bytes_sent_ = bytes_received_ = 0;  // the counters report collective traffic only
  } catch (...) {
    shutdown();  // the destructor does not run for a half-built object
    throw;
  }
  GX_LOG(kInfo) << "UCX communicator ready: rank " << rank_ << " of " << size_ << " (" << took
                << (paced_flows_ > 0 ? "; " + std::to_string(paced_flows_) + " TCP flows paced"
                                     : "")
                << ")";
}

bool UcxCommunicator::hierarchical_shm_for(const std::vector<std::string>& hosts) const {
  if (options_.hierarchical_shm != CommOptions::HierarchicalShm::kAuto)
    return options_.hierarchical_shm == CommOptions::HierarchicalShm::kOn;
  // kAuto: the hierarchical exchange runs on jobs of several hosts of which one holds two ranks.
  std::vector<std::string> sorted = hosts;
  std::sort(sorted.begin(), sorted.end());
  const bool shared = std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end();
  const bool several = sorted.front() != sorted.back();
  return shared && several;
}

bool UcxCommunicator::shared_memory_between(const std::vector<std::string>& hosts,
                                            const std::string& my_host) const {
  int same_host = 0;
  for (const std::string& h : hosts)
    same_host += h == my_host ? 1 : 0;
  if (same_host < 2) return false;  // no peer on this host (this rank is one of them)
  return options_.shared_memory || hierarchical_shm_for(hosts);
}

bool UcxCommunicator::may_use_shared_memory(Store& store) {
  // Which ranks share a host decides it: every rank publishes its host first, whatever its own
  // options (a rank whose options differ must not leave the others waiting here: the start-up
  // agreement names the difference once connected). Only the transport thresholds depend on it;
  // the endpoints' shared memory is decided again from the (authenticated) address entries in
  // connect_endpoints.
  const auto deadline = Clock::now() + options_.timeout;
  const std::string my_host = host_identity(options_.host_id);
  // "world size\nhost": a rank started with another world size is named here, as at connect.
  const std::string mine = std::to_string(size_) + "\n" + my_host;
  store.set(host_key(rank_), Bytes(mine.begin(), mine.end()));
  // A launcher that counts one rank on this host (torchrun's LOCAL_WORLD_SIZE=1, and its peers')
  // answers it without the peers' entries, which cost a round trip each to the store's host: no
  // peer shares this host's memory. Published all the same, for ranks whose launcher says
  // otherwise; connect_endpoints checks the answer against the published hosts.
  if (launcher_counts_one_rank_here()) {
    alone_by_launcher_ = true;
    return false;
  }
  std::vector<std::string> hosts(static_cast<size_t>(size_));
  hosts[static_cast<size_t>(rank_)] = my_host;
  // Each get is a round trip to the store's host (across a WAN, tens of ms): the peers' entries
  // only, this rank's own is known.
  for (int i = 1; i < size_; ++i) {
    const int p = (rank_ + i) % size_;
    const Bytes b = store.get(host_key(p), millis_until(deadline));
    const std::string entry(b.begin(), b.end());
    const size_t cut = entry.find('\n');
    const std::string world = entry.substr(0, cut);
    if (cut == std::string::npos || world != std::to_string(size_))
      throw MismatchError("connect: rank " + std::to_string(p) + " was started with world size " +
                          world + ", this rank with " + std::to_string(size_));
    hosts[static_cast<size_t>(p)] = entry.substr(cut + 1);
  }
  return shared_memory_between(hosts, my_host);
}

void UcxCommunicator::connect_endpoints(Store& store) {
  auto deadline = Clock::now() + options_.timeout;
  const std::string my_host = host_identity(options_.host_id);
  std::vector<Bytes> raw;
  {
    // Published with this rank's world size, host and process, bound to it by an HMAC when there
    // is a job secret (ucx_peer_auth.h). The host field carries "host\nprocess". This rank reads
    // its own entry from here, not back from the store (a round trip to the store's host), and
    // the peers' in as few round trips as the world size allows: rank 0 combines them, so that a
    // rank reads one key (each entry keeps its owner's HMAC, checked below as before).
    WorkerAddress address(*worker_);
    Bytes entry = encode_address_entry(rank_, size_, my_host + "\n" + process_identity(),
                                       address.data(), address.size(), options_.job_secret);
    store.set(address_key(rank_), entry);
    raw = gather_store_entries(store, address_key, address_combined_key(), rank_, size_,
                               std::move(entry), millis_until(deadline));
  }
  // Sized first: shutdown() of a half-built communicator (a peer's entry refused below) walks them.
  endpoints_.resize(static_cast<size_t>(size_));
  shared_memory_peer_.assign(static_cast<size_t>(size_), false);
  peer_addresses_.assign(static_cast<size_t>(size_), Bytes());
  std::vector<AddressEntry> entries(static_cast<size_t>(size_));
  rank_hosts_.assign(static_cast<size_t>(size_), std::string());
  rank_processes_.assign(static_cast<size_t>(size_), std::string());
  for (int p = 0; p < size_; ++p) {
    const auto pi = static_cast<size_t>(p);
    entries[pi] = decode_address_entry(raw[pi], rank_, p, options_.job_secret);
    peer_addresses_[pi].assign(entries[pi].address, entries[pi].address + entries[pi].address_size);
    const uint32_t world = entries[pi].world;
    if (static_cast<int>(world) != size_)
      throw MismatchError("connect: rank " + std::to_string(p) + " was started with world size " +
                          std::to_string(world) + ", this rank with " + std::to_string(size_));
    const std::string& published = entries[pi].host;
    const size_t cut = published.find('\n');
    rank_hosts_[pi] = published.substr(0, cut);
    if (cut != std::string::npos) rank_processes_[pi] = published.substr(cut + 1);
  }
  // The hierarchical exchange keeps same-host traffic on shared memory (CommOptions::
  // hierarchical_shm); every rank sees the same published hosts, so the decision is the same
  // everywhere.
  const bool hierarchical_shm = hierarchical_shm_for(rank_hosts_);
  if (shared_memory_between(rank_hosts_, my_host) && context_rndv_eager_) {
    if (!alone_by_launcher_)
      throw InternalError(
          "connect: shared-memory peers appeared after the context took eager "
          "sends");
    GX_LOG(kWarn) << "connect: the launcher counts one rank on this host (LOCAL_WORLD_SIZE or "
                     "its like), yet other ranks publish the same host ('"
                  << my_host
                  << "'): their shared memory runs with eager sends, correct but slower for "
                     "large messages (set the launcher's local size, or GRADEX_HOST_ID)";
  }
  for (int i = 0; i < size_; ++i) {
    const int p = (rank_ + i) % size_;
    const AddressEntry& remote_entry = entries[static_cast<size_t>(p)];
    const bool same_host = rank_hosts_[static_cast<size_t>(p)] == my_host;
    ucp_ep_params_t params{};
    params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                        UCP_EP_PARAM_FIELD_ERR_HANDLER;
    params.address = reinterpret_cast<const ucp_address_t*>(remote_entry.address);
    // UCX 1.13 offers no shared-memory transport with peer failure handling: a same-host peer gets
    // shared memory (GRADEX_SHM=1, or the hierarchical exchange) and its death is caught by the
    // process check (check_shared_memory_peers) instead of by UCX; other peers get immediate
    // failure detection.
    params.err_mode = same_host && (options_.shared_memory || hierarchical_shm)
                          ? UCP_ERR_HANDLING_MODE_NONE
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

void UcxCommunicator::on_endpoint_error(void* arg, ucp_ep_h, ucs_status_t status) {
  auto* slot = static_cast<PeerSlot*>(arg);
  if (slot->error != UCS_OK) return;
  slot->error = status;
  UcxCommunicator* self = slot->self;
  if (self->closing_ || self->leaving_) {
    GX_LOG(kDebug) << "endpoint to rank " << slot->rank
                   << " reported an error while closing: " << ucs_status_string(status);
  } else {
    GX_LOG(kWarn) << "endpoint to rank " << slot->rank << " failed: " << ucs_status_string(status);
  }
}

uint64_t UcxCommunicator::following_collective_seq() const {
  // A 23-bit sequence number in bits 16..38 of the user tag; the low 16 bits are the
  // collective's own sub-tags. Sequence 0 is skipped so tag 0 stays reserved for the hello.
  constexpr uint64_t kSeqMask = (uint64_t{1} << 23) - 1;
  uint64_t seq = (collective_seq_ + 1) & kSeqMask;
  return seq == 0 ? 1 : seq;
}

uint64_t UcxCommunicator::next_collective_tag() {
  collective_seq_ = following_collective_seq();
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
    close_stripes(p, force, &closing);
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
    notify_abort(rank_, ErrorCode::kPeer, "");
  }
  // An interrupted communicator's owner is leaving without its peers (Communicator::interrupt).
  if (failure_code_ == ErrorCode::kOk && !interrupted_.load() && size_ > 1) goodbye_barrier();
  shutdown();
}

// A barrier before closing: a rank that closes its endpoints while a peer still finishes its
// last collective would make that peer's endpoint fail (tcp reports the disconnect). Bounded; on
// failure the endpoints are simply force-closed.
void UcxCommunicator::goodbye_barrier() {
  leaving_ = true;
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
  stripe_hello_.clear();  // releases what is still in flight before the endpoints close
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
