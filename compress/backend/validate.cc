#include "compress/backend/validate.h"

#include <algorithm>
#include <cstring>
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

OpName::OpName(DeviceType backend, const char* call) {
  const char* name = device_type_name(backend);
  const size_t a = std::min(std::strlen(name), sizeof(text_) - 2);
  const size_t b = std::min(std::strlen(call), sizeof(text_) - 2 - a);
  std::memcpy(text_, name, a);
  text_[a] = ' ';
  std::memcpy(text_ + a + 1, call, b);
  text_[a + 1 + b] = '\0';
}

// Backend's public calls: the checks every backend shares, then the backend's own operation.

DgcStatePtr Backend::create_dgc(size_t numel, const DgcOptions& options) {
  check_dgc(numel, options, OpName(type(), "create_dgc"));
  return do_create_dgc(numel, options);
}

CastCounts Backend::to_half(const float* in, uint16_t* out, size_t n, DType type, float scale,
                            Stream& stream) {
  const OpName op(this->type(), "to_half");
  require_half_type(type, op);
  require_pointers(n, op, in, out);
  if (n == 0) return {};
  return do_to_half(in, out, n, type, scale, stream);
}

void Backend::from_half(const uint16_t* in, float* out, size_t n, DType type, float scale, bool add,
                        Stream& stream) {
  const OpName op(this->type(), "from_half");
  require_half_type(type, op);
  require_pointers(n, op, in, out);
  do_from_half(in, out, n, type, scale, add, stream);
}

size_t Backend::count_nonfinite(const float* x, size_t n, Stream& stream) {
  require_pointers(n, OpName(type(), "count_nonfinite"), x);
  return do_count_nonfinite(x, n, stream);
}

double Backend::sum_squares(const float* x, size_t n, Stream& stream) {
  require_pointers(n, OpName(type(), "sum_squares"), x);
  return do_sum_squares(x, n, stream);
}

void Backend::zero_nonfinite(float* x, size_t n, Stream& stream) {
  require_pointers(n, OpName(type(), "zero_nonfinite"), x);
  do_zero_nonfinite(x, n, stream);
}

void Backend::apply_momentum(float* g, float* u, size_t n, float momentum, bool nesterov,
                             float grad_scale, Stream& stream) {
  check_momentum(g, u, n, momentum, OpName(type(), "apply_momentum"));
  do_apply_momentum(g, u, n, momentum, nesterov, grad_scale, stream);
}

void Backend::gather(const FusionEntry* entries, size_t count, float* bucket, Stream& stream) {
  check_fusion(entries, count, bucket, OpName(type(), "gather"));
  do_gather(entries, count, bucket, stream);
}

void Backend::scatter(const float* bucket, const FusionEntry* entries, size_t count,
                      Stream& stream) {
  check_fusion(entries, count, bucket, OpName(type(), "scatter"));
  do_scatter(bucket, entries, count, stream);
}

void Backend::scatter_add(const uint32_t* indices, const float* values, size_t count, float* out,
                          size_t numel, float scale, Stream& stream) {
  const OpName op(type(), "scatter_add");
  require_pointers(count, op, indices, values);
  require_pointers(count, op, out);
  do_scatter_add(indices, values, count, out, numel, scale, stream);
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
