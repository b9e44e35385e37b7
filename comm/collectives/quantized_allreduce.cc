// encoded_allreduce: a direct reduce-scatter and a direct allgather of encoded segments (contract
// in comm/collectives.h). Direct rather than ring because a ring would decode, sum and re-encode
// at every hop (P - 1 roundings of a lossy code); here every contribution is encoded once by its
// rank and every reduced segment once by its owner, and the owner sums in a fixed rank order.
// Each rank sends and receives (P - 1) / P of the encoded buffers in each phase, as a ring does.
// The one-hop form (options.one_hop) trades bytes for a latency: every rank's whole encoding to
// every rank, summed by each in the same rank order, so it too gives the same bits everywhere.
#include <algorithm>
#include <string>

#include "base/check.h"
#include "base/error.h"
#include "comm/collectives.h"

namespace gradex::comm {
namespace {

// Codec work is cut into pieces of about this many elements (whole granules) with a call to the
// transport's progress between them: messages already posted keep moving while this thread
// computes (UCX moves a large message only while its owner drives progress).
constexpr size_t kProgressElements = 1u << 16;

// One call's segments: seg[b][k] is segment k of buffer b.
struct Layout {
  std::vector<std::vector<Segment>> seg;

  Layout(const std::vector<EncodedBuffer>& buffers, int world) : seg(buffers.size()) {
    for (size_t b = 0; b < buffers.size(); ++b) {
      const EncodedBuffer& x = buffers[b];
      GX_CHECK(x.contribution != nullptr && x.result != nullptr);
      GX_CHECK_EQ(x.contribution->granularity(), x.result->granularity());
      GX_CHECK(x.count == 0 || (x.in != nullptr && x.out != nullptr));
      for (int k = 0; k < world; ++k)
        seg[b].push_back(encoded_segment(x.count, x.contribution->granularity(), world, k));
    }
  }
  const Segment& at(size_t b, int k) const { return seg[b][static_cast<size_t>(k)]; }
};

// Bytes of the message holding segment k of every buffer, each encoded with codec_of(buffer).
template <typename CodecOf>
size_t message_bytes(const std::vector<EncodedBuffer>& buffers, const Layout& layout, int k,
                     CodecOf codec_of) {
  size_t n = 0;
  for (size_t b = 0; b < buffers.size(); ++b)
    n += codec_of(buffers[b]).encoded_size(layout.at(b, k).count);
  return n;
}

// Adds the decoding of `in` to sum[0, count), or writes it there when it is the sum's first term:
// the sum starts from its first term, as the rings' sums do, with no zeroed buffer written and read
// first. Where a codec can decode to -0 (fp32) this keeps a sum of -0 terms at -0 (-0 is IEEE
// addition's identity; a +0 start would have made it +0); the quantized codes never decode to -0.
void decode_into_sum(const ChunkCodec& codec, const uint8_t* in, size_t count, float* sum,
                     bool first) {
  if (first)
    codec.decode(in, count, sum);
  else
    codec.decode_add(in, count, sum);
}

size_t progress_elements(const ChunkCodec& codec) {
  const size_t g = codec.granularity();
  return std::max<size_t>(1, kProgressElements / g) * g;
}

// Encodes values[0, count) (elements [offset, offset + count) of the buffer) piece by piece.
void encode_pieces(Communicator& comm, ChunkCodec& codec, const float* values, size_t count,
                   size_t offset, uint8_t* out) {
  const size_t step = progress_elements(codec);
  for (size_t a = 0; a < count; a += step) {
    const size_t n = std::min(step, count - a);
    codec.encode(values + a, n, offset + a, out + codec.encoded_size(a));
    comm.progress();
  }
}

// Message buffers kept between calls (each thread its own: the engine and the DiLoCo worker call
// from their own threads), so that steady-state steps allocate and fault in nothing.
struct Buffers {
  std::vector<std::vector<uint8_t>> out, in, seg;
  std::vector<uint8_t> own;
  std::vector<float> sum;
};

class Exchange {
 public:
  Exchange(Communicator& comm, const std::vector<EncodedBuffer>& buffers,
           const EncodedAllreduceOptions& options)
      : comm_(comm),
        buffers_(buffers),
        options_(options),
        P_(comm.size()),
        r_(comm.rank()),
        layout_(buffers, P_),
        reduce_scatter_(options.name + " reduce-scatter"),
        allgather_(options.name + " allgather") {}

