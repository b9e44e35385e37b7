// Route kSparse: a DGC unit (one tensor, or a group of small ones) whose payloads, framed into one
// message per rank (pack_sparse, below), travel in one allgatherv chosen by
// sync/data/sparse_gather.h (inline round trip when small, direct or ring above); the engine's
// finish stage sums every rank's payloads of each tensor.
#include <chrono>
#include <string>

#include "base/check.h"
#include "base/error.h"
#include "base/log.h"
#include "base/wall_time.h"
#include "sync/route/routes.h"

namespace gradex::sync::route {

// The link probe every DGC route agrees before its first gather (shared with
// sparse_hierarchical.cc): its bytes are not the unit's.
void plan_sparse(Context& ctx) {
  if (ctx.gather.needs_link() && ctx.world_size > 1) ctx.link.agree(ctx.comm);
}

// The DGC routes' message: one payload per job, framed in job order (compress/wire/message.h);
// riders' payloads follow the DGC jobs'. Shared with sparse_hierarchical.cc.
namespace wire = compress::wire;

void pack_sparse(pipeline::Unit& unit, const JobWork& work) {
  std::vector<uint8_t>& m = unit.message;
  m.clear();
  unit.rider_message_bytes = 0;
  if (work.spread) {
    // Spread, every payload is encoded into its job's own buffer and framed in job order: the
    // message does not depend on the pool or on timing.
    work.spread([&](size_t j) {
      pipeline::Job& job = *unit.jobs[j];
      job.payload.clear();
      work.prepare(j, job.payload);
    });
    wire::begin_message(m, static_cast<uint32_t>(unit.jobs.size()));
    for (pipeline::Job* job : unit.jobs) {
      const size_t before = m.size();
      const size_t at = wire::begin_payload(m);
      m.insert(m.end(), job->payload.begin(), job->payload.end());
      wire::end_payload(m, at);
      if (job->rider) unit.rider_message_bytes += m.size() - before;
    }
    return;
  }
  // In order: each payload is encoded straight into the message.
  wire::begin_message(m, static_cast<uint32_t>(unit.jobs.size()));
  for (size_t j = 0; j < unit.jobs.size(); ++j) {
    const size_t before = m.size();
    const size_t at = wire::begin_payload(m);
    work.prepare(j, m);
    wire::end_payload(m, at);
    if (unit.jobs[j]->rider) unit.rider_message_bytes += m.size() - before;
  }
}

Payloads unpack_sparse(const pipeline::Unit& unit, const Context& ctx) {
  // One message per rank, or per host under the hierarchical exchange (its host payloads,
  // sparse_hierarchical.cc); summed in that order either way.
  const bool per_host = ctx.hosts != nullptr;
  GX_CHECK_EQ(unit.received.size(), per_host ? static_cast<size_t>(ctx.hosts->host_count())
                                             : static_cast<size_t>(ctx.world_size));
  Payloads payloads(unit.jobs.size());
  std::vector<wire::PayloadSpan> spans;
  for (size_t r = 0; r < unit.received.size(); ++r) {
    const comm::Bytes& m = unit.received[r];
    const std::string what =
        (per_host ? "sparse message of host " : "sparse message from rank ") + std::to_string(r);
    const uint32_t count = wire::message_count(m.data(), m.size(), what);
    if (count != unit.jobs.size())
      throw CorruptPayload(what + " holds " + std::to_string(count) + " tensor(s) where [" +
                           unit.keys() + "] were expected (ranks with different " +
                           "GRADEX_SPARSE_GROUP_MB?)");
    wire::split_message(m.data(), m.size(), unit.jobs.size(), what, spans);
    for (size_t j = 0; j < unit.jobs.size(); ++j)
      payloads[j].push_back(spans[j]);
  }
  return payloads;
}

Codec sparse_codec_of(const pipeline::Unit& unit) {
  for (const pipeline::Job* job : unit.jobs)
    if (!job->rider) return job->tensor->policy.rung.codec;
  return Codec::kDgc;
}

namespace {

// Messages on the critical path of the gather that ran (comm::AllgathervPath).
double gather_latencies(comm::AllgathervPath path, int world) {
  switch (path) {
    case comm::AllgathervPath::kLocal:
      return 0;
    case comm::AllgathervPath::kOneRound:
    case comm::AllgathervPath::kDirectUnsized:
      return 1;
    case comm::AllgathervPath::kDirect:
      return 2;
    case comm::AllgathervPath::kRing:
    case comm::AllgathervPath::kRingUnsized:
      return world - 1;
  }
  return 2;
}

class SparseRoute : public Transfer {
 public:
  Path path() const override { return Path::kSparse; }
  void pack(pipeline::Unit& unit, const JobWork& work) const override { pack_sparse(unit, work); }
  void plan(Context& ctx) const override { plan_sparse(ctx); }
  Payloads unpack(const pipeline::Unit& unit, const Context& ctx) const override {
    return unpack_sparse(unit, ctx);
  }
  // The bytes are what arrived (the engine counts them once the collective returned).
  void finish(pipeline::Unit& unit, Context& ctx) const override {
    (void)ctx;
    unit.sample.terms.bytes = static_cast<double>(unit.counters.received_bytes);
  }

  void exchange(pipeline::Unit& unit, Context& ctx) const override {
    const auto t0 = std::chrono::steady_clock::now();
    try {
      const comm::AllgathervPath path =
          ctx.gather.gather(ctx.comm, ctx.link.model(), unit.message, unit.received);
      GX_LOG(kDebug) << "sparse gather of [" << unit.keys() << "]: " << unit.message.size()
                     << " bytes, " << comm::allgatherv_path_name(path);
      unit.sample.codec = sparse_codec_of(unit);
      unit.sample.terms.latency = gather_latencies(path, ctx.world_size);
    } catch (const Error& e) {
      throw Error(e.code(), "sparse exchange of [" + unit.keys() + "]: " + e.what());
    }
    unit.counters.transfer_seconds += seconds_since(t0);
  }
};

}  // namespace

const Transfer& sparse_route() {
  static const SparseRoute route;
  return route;
}

}  // namespace gradex::sync::route
