// The sparse payload wire format (version 1). All fields little-endian:
//   off size field
//    0   4  magic 'G' 'X' 'S' 'P'
//    4   2  version (1)
//    6   2  header bytes (48)
//    8   8  tensor key
//   16   8  element count (numel, <= 2^32)
//   24   4  selected count (<= numel)
//   28   1  value dtype (base/dtype.h)
//   29   1  index coding (IndexCoding: varint 0, rice 1, bitmap 2)
//   30   1  flags: bit 0 = body compressed with zstd; other bits zero
//   31   1  rice parameter (0 unless rice)
//   32   4  index section bytes (before zstd)
//   36   4  body bytes before zstd (= index bytes + selected * value size)
//   40   4  stored body bytes (payload length after the header)
//   44   4  CRC-32C of bytes [0, 44) followed by the stored body
// then the body: the index section, then the values (fp32, fp16 or bf16).
// The decoder validates every field before it allocates or decodes anything and throws
// CorruptPayload naming what is wrong; it never reads or writes out of bounds.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "base/dtype.h"
#include "compress/options.h"

namespace gradex::compress {
struct Selection;  // compress/dgc/compressor.h: the format does not depend on the compressor
}

namespace gradex::compress::wire {

constexpr uint32_t kMagic = 0x50535847u;  // "GXSP"
constexpr uint16_t kVersion = 1;
constexpr size_t kHeaderBytes = 48;
constexpr uint8_t kFlagZstd = 1;
// zstd bodies may expand at most this much (plus kZstdSlack): bounds the decoder's allocation.
constexpr uint64_t kMaxZstdRatio = 1024;
constexpr uint64_t kZstdSlack = 65536;

// A sparse tensor to encode: strictly increasing indices < numel, values exactly representable in
// value_dtype (they are rounded, saturating, otherwise).
struct SparseRef {
  uint64_t numel = 0;
  const uint32_t* indices = nullptr;
  const float* values = nullptr;
  size_t count = 0;
  DType value_dtype = DType::kFloat32;
};
// A DGC selection as a SparseRef (compress/wire/selection.cc).
SparseRef sparse_ref(const Selection& s);

struct PayloadHeader {
  uint64_t key = 0;
  uint64_t numel = 0;
  uint32_t selected = 0;
  DType value_dtype = DType::kFloat32;
  IndexCoding index_coding = IndexCoding::kVarint;
  bool zstd = false;
  uint8_t rice_param = 0;
  uint32_t index_bytes = 0;
  uint32_t body_bytes = 0;
  uint32_t stored_bytes = 0;
  uint32_t checksum = 0;
};

// Encodes into out (replaced). Throws InvalidArgument when the input breaks the contract above.
void encode(const SparseRef& sparse, uint64_t key, const WireOptions& options,
            std::vector<uint8_t>& out);
// The same payload appended at out's end (out's earlier bytes are kept): a sender that frames
// several payloads into one message encodes each in place, without an intermediate copy.
void encode_append(const SparseRef& sparse, uint64_t key, const WireOptions& options,
                   std::vector<uint8_t>& out);
std::vector<uint8_t> encode(const Selection& selection, uint64_t key, const WireOptions& options);

// Validates the header fields and the total length (not the checksum): enough to route a payload
// by its key before decoding it.
PayloadHeader parse_header(const uint8_t* data, size_t size);

struct DecodedPayload {
  PayloadHeader header;
  std::vector<uint32_t> indices;  // strictly increasing, < header.numel
  std::vector<float> values;      // widened to fp32 exactly
};

// Fully validates and decodes; `out` is reused (its buffers keep their capacity).
void decode(const uint8_t* data, size_t size, DecodedPayload& out);
DecodedPayload decode(const uint8_t* data, size_t size);

// out[idx] += scale * value for every decoded element; out holds out_numel floats, which must equal
// the payload's element count (InvalidArgument otherwise).
void accumulate(const DecodedPayload& payload, float* out, size_t out_numel, float scale);

// A fully validated payload whose values stay in their wire type, in place: the receive path
// adds them into a sum directly (no widened copy), possibly split over threads by element range.
struct PayloadView {
  PayloadHeader header;
  const uint32_t* indices = nullptr;  // header.selected, strictly increasing, < header.numel
  const uint8_t* values = nullptr;    // header.selected values of header.value_dtype (LE)
};
// Buffers a view's indices (and a zstd body) live in; reused across calls, one per view alive.
struct DecodeScratch {
  std::vector<uint32_t> indices;
  std::vector<uint8_t> inflated;
};
// Validates exactly as decode() does (CorruptPayload otherwise). The view points into `data` and
// `scratch`: valid while both are unchanged.
PayloadView decode_view(const uint8_t* data, size_t size, DecodeScratch& scratch);
// out[idx] += scale * value for the view's elements with begin <= idx < end (the same arithmetic
// as accumulate: bit-identical sums). Callers may split [0, numel) over threads; per element the
// additions happen in call order. out holds out_numel == header.numel floats (InvalidArgument
// otherwise).
void add_range(const PayloadView& view, float* out, size_t out_numel, float scale, size_t begin,
               size_t end);

}  // namespace gradex::compress::wire