  void run() {
    const uint64_t tag = P_ > 1 ? comm_.next_collective_tag() : 0;
    thread_local Buffers buffers;
    if (options_.one_hop) {
      if (options_.results) options_.results->clear();
      gather_sum(buffers, tag);
      return;
    }
    reduce_scatter(buffers, tag);
    reduce_own(buffers);
    allgather(buffers, tag + 1);
    if (options_.results) {
      options_.results->clear();
      for (const std::vector<uint8_t>& segments : buffers.seg)
        options_.results->insert(options_.results->end(), segments.begin(), segments.end());
    }
  }

 private:
  static ChunkCodec& contribution(const EncodedBuffer& b) { return *b.contribution; }
  static ChunkCodec& result(const EncodedBuffer& b) { return *b.result; }

  std::string piece_name(const std::string& phase, int peer, size_t b) const {
    return phase + " from rank " + std::to_string(peer) + ", " + buffers_[b].label;
  }

  void check_length(const Request& request, size_t expected, int peer,
                    const std::string& phase) const {
    const size_t got = comm_.recv_length(request);
    if (got != expected)
      throw CorruptPayload(phase + ": rank " + std::to_string(peer) + " sent " +
                           std::to_string(got) + " bytes for " + std::to_string(buffers_.size()) +
                           " buffer(s) starting with " + buffers_.front().label + ", " +
                           std::to_string(expected) + " expected (truncated or a different unit)");
  }

  // Segment k of every buffer, encoded with the contribution codecs into out[k].
  void encode_for(Buffers& x, int k) {
    auto& m = x.out[static_cast<size_t>(k)];
    m.resize(message_bytes(buffers_, layout_, k, contribution));
    size_t at = 0;
    for (size_t b = 0; b < buffers_.size(); ++b) {
      const EncodedBuffer& e = buffers_[b];
      const Segment& s = layout_.at(b, k);
      encode_pieces(comm_, *e.contribution, e.in + s.begin, s.count, s.begin, m.data() + at);
      at += e.contribution->encoded_size(s.count);
    }
  }

  // Segments are encoded owner by owner in the order this rank sends them, each overlapping the
  // previous message on the wire; this rank's own segments last (it keeps them). Both phases keep
  // one send in flight: where a message outgrows the socket buffers, the shifted order then gives
  // each receiver one flow at a time (the one hop below differs).
  void reduce_scatter(Buffers& x, uint64_t tag) {
    x.out.resize(static_cast<size_t>(P_));
    x.in.resize(static_cast<size_t>(P_));
    const size_t mine_bytes = message_bytes(buffers_, layout_, r_, contribution);
    std::vector<RequestPtr> recvs, last_send;
    std::vector<int> peers;
    for (int j = 1; j < P_; ++j) {
      const int q = (r_ - j + P_) % P_;
      x.in[static_cast<size_t>(q)].resize(mine_bytes);
      recvs.push_back(comm_.irecv(q, tag, x.in[static_cast<size_t>(q)].data(), mine_bytes));
      peers.push_back(q);
    }
    for (int j = 1; j < P_; ++j) {
      const int k = (r_ + j) % P_;
      encode_for(x, k);
      if (!last_send.empty()) comm_.wait_all(last_send, reduce_scatter_.c_str());
      last_send.clear();
      const auto& m = x.out[static_cast<size_t>(k)];
      last_send.push_back(comm_.isend(k, tag, m.data(), m.size()));
    }
    encode_for(x, r_);
    comm_.wait_all(recvs, reduce_scatter_.c_str());
    for (size_t i = 0; i < recvs.size(); ++i)
      check_length(*recvs[i], mine_bytes, peers[i], reduce_scatter_);
    comm_.wait_all(last_send, reduce_scatter_.c_str());
    x.in[static_cast<size_t>(r_)].swap(x.out[static_cast<size_t>(r_)]);
  }

