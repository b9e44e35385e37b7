#include "sync/data/gather_rider.h"

#include <cstring>

#include "base/error.h"
#include "compress/backend/dgc_codec.h"
#include "compress/half/cast.h"
#include "compress/wire/codec.h"

namespace gradex::sync::rider {
namespace {

namespace wire = compress::wire;

// 0, 1, ..., n-1: a full payload's indices (per thread, grown on demand).
const uint32_t* every_index(uint64_t n) {
  thread_local std::vector<uint32_t> indices;
  while (indices.size() < n)
    indices.push_back(static_cast<uint32_t>(indices.size()));
  return indices.data();
}

}  // namespace

uint64_t encode(const float* x, uint64_t n, const std::string& key, DType wire_type, int world_size,
                std::vector<uint8_t>& out) {
  const float* values = x;
  uint64_t saturated = 0;
  thread_local std::vector<float> divided;
  if (wire_type != DType::kFloat32) {
    // Rounded here (saturation counted), so the encoder's own cast is exact.
    divided.resize(n);
    const float scale = 1.0f / static_cast<float>(world_size);
    for (uint64_t i = 0; i < n; ++i) {
      bool s = false;
      divided[i] = compress::half::round_to(x[i] * scale, wire_type, &s);
      saturated += s;
    }
    values = divided.data();
  }
  wire::SparseRef ref;
  ref.numel = n;
  ref.indices = every_index(n);
  ref.values = values;
  ref.count = n;
  ref.value_dtype = wire_type;
  compress::WireOptions options;
  options.index_coding = compress::IndexCoding::kBitmap;
  wire::encode_append(ref, compress::backend::tensor_key_id(key), options, out);
  return saturated;
}

bool average(const std::vector<wire::PayloadSpan>& payloads, const std::string& key, uint64_t n,
             DType wire_type, float* out) {
  thread_local wire::DecodeScratch scratch;
  const uint64_t id = compress::backend::tensor_key_id(key);
  const float weight =
      wire_type == DType::kFloat32 ? 1.0f / static_cast<float>(payloads.size()) : 1.0f;
  std::memset(out, 0, n * sizeof(float));
  for (size_t r = 0; r < payloads.size(); ++r) {
    const std::string from = "dense tensor '" + key + "' from rank " + std::to_string(r) + ": ";
    wire::PayloadView view;
    try {
      view = wire::decode_view(payloads[r].first, payloads[r].second, scratch);
    } catch (const CorruptPayload& e) {
      throw CorruptPayload(from + e.what());
    }
    if (view.header.key != id)
      throw CorruptPayload(from + "the payload carries another tensor's key");
    if (view.header.numel != n || view.header.selected != n || view.header.value_dtype != wire_type)
      throw CorruptPayload(
          from + "expected all " + std::to_string(n) + " values as " + dtype_name(wire_type) +
          ", the payload holds " + std::to_string(view.header.selected) + " of " +
          std::to_string(view.header.numel) + " as " + dtype_name(view.header.value_dtype));
    wire::add_range(view, out, n, weight, 0, n);
  }
  return compress::half::count_nonfinite(out, n) > 0;
}

}  // namespace gradex::sync::rider
