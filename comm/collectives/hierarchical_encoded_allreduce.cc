// hierarchical_encoded_allreduce (comm/hierarchical.h): each rank's encoding of the local shards
// others own to their owners, the encoded allreduce of each host sum across hosts among the
// shard's owners, then the owners' result encodings to the host's other ranks.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "base/check.h"
#include "base/error.h"
#include "comm/collectives.h"
#include "comm/collectives/group_communicator.h"
#include "comm/collectives/received_length.h"
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

// Message buffers kept between calls (each thread its own), so that steady-state steps allocate
// and fault in nothing, as the flat encoded allreduce's.
struct Buffers {
  std::vector<std::vector<uint8_t>> sent, received, results;
  std::vector<std::vector<float>> averages;
};

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
      expect_received(comm, *requests[k], bytes, from, [&] {
        return ReceivedText{options.name + " " + what, "",
                            ": the ranks disagree on the buffers' sizes"};
      });
    }
  };

  // Bytes of shard s of every buffer in the contribution encoding, and of the results among the
  // owners (owner by owner across the H groups, each owner's segments of every buffer).
  const int H = topology.host_count();
  auto contribution_bytes = [&](size_t s) {
    size_t n = 0;
    for (size_t b = 0; b < buffers.size(); ++b)
      n += buffers[b].contribution->encoded_size(shard[s][b].count);
    return n;
  };
  auto result_bytes = [&](size_t s) {
    size_t n = 0;
    for (int q = 0; q < H; ++q)
      for (size_t b = 0; b < buffers.size(); ++b)
        n += buffers[b].result->encoded_size(
            encoded_segment(shard[s][b].count, buffers[b].result->granularity(), H, q).count);
    return n;
  };
  auto piece = [&](const std::string& phase, int from, size_t b) {
    return options.name + " " + phase + " from rank " + std::to_string(from) + ", " +
           buffers[b].label;
  };

  // (1) Every rank's shards that another local rank owns, encoded with the contribution codecs
  // (their error feedback at those elements), to the owner.
  thread_local Buffers x;
  std::vector<std::vector<uint8_t>>& sent = x.sent;
  std::vector<std::vector<uint8_t>>& received = x.received;
  sent.resize(S);
  received.resize(S * L);
  std::vector<RequestPtr> requests;
  std::vector<std::pair<int, size_t>> expected;  // per request: (sender, bytes), or (-1, 0)
  for (size_t s = 0; s < S; ++s) {
    if (floats[s] == 0) continue;
    if (!owns(s)) {
      sent[s].resize(contribution_bytes(s));
      size_t at = 0;
      for (size_t b = 0; b < buffers.size(); ++b) {
        const Segment& seg = shard[s][b];
        buffers[b].contribution->encode(buffers[b].in + seg.begin, seg.count, seg.begin,
                                        sent[s].data() + at);
        at += buffers[b].contribution->encoded_size(seg.count);
        comm.progress();
      }
      requests.push_back(comm.isend(local[s % L], tag_reduce + s, sent[s].data(), sent[s].size()));
      expected.emplace_back(-1, 0);
      continue;
    }
    for (size_t j = 0; j < L; ++j) {
      if (j == my_index) continue;
      std::vector<uint8_t>& in = received[s * L + j];
      in.resize(contribution_bytes(s));
      requests.push_back(comm.irecv(local[j], tag_reduce + s, in.data(), in.size()));
      expected.emplace_back(local[j], in.size());
    }
  }
  comm.wait_all(requests, (options.name + " (sums inside the host)").c_str());
  check_lengths(requests, expected, "sums inside the host");
  requests.clear();
  expected.clear();
  // The host's sum of each owned shard into this rank's `out`: its own values, then the others'
  // decoded in local index order (only the owner computes it: its bits are what everyone gets).
  for (size_t s = 0; s < S; ++s) {
    if (!owns(s) || floats[s] == 0) continue;
    size_t at = 0;
    for (size_t b = 0; b < buffers.size(); ++b) {
      const EncodedBuffer& buf = buffers[b];
      const Segment& seg = shard[s][b];
      const size_t bytes = buf.contribution->encoded_size(seg.count);
      float* out = buf.out + seg.begin;
      if (buf.in != buf.out && seg.count) std::memcpy(out, buf.in + seg.begin, 4 * seg.count);
      for (size_t j = 0; j < L; ++j) {
        if (j == my_index) continue;
        const uint8_t* in = received[s * L + j].data() + at;
        buf.contribution->validate(in, bytes, seg.count, piece("inside the host", local[j], b));
        buf.contribution->decode_add(in, seg.count, out);
      }
      at += bytes;
      comm.progress();
    }
  }

  // (2) Each owned shard across hosts among its owners, in host order; the results' encodings
  // kept for step (3) (the one hop has none: its averages go on as fp32).
  std::vector<std::vector<uint8_t>>& results = x.results;
  results.resize(S);
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
    across.results = &results[s];
    GroupCommunicator group(comm, std::move(owners), {tag_cross[s]});
    encoded_allreduce(group, parts, across);
  }
  if (options.results) options.results->clear();

  // (3) Each shard's results from its owner to the host's other ranks: the encodings every owner
  // decoded, decoded here from the same bytes (fp32 after a one-hop step).
  if (L == 1) return;
  const bool encoded = !options.one_hop;
  std::vector<std::vector<float>>& averages = x.averages;
  averages.resize(S);
  for (size_t s = 0; s < S; ++s) {
    if (floats[s] == 0) continue;
    if (owns(s)) {
      if (!encoded) {
        averages[s].resize(floats[s]);
        size_t at = 0;
        for (size_t b = 0; b < buffers.size(); ++b) {
          const Segment& seg = shard[s][b];
          std::copy(buffers[b].out + seg.begin, buffers[b].out + seg.begin + seg.count,
                    averages[s].begin() + static_cast<std::ptrdiff_t>(at));
          at += seg.count;
        }
      }
      const void* data = encoded ? static_cast<const void*>(results[s].data()) : averages[s].data();
      const size_t bytes = encoded ? results[s].size() : 4 * floats[s];
      for (size_t j = 0; j < L; ++j) {
        if (j == my_index) continue;
        requests.push_back(comm.isend(local[j], tag_copy + s, data, bytes));
        expected.emplace_back(-1, 0);
      }
      continue;
    }
    const int from = local[s % L];
    if (encoded) {
      results[s].resize(result_bytes(s));
      requests.push_back(comm.irecv(from, tag_copy + s, results[s].data(), results[s].size()));
      expected.emplace_back(from, results[s].size());
    } else {
      averages[s].resize(floats[s]);
      requests.push_back(comm.irecv(from, tag_copy + s, averages[s].data(), 4 * floats[s]));
      expected.emplace_back(from, 4 * floats[s]);
    }
  }
  comm.wait_all(requests, (options.name + " (results inside the host)").c_str());
  check_lengths(requests, expected, "results inside the host");
  for (size_t s = 0; s < S; ++s) {
    if (owns(s) || floats[s] == 0) continue;
    const int from = local[s % L];
    if (!encoded) {
      size_t at = 0;
      for (size_t b = 0; b < buffers.size(); ++b) {
        const Segment& seg = shard[s][b];
        std::copy(averages[s].begin() + static_cast<std::ptrdiff_t>(at),
                  averages[s].begin() + static_cast<std::ptrdiff_t>(at + seg.count),
                  buffers[b].out + seg.begin);
        at += seg.count;
      }
      continue;
    }
    const uint8_t* in = results[s].data();
    for (int q = 0; q < H; ++q) {
      for (size_t b = 0; b < buffers.size(); ++b) {
        const EncodedBuffer& buf = buffers[b];
        const Segment& seg = shard[s][b];
        const Segment part = encoded_segment(seg.count, buf.result->granularity(), H, q);
        const size_t bytes = buf.result->encoded_size(part.count);
        buf.result->validate(in, bytes, part.count, piece("results inside the host", from, b));
        buf.result->decode(in, part.count, buf.out + seg.begin + part.begin);
        in += bytes;
      }
    }
    comm.progress();
  }
}

}  // namespace gradex::comm
