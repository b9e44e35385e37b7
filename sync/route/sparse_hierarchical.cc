// Route kSparseHierarchical: a DGC unit under the hierarchical exchange (GRADEX_HIERARCHICAL), with
// DGC's host-level re-selection (docs/collectives.md, "Hierarchical exchange").
//   1. Inside each host every rank's message reaches every local rank (allgatherv over the host).
//   2. Tensor j of the unit belongs to class c = j mod S (S: the most ranks on any host); on host h
//      the class's owner is local rank c mod L_h. The owner decodes the host's payloads of j, sums
//      them in local rank order, keeps as many of the largest sums as the largest local selection
//      (compress/backend/host_reselect.h), returns everything it does not keep to its own
//      residual of j, and encodes the kept sums: the host payload of j.
//   3. Every rank's host payloads reach every rank through comm::hierarchical_allgatherv: each
//      crosses each host's link once per remote host, then is shared inside each host.
// Every rank then holds, per tensor, the same H host payloads and sums them in host order
// (the engine's finish stage), so results are bit-identical on every rank. Σ over ranks of (what
// was sent + residual) is unchanged by the re-selection up to fp32 rounding: kept and dropped
// partition each host sum. Leaves unit.received holding one message per host (host order).
#include <chrono>
#include <cstring>
#include <string>

#include "base/check.h"
#include "base/error.h"
#include "base/wall_time.h"
#include "comm/collectives.h"
#include "comm/collectives/group_communicator.h"
#include "comm/hierarchical.h"
#include "compress/backend/dgc_codec.h"
#include "compress/backend/host_reselect.h"
#include "compress/options.h"
#include "compress/wire/message.h"
#include "sync/data/backend_path.h"
#include "sync/data/backend_tensor.h"
#include "sync/route/routes.h"

