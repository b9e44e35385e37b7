// libFuzzer target for the sparse payload decoder. Any input must either decode into a valid
// payload (indices strictly increasing and in range, one value each) that re-encodes and decodes to
// the same content, or be rejected with CorruptPayload. Anything else (a crash, a sanitizer report,
// another exception) is a bug.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "compress/compress.h"
#include "compress/wire/checksum.h"

using namespace gradex;
using namespace gradex::compress;

namespace {

void check_one(const uint8_t* data, size_t size) {
  static wire::DecodedPayload out;
  try {
    wire::decode(data, size, out);
  } catch (const CorruptPayload&) {
    return;
  }
  const auto& h = out.header;
  if (out.indices.size() != h.selected || out.values.size() != h.selected) std::abort();
  for (size_t j = 0; j < out.indices.size(); ++j)
    if (out.indices[j] >= h.numel || (j > 0 && out.indices[j] <= out.indices[j - 1])) std::abort();
  // Round trip: the decoded content re-encodes (same coding, no zstd) and decodes identically.
  // Values widened from 16 bits are exactly representable; NaN payload bits may change, so compare
  // indices only for them.
  std::vector<uint8_t> again;
  wire::encode({h.numel, out.indices.data(), out.values.data(), out.indices.size(), h.value_dtype},
               h.key, {h.index_coding, 0}, again);
  wire::DecodedPayload back = wire::decode(again.data(), again.size());
  if (back.indices != out.indices || back.header.key != h.key) std::abort();
  if (h.numel <= (1u << 16)) {
    std::vector<float> sum(h.numel, 0.0f);
    wire::accumulate(out, sum.data(), sum.size(), 1.0f);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  check_one(data, size);
  // Mutations almost never keep the checksum valid, which would stop the fuzzer at the checksum
  // test: decode a re-signed copy too, so that every structural check behind it is exercised.
  if (size >= wire::kHeaderBytes) {
    std::vector<uint8_t> signed_copy(data, data + size);
    uint32_t crc = wire::crc32c(signed_copy.data(), 44);
    crc = wire::crc32c(signed_copy.data() + wire::kHeaderBytes, size - wire::kHeaderBytes, crc);
    std::memcpy(signed_copy.data() + 44, &crc, 4);
    check_one(signed_copy.data(), signed_copy.size());
  }
  return 0;
}
