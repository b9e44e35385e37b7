// libFuzzer target for the sparse payload decoder. Any input must either decode into a valid
// payload (indices strictly increasing and in range, one value each) that re-encodes and decodes to
// the same content, or be rejected with CorruptPayload. The exchange's in-place path
// (decode_view + add_range, split at arbitrary points) must accept and refuse exactly the same
// inputs and add exactly what accumulate adds. Anything else (a crash, a sanitizer report, another
// exception) is a bug.
#include <algorithm>
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
  static wire::DecodeScratch scratch;
  bool view_ok = true;
  wire::PayloadView view;
  try {
    view = wire::decode_view(data, size, scratch);
  } catch (const CorruptPayload&) {
    view_ok = false;
  }
  try {
    wire::decode(data, size, out);
  } catch (const CorruptPayload&) {
    if (view_ok) std::abort();  // the two decoders must agree on what is valid
    return;
  }
  if (!view_ok) std::abort();
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
    std::vector<float> sum(h.numel, 0.0f), parts(h.numel, 0.0f);
    wire::accumulate(out, sum.data(), sum.size(), 1.0f);
    // The same sum in three pieces cut where the payload's own bytes say.
    const size_t cut1 = h.numel ? data[size - 1] % (h.numel + 1) : 0;
    const size_t cut2 = std::max(cut1, h.numel ? data[size / 2] * 257 % (h.numel + 1) : 0);
    wire::add_range(view, parts.data(), h.numel, 1.0f, 0, cut1);
    wire::add_range(view, parts.data(), h.numel, 1.0f, cut1, cut2);
    wire::add_range(view, parts.data(), h.numel, 1.0f, cut2, h.numel);
    if (h.numel > 0 && std::memcmp(sum.data(), parts.data(), h.numel * sizeof(float)) != 0)
      std::abort();
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
