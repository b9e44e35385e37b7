// Collectives over a Communicator. Every rank calls the same collectives in the same order with
// matching arguments (the sync engine guarantees that); mismatched sizes are detected where the
// protocol can see them (allreduce exchanges no sizes: the engine validates before calling it).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "base/dtype.h"
#include "comm/communicator.h"

namespace gradex::comm {

// In-place sum across ranks (ring: reduce-scatter then allgather, each ring step pipelined in
// options().ring_chunk_bytes chunks). fp16/bf16 inputs are accumulated in fp32 and rounded once per
// hop. fp32 results are bit-identical on every rank and equal to summing the ranks' values in the
// ring order documented in docs/collectives.md (so a reference can reproduce them exactly).
void allreduce_sum(Communicator& comm, void* data, size_t count, DType dtype);

// The same sum, bit for bit, as two phases of direct messages (a reduce-scatter to each segment's
// owner, then an allgather from the owners): two message latencies whatever the world size, where
// the ring chains 2(P-1), for the same bytes per rank; but P-1 messages reach every rank at once in
// each phase (incast). For links where latency bounds a buffer (comm/direct_allreduce.cc).
void direct_allreduce_sum(Communicator& comm, void* data, size_t count, DType dtype);

// Every rank contributes a byte payload of any size (0 included); returns all payloads, indexed by
// rank.
std::vector<Bytes> allgatherv(Communicator& comm, const void* data, size_t bytes);

// Same contract and result as allgatherv, as a ring: each rank sends its own payload and forwards
// the others' to its right neighbour, chunk by chunk, so no link carries more than one payload at
// a time (no incast on an uplink; P-1 ring steps of latency). Received lengths are checked against
// the announced sizes (MismatchError naming the origin rank otherwise).
std::vector<Bytes> ring_allgatherv(Communicator& comm, const void* data, size_t bytes);

// The same two collectives into `result` (resized to P slots whose buffers are reused): a caller
// that keeps `result` between calls allocates nothing once the payload sizes stop growing.
void allgatherv(Communicator& comm, const void* data, size_t bytes, std::vector<Bytes>& result);
void ring_allgatherv(Communicator& comm, const void* data, size_t bytes,
                     std::vector<Bytes>& result);

// --- allgatherv in one round trip for small payloads (comm/allgatherv_inline.cc) ---

// Which way an allgatherv_inline call moved the payloads.
enum class AllgathervPath : uint8_t {
  kLocal = 0,     // one rank: nothing moved
  kOneRound = 1,  // every payload travelled inline with its size: one round trip
  kDirect = 2,    // payloads above the maximum followed directly, in a second round
  kRing = 3,      // payloads above the maximum followed around the ring
};
const char* allgatherv_path_name(AllgathervPath path);

struct AllgathervOptions {
  // Payloads of at most this many bytes travel in one message with their size: every rank posts
  // a receive of inline_max_bytes + 8 bytes for every peer and reads the received length, so the
  // call takes one round trip. A larger payload announces its size in that message and follows in
  // a second round. 0: every payload follows (the size round of the two-round collectives). Must
  // be equal on every rank (a larger inline payload than a receiver's maximum is a MismatchError
  // there, never a truncation).
  size_t inline_max_bytes = 0;
  // Called with what the second round must move (every rank's payload size above the maximum, 0
  // for the ranks that sent theirs inline; identical on every rank after the first round): true
  // sends those payloads around the ring, false directly. It must depend only on its argument and
  // on numbers equal on every rank, or ranks would run different collectives. Null: direct.
  std::function<bool(const std::vector<uint64_t>& following)> ring_for;
};

// The allgatherv contract (every rank's payload, indexed by rank, bit-identical to allgatherv's and
// ring_allgatherv's), taking one round trip when no payload exceeds options.inline_max_bytes. Every
// received message is checked: a length that disagrees with the size it carries, a message shorter
// than its size header or longer than the posted maximum is a MismatchError naming both ranks;
// sizes beyond this host's memory are a CorruptPayload; peers that fail or stall are PeerError /
// TimeoutError as everywhere. `operation` names the call in errors ("negotiation", ...).
AllgathervPath allgatherv_inline(Communicator& comm, const void* data, size_t bytes,
                                 std::vector<Bytes>& result, const AllgathervOptions& options,
                                 const char* operation = "allgatherv");

// Copies `bytes` bytes from `root`'s buffer into every other rank's buffer.
void broadcast(Communicator& comm, void* data, size_t bytes, int root);

// Returns once every rank has entered the barrier.
void barrier(Communicator& comm);

// --- Encoded allreduce (reduce-scatter + allgather in a caller-defined compact format) ---

// An encoding of fp32 values chosen above comm/ (e.g. sync/outer's block quantization); comm/
// only moves and sums it. Encodings of element ranges cut at multiples of granularity() must
// concatenate: the encoding of [a, b) is bytes [encoded_size(a), encoded_size(b)) of the encoding
// of [0, b) whenever a is such a multiple.
class ChunkCodec {
 public:
  virtual ~ChunkCodec() = default;
  virtual size_t granularity() const = 0;
  virtual size_t encoded_size(size_t count) const = 0;
  // Encodes values[0, count), elements [offset, offset + count) of the whole buffer (offset is a
  // multiple of granularity()). May update state of the codec (error-feedback residuals).
  virtual void encode(const float* values, size_t count, size_t offset, uint8_t* out) = 0;
  // acc[i] += decoded value i (one fp32 addition per element).
  virtual void decode_add(const uint8_t* in, size_t count, float* acc) const = 0;
  // out[i] = decoded value i.
  virtual void decode(const uint8_t* in, size_t count, float* out) const = 0;
};

// Elements [begin, begin + count) of segment k (owned by rank k) in an encoded allreduce of
// `count` elements over `world` ranks: whole granules, split as evenly as possible, the first
// ones one granule longer.
struct Segment {
  size_t begin = 0;
  size_t count = 0;
};
Segment encoded_segment(size_t count, size_t granularity, int world, int k);

// out = transform(sum over ranks of decode(contribution.encode(in))), identical bits on every
// rank. Reduce-scatter: every rank encodes its values of segment k with `contribution` and sends
// them to rank k (in chunks of about options().ring_chunk_bytes, cut at granules); rank k decodes
// the P contributions and sums them in fp32 in rank order 0..P-1 (starting from 0), then calls
// transform(sum, segment.count, segment.begin) on its segment. Allgather: rank k encodes the
// transformed segment with `result` and sends it to every rank; every rank, rank k included,
// decodes every segment from the same bytes into `out`. `in` and `out` may alias. Both codecs
// must have the same granularity on every rank. A received message of the wrong length is a
// CorruptPayload error; transport failures are PeerError / TimeoutError as everywhere.
void encoded_allreduce(
    Communicator& comm, ChunkCodec& contribution, ChunkCodec& result, const float* in, float* out,
    size_t count, const std::function<void(float* values, size_t count, size_t offset)>& transform);

}  // namespace gradex::comm