  // The owner's fp32 sum in rank order, the transform, its encoding with the result codecs.
  void reduce_own(Buffers& x) {
    x.own.resize(message_bytes(buffers_, layout_, r_, result));
    size_t at = 0, own_at = 0;
    for (size_t b = 0; b < buffers_.size(); ++b) {
      const EncodedBuffer& e = buffers_[b];
      const Segment& s = layout_.at(b, r_);
      const size_t bytes = e.contribution->encoded_size(s.count);
      x.sum.resize(s.count);
      for (int q = 0; q < P_; ++q) {
        const uint8_t* piece = x.in[static_cast<size_t>(q)].data() + at;
        if (q != r_)
          e.contribution->validate(piece, bytes, s.count, piece_name(reduce_scatter_, q, b));
        decode_into_sum(*e.contribution, piece, s.count, x.sum.data(), q == 0);
      }
      if (s.count > 0 && options_.transform) options_.transform(b, x.sum.data(), s.count, s.begin);
      encode_pieces(comm_, *e.result, x.sum.data(), s.count, s.begin, x.own.data() + own_at);
      at += bytes;
      own_at += e.result->encoded_size(s.count);
    }
  }

  // Every segment of rank q, decoded into the buffers from seg[q].
  void decode_from(Buffers& x, int q) {
    size_t at = 0;
    for (size_t b = 0; b < buffers_.size(); ++b) {
      const EncodedBuffer& e = buffers_[b];
      const Segment& s = layout_.at(b, q);
      const size_t bytes = e.result->encoded_size(s.count);
      const uint8_t* piece = x.seg[static_cast<size_t>(q)].data() + at;
      if (q != r_) e.result->validate(piece, bytes, s.count, piece_name(allgather_, q, b));
      e.result->decode(piece, s.count, e.out + s.begin);
      at += bytes;
    }
  }

  // The owners' encodings in the same shifted order; each segment decoded as soon as it arrives.
  void allgather(Buffers& x, uint64_t tag) {
    x.seg.resize(static_cast<size_t>(P_));
    std::vector<RequestPtr> recvs, last_send;
    std::vector<size_t> expected;
    for (int j = 1; j < P_; ++j) {
      const int q = (r_ - j + P_) % P_;
      expected.push_back(message_bytes(buffers_, layout_, q, result));
      x.seg[static_cast<size_t>(q)].resize(expected.back());
      recvs.push_back(comm_.irecv(q, tag, x.seg[static_cast<size_t>(q)].data(), expected.back()));
    }
    for (int j = 1; j < P_; ++j) {
      if (!last_send.empty()) comm_.wait_all(last_send, allgather_.c_str());
      last_send.clear();
      last_send.push_back(comm_.isend((r_ + j) % P_, tag, x.own.data(), x.own.size()));
    }
    for (int j = 1; j < P_; ++j) {
      const int q = (r_ - j + P_) % P_;
      std::vector<RequestPtr> one;
      one.push_back(std::move(recvs[static_cast<size_t>(j - 1)]));
      comm_.wait_all(one, allgather_.c_str());
      check_length(*one[0], expected[static_cast<size_t>(j - 1)], q, allgather_);
      decode_from(x, q);
    }
    comm_.wait_all(last_send, allgather_.c_str());
    // The owner decodes its own segments from its own bytes, like everyone else (after the sends
    // that read them).
    x.seg[static_cast<size_t>(r_)].swap(x.own);
    decode_from(x, r_);
  }

