// Collectives over a Communicator. Every rank calls the same collectives in the same order with
// matching arguments (the sync engine guarantees that); mismatched sizes are detected where the
// protocol can see them (allreduce exchanges no sizes: the engine validates before calling it).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
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
// each phase (incast). Two ranks swap their whole buffers in one message latency (the same bytes,
// no incast; each sums the whole buffer where the ring sums half). For links where latency bounds
// a buffer (comm/collectives/direct_allreduce.cc).
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

// --- allgatherv in one round trip for small payloads (comm/collectives/allgatherv_inline.cc) ---

// Which way an allgatherv_inline call moved the payloads.
enum class AllgathervPath : uint8_t {
  kLocal = 0,     // one rank: nothing moved
  kOneRound = 1,  // every payload travelled inline with its size: one round trip
  kDirect = 2,    // payloads above the maximum followed directly, in a second round
  kRing = 3,      // payloads above the maximum followed around the ring
  // allgatherv_unsized (no size round), as the caller chose it:
  kDirectUnsized = 4,  // every payload directly, in one round
  kRingUnsized = 5,    // every payload around the ring
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

// --- allgatherv without a size round (comm/collectives/allgatherv_unsized.cc) ---

// The allgatherv contract in one round of payloads (no size round), on a communicator that
// receives messages of unknown length (Communicator::receives_any_length; InternalError
// otherwise): directly (one message latency; P-1 payloads into every rank at once) or, with
// `ring`, around the ring (P-1 message latencies, one payload per link at a time). A payload
// longer than `max_bytes` is a MismatchError naming the ranks. Every rank passes the same `ring`.
// The largest payload the engine's unsized gathers accept from a peer: a bound against a corrupt
// length, far above any payload they carry.
constexpr size_t kUnsizedMaxBytes = size_t{1} << 31;
void allgatherv_unsized(Communicator& comm, const void* data, size_t bytes,
                        std::vector<Bytes>& result, bool ring, size_t max_bytes,
                        const char* operation = "allgatherv");

// Copies `bytes` bytes from `root`'s buffer into every other rank's buffer.
void broadcast(Communicator& comm, void* data, size_t bytes, int root);

// Returns once every rank has entered the barrier.
void barrier(Communicator& comm);

// --- Encoded allreduce (reduce-scatter + allgather in a caller-defined compact format) ---

// An encoding of fp32 values chosen above comm/ (outer/'s block quantization, the engine's
// 8-bit route); comm/ only moves and sums it. Encodings of element ranges cut at multiples of
// granularity() must concatenate: the encoding of [a, b) is bytes [encoded_size(a),
// encoded_size(b)) of the encoding of [0, b) whenever a is such a multiple.
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
  // Throws CorruptPayload (naming `what`) when `bytes` bytes received from a peer are not a valid
  // encoding of `count` values; called on every received piece before it is decoded. The default
  // accepts everything (an encoding without invalid byte patterns).
  virtual void validate(const uint8_t* in, size_t bytes, size_t count,
                        const std::string& what) const {
    (void)in, (void)bytes, (void)count, (void)what;
  }
};

// Elements [begin, begin + count) of segment k (owned by rank k) in an encoded allreduce of
// `count` elements over `world` ranks: whole granules, split as evenly as possible, the first
// ones one granule longer.
struct Segment {
  size_t begin = 0;
  size_t count = 0;
};
Segment encoded_segment(size_t count, size_t granularity, int world, int k);

// One buffer of a (fused) encoded allreduce.
struct EncodedBuffer {
  ChunkCodec* contribution = nullptr;  // encodes this rank's values of every segment
  ChunkCodec* result = nullptr;        // encodes the owner's transformed segment
  const float* in = nullptr;           // count values (may alias out)
  float* out = nullptr;                // count values: the result, identical on every rank
  size_t count = 0;
  std::string label;  // names the buffer in errors ("tensor 'w'")
};

struct EncodedAllreduceOptions {
  // Prefixes the phases in errors and wait diagnostics ("<name> reduce-scatter").
  std::string name = "encoded";
  // Called by each owner on its summed segment of buffer `buffer` (values[0, count) are elements
  // [offset, offset + count) of it) before it is encoded with `result`. Empty: the sum itself.
  std::function<void(size_t buffer, float* values, size_t count, size_t offset)> transform;
  // One hop instead of two: every rank sends its `contribution` encoding of the whole of every
  // buffer to every peer, and every rank validates and decodes the P encodings of each buffer and
  // sums them in fp32 in rank order 0..P-1 (its own decoded from its own bytes), then calls
  // transform on the whole buffer (offset 0). One message latency where the two phases take two,
  // for (P-1) times the encoded buffers through each rank's link where they move 2(P-1)/P; one
  // lossy encoding instead of two (the `result` codecs are not called). The same bits on every
  // rank; every rank must pass the same value. A piece is validated before it is summed, but the
  // outputs are written from the first one on: after an error they hold a partial sum.
  bool one_hop = false;
  // Two phases: when set, receives the `result` encodings every rank decoded, owner by owner
  // (rank 0's segments of every buffer, then rank 1's, ...), so that a caller can pass the
  // averages on in their encoded form (comm::hierarchical_encoded_allreduce, which itself leaves
  // it empty). One hop: cleared.
  std::vector<uint8_t>* results = nullptr;
};

// out = transform(sum over ranks of decode(contribution.encode(in))) for every buffer, identical
// bits on every rank. Each buffer is cut into P segments of whole granules of its own codecs
// (encoded_segment of the buffer alone, so a rank owns the same elements of a buffer whatever
// else shares the call). Reduce-scatter: rank r sends rank k one message holding its encoding of
// segment k of every buffer, in buffer order; rank k validates and decodes the P contributions
// and sums them in fp32 in rank order 0..P-1 (starting from rank 0's term, with no zero before
// it: a sum of -0 terms stays -0, as in the rings; its own contribution is decoded
// from its own bytes like everyone else's), then calls transform on its segment. Allgather: rank k
// sends every rank one message holding the `result` encoding of its segments; every rank, rank k
// included, decodes every segment from the same bytes. Messages go in a shifted order (at step j
// rank r sends to r + j and receives from r - j), one send in flight, each encoded just before it
// leaves while the previous one is on the wire, with transport progress between pieces of codec
// work, so no link carries two messages at once. Both codecs of a buffer must have the same
// granularity on every rank. A message of the wrong length, or a piece validate() rejects, is a
// CorruptPayload naming the phase, the rank and the buffer, before anything is summed; transport
// failures are PeerError / TimeoutError as everywhere. Bytes per rank and phase: (P - 1) / P of
// the encoded buffers, as a ring moves.
void encoded_allreduce(Communicator& comm, const std::vector<EncodedBuffer>& buffers,
                       const EncodedAllreduceOptions& options);

// The single-buffer form: transform(sum, segment.count, segment.begin) on each owner's segment.
void encoded_allreduce(
    Communicator& comm, ChunkCodec& contribution, ChunkCodec& result, const float* in, float* out,
    size_t count, const std::function<void(float* values, size_t count, size_t offset)>& transform);

}  // namespace gradex::comm
