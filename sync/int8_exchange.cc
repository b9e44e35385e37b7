// The dense 8-bit route's allreduce (contract in int8_exchange.h). Direct messages rather than a
// ring: a ring would decode, sum and re-encode at every hop (P - 1 lossy roundings); here every
// contribution is encoded once by its rank and every averaged segment once by its owner.
#include "sync/int8_exchange.h"

#include <chrono>
#include <string>

#include "base/error.h"
#include "compress/backend/int8_codec.h"

namespace gradex::sync {
namespace {

namespace q8 = compress::backend::int8;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

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

  // 1. Every segment of every tensor encoded with this rank's residual, one message per owner.
  auto t0 = Clock::now();
  thread_local Buffers buffers;
  auto& out = buffers.out;
  out.resize(static_cast<size_t>(P));
  for (int k = 0; k < P; ++k) {
    auto& m = out[static_cast<size_t>(k)];
    m.resize(message_bytes(items, P, k));
    size_t at = 0;
    for (Int8Item& it : items) {
      const comm::Segment s = int8_segment(it.numel, P, k);
      counters.nonfinite +=
          q8::encode(it.values + s.begin, it.residual ? it.residual + s.begin : nullptr, s.count,
                     m.data() + at);
      at += q8::encoded_size(s.count);
    }
  }
  counters.encode_seconds += seconds_since(t0);

  // 2. Reduce-scatter: every rank's encoding of this rank's segments.
  auto t1 = Clock::now();
  const size_t mine_bytes = message_bytes(items, P, r);
  auto& in = buffers.in;
  in.resize(static_cast<size_t>(P));
  {
    std::vector<comm::RequestPtr> recvs, sends;
    std::vector<int> peers;
    for (int q = 0; q < P; ++q) {
      if (q == r) continue;
      in[static_cast<size_t>(q)].resize(mine_bytes);
      recvs.push_back(comm.irecv(q, tag, in[static_cast<size_t>(q)].data(), mine_bytes));
      peers.push_back(q);
      const auto& m = out[static_cast<size_t>(q)];
      sends.push_back(comm.isend(q, tag, m.data(), m.size()));
    }
    comm.wait_all(recvs, "8-bit reduce-scatter");
    for (size_t i = 0; i < recvs.size(); ++i)
      check_length(comm, *recvs[i], mine_bytes, peers[i], "reduce-scatter", items);
    comm.wait_all(sends, "8-bit reduce-scatter");
  }
  in[static_cast<size_t>(r)].swap(out[static_cast<size_t>(r)]);
  counters.communicate_seconds += seconds_since(t1);

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
          q8::encode(sum.data(), it.owner_residual + s.begin, s.count, own.data() + at);
      at += bytes;
    }
  }
  counters.encode_seconds += seconds_since(t2);

  // 4. Allgather of the owners' encodings; everyone decodes every segment from the same bytes.
  auto t3 = Clock::now();
  auto& seg = buffers.seg;
  seg.resize(static_cast<size_t>(P));
  {
    std::vector<comm::RequestPtr> recvs, sends;
    std::vector<int> peers;
    std::vector<size_t> expected;
    for (int q = 0; q < P; ++q) {
      if (q == r) continue;
      expected.push_back(message_bytes(items, P, q));
      seg[static_cast<size_t>(q)].resize(expected.back());
      recvs.push_back(comm.irecv(q, tag + 1, seg[static_cast<size_t>(q)].data(), expected.back()));
      peers.push_back(q);
      sends.push_back(comm.isend(q, tag + 1, own.data(), own.size()));
    }
    comm.wait_all(recvs, "8-bit allgather");
    for (size_t i = 0; i < recvs.size(); ++i)
      check_length(comm, *recvs[i], expected[i], peers[i], "allgather", items);
    comm.wait_all(sends, "8-bit allgather");
  }
  seg[static_cast<size_t>(r)].swap(own);
  counters.communicate_seconds += seconds_since(t3);

  auto t4 = Clock::now();
  for (int q = 0; q < P; ++q) {
    size_t at = 0;
    for (Int8Item& it : items) {
      const comm::Segment s = int8_segment(it.numel, P, q);
      const size_t bytes = q8::encoded_size(s.count);
      const uint8_t* piece = seg[static_cast<size_t>(q)].data() + at;
      if (q != r) q8::validate(piece, bytes, s.count, piece_name("allgather", q, it));
      q8::decode(piece, s.count, it.values + s.begin);
      at += bytes;
    }
  }
  counters.decode_seconds += seconds_since(t4);
}

}  // namespace gradex::sync
