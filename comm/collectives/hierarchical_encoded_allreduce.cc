// hierarchical_encoded_allreduce (comm/hierarchical.h): fp32 sums to the local shards' owners
// inside each host, the encoded allreduce of each shard across hosts among its owners, then the
// results copied back inside each host.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "base/check.h"
#include "base/error.h"
#include "base/thread_buffer.h"
#include "comm/collectives.h"
#include "comm/collectives/group_communicator.h"
#include "comm/hierarchical.h"

namespace gradex::comm {
namespace {

// A buffer's codec as one of its local shards sees it: the offsets it is called with are the
// shard's, the inner codec gets the whole buffer's.
class ShardCodec final : public ChunkCodec {
 public:
  ShardCodec(ChunkCodec& inner, size_t begin) : inner_(inner), begin_(begin) {}
  size_t granularity() const override { return inner_.granularity(); }
  size_t encoded_size(size_t count) const override { return inner_.encoded_size(count); }
  void encode(const float* values, size_t count, size_t offset, uint8_t* out) override {
    inner_.encode(values, count, begin_ + offset, out);
  }
  void decode_add(const uint8_t* in, size_t count, float* acc) const override {
    inner_.decode_add(in, count, acc);
  }
  void decode(const uint8_t* in, size_t count, float* out) const override {
    inner_.decode(in, count, out);
  }
  void validate(const uint8_t* in, size_t bytes, size_t count,
                const std::string& what) const override {
    inner_.validate(in, bytes, count, what);
  }

