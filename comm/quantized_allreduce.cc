// encoded_allreduce: a direct reduce-scatter and a direct allgather of encoded segments (contract
// in comm/collectives.h). Direct rather than ring because a ring would decode, sum and re-encode
// at every hop (P - 1 roundings of a lossy code); here every contribution is encoded once by its
// rank and every reduced segment once by its owner, and the owner sums in a fixed rank order.
// Each rank sends and receives (P - 1) / P of the encoded buffer in each phase, as a ring does.
#include <algorithm>
#include <string>

#include "base/check.h"
#include "base/error.h"
#include "comm/collectives.h"

namespace gradex::comm {
namespace {

// Chunk boundaries inside a segment: multiples of `chunk_elems` elements.
size_t chunk_elems_of(const ChunkCodec& codec, size_t ring_chunk_bytes) {
  const size_t g = codec.granularity();
  const size_t granule_bytes = std::max<size_t>(1, codec.encoded_size(g));
  return g * std::max<size_t>(1, ring_chunk_bytes / granule_bytes);
}

// Posts the sends (or receives) of one segment's encoding, chunk by chunk, all on one tag (UCX
// matches messages of one sender and tag in order).
template <typename Post>
void for_each_chunk(const ChunkCodec& codec, size_t seg_count, size_t chunk_elems, Post&& post) {
  for (size_t a = 0; a < seg_count; a += chunk_elems) {
    const size_t b = std::min(seg_count, a + chunk_elems);
    const size_t off = codec.encoded_size(a);
    post(off, codec.encoded_size(b) - off);
  }
}

void check_lengths(Communicator& comm, const std::vector<RequestPtr>& recvs,
                   const std::vector<size_t>& expected, const std::vector<int>& peers,
                   const char* operation) {
  for (size_t i = 0; i < recvs.size(); ++i) {
    const size_t got = comm.recv_length(*recvs[i]);
    if (got != expected[i])
      throw CorruptPayload(std::string(operation) + ": rank " + std::to_string(peers[i]) +
                           " sent a chunk of " + std::to_string(got) + " bytes, " +
                           std::to_string(expected[i]) + " expected (codecs differ across ranks?)");
  }
}

}  // namespace

Segment encoded_segment(size_t count, size_t granularity, int world, int k) {
  GX_CHECK_GT(granularity, 0u);
  GX_CHECK(k >= 0 && k < world);
  const size_t granules = (count + granularity - 1) / granularity;
  const size_t P = static_cast<size_t>(world), K = static_cast<size_t>(k);
  const size_t first = K * (granules / P) + std::min(K, granules % P);
  const size_t n = granules / P + (K < granules % P);
  Segment s;
  s.begin = std::min(count, first * granularity);
  s.count = std::min(count, (first + n) * granularity) - s.begin;
  return s;
}

void encoded_allreduce(Communicator& comm, ChunkCodec& contribution, ChunkCodec& result,
                       const float* in, float* out, size_t count,
                       const std::function<void(float*, size_t, size_t)>& transform) {
  const int P = comm.size(), r = comm.rank();
  GX_CHECK_EQ(contribution.granularity(), result.granularity());
  GX_CHECK(count == 0 || (in != nullptr && out != nullptr));
  const size_t g = contribution.granularity();
  const size_t chunk_c = chunk_elems_of(contribution, comm.options().ring_chunk_bytes);
  const size_t chunk_r = chunk_elems_of(result, comm.options().ring_chunk_bytes);
  std::vector<Segment> seg(static_cast<size_t>(P));
  for (int k = 0; k < P; ++k)
    seg[static_cast<size_t>(k)] = encoded_segment(count, g, P, k);
  const Segment mine = seg[static_cast<size_t>(r)];
  const uint64_t tag = P > 1 ? comm.next_collective_tag() : 0;

  // Reduce-scatter: encode every segment (own included, so that the owner sums its own decoded
  // contribution like everyone else's), send segment k to rank k, receive P - 1 encodings of own.
  std::vector<std::vector<uint8_t>> enc(static_cast<size_t>(P));
  for (int k = 0; k < P; ++k) {
    const Segment& s = seg[static_cast<size_t>(k)];
    enc[static_cast<size_t>(k)].resize(contribution.encoded_size(s.count));
    contribution.encode(in + s.begin, s.count, s.begin, enc[static_cast<size_t>(k)].data());
  }
  std::vector<float> sum(mine.count, 0.0f);
  {
    std::vector<std::vector<uint8_t>> got(static_cast<size_t>(P));
    std::vector<RequestPtr> recvs, sends;
    std::vector<size_t> expected;
    std::vector<int> peers;
    for (int q = 0; q < P; ++q) {
      if (q == r) continue;
      auto& buf = got[static_cast<size_t>(q)];
      buf.resize(contribution.encoded_size(mine.count));
      for_each_chunk(contribution, mine.count, chunk_c, [&](size_t off, size_t len) {
        recvs.push_back(comm.irecv(q, tag, buf.data() + off, len));
        expected.push_back(len);
        peers.push_back(q);
      });
      const Segment& s = seg[static_cast<size_t>(q)];
      const uint8_t* src = enc[static_cast<size_t>(q)].data();
      for_each_chunk(contribution, s.count, chunk_c, [&](size_t off, size_t len) {
        sends.push_back(comm.isend(q, tag, src + off, len));
      });
    }
    comm.wait_all(recvs, "encoded reduce-scatter");
    check_lengths(comm, recvs, expected, peers, "encoded reduce-scatter");
    comm.wait_all(sends, "encoded reduce-scatter");
    got[static_cast<size_t>(r)] = std::move(enc[static_cast<size_t>(r)]);
    for (int q = 0; q < P; ++q)
      contribution.decode_add(got[static_cast<size_t>(q)].data(), mine.count, sum.data());
  }
  if (mine.count > 0) transform(sum.data(), mine.count, mine.begin);

  // Allgather: the owner's encoding of its reduced segment goes to every rank; everyone decodes
  // every segment from the same bytes.
  std::vector<uint8_t> own(result.encoded_size(mine.count));
  result.encode(sum.data(), mine.count, mine.begin, own.data());
  std::vector<std::vector<uint8_t>> segs(static_cast<size_t>(P));
  std::vector<RequestPtr> recvs, sends;
  std::vector<size_t> expected;
  std::vector<int> peers;
  for (int q = 0; q < P; ++q) {
    if (q == r) continue;
    const Segment& s = seg[static_cast<size_t>(q)];
    auto& buf = segs[static_cast<size_t>(q)];
    buf.resize(result.encoded_size(s.count));
    for_each_chunk(result, s.count, chunk_r, [&](size_t off, size_t len) {
      recvs.push_back(comm.irecv(q, tag + 1, buf.data() + off, len));
      expected.push_back(len);
      peers.push_back(q);
    });
    for_each_chunk(result, mine.count, chunk_r, [&](size_t off, size_t len) {
      sends.push_back(comm.isend(q, tag + 1, own.data() + off, len));
    });
  }
  comm.wait_all(recvs, "encoded allgather");
  check_lengths(comm, recvs, expected, peers, "encoded allgather");
  comm.wait_all(sends, "encoded allgather");
  segs[static_cast<size_t>(r)] = std::move(own);
  for (int q = 0; q < P; ++q) {
    const Segment& s = seg[static_cast<size_t>(q)];
    result.decode(segs[static_cast<size_t>(q)].data(), s.count, out + s.begin);
  }
}

}  // namespace gradex::comm
