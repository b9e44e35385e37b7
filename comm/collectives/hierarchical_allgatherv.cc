// hierarchical_allgatherv (comm/hierarchical.h): each local index's payloads gathered across hosts
// by its representatives, then every payload a rank holds shared inside its host as framed records
// [u32 origin rank][u64 length][bytes].
#include <cstring>
#include <string>

#include "base/check.h"
#include "base/error.h"
#include "comm/collectives.h"
#include "comm/collectives/group_communicator.h"
#include "comm/hierarchical.h"

namespace gradex::comm {
namespace {

void put(Bytes& out, const void* p, size_t n) {
  const auto* b = static_cast<const uint8_t*>(p);
  out.insert(out.end(), b, b + n);
}

[[noreturn]] void corrupt(int me, int from, const std::string& why) {
  throw CorruptPayload("hierarchical allgatherv: rank " + std::to_string(me) +
                       " received a malformed record set from rank " + std::to_string(from) + ": " +
                       why);
}

}  // namespace

void hierarchical_allgatherv(Communicator& comm, const HostTopology& topology, const void* data,
                             size_t bytes, std::vector<Bytes>& result) {
  const int P = comm.size();
  GX_CHECK_EQ(topology.world_size(), P);
  const int me = comm.rank();
  result.resize(static_cast<size_t>(P));
  result[static_cast<size_t>(me)].assign(static_cast<const uint8_t*>(data),
                                         static_cast<const uint8_t*>(data) + bytes);
  if (P == 1) return;
  const int h = topology.host_of[static_cast<size_t>(me)];
  const std::vector<int>& local = topology.hosts[static_cast<size_t>(h)];
  const size_t L = local.size();
  const size_t my_index = static_cast<size_t>(topology.local_index[static_cast<size_t>(me)]);
  const size_t S = static_cast<size_t>(topology.max_local());

  std::vector<uint64_t> tag_cross(S);
  for (size_t i = 0; i < S; ++i)
    tag_cross[i] = comm.next_collective_tag();
  const uint64_t tag_host = comm.next_collective_tag();

  // (1) Across hosts, per local index i, among its representatives.
  std::vector<int> held;  // ranks of other hosts whose payloads this rank received
  std::vector<Bytes> gathered;
  for (size_t i = 0; i < S; ++i) {
    if (i % L != my_index) continue;
    std::vector<int> group;
    group.reserve(topology.hosts.size());
    for (const auto& host : topology.hosts)
      group.push_back(host[i % host.size()]);
    GroupCommunicator hosts(comm, std::move(group), {tag_cross[i]});
    const bool mine = i == my_index;
    // Directly either way; without a size round where receives learn their length on arrival
    // (the same messages and bursts, one message latency fewer: across regions, a round trip).
    if (hosts.receives_any_length())
      allgatherv_unsized(hosts, mine ? data : nullptr, mine ? bytes : 0, gathered, false,
                         kUnsizedMaxBytes, "hierarchical allgatherv across hosts");
    else
      allgatherv(hosts, mine ? data : nullptr, mine ? bytes : 0, gathered);
    for (size_t g = 0; g < topology.hosts.size(); ++g) {
      const auto& host = topology.hosts[g];
      if (static_cast<int>(g) == h || i >= host.size()) continue;
      const int origin = host[i];
      result[static_cast<size_t>(origin)] = std::move(gathered[g]);
      held.push_back(origin);
    }
  }
  if (L == 1) return;

  // (2) Inside the host: this rank's own payload and those it holds, to every local rank.
  Bytes records;
  auto add_record = [&](int origin) {
    const Bytes& p = result[static_cast<size_t>(origin)];
    const uint32_t o = static_cast<uint32_t>(origin);
    const uint64_t n = p.size();
    put(records, &o, sizeof(o));
    put(records, &n, sizeof(n));
    put(records, p.data(), p.size());
  };
  add_record(me);
  for (int origin : held)
    add_record(origin);
  std::vector<Bytes> from_host;
  GroupCommunicator host(comm, local, {tag_host});
  allgatherv(host, records.data(), records.size(), from_host);

  std::vector<char> filled(static_cast<size_t>(P), 0);
  filled[static_cast<size_t>(me)] = 1;
  for (int origin : held)
    filled[static_cast<size_t>(origin)] = 1;
  for (size_t j = 0; j < L; ++j) {
    if (j == my_index) continue;
    const int from = local[j];
    const Bytes& in = from_host[j];
    size_t at = 0;
    while (at < in.size()) {
      uint32_t origin = 0;
      uint64_t n = 0;
      if (in.size() - at < sizeof(origin) + sizeof(n)) corrupt(me, from, "a truncated header");
      std::memcpy(&origin, in.data() + at, sizeof(origin));
      std::memcpy(&n, in.data() + at + sizeof(origin), sizeof(n));
      at += sizeof(origin) + sizeof(n);
      if (origin >= static_cast<uint32_t>(P)) corrupt(me, from, "origin rank out of range");
      if (n > in.size() - at) corrupt(me, from, "a record longer than the message");
      if (filled[origin]) corrupt(me, from, "rank " + std::to_string(origin) + " twice");
      filled[origin] = 1;
      result[origin].assign(in.data() + at, in.data() + at + n);
      at += n;
    }
  }
  for (int r = 0; r < P; ++r)
    if (!filled[static_cast<size_t>(r)])
      throw MismatchError("hierarchical allgatherv: rank " + std::to_string(me) +
                          " received no payload of rank " + std::to_string(r) +
                          ": the ranks disagree on the host topology");
}

}  // namespace gradex::comm