 private:
  ChunkCodec& inner_;
  size_t begin_;
};

struct SendPackTag {};
struct SlotsTag {};

}  // namespace

void hierarchical_encoded_allreduce(Communicator& comm, const HostTopology& topology,
                                    const std::vector<EncodedBuffer>& buffers,
                                    const EncodedAllreduceOptions& options) {
  const int P = comm.size();
  GX_CHECK_EQ(topology.world_size(), P);
  if (buffers.empty()) return;
  const int me = comm.rank();
  const std::vector<int>& local =
      topology.hosts[static_cast<size_t>(topology.host_of[static_cast<size_t>(me)])];
  const size_t L = local.size();
  const size_t my_index = static_cast<size_t>(topology.local_index[static_cast<size_t>(me)]);
  const size_t S = static_cast<size_t>(topology.max_local());

  // Tags in the same order on every rank, whatever part this rank plays.
  const uint64_t tag_reduce = comm.next_collective_tag();
  std::vector<uint64_t> tag_cross(S);
  for (uint64_t& tag : tag_cross)
    tag = comm.next_collective_tag();
  const uint64_t tag_copy = comm.next_collective_tag();

  // shard[s][b]: buffer b's elements in local shard s; floats[s]: shard s of every buffer.
  std::vector<std::vector<Segment>> shard(S, std::vector<Segment>(buffers.size()));
  std::vector<size_t> floats(S, 0);
  for (size_t s = 0; s < S; ++s) {
    for (size_t b = 0; b < buffers.size(); ++b) {
      const EncodedBuffer& buf = buffers[b];
      GX_CHECK(buf.contribution != nullptr && buf.result != nullptr);
      shard[s][b] = encoded_segment(buf.count, buf.contribution->granularity(), static_cast<int>(S),
                                    static_cast<int>(s));
      floats[s] += shard[s][b].count;
    }
  }
  auto owns = [&](size_t s) { return s % L == my_index; };
  auto check_lengths = [&](std::vector<RequestPtr>& requests,
                           const std::vector<std::pair<int, size_t>>& expected, const char* what) {
    for (size_t k = 0; k < requests.size(); ++k) {
      const auto& [from, bytes] = expected[k];
      if (from < 0) continue;
      const size_t got = comm.recv_length(*requests[k]);
      if (got != bytes)
        throw MismatchError(options.name + " " + what + ": rank " + std::to_string(me) +
                            " received " + std::to_string(got) + " bytes from rank " +
                            std::to_string(from) + ", expected " + std::to_string(bytes) +
                            ": the ranks disagree on the buffers' sizes");
    }
  };

  // (1) Every rank's values of each shard to its owner; owners keep each local rank's in a slot.
  size_t pack_floats = 0, slot_floats = 0;
  for (size_t s = 0; s < S; ++s)
    (owns(s) ? slot_floats : pack_floats) += owns(s) ? floats[s] * L : floats[s];
  auto* pack =
      reinterpret_cast<float*>(thread_buffer<SendPackTag>(4 * std::max<size_t>(pack_floats, 1)));
  auto* slots =
      reinterpret_cast<float*>(thread_buffer<SlotsTag>(4 * std::max<size_t>(slot_floats, 1)));
  std::vector<size_t> slot_at(S, 0);  // owned shard s: its slots start here (slot j: local rank j)
  std::vector<RequestPtr> requests;
  std::vector<std::pair<int, size_t>> expected;  // per request: (sender, bytes), or (-1, 0)
  {
    size_t packed = 0, slotted = 0;
    for (size_t s = 0; s < S; ++s) {
      if (floats[s] == 0) continue;
      if (!owns(s)) {
        float* at = pack + packed;
        for (size_t b = 0; b < buffers.size(); ++b) {
          const Segment& seg = shard[s][b];
          if (seg.count) std::memcpy(at, buffers[b].in + seg.begin, 4 * seg.count);
          at += seg.count;
        }
        requests.push_back(comm.isend(local[s % L], tag_reduce + s, pack + packed, 4 * floats[s]));
        expected.emplace_back(-1, 0);
        packed += floats[s];
        continue;
      }
      slot_at[s] = slotted;
      for (size_t j = 0; j < L; ++j) {
        if (j == my_index) continue;
        requests.push_back(
            comm.irecv(local[j], tag_reduce + s, slots + slotted + j * floats[s], 4 * floats[s]));
        expected.emplace_back(local[j], 4 * floats[s]);
      }
      slotted += floats[s] * L;
    }
  }
  comm.wait_all(requests, (options.name + " (sums inside the host)").c_str());
  check_lengths(requests, expected, "sums inside the host");
  requests.clear();
  expected.clear();
  // The host's sum of each owned shard into this rank's `out`, in local index order: this rank's
  // values join the others' in its own slot first (`in` may alias `out`).
  for (size_t s = 0; s < S; ++s) {
    if (!owns(s) || floats[s] == 0) continue;
    auto slot = [&](size_t j) { return slots + slot_at[s] + j * floats[s]; };
    size_t at = 0;
    for (size_t b = 0; b < buffers.size(); ++b) {
      const Segment& seg = shard[s][b];
      if (seg.count) std::memcpy(slot(my_index) + at, buffers[b].in + seg.begin, 4 * seg.count);
      at += seg.count;
    }
    at = 0;
    for (size_t b = 0; b < buffers.size(); ++b) {
      const Segment& seg = shard[s][b];
      float* out = buffers[b].out + seg.begin;
      if (seg.count) std::memcpy(out, slot(0) + at, 4 * seg.count);
      for (size_t j = 1; j < L; ++j) {
        const float* x = slot(j) + at;
        for (size_t i = 0; i < seg.count; ++i)
          out[i] = x[i] + out[i];
      }
      at += seg.count;
    }
  }

  // (2) Each owned shard across hosts among its owners, in host order.
  for (size_t s = 0; s < S; ++s) {
    if (!owns(s)) continue;
    std::vector<int> owners;
    owners.reserve(topology.hosts.size());
    for (const std::vector<int>& host : topology.hosts)
      owners.push_back(host[s % host.size()]);
    std::vector<ShardCodec> codecs;
    codecs.reserve(2 * buffers.size());
    std::vector<EncodedBuffer> parts(buffers.size());
    std::vector<size_t> begin(buffers.size());
    for (size_t b = 0; b < buffers.size(); ++b) {
      const Segment& seg = shard[s][b];
      begin[b] = seg.begin;
      codecs.emplace_back(*buffers[b].contribution, seg.begin);
      codecs.emplace_back(*buffers[b].result, seg.begin);
      parts[b] = {&codecs[2 * b],
                  &codecs[2 * b + 1],
                  buffers[b].out + seg.begin,
                  buffers[b].out + seg.begin,
                  seg.count,
                  buffers[b].label};
    }
    EncodedAllreduceOptions across = options;
    if (options.transform) {
      across.transform = [&options, &begin](size_t b, float* values, size_t count, size_t offset) {
        options.transform(b, values, count, begin[b] + offset);
      };
    }
    GroupCommunicator group(comm, std::move(owners), {tag_cross[s]});
    encoded_allreduce(group, parts, across);
  }

  // (3) The results of each shard from its owner to the host's other ranks, stored unchanged.
  if (L == 1) return;
  {
    size_t packed = 0;
    for (size_t s = 0; s < S; ++s) {
      if (floats[s] == 0) continue;
      if (owns(s)) {
        float* at =
            slots + slot_at[s];  // this shard's slots are spent: the results go out from here
        for (size_t b = 0; b < buffers.size(); ++b) {
          const Segment& seg = shard[s][b];
          if (seg.count) std::memcpy(at, buffers[b].out + seg.begin, 4 * seg.count);
          at += seg.count;
        }
        for (size_t j = 0; j < L; ++j) {
          if (j == my_index) continue;
          requests.push_back(comm.isend(local[j], tag_copy + s, slots + slot_at[s], 4 * floats[s]));
          expected.emplace_back(-1, 0);
        }
        continue;
      }
      requests.push_back(comm.irecv(local[s % L], tag_copy + s, pack + packed, 4 * floats[s]));
      expected.emplace_back(local[s % L], 4 * floats[s]);
      packed += floats[s];
    }
  }
  comm.wait_all(requests, (options.name + " (results inside the host)").c_str());
  check_lengths(requests, expected, "results inside the host");
  size_t packed = 0;
  for (size_t s = 0; s < S; ++s) {
    if (owns(s) || floats[s] == 0) continue;
    const float* at = pack + packed;
    for (size_t b = 0; b < buffers.size(); ++b) {
      const Segment& seg = shard[s][b];
      if (seg.count) std::memcpy(buffers[b].out + seg.begin, at, 4 * seg.count);
      at += seg.count;
    }
    packed += floats[s];
  }
}

}  // namespace gradex::comm
