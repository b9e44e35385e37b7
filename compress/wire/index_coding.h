// Codings of a strictly increasing index list over [0, numel). All three code the gaps
// d_j = idx_j - idx_{j-1} - 1 (idx_{-1} = -1):
//   varint: LEB128 of each gap, byte aligned;
//   rice:   Golomb-Rice with parameter r: gap >> r in unary (ones, then a zero), then the low r
//           bits, packed LSB first; the best r is chosen exactly from the gaps;
//   bitmap: one bit per element (LSB first), ceil(numel / 8) bytes.
// Decoders validate everything and throw CorruptPayload saying what is wrong.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "compress/options.h"

namespace gradex::compress::wire {

struct IndexPlan {
  IndexCoding coding;
  uint8_t rice_param;  // 0 unless rice
  uint64_t bytes;      // exact encoded size
};

// Exact encoded sizes; best_plan picks the smallest (auto) or returns the requested coding.
uint64_t varint_bytes(const uint32_t* idx, size_t count);
IndexPlan rice_plan(const uint32_t* idx, size_t count);
uint64_t bitmap_bytes(uint64_t numel);
IndexPlan best_plan(IndexCoding requested, const uint32_t* idx, size_t count, uint64_t numel);

// Appends exactly plan.bytes bytes to out.
void encode_indices(const IndexPlan& plan, const uint32_t* idx, size_t count, uint64_t numel,
                    std::vector<uint8_t>& out);

// Decodes exactly `count` indices from [data, data + size) into out (resized to count); the
// section must be consumed exactly (no trailing bytes, zero padding bits).
void decode_indices(IndexCoding coding, uint8_t rice_param, const uint8_t* data, size_t size,
                    size_t count, uint64_t numel, uint32_t* out);

// Largest index section a valid payload can have for these counts (bounds allocations before any
// decoding).
uint64_t max_index_bytes(IndexCoding coding, uint8_t rice_param, uint64_t numel, uint64_t count);

}  // namespace gradex::compress::wire
