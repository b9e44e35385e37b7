// hierarchical_allreduce_sum (comm/hierarchical.h): reduce to shard owners inside each host,
// allreduce each shard across hosts among its owners, then copy the shards back inside each host.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>

#include "base/check.h"
#include "base/error.h"
#include "base/thread_buffer.h"
#include "comm/collectives.h"
#include "comm/collectives/group_communicator.h"
#include "comm/collectives/received_length.h"
#include "comm/collectives/reduce.h"
#include "comm/hierarchical.h"

namespace gradex::comm {
namespace {

struct Shard {
  size_t begin = 0;
  size_t count = 0;
};

// The ring's segment rule: the first count % n shards one element longer.
Shard shard_of(size_t count, size_t n, size_t s) {
  const size_t base = count / n, extra = count % n;
  return {s * base + std::min(s, extra), base + (s < extra ? 1 : 0)};
}

struct IntraSlotsTag {};

}  // namespace

void hierarchical_allreduce_sum(Communicator& comm, const HostTopology& topology, void* data,
                                size_t count, DType dtype, bool direct_across) {
  const int P = comm.size();
  GX_CHECK_EQ(topology.world_size(), P);
  if (P == 1 || count == 0) return;
  GX_CHECK(data != nullptr);
  const int me = comm.rank();
  const int h = topology.host_of[static_cast<size_t>(me)];
  const std::vector<int>& local = topology.hosts[static_cast<size_t>(h)];
  const size_t L = local.size();
  const size_t my_index = static_cast<size_t>(topology.local_index[static_cast<size_t>(me)]);
  const size_t S = static_cast<size_t>(topology.max_local());
  const size_t elem = dtype_size(dtype);
  auto* bytes = static_cast<uint8_t*>(data);

  // Tags in the same order on every rank, whatever part this rank plays.
  const uint64_t tag_reduce = comm.next_collective_tag();
  std::vector<uint64_t> tag_cross(S);
  for (size_t s = 0; s < S; ++s)
    tag_cross[s] = comm.next_collective_tag();
  const uint64_t tag_copy = comm.next_collective_tag();

  auto owns = [&](size_t s) { return s % L == my_index; };

  // (1) Shards to their owners inside the host. Owners receive every other local rank's copy of
  // each shard they own into a slot of its own (slot j of shard s: local rank j's values).
  size_t slot_bytes = 0;
  for (size_t s = 0; s < S; ++s)
    if (owns(s)) slot_bytes += shard_of(count, S, s).count * elem * L;
  uint8_t* slots = thread_buffer<IntraSlotsTag>(std::max<size_t>(slot_bytes, 1));
  std::vector<RequestPtr> requests;
  std::vector<std::pair<size_t, size_t>> expected;  // request index -> (local rank, bytes)
  {
    size_t offset = 0;
    for (size_t s = 0; s < S; ++s) {
      const Shard sh = shard_of(count, S, s);
      if (sh.count == 0) continue;
      const size_t n = sh.count * elem;
      if (!owns(s)) {
        requests.push_back(comm.isend(local[s % L], tag_reduce + s, bytes + sh.begin * elem, n));
        expected.emplace_back(SIZE_MAX, 0);
        continue;
      }
      for (size_t j = 0; j < L; ++j) {
        if (j != my_index) {
          requests.push_back(comm.irecv(local[j], tag_reduce + s, slots + offset + j * n, n));
          expected.emplace_back(j, n);
        }
      }
      offset += n * L;
    }
  }
  comm.wait_all(requests, "hierarchical allreduce (reduce inside the host)");
  for (size_t k = 0; k < requests.size(); ++k) {
    if (expected[k].first == SIZE_MAX) continue;
    expect_received(comm, *requests[k], expected[k].second, local[expected[k].first], [] {
      return ReceivedText{"hierarchical allreduce", " of a shard",
                          ": the ranks disagree on the buffer's size or type"};
    });
  }
  requests.clear();
  {
    // The host's sum in local index order, accumulated in local rank 0's slot (or this rank's own
    // values when it is local rank 0), then written into this rank's buffer.
    size_t offset = 0;
    for (size_t s = 0; s < S; ++s) {
      const Shard sh = shard_of(count, S, s);
      if (!owns(s) || sh.count == 0) continue;
      const size_t n = sh.count * elem;
      uint8_t* own = bytes + sh.begin * elem;
      auto values = [&](size_t j) { return j == my_index ? own : slots + offset + j * n; };
      uint8_t* acc = values(0);
      for (size_t j = 1; j < L; ++j)
        sum_into(acc, values(j), sh.count, dtype);
      if (acc != own) std::memcpy(own, acc, n);
      offset += n * L;
    }
  }

  // (2) Each shard across hosts among its owners (host order), on their host sums.
  for (size_t s = 0; s < S; ++s) {
    if (!owns(s)) continue;
    const Shard sh = shard_of(count, S, s);
    std::vector<int> owners;
    owners.reserve(topology.hosts.size());
    for (const auto& host : topology.hosts)
      owners.push_back(host[s % host.size()]);
    GroupCommunicator group(comm, std::move(owners), {tag_cross[s]});
    if (direct_across)
      direct_allreduce_sum(group, bytes + sh.begin * elem, sh.count, dtype);
    else
      allreduce_sum(group, bytes + sh.begin * elem, sh.count, dtype);
  }

  // (3) Reduced shards from their owners to the other ranks of the host, stored unchanged.
  if (L == 1) return;
  std::vector<size_t> shard_of_request;
  for (size_t s = 0; s < S; ++s) {
    const Shard sh = shard_of(count, S, s);
    if (sh.count == 0) continue;
    uint8_t* at = bytes + sh.begin * elem;
    const size_t n = sh.count * elem;
    if (owns(s)) {
      for (size_t j = 0; j < L; ++j)
        if (j != my_index) requests.push_back(comm.isend(local[j], tag_copy + s, at, n));
      continue;
    }
    requests.push_back(comm.irecv(local[s % L], tag_copy + s, at, n));
    shard_of_request.resize(requests.size(), SIZE_MAX);
    shard_of_request.back() = s;
  }
  comm.wait_all(requests, "hierarchical allreduce (copy inside the host)");
  for (size_t k = 0; k < shard_of_request.size(); ++k) {
    if (shard_of_request[k] == SIZE_MAX) continue;
    const size_t s = shard_of_request[k];
    const size_t n = shard_of(count, S, s).count * elem;
    expect_received(comm, *requests[k], n, local[s % L], [s] {
      return ReceivedText{"hierarchical allreduce", " of reduced shard " + std::to_string(s), ""};
    });
  }
}

}  // namespace gradex::comm