namespace gradex::sync::route {
namespace {

namespace wire = compress::wire;

void put(comm::Bytes& out, const void* p, size_t n) {
  const auto* b = static_cast<const uint8_t*>(p);
  out.insert(out.end(), b, b + n);
}

// Records [u32 tensor][u32 host][u64 length][payload]: host payloads in transit.
void add_record(comm::Bytes& out, uint32_t tensor, uint32_t host, const comm::Bytes& payload) {
  const uint64_t n = payload.size();
  put(out, &tensor, 4);
  put(out, &host, 4);
  put(out, &n, 8);
  put(out, payload.data(), payload.size());
}

void exchange_hierarchical(pipeline::Unit& unit, Context& ctx) {
  comm::Communicator& comm = ctx.comm;
  const comm::HostTopology& hosts = *ctx.hosts;
  const int me = comm.rank();
  const int h = hosts.host_of[static_cast<size_t>(me)];
  const std::vector<int>& local = hosts.hosts[static_cast<size_t>(h)];
  const size_t L = local.size();
  const size_t my_index = static_cast<size_t>(hosts.local_index[static_cast<size_t>(me)]);
  const size_t S = static_cast<size_t>(hosts.max_local());
  const size_t H = static_cast<size_t>(hosts.host_count());
  const size_t J = unit.jobs.size();
  const uint64_t tag_local = comm.next_collective_tag();
  auto owns_class = [&](size_t c) { return c % L == my_index; };
  const compress::WireOptions wire_options = compress::wire_options_from_config(ctx.config);

  // 1. The host's messages, by local index.
  std::vector<comm::Bytes> host_messages;
  {
    comm::GroupCommunicator group(comm, local, {tag_local});
    comm::allgatherv(group, unit.message.data(), unit.message.size(), host_messages);
  }
  std::vector<std::vector<wire::PayloadSpan>> spans(L);
  for (size_t i = 0; i < L; ++i) {
    const std::string what = "sparse message from rank " + std::to_string(local[i]);
    const comm::Bytes& m = host_messages[i];
    if (wire::message_count(m.data(), m.size(), what) != J)
      throw CorruptPayload(what + " does not hold the " + std::to_string(J) + " tensor(s) [" +
                           unit.keys() + "] (ranks with different GRADEX_SPARSE_GROUP_MB?)");
    wire::split_message(m.data(), m.size(), J, what, spans[i]);
  }

  // 2. Host payloads of the tensors this rank owns: host_payload[j] (empty when not owned).
  std::vector<comm::Bytes> host_payload(J);
  std::vector<wire::DecodedPayload> decoded(L);
  std::vector<const wire::DecodedPayload*> parts(L);
  compress::backend::HostSelection selection;
  for (size_t j = 0; j < J; ++j) {
    if (!owns_class(j % S)) continue;
    TensorState& t = *unit.jobs[j]->tensor;
    for (size_t i = 0; i < L; ++i) {
      wire::decode(spans[i][j].first, spans[i][j].second, decoded[i]);
      if (decoded[i].header.numel != t.numel)
        throw CorruptPayload("sparse payload of '" + t.key + "' from rank " +
                             std::to_string(local[i]) + " has " +
                             std::to_string(decoded[i].header.numel) + " elements, expected " +
                             std::to_string(t.numel));
      parts[i] = &decoded[i];
    }
    const DType value_dtype = decoded[0].header.value_dtype;
    compress::backend::reselect_host_sum(parts, value_dtype, selection);
    ctx.path.return_to_residual(t, selection.dropped);
    wire::SparseRef ref;
    ref.numel = t.numel;
    ref.indices = selection.kept_indices.data();
    ref.values = selection.kept_values.data();
    ref.count = selection.kept_indices.size();
    ref.value_dtype = value_dtype;
    std::vector<uint8_t> encoded;
    wire::encode(ref, decoded[0].header.key, wire_options, encoded);
    host_payload[j].assign(encoded.begin(), encoded.end());
  }

  // 3. Every rank's host payloads (those of the tensors it owns) to every rank: across hosts
  // once per remote host, then inside each host (comm/hierarchical.h). gathered[j][g] = host g's
  // payload of j; each must come from its owner, exactly once.
  comm::Bytes mine;
  for (size_t j = 0; j < J; ++j)
    if (owns_class(j % S))
      add_record(mine, static_cast<uint32_t>(j), static_cast<uint32_t>(h), host_payload[j]);
  std::vector<comm::Bytes> from_rank;
  comm::hierarchical_allgatherv(comm, hosts, mine.data(), mine.size(), from_rank);
  std::vector<std::vector<comm::Bytes>> gathered(J, std::vector<comm::Bytes>(H));
  std::vector<char> have(J * H, 0);
  for (size_t q = 0; q < from_rank.size(); ++q) {
    const comm::Bytes& in = from_rank[q];
    const size_t g = static_cast<size_t>(hosts.host_of[q]);
    const size_t index = static_cast<size_t>(hosts.local_index[q]);
    const size_t Lg = hosts.hosts[g].size();
    size_t at = 0;
    while (at < in.size()) {
      uint32_t tj = 0, th = 0;
      uint64_t n = 0;
      if (in.size() - at < 16) throw CorruptPayload("hierarchical sparse exchange: truncated");
      std::memcpy(&tj, in.data() + at, 4);
      std::memcpy(&th, in.data() + at + 4, 4);
      std::memcpy(&n, in.data() + at + 8, 8);
      at += 16;
      if (tj >= J || th != g || (tj % S) % Lg != index || n > in.size() - at || have[tj * H + th])
        throw CorruptPayload("hierarchical sparse exchange: a malformed record from rank " +
                             std::to_string(q));
      gathered[tj][th].assign(in.data() + at, in.data() + at + n);
      have[tj * H + th] = 1;
      at += n;
    }
  }
  for (size_t j = 0; j < J; ++j)
    for (size_t g = 0; g < H; ++g)
      if (!have[j * H + g])
        throw MismatchError("hierarchical sparse exchange: no payload of '" +
                            unit.jobs[j]->tensor->key + "' from host " + std::to_string(g) +
                            " reached rank " + std::to_string(me));

  // One message per host, framed as a rank's (compress/wire/message.h), for finish_unit.
  unit.received.assign(H, comm::Bytes());
  for (size_t g = 0; g < H; ++g) {
    std::vector<uint8_t> m;
    wire::begin_message(m, static_cast<uint32_t>(J));
    for (size_t j = 0; j < J; ++j) {
      const size_t at = wire::begin_payload(m);
      m.insert(m.end(), gathered[j][g].begin(), gathered[j][g].end());
      wire::end_payload(m, at);
    }
    unit.received[g].assign(m.begin(), m.end());
  }
}

class SparseHierarchicalRoute : public Transfer {
 public:
  Path path() const override { return Path::kSparseHierarchical; }
  void pack(pipeline::Unit& unit, const JobWork& work) const override { pack_sparse(unit, work); }
  void plan(Context& ctx) const override { plan_sparse(ctx); }
  Payloads unpack(const pipeline::Unit& unit, const Context& ctx) const override {
    return unpack_sparse(unit, ctx);
  }
  // Priced as the flat gather the planner prices (its host steps are not modelled yet); the bytes
  // are what arrived.
  void finish(pipeline::Unit& unit, Context& ctx) const override {
    unit.sample.codec = sparse_codec_of(unit);
    unit.sample.terms =
        cost::allgatherv_terms(1, ctx.world_size, ctx.options.sparse_ring_for(ctx.world_size));
    unit.sample.terms.bytes = static_cast<double>(unit.counters.received_bytes);
  }

  void exchange(pipeline::Unit& unit, Context& ctx) const override {
    const auto t0 = std::chrono::steady_clock::now();
    try {
      exchange_hierarchical(unit, ctx);
    } catch (const Error& e) {
      throw Error(e.code(), "sparse exchange of [" + unit.keys() + "]: " + e.what());
    }
    unit.counters.transfer_seconds += seconds_since(t0);
  }
};

}  // namespace

const Transfer& sparse_hierarchical_route() {
  static const SparseHierarchicalRoute route;
  return route;
}

}  // namespace gradex::sync::route
