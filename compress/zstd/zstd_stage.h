// The optional zstd stage of the wire format. Compression is kept only when it shrinks the data;
// decompression is bounded by the size the header declares and validates the frame.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace gradex::compress::zstd {

// Compresses [data, data + size) at `level` (1..22) into out (replaced). Returns false (out
// unspecified) when the result would not be smaller than max_bytes.
bool compress(const uint8_t* data, size_t size, int level, size_t max_bytes,
              std::vector<uint8_t>& out);

// Decompresses one frame into exactly `expected` bytes at out (caller-allocated). Throws
// CorruptPayload when the frame is invalid, declares a different size or decodes to another size.
void decompress(const uint8_t* data, size_t size, uint8_t* out, size_t expected);

}  // namespace gradex::compress::zstd
