#include <algorithm>
#include <string>

#include "base/error.h"
#include "base/half.h"
#include "compress/wire/bytes.h"
#include "compress/wire/checksum.h"
#include "compress/wire/codec.h"
#include "compress/wire/index_coding.h"
#include "compress/zstd/zstd_stage.h"

namespace gradex::compress::wire {
namespace {

[[noreturn]] void corrupt(const std::string& what) {
  throw CorruptPayload("payload " + what);
}

std::string n2s(uint64_t v) {
  return std::to_string(v);
}

}  // namespace

PayloadHeader parse_header(const uint8_t* data, size_t size) {
  if (data == nullptr || size < kHeaderBytes)
    corrupt("is truncated: " + n2s(size) + " bytes, a header needs " + n2s(kHeaderBytes));
  if (get<uint32_t>(data) != kMagic) corrupt("has a bad magic number (not a gradex payload)");
  const uint16_t version = get<uint16_t>(data + 4);
  if (version != kVersion)
    corrupt("has version " + n2s(version) + ", this build reads version " + n2s(kVersion));
  if (get<uint16_t>(data + 6) != kHeaderBytes)
    corrupt("declares a " + n2s(get<uint16_t>(data + 6)) + "-byte header, version 1 has " +
            n2s(kHeaderBytes));
  PayloadHeader h;
  h.key = get<uint64_t>(data + 8);
  h.numel = get<uint64_t>(data + 16);
  h.selected = get<uint32_t>(data + 24);
  if (h.numel > (uint64_t{1} << 32)) corrupt("element count " + n2s(h.numel) + " exceeds 2^32");
  if (h.selected > h.numel)
    corrupt("selected count " + n2s(h.selected) + " exceeds the element count " + n2s(h.numel));
  if (!dtype_valid(data[28])) corrupt("has an unknown value dtype " + n2s(data[28]));
  h.value_dtype = static_cast<DType>(data[28]);
  if (data[29] > static_cast<uint8_t>(IndexCoding::kBitmap))
    corrupt("has an unknown index coding " + n2s(data[29]));
  h.index_coding = static_cast<IndexCoding>(data[29]);
  if (data[30] & ~kFlagZstd) corrupt("has unknown flags " + n2s(data[30]));
  h.zstd = data[30] & kFlagZstd;
  h.rice_param = data[31];
  if (h.rice_param > 31 || (h.rice_param != 0 && h.index_coding != IndexCoding::kRice))
    corrupt("has an invalid rice parameter " + n2s(h.rice_param));
  h.index_bytes = get<uint32_t>(data + 32);
  h.body_bytes = get<uint32_t>(data + 36);
  h.stored_bytes = get<uint32_t>(data + 40);
  h.checksum = get<uint32_t>(data + 44);
  const uint64_t max_index = max_index_bytes(h.index_coding, h.rice_param, h.numel, h.selected);
  if (h.index_bytes > max_index)
    corrupt("index section of " + n2s(h.index_bytes) + " bytes exceeds the " + n2s(max_index) +
            " that " + n2s(h.selected) + " " + index_coding_name(h.index_coding) +
            "-coded indices can take");
  const uint64_t values = uint64_t{h.selected} * dtype_size(h.value_dtype);
  if (uint64_t{h.index_bytes} + values != h.body_bytes)
    corrupt("body of " + n2s(h.body_bytes) + " bytes does not match " + n2s(h.index_bytes) +
            " index bytes + " + n2s(values) + " value bytes");
  if (size - kHeaderBytes != h.stored_bytes)
    corrupt("length " + n2s(size) + " does not match the header's " +
            n2s(kHeaderBytes + uint64_t{h.stored_bytes}) + " bytes");
  if (!h.zstd && h.stored_bytes != h.body_bytes)
    corrupt("stores " + n2s(h.stored_bytes) + " body bytes without zstd, expected " +
            n2s(h.body_bytes));
  if (h.zstd && h.body_bytes > kMaxZstdRatio * h.stored_bytes + kZstdSlack)
    corrupt("zstd body expands " + n2s(h.stored_bytes) + " bytes to " + n2s(h.body_bytes) +
            ", beyond the allowed ratio");
  return h;
}

PayloadView decode_view(const uint8_t* data, size_t size, DecodeScratch& scratch) {
  PayloadView view;
  view.header = parse_header(data, size);
  const PayloadHeader& h = view.header;
  uint32_t crc = crc32c(data, 44);
  crc = crc32c(data + kHeaderBytes, h.stored_bytes, crc);
  if (crc != h.checksum) corrupt("checksum mismatch (payload damaged in transit)");

  const uint8_t* body = data + kHeaderBytes;
  if (h.zstd) {
    scratch.inflated.resize(h.body_bytes);
    zstd::decompress(body, h.stored_bytes, scratch.inflated.data(), h.body_bytes);
    body = scratch.inflated.data();
  }
  scratch.indices.resize(h.selected);
  decode_indices(h.index_coding, h.rice_param, body, h.index_bytes, h.selected, h.numel,
                 scratch.indices.data());
  view.indices = scratch.indices.data();
  view.values = body + h.index_bytes;
  return view;
}

void decode(const uint8_t* data, size_t size, DecodedPayload& out) {
  thread_local DecodeScratch scratch;
  scratch.indices.swap(out.indices);  // decoded straight into out.indices, no copy
  const PayloadView view = decode_view(data, size, scratch);
  out.indices.swap(scratch.indices);
  const PayloadHeader& h = view.header;
  out.header = h;
  out.values.resize(h.selected);
  const uint8_t* v = view.values;
  switch (h.value_dtype) {
    case DType::kFloat32:
      if (h.selected) std::memcpy(out.values.data(), v, uint64_t{h.selected} * 4);
      break;
    case DType::kFloat16:
      for (uint32_t j = 0; j < h.selected; ++j)
        out.values[j] = half_to_float(get<uint16_t>(v + 2 * j));
      break;
    case DType::kBFloat16:
      for (uint32_t j = 0; j < h.selected; ++j)
        out.values[j] = bf16_to_float(get<uint16_t>(v + 2 * j));
      break;
  }
}

DecodedPayload decode(const uint8_t* data, size_t size) {
  DecodedPayload out;
  decode(data, size, out);
  return out;
}

void accumulate(const DecodedPayload& p, float* out, size_t out_numel, float scale) {
  if (out_numel != p.header.numel)
    throw InvalidArgument("wire::accumulate: buffer of " + n2s(out_numel) +
                          " elements for a payload of " + n2s(p.header.numel));
  if (p.indices.size() != p.values.size())
    throw InvalidArgument("wire::accumulate: payload has mismatched index and value counts");
  if (!p.indices.empty() && out == nullptr) throw InvalidArgument("wire::accumulate: null buffer");
  for (size_t j = 0; j < p.indices.size(); ++j) {
    const uint32_t i = p.indices[j];
    if (i >= out_numel) throw InvalidArgument("wire::accumulate: index out of range");
    out[i] += scale * p.values[j];
  }
}

namespace {

// out[idx[j]] += scale * load(values, j) for j in [first, last): fp16/bf16 widen exactly, so the
// sum is bit-identical to accumulate() over a decoded copy.
template <typename Load>
void add_values(const uint32_t* idx, const uint8_t* values, size_t first, size_t last, float* out,
                float scale, Load load) {
  for (size_t j = first; j < last; ++j)
    out[idx[j]] += scale * load(values, j);
}

}  // namespace

void add_range(const PayloadView& view, float* out, size_t out_numel, float scale, size_t begin,
               size_t end) {
  const PayloadHeader& h = view.header;
  if (out_numel != h.numel)
    throw InvalidArgument("wire::accumulate: buffer of " + n2s(out_numel) +
                          " elements for a payload of " + n2s(h.numel));
  if (h.selected == 0 || begin >= end) return;
  if (out == nullptr) throw InvalidArgument("wire::accumulate: null buffer");
  const uint32_t* idx = view.indices;
  const size_t first =
      static_cast<size_t>(begin == 0 ? 0 : std::lower_bound(idx, idx + h.selected, begin) - idx);
  const size_t last = static_cast<size_t>(
      end >= h.numel ? h.selected : std::lower_bound(idx, idx + h.selected, end) - idx);
  switch (h.value_dtype) {
    case DType::kFloat32:
      add_values(idx, view.values, first, last, out, scale,
                 [](const uint8_t* v, size_t j) { return get<float>(v + 4 * j); });
      break;
    case DType::kFloat16:
      add_values(idx, view.values, first, last, out, scale, [](const uint8_t* v, size_t j) {
        return half_to_float(get<uint16_t>(v + 2 * j));
      });
      break;
    case DType::kBFloat16:
      add_values(idx, view.values, first, last, out, scale, [](const uint8_t* v, size_t j) {
        return bf16_to_float(get<uint16_t>(v + 2 * j));
      });
      break;
  }
}

}  // namespace gradex::compress::wire
