#include "sync/policy/agreed_link.h"

#include <chrono>
#include <iterator>
#include <mutex>
#include <string>

#include "base/log.h"
#include "comm/topology/host_identity.h"
#include "comm/topology/tcp_limits.h"

namespace gradex::sync {
namespace {
// The link rate the TCP advice sizes windows for when the probe's stream cannot tell it: the fast
// end of the commodity Ethernet gradex is built for.
constexpr double kTcpAdviceTargetBits = 10e9;
}  // namespace

const LinkModel& AgreedLink::agree(comm::Communicator& comm, bool incast) {
  if (model_ && !(incast && lacks_bursts_)) return *model_;
  if (comm.size() < 2) {
    replace_model(std::make_unique<LinkModel>());
    return *model_;
  }
  cost::ProbeOptions options;
  if (!port_queue_explicit_)
    options.burst_bytes_per_sender.assign(std::begin(kBurstBytesPerSender),
                                          std::end(kBurstBytesPerSender));
  if (!incast) options.burst_min_alpha_s = LinkModel::kLatencyBoundS;
  options.rank0_round_trips_s = rank0_round_trips_s_;
  const auto started = std::chrono::steady_clock::now();
  const uint64_t received_before = comm.bytes_received();
  auto probe = std::make_unique<cost::ProbeResult>(
      cost::probe_links(comm, comm::host_identity(comm.options().host_id), options));
  if (comm.rank() == 0) {
    const cost::ProbeResult::Parts& parts = probe->parts;
    GX_LOG(kInfo) << "link probe: " << log::ms_between(started, std::chrono::steady_clock::now())
                  << " ms, " << (comm.bytes_received() - received_before) / 1000
                  << " kB received (peers " << parts.peers_s * 1e3 << " ms, round trips "
                  << parts.pings_s * 1e3 << " ms, streams " << parts.stream_s * 1e3
                  << " ms, incast bursts " << parts.bursts_s * 1e3 << " ms, agreeing "
                  << parts.agree_s * 1e3 << " ms)";
  }
  auto model = std::make_unique<LinkModel>(probe->model(comm.size(), port_queue_s_));
  std::string bursts;
  for (const cost::IncastBurst& b : model->bursts)
    bursts += " " + std::to_string(b.bytes) + " B cost " + std::to_string(b.extra_s * 1e3) + " ms,";
  GX_LOG(kDebug) << "link model: " << model->describe() << "; incast bursts"
                 << (bursts.empty() ? " none," : bursts)
                 << " beyond their transfer, inline maximum "
                 << model->inline_max(comm.options().allgather_inline_bytes) << " B";
  // Across regions the kernel's TCP settings, not the link, often cap the exchange: said once,
  // with the fix, by rank 0 (whose numbers every rank plans from).
  if (model->latency_bound() && comm.rank() == 0) {
    static std::once_flag said;
    const double rtt_s = 2 * model->link().alpha_s;
    const int flows = comm.connections_per_peer();  // striping (GRADEX_STRIPES)
    const cost::LinkParams link = model->link();
    std::call_once(said, [rtt_s, flows, link] {
      const comm::TcpLimits limits = comm::read_tcp_limits();
      const double measured =
          link.measured && link.beta_s_per_byte > 0 ? 8.0 / link.beta_s_per_byte : 0.0;
      const std::string advice = comm::tcp_limits_advice(
          limits, rtt_s,
          comm::advice_target_bits(limits, rtt_s, flows, measured, kTcpAdviceTargetBits), flows);
      if (!advice.empty()) {
        GX_LOG(kWarn) << advice;
      }
    });
  }
  lacks_bursts_ = !options.burst_bytes_per_sender.empty() && model->crosses_hosts() &&
                  model->link().alpha_s < options.burst_min_alpha_s;
  replace_model(std::move(model));
  probe_ = std::move(probe);
  return *model_;
}

}  // namespace gradex::sync