  // One hop (EncodedAllreduceOptions::one_hop): this rank's whole encoding, made once, goes to
  // every peer at once (posted in the shifted order), and the P encodings are validated, decoded
  // and summed in rank order as they arrive. All sends are in flight together because a send
  // completes only once the kernel holds its bytes: on warm connections that is at once, so the
  // messages left together anyway, but on a cold one (a delay lane's first exchange across a WAN,
  // small socket buffers) one send at a time made the peers' slow starts take turns (567 ms
  // against ~270 for the slowest peer alone, 850 kB to each of 3 peers at 25 ms one way).
  void gather_sum(Buffers& x, uint64_t tag) {
    const std::string phase = options_.name + " gather";
    size_t whole = 0;
    for (const EncodedBuffer& e : buffers_)
      whole += e.contribution->encoded_size(e.count);
    x.own.resize(whole);
    size_t at = 0;
    for (const EncodedBuffer& e : buffers_) {
      encode_pieces(comm_, *e.contribution, e.in, e.count, 0, x.own.data() + at);
      at += e.contribution->encoded_size(e.count);
    }
    x.in.resize(static_cast<size_t>(P_));
    std::vector<RequestPtr> recvs(static_cast<size_t>(P_)), sends;
    for (int j = 1; j < P_; ++j) {
      const auto q = static_cast<size_t>((r_ - j + P_) % P_);
      x.in[q].resize(whole);
      recvs[q] = comm_.irecv(static_cast<int>(q), tag, x.in[q].data(), whole);
    }
    for (int j = 1; j < P_; ++j)
      sends.push_back(comm_.isend((r_ + j) % P_, tag, x.own.data(), x.own.size()));
    // `in` may alias `out`: every encoding is made before any output is written.
    for (int next = 0; next < P_; ++next) {  // the sum's order
      const uint8_t* message = x.own.data();
      if (next != r_) {
        std::vector<RequestPtr> one;
        one.push_back(std::move(recvs[static_cast<size_t>(next)]));
        comm_.wait_all(one, phase.c_str());
        check_length(*one[0], whole, next, phase);
        message = x.in[static_cast<size_t>(next)].data();
      }
      size_t offset = 0;
      for (size_t b = 0; b < buffers_.size(); ++b) {
        const EncodedBuffer& e = buffers_[b];
        const size_t bytes = e.contribution->encoded_size(e.count);
        if (next != r_)
          e.contribution->validate(message + offset, bytes, e.count, piece_name(phase, next, b));
        decode_into_sum(*e.contribution, message + offset, e.count, e.out, next == 0);
        offset += bytes;
        comm_.progress();
      }
    }
    comm_.wait_all(sends, phase.c_str());
    for (size_t b = 0; b < buffers_.size(); ++b) {
      const EncodedBuffer& e = buffers_[b];
      if (e.count > 0 && options_.transform) options_.transform(b, e.out, e.count, 0);
    }
  }

  Communicator& comm_;
  const std::vector<EncodedBuffer>& buffers_;
  const EncodedAllreduceOptions& options_;
  const int P_, r_;
  const Layout layout_;
  const std::string reduce_scatter_, allgather_;
};

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

void encoded_allreduce(Communicator& comm, const std::vector<EncodedBuffer>& buffers,
                       const EncodedAllreduceOptions& options) {
  if (buffers.empty()) return;
  Exchange(comm, buffers, options).run();
}

void encoded_allreduce(Communicator& comm, ChunkCodec& contribution, ChunkCodec& result,
                       const float* in, float* out, size_t count,
                       const std::function<void(float*, size_t, size_t)>& transform) {
  std::vector<EncodedBuffer> buffers(1);
  buffers[0] = {&contribution, &result, in, out, count, "the buffer"};
  EncodedAllreduceOptions options;
  if (transform) {
    options.transform = [&transform](size_t, float* values, size_t n, size_t offset) {
      transform(values, n, offset);
    };
  }
  encoded_allreduce(comm, buffers, options);
}

}  // namespace gradex::comm
