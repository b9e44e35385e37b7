// The dense 8-bit route's allreduce (contract in int8_exchange.h). Direct messages rather than a
// ring: a ring would decode, sum and re-encode at every hop (P - 1 lossy roundings); here every
// contribution is encoded once by its rank and every averaged segment once by its owner.
#include "sync/int8_exchange.h"

#include <chrono>
#include <string>

#include "base/error.h"
#include "base/wall_time.h"
#include "compress/backend/int8_codec.h"

namespace gradex::sync {
namespace {

namespace q8 = compress::backend::int8;
using Clock = std::chrono::steady_clock;


// Bytes of the message rank k's segments make (one piece per item, in item order).
size_t message_bytes(const std::vector<Int8Item>& items, int world, int k) {
  size_t n = 0;
  for (const Int8Item& it : items)
    n += q8::encoded_size(int8_segment(it.numel, world, k).count);
  return n;
}

void check_length(comm::Communicator& comm, const comm::Request& request, size_t expected, int peer,
                  const char* phase, const std::vector<Int8Item>& items) {
  const size_t got = comm.recv_length(request);
  if (got != expected)
    throw CorruptPayload(std::string("8-bit ") + phase + ": rank " + std::to_string(peer) +
                         " sent " + std::to_string(got) + " bytes for " +
                         std::to_string(items.size()) + " tensor(s) starting with '" +
                         (items.front().key ? *items.front().key : "?") + "', " +
                         std::to_string(expected) + " expected (truncated or a different unit)");
}

// Message buffers kept between calls (each thread its own: the engine calls from its progress
// thread), so that steady-state steps allocate and fault in nothing: they only grow.
struct Buffers {
  std::vector<std::vector<uint8_t>> out, in, seg;
  std::vector<uint8_t> own;
  std::vector<float> sum;
};

// Codec work is cut into pieces of this many elements (whole blocks) with a call to the transport's
// progress between them: messages already posted keep moving while this thread computes (UCX moves
// a large message only while its owner drives progress).
constexpr size_t kProgressElements = 1u << 16;

size_t encode_pieces(comm::Communicator& comm, const float* values, float* residual, size_t count,
                     uint8_t* out) {
  size_t nonfinite = 0;
  for (size_t a = 0; a < count; a += kProgressElements) {
    const size_t n = std::min(kProgressElements, count - a);
    nonfinite +=
        q8::encode(values + a, residual ? residual + a : nullptr, n, out + q8::encoded_size(a));
    comm.progress();
  }
  return nonfinite;
}

std::string piece_name(const char* phase, int peer, const Int8Item& it) {
  return std::string("8-bit ") + phase + " from rank " + std::to_string(peer) + ", tensor '" +
         (it.key ? *it.key : "?") + "'";
}

}  // namespace

comm::Segment int8_segment(size_t numel, int world, int k) {
  return comm::encoded_segment(numel, q8::kInt8Block, world, k);
}

void int8_fold_residuals(float* values, float* residual, float* owner_residual, size_t numel,
                         int world) {
  const float P = static_cast<float>(world);
  for (size_t i = 0; i < numel; ++i) {
    values[i] += residual[i] + P * owner_residual[i];
    residual[i] = 0.0f;
    owner_residual[i] = 0.0f;
  }
}

void int8_allreduce(comm::Communicator& comm, std::vector<Int8Item>& items,
                    Int8Counters& counters) {
  if (items.empty()) return;
  const int P = comm.size(), r = comm.rank();
  const uint64_t tag = P > 1 ? comm.next_collective_tag() : 0;

  // 1-2. Reduce-scatter. Segments are encoded owner by owner in the order this rank sends them: at
  // step j every rank sends to r + j and receives from r - j, so no link carries two messages at
  // once (no incast on a shaped port), and each encode overlaps the previous message on the wire.
  thread_local Buffers buffers;
  auto& out = buffers.out;
  auto& in = buffers.in;
  out.resize(static_cast<size_t>(P));
  in.resize(static_cast<size_t>(P));
  auto encode_for = [&](int k) {
    auto t0 = Clock::now();
    auto& m = out[static_cast<size_t>(k)];
    m.resize(message_bytes(items, P, k));
    size_t at = 0;
    for (Int8Item& it : items) {
      const comm::Segment s = int8_segment(it.numel, P, k);
      counters.nonfinite +=
          encode_pieces(comm, it.values + s.begin, it.residual ? it.residual + s.begin : nullptr,
                        s.count, m.data() + at);
      at += q8::encoded_size(s.count);
    }
    counters.encode_seconds += seconds_since(t0);
  };
  const size_t mine_bytes = message_bytes(items, P, r);
  {
    std::vector<comm::RequestPtr> recvs, last_send;
    std::vector<int> peers;
    for (int j = 1; j < P; ++j) {
      const int q = (r - j + P) % P;
      in[static_cast<size_t>(q)].resize(mine_bytes);
      recvs.push_back(comm.irecv(q, tag, in[static_cast<size_t>(q)].data(), mine_bytes));
      peers.push_back(q);
    }
    for (int j = 1; j < P; ++j) {
      const int k = (r + j) % P;
      encode_for(k);
      auto t1 = Clock::now();
      if (!last_send.empty()) comm.wait_all(last_send, "8-bit reduce-scatter");
      last_send.clear();
      const auto& m = out[static_cast<size_t>(k)];
      last_send.push_back(comm.isend(k, tag, m.data(), m.size()));
      counters.communicate_seconds += seconds_since(t1);
    }
    encode_for(r);
    auto t1 = Clock::now();
    comm.wait_all(recvs, "8-bit reduce-scatter");
    for (size_t i = 0; i < recvs.size(); ++i)
      check_length(comm, *recvs[i], mine_bytes, peers[i], "reduce-scatter", items);
    comm.wait_all(last_send, "8-bit reduce-scatter");
    counters.communicate_seconds += seconds_since(t1);
  }
  in[static_cast<size_t>(r)].swap(out[static_cast<size_t>(r)]);

  // 3. The owner's fp32 sum in rank order, the average, its 8-bit encoding with the owner residual.
  auto t2 = Clock::now();
  auto& own = buffers.own;
  own.resize(mine_bytes);
  {
    auto& sum = buffers.sum;
    const float divisor = static_cast<float>(P);
    size_t at = 0;
    for (Int8Item& it : items) {
      const comm::Segment s = int8_segment(it.numel, P, r);
      const size_t bytes = q8::encoded_size(s.count);
      sum.assign(s.count, 0.0f);
      for (int q = 0; q < P; ++q) {
        const uint8_t* piece = in[static_cast<size_t>(q)].data() + at;
        q8::validate(piece, bytes, s.count, piece_name("reduce-scatter", q, it));
        q8::decode_add(piece, s.count, sum.data());
      }
      for (float& x : sum)
        x = x / divisor;
      counters.nonfinite +=
          encode_pieces(comm, sum.data(), it.owner_residual + s.begin, s.count, own.data() + at);
      at += bytes;
    }
  }
  counters.encode_seconds += seconds_since(t2);

  // 4. Allgather of the owners' encodings, in the same shifted order; every rank decodes every
  // segment from the same bytes, each as soon as it has arrived.
  auto& seg = buffers.seg;
  seg.resize(static_cast<size_t>(P));
  auto decode_from = [&](int q) {
    auto t4 = Clock::now();
    size_t at = 0;
    for (Int8Item& it : items) {
      const comm::Segment s = int8_segment(it.numel, P, q);
      const size_t bytes = q8::encoded_size(s.count);
      const uint8_t* piece = seg[static_cast<size_t>(q)].data() + at;
      if (q != r) q8::validate(piece, bytes, s.count, piece_name("allgather", q, it));
      q8::decode(piece, s.count, it.values + s.begin);
      at += bytes;
    }
    counters.decode_seconds += seconds_since(t4);
  };
  {
    auto t3 = Clock::now();
    std::vector<comm::RequestPtr> recvs, last_send;
    std::vector<size_t> expected;
    for (int j = 1; j < P; ++j) {
      const int q = (r - j + P) % P;
      expected.push_back(message_bytes(items, P, q));
      seg[static_cast<size_t>(q)].resize(expected.back());
      recvs.push_back(comm.irecv(q, tag + 1, seg[static_cast<size_t>(q)].data(), expected.back()));
    }
    for (int j = 1; j < P; ++j) {
      if (!last_send.empty()) comm.wait_all(last_send, "8-bit allgather");
      last_send.clear();
      last_send.push_back(comm.isend((r + j) % P, tag + 1, own.data(), own.size()));
    }
    counters.communicate_seconds += seconds_since(t3);
    for (int j = 1; j < P; ++j) {
      const int q = (r - j + P) % P;
      auto t5 = Clock::now();
      std::vector<comm::RequestPtr> one;
      one.push_back(std::move(recvs[static_cast<size_t>(j - 1)]));
      comm.wait_all(one, "8-bit allgather");
      check_length(comm, *one[0], expected[static_cast<size_t>(j - 1)], q, "allgather", items);
      counters.communicate_seconds += seconds_since(t5);
      decode_from(q);
    }
    auto t6 = Clock::now();
    comm.wait_all(last_send, "8-bit allgather");
    counters.communicate_seconds += seconds_since(t6);
  }
  // The owner decodes its own segments from its own bytes, like everyone else (after the sends
  // that read them).
  seg[static_cast<size_t>(r)].swap(own);
  decode_from(r);
}

}  // namespace gradex::sync
