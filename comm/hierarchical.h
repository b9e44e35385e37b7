// Hierarchical collectives (GRADEX_HIERARCHICAL, docs/collectives.md "Hierarchical exchange"):
// traffic inside a host stays inside it (shared memory where the communicator uses it), and what
// crosses hosts crosses each host's link once per host, sharded over the host's local ranks so that
// every local rank (every NIC lane) carries part of it. Every rank of the job calls them with the
// same topology and arguments, as the flat collectives; ranks need not be contiguous per host.
#pragma once

#include <cstddef>
#include <vector>

#include "base/dtype.h"
#include "comm/collectives.h"
#include "comm/communicator.h"
#include "comm/topology/host_topology.h"

namespace gradex::comm {

// In-place sum across ranks. With L = topology.max_local() the buffer is cut into L shards (the
// ring's segment rule, docs/collectives.md); shard s of host h is owned by its local rank
// s mod L_h. (1) Inside each host every rank sends each shard to its owner, which sums it in local
// index order: acc = x_0, then acc = x_i + acc for i = 1 .. L_h-1 (sum_into: fp32 additions; 16-bit
// values widened, added, rounded once per addition). (2) The owners of shard s on every host run
// allreduce_sum (the flat ring, in host order) over their host sums, or with `direct_across`
// direct_allreduce_sum (the same bits in 2 message latencies, 1 between two hosts: for a tier
// whose latency bounds the exchange, such as regions). (3) Each owner sends its reduced shard to
// the other ranks of its host, which store the bytes unchanged. The result is bit-identical on
// every rank, and equal to the flat ring's up to the summation order. Takes 2 + L of comm's
// collective tags on every rank.
void hierarchical_allreduce_sum(Communicator& comm, const HostTopology& topology, void* data,
                                size_t count, DType dtype, bool direct_across = false);

// Same contract and result as allgatherv (every rank's payload, indexed by rank, byte for byte).
// (1) For each local index i, the ranks that represent it on every host (local rank i mod L_h)
// run an allgatherv over the hosts of the payload of the rank with local index i (empty where a
// host has fewer ranks; allgatherv_unsized, direct, where comm receives messages of unknown
// length: no size round): each payload crosses each host's link once per remote host instead of
// once per remote rank. (2) Inside each host every rank sends the payloads it holds (its own and
// those it received) to the others in one allgatherv of framed records. Takes 1 + L tags.
void hierarchical_allgatherv(Communicator& comm, const HostTopology& topology, const void* data,
                             size_t bytes, std::vector<Bytes>& result);

// encoded_allreduce (comm/collectives.h) with the same layout: the encoded phases cross hosts once
// per host, sharded over the host's local ranks, and nothing travels unencoded. With
// S = topology.max_local(), each buffer is cut into S local shards of whole granules
// (encoded_segment(count, granularity, S, s): a rank owns the same elements of a buffer whatever
// else shares the call); shard s of host h is owned by its local rank s mod L_h. Codecs are called
// with the whole buffer's offsets throughout, so codec state indexed by element (a residual) stays
// with the elements. (1) Inside each host every rank encodes its `in` values of each shard another
// local rank owns with the `contribution` codecs and sends them, every buffer's back to back, to
// the owner, which validates them and adds them, decoded in local index order, to its own exact
// values in its `out`. (2) The owners of shard s on every host run
// encoded_allreduce over their host sums (in host order), transform called with whole-buffer
// offsets. (3) Each owner passes the `result` encodings it decoded to the other ranks of its host,
// which validate and decode the same bytes (after a one-hop step, which has none, the fp32
// averages). The same bits on every rank; one more lossy encoding than the flat call for the
// values of ranks that own no shard of them. Cross-host bytes per host and phase: (H-1)/H of the
// encoded buffers, where the flat call moves about L_h times that. A piece of the wrong length
// inside a host is a MismatchError naming both ranks, an invalid one the codec's CorruptPayload.
// `in` may alias `out`. Takes 2 + S of comm's collective tags on every rank.
void hierarchical_encoded_allreduce(Communicator& comm, const HostTopology& topology,
                                    const std::vector<EncodedBuffer>& buffers,
                                    const EncodedAllreduceOptions& options);

}  // namespace gradex::comm
