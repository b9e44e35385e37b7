#include <string>

#include "base/check.h"
#include "base/error.h"
#include "compress/half/cast.h"
#include "compress/wire/bytes.h"
#include "compress/wire/checksum.h"
#include "compress/wire/codec.h"
#include "compress/wire/index_coding.h"
#include "compress/zstd/zstd_stage.h"

namespace gradex::compress::wire {
namespace {

void check_input(const SparseRef& s) {
  if (s.numel > (uint64_t{1} << 32))
    throw InvalidArgument("wire::encode: numel " + std::to_string(s.numel) + " exceeds 2^32");
  if (s.count > s.numel)
    throw InvalidArgument("wire::encode: " + std::to_string(s.count) + " indices for " +
                          std::to_string(s.numel) + " elements");
  if (s.count > 0 && (s.indices == nullptr || s.values == nullptr))
    throw InvalidArgument("wire::encode: null indices or values");
  if (!dtype_valid(static_cast<uint8_t>(s.value_dtype)))
    throw InvalidArgument("wire::encode: invalid value dtype");
  for (size_t j = 0; j < s.count; ++j) {
    if (s.indices[j] >= s.numel || (j > 0 && s.indices[j] <= s.indices[j - 1]))
      throw InvalidArgument("wire::encode: index " + std::to_string(s.indices[j]) +
                            " at position " + std::to_string(j) +
                            " is out of range or not increasing");
  }
}

void append_values(const SparseRef& s, std::vector<uint8_t>& out) {
  const size_t at = out.size();
  out.resize(at + s.count * dtype_size(s.value_dtype));
  uint8_t* p = out.data() + at;
  if (s.value_dtype == DType::kFloat32) {
    if (s.count) std::memcpy(p, s.values, s.count * 4);  // values may be null when empty
    return;
  }
  for (size_t j = 0; j < s.count; ++j) {
    bool saturated;
    uint16_t h = s.value_dtype == DType::kFloat16
                     ? half::to_half_saturating(s.values[j], &saturated)
                     : half::to_bf16_saturating(s.values[j], &saturated);
    put(p + 2 * j, h);
  }
}

}  // namespace

void encode_append(const SparseRef& s, uint64_t key, const WireOptions& options,
                   std::vector<uint8_t>& out) {
  check_input(s);
  const IndexPlan plan = best_plan(options.index_coding, s.indices, s.count, s.numel);
  const uint64_t body = plan.bytes + uint64_t{s.count} * dtype_size(s.value_dtype);
  if (body > 0xffffffffu)
    throw InvalidArgument("wire::encode: body of " + std::to_string(body) + " bytes exceeds 4 GiB");

  const size_t at = out.size();  // this payload's first byte
  out.reserve(at + kHeaderBytes + body);
  out.resize(at + kHeaderBytes, 0);
  encode_indices(plan, s.indices, s.count, s.numel, out);
  append_values(s, out);
  GX_CHECK_EQ(out.size(), at + kHeaderBytes + body);

  uint8_t flags = 0;
  if (options.zstd_level > 0 && body > 0) {
    thread_local std::vector<uint8_t> packed;
    // Kept only when smaller, and within the expansion bound the decoder enforces.
    if (zstd::compress(out.data() + at + kHeaderBytes, body, options.zstd_level, body, packed) &&
        body <= kMaxZstdRatio * packed.size() + kZstdSlack) {
      out.resize(at + kHeaderBytes);
      out.insert(out.end(), packed.begin(), packed.end());
      flags |= kFlagZstd;
    }
  }
  uint8_t* h = out.data() + at;
  const size_t stored = out.size() - at - kHeaderBytes;
  put<uint32_t>(h + 0, kMagic);
  put<uint16_t>(h + 4, kVersion);
  put<uint16_t>(h + 6, static_cast<uint16_t>(kHeaderBytes));
  put<uint64_t>(h + 8, key);
  put<uint64_t>(h + 16, s.numel);
  put<uint32_t>(h + 24, static_cast<uint32_t>(s.count));
  h[28] = static_cast<uint8_t>(s.value_dtype);
  h[29] = static_cast<uint8_t>(plan.coding);
  h[30] = flags;
  h[31] = plan.rice_param;
  put<uint32_t>(h + 32, static_cast<uint32_t>(plan.bytes));
  put<uint32_t>(h + 36, static_cast<uint32_t>(body));
  put<uint32_t>(h + 40, static_cast<uint32_t>(stored));
  uint32_t crc = crc32c(h, 44);
  crc = crc32c(h + kHeaderBytes, stored, crc);
  put<uint32_t>(h + 44, crc);
}

void encode(const SparseRef& s, uint64_t key, const WireOptions& options,
            std::vector<uint8_t>& out) {
  out.clear();
  encode_append(s, key, options, out);
}

}  // namespace gradex::compress::wire
