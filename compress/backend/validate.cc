#include "compress/backend/validate.h"

#include <algorithm>
#include <string>
#include <vector>

#include "base/error.h"
#include "compress/dgc/schedule.h"

namespace gradex::compress::backend {

const char* device_type_name(DeviceType type) {
  switch (type) {
    case DeviceType::kCpu:
      return "cpu";
    case DeviceType::kThrustOmp:
      return "thrust-omp";
    case DeviceType::kCuda:
      return "cuda";
  }
  return "unknown";
}

void require_half_type(DType type, const char* op) {
  if (type != DType::kFloat16 && type != DType::kBFloat16)
    throw InvalidArgument(std::string(op) + ": type must be fp16 or bf16, got " + dtype_name(type));
}

void require_pointers(size_t n, const char* op, const void* a, const void* b) {
  if (n > 0 && (a == nullptr || b == nullptr))
    throw InvalidArgument(std::string(op) + ": null buffer for " + std::to_string(n) + " elements");
}

size_t check_fusion(const FusionEntry* entries, size_t count, const void* bucket, const char* op) {
  if (count > 0 && entries == nullptr) throw InvalidArgument(std::string(op) + ": null entries");
  std::vector<std::pair<size_t, size_t>> spans;
  spans.reserve(count);
  size_t end = 0;
  for (size_t i = 0; i < count; ++i) {
    const FusionEntry& e = entries[i];
    if (e.numel == 0) continue;
    if (e.data == nullptr)
      throw InvalidArgument(std::string(op) + ": entry " + std::to_string(i) + " has null data");
    if (e.offset > SIZE_MAX / 4 - e.numel)
      throw InvalidArgument(std::string(op) + ": entry " + std::to_string(i) +
                            " lies beyond any addressable bucket");
    spans.emplace_back(e.offset, e.offset + e.numel);
    end = std::max(end, e.offset + e.numel);
  }
  if (end > 0 && bucket == nullptr) throw InvalidArgument(std::string(op) + ": null bucket");
  std::sort(spans.begin(), spans.end());
  for (size_t i = 1; i < spans.size(); ++i)
    if (spans[i].first < spans[i - 1].second)
      throw InvalidArgument(std::string(op) + ": entries overlap in the bucket at element " +
                            std::to_string(spans[i].first));
  return end;
}

void check_momentum(const float* g, const float* u, size_t n, float momentum, const char* op) {
  if (!(momentum >= 0.0f && momentum < 1.0f))
    throw InvalidArgument(std::string(op) + ": momentum " + std::to_string(momentum) +
                          " outside [0, 1)");
  require_pointers(n, op, g);
  if (momentum > 0.0f) require_pointers(n, op, u);
}

void check_dgc(size_t numel, const DgcOptions& options, const char* op) {
  validate(options);
  if (numel > (uint64_t{1} << 32))
    throw InvalidArgument(std::string(op) + ": " + std::to_string(numel) +
                          " elements exceed the 2^32 that uint32 indices can address");
}

size_t max_selected_count(size_t numel, const DgcOptions& o) {
  double lowest = o.sparsity;
  const uint64_t steps =
      std::max<uint64_t>(o.schedule.size(), o.warmup_steps > 0 ? o.warmup_steps : 0);
  for (uint64_t s = 0; s < steps; ++s)
    lowest = std::min(lowest, dgc::sparsity_at(o, s));
  return dgc::count_bounds(o, numel, lowest).cap;
}

}  // namespace gradex::compress::backend
