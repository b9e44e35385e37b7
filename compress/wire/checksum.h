// CRC-32C (Castagnoli) for payload and state checksums: SSE4.2 instructions where the CPU has
// them, a table otherwise; both give the same value.
#pragma once

#include <cstddef>
#include <cstdint>

namespace gradex::compress::wire {

// Continues a CRC: crc32c(b, crc32c(a)) == crc32c(a ++ b). Start from 0.
uint32_t crc32c(const void* data, size_t size, uint32_t crc = 0);

}  // namespace gradex::compress::wire
