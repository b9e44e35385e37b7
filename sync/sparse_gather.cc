#include "sync/sparse_gather.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <mutex>
#include <optional>
#include <string>

#include "base/log.h"
#include "comm/topology/host_identity.h"
#include "comm/topology/tcp_limits.h"
#include "sync/link_probe.h"

namespace gradex::sync {
namespace {
// The link rate the TCP advice sizes windows for: the fast end of the commodity Ethernet gradex
// is built for (a slower link needs proportionally less, which the advice line states).
constexpr double kTcpAdviceTargetBits = 10e9;
}  // namespace

double GatherModel::direct_seconds(const std::vector<uint64_t>& following) const {
  const int P = static_cast<int>(following.size());
  if (P < 2) return 0;
  uint64_t total = 0, largest = 0, smallest = UINT64_MAX;
  for (uint64_t s : following) {
    total += s;
    largest = std::max(largest, s);
    smallest = std::min(smallest, s);
  }
  const double uplink = static_cast<double>(P - 1) * static_cast<double>(largest);
  const double downlink = static_cast<double>(total - smallest);  // the busiest receiver's
  return link.seconds(1.0, std::max(uplink, downlink)) + incast_seconds(downlink);
}

double GatherModel::incast_seconds(double arriving) const {
  if (!crosses_hosts || arriving <= 0) return 0;
  const double rule = arriving * link.beta_s_per_byte > port_queue_s ? kIncastPenalty : 0;
  for (const cost::IncastBurst& b : bursts)
    if (arriving <= static_cast<double>(b.bytes)) return std::min(rule, b.extra_s);
  return rule;
}

double GatherModel::ring_seconds(const std::vector<uint64_t>& following) const {
  const int P = static_cast<int>(following.size());
  if (P < 2) return 0;
  uint64_t total = 0, smallest = UINT64_MAX;
  for (uint64_t s : following) {
    total += s;
    smallest = std::min(smallest, s);
  }
  return link.seconds(static_cast<double>(P - 1), static_cast<double>(total - smallest));
}

bool GatherModel::ring_for(const std::vector<uint64_t>& following) const {
  return ring_seconds(following) < direct_seconds(following);
}

size_t GatherModel::inline_max(size_t configured) const {
  if (latency_bound() && link.beta_s_per_byte > 0) {
    const double in_one_latency = link.alpha_s / link.beta_s_per_byte;
    configured = std::max(configured, static_cast<size_t>(std::min(
                                          in_one_latency, static_cast<double>(kLatencyInlineMax))));
  }
  if (!crosses_hosts || world_size < 2) return configured;
  const double senders = static_cast<double>(world_size - 1);
  if (absorbs(senders * static_cast<double>(configured))) return configured;
  double fits = port_queue_s / link.beta_s_per_byte;
  for (const cost::IncastBurst& b : bursts) {
    if (b.extra_s > link.alpha_s) break;
    fits = std::max(fits, static_cast<double>(b.bytes));
  }
  fits /= senders;
  if (!(fits < static_cast<double>(configured))) return configured;
  return static_cast<size_t>(std::max(0.0, std::floor(fits)));
}

double GatherModel::dense_ring_seconds(uint64_t bytes) const {
  const double P = world_size;
  if (world_size < 2) return 0;
  return link.seconds(2 * (P - 1), 2 * (P - 1) / P * static_cast<double>(bytes));
}

double GatherModel::dense_direct_seconds(uint64_t bytes) const {
  const double P = world_size;
  if (world_size < 2) return 0;
  // Two ranks swap their buffers: one message of all of it each way, nothing at once.
  if (world_size == 2) return link.seconds(1, static_cast<double>(bytes));
  const double incoming = (P - 1) / P * static_cast<double>(bytes);  // per rank and phase
  return link.seconds(2, 2 * incoming) + 2 * incast_seconds(incoming);
}

uint64_t GatherModel::dense_direct_max_bytes() const {
  if (!dense_direct_for(1)) return 0;
  uint64_t yes = 1, no = uint64_t{1} << 40;
  if (dense_direct_for(no)) return no;
  while (no - yes > 1) {
    const uint64_t mid = yes + (no - yes) / 2;
    (dense_direct_for(mid) ? yes : no) = mid;
  }
  return yes;
}

namespace {

// The most bytes per rank that travel in one hop (every rank's payload to every rank) rather than
// in a direct allreduce's two phases while the hop's extra arrivals, (P-1)(P-2)/P of them at
// `beta` each, cost at most `budget_s`; `cap` where they cost nothing (fewer than three ranks, or
// a link without a time per byte).
uint64_t one_hop_bytes_within(int world, double beta, double budget_s, uint64_t cap) {
  const double P = world;
  const double extra_per_byte = (P - 1) * (P - 2) / P * beta;
  if (world < 3 || extra_per_byte <= 0) return cap;
  const double limit = budget_s / extra_per_byte;
  return limit >= static_cast<double>(cap) ? cap : static_cast<uint64_t>(limit);
}

}  // namespace

uint64_t GatherModel::rider_bytes() const {
  return one_hop_bytes_within(world_size, link.beta_s_per_byte, 2 * link.alpha_s, kRiderMaxBytes);
}

double GatherModel::bulk_beta_s_per_byte() const {
  double beta = link.beta_s_per_byte;
  for (const cost::IncastBurst& b : bursts) {
    const double data_s = b.seconds - 2 * link.alpha_s;
    if (b.bytes > 0 && data_s > 0) beta = std::min(beta, data_s / static_cast<double>(b.bytes));
  }
  return beta;
}

uint64_t GatherModel::quantized_one_hop_max_bytes() const {
  if (world_size < 2 || !latency_bound()) return 0;
  return one_hop_bytes_within(world_size, bulk_beta_s_per_byte(),
                              kOneHopLatencyShare * link.alpha_s, UINT64_MAX);
}

void SparseGather::agree(comm::Communicator& comm) {
  if (mode_ == EngineOptions::SparseCollective::kAuto) agree_model(comm);
}

void SparseGather::agree_model(comm::Communicator& comm, bool incast) {
  if (comm.size() < 2 || (model_ && !(incast && model_lacks_bursts_))) return;
  cost::ProbeOptions options;
  if (!port_queue_explicit_)
    options.burst_bytes_per_sender.assign(std::begin(kBurstBytesPerSender),
                                          std::end(kBurstBytesPerSender));
  if (!incast) options.burst_min_alpha_s = GatherModel::kLatencyBoundS;
  const cost::ProbeResult probe =
      cost::probe_links(comm, comm::host_identity(comm.options().host_id), options);
  auto model = std::make_unique<GatherModel>();
  const cost::PeerClass cls = cost::collective_class(probe.hosts);
  model->link = probe.link[static_cast<size_t>(cls)];
  model->crosses_hosts = cls == cost::PeerClass::kOtherHost;
  model->port_queue_s = port_queue_s_;
  model->world_size = comm.size();
  model->bursts = probe.bursts;
  std::string bursts;
  for (const cost::IncastBurst& b : model->bursts)
    bursts += " " + std::to_string(b.bytes) + " B cost " + std::to_string(b.extra_s * 1e3) + " ms,";
  GX_LOG(kDebug) << "sparse gather model: " << cost::peer_class_name(cls) << " (measured with rank "
                 << probe.peers[static_cast<size_t>(cls)] << ") alpha " << model->link.alpha_s * 1e6
                 << " us, beta " << model->link.beta_s_per_byte * 1e9 << " ns/B (bulk "
                 << model->bulk_beta_s_per_byte() * 1e9 << "), incast bursts"
                 << (bursts.empty() ? " none," : bursts)
                 << " beyond their transfer, inline maximum "
                 << model->inline_max(comm.options().allgather_inline_bytes) << " B";
  // Across regions the kernel's TCP settings, not the link, often cap the exchange: said once,
  // with the fix, by rank 0 (whose numbers every rank plans from).
  if (model->latency_bound() && comm.rank() == 0) {
    static std::once_flag said;
    const double rtt_s = 2 * model->link.alpha_s;
    const int flows = comm.connections_per_peer();  // striping (GRADEX_STRIPES)
    std::call_once(said, [rtt_s, flows] {
      const std::string advice =
          comm::tcp_limits_advice(comm::read_tcp_limits(), rtt_s, kTcpAdviceTargetBits, flows);
      if (!advice.empty()) {
        GX_LOG(kWarn) << advice;
      }
    });
  }
  // Every rank agrees on rank 0's fit, so every rank reaches the same verdict.
  model_lacks_bursts_ = !options.burst_bytes_per_sender.empty() && model->crosses_hosts &&
                        model->link.alpha_s < options.burst_min_alpha_s;
  model_ = std::move(model);
}

std::optional<bool> SparseGather::unsized_ring(comm::Communicator& comm) {
  using Mode = EngineOptions::SparseCollective;
  if (comm.size() < 2 || !comm.receives_any_length()) return std::nullopt;
  if (mode_ == Mode::kDirect) return false;
  if (mode_ != Mode::kAuto) return std::nullopt;
  agree(comm);
  // The direct exchange or the ring as the model prices the last gather's sizes (every rank holds
  // them all, so every rank runs the same collective); the first gather learns them.
  if (!model_->latency_bound() || last_sizes_.size() != static_cast<size_t>(comm.size()))
    return std::nullopt;
  return model_->ring_for(last_sizes_);
}

comm::AllgathervPath SparseGather::gather(comm::Communicator& comm,
                                          const std::vector<uint8_t>& message,
                                          std::vector<comm::Bytes>& received) {
  using Mode = EngineOptions::SparseCollective;
  if (mode_ == Mode::kRing) {
    comm::ring_allgatherv(comm, message.data(), message.size(), received);
    return comm.size() > 1 ? comm::AllgathervPath::kRing : comm::AllgathervPath::kLocal;
  }
  comm::AllgathervPath path;
  if (const std::optional<bool> ring = unsized_ring(comm)) {
    comm::allgatherv_unsized(comm, message.data(), message.size(), received, *ring,
                             comm::kUnsizedMaxBytes, "sparse allgatherv");
    path = *ring ? comm::AllgathervPath::kRingUnsized : comm::AllgathervPath::kDirectUnsized;
  } else {
    comm::AllgathervOptions options;
    options.inline_max_bytes = comm.options().allgather_inline_bytes;
    if (mode_ == Mode::kAuto && comm.size() > 1) {
      agree(comm);
      const GatherModel* model = model_.get();
      options.inline_max_bytes = model->inline_max(options.inline_max_bytes);
      options.ring_for = [model](const std::vector<uint64_t>& following) {
        return model->ring_for(following);
      };
    }
    path = comm::allgatherv_inline(comm, message.data(), message.size(), received, options,
                                   "sparse allgatherv");
  }
  remember_sizes(received);
  return path;
}

void SparseGather::remember_sizes(const std::vector<comm::Bytes>& received) {
  last_sizes_.resize(received.size());
  for (size_t q = 0; q < received.size(); ++q)
    last_sizes_[q] = received[q].size();
}

}  // namespace gradex::sync
