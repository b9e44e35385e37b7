// The wire paths a tensor's bytes can take (each is described in sync/route/route.h). A job's path
// is set by route::assign from agreed data only, and pipeline::plan packs units by it, so every
// rank cuts the same units.
#pragma once

#include <cstdint>

namespace gradex::sync::route {

enum class Path : uint8_t {
  kDense,
  kDgcDenseStep,
  kDenseFp32,
  kInt8,
  kInt4,
  kFirstAverage,
  kSparse,
  kSparseHierarchical,
};
const char* path_name(Path path);

// The path of the units a job of `path` travels in: a DGC tensor's dense step rides the dense
// buckets; kSparseHierarchical is chosen per unit (route::path_of), never on a job.
constexpr Path unit_path(Path path) {
  return path == Path::kDgcDenseStep ? Path::kDense : path;
}

// Whether a job of `path` travels in a fused dense allreduce of its values (16-bit, fp32, 8-bit or
// 4-bit on the wire), as opposed to a first average or a sparse allgather.
constexpr bool dense_allreduce(Path path) {
  return path == Path::kDense || path == Path::kDgcDenseStep || path == Path::kDenseFp32 ||
         path == Path::kInt8 || path == Path::kInt4;
}

// The quantized route's paths (sync/data/int8_exchange.h) and their code width.
constexpr bool quantized_path(Path path) {
  return path == Path::kInt8 || path == Path::kInt4;
}
constexpr int quantized_path_bits(Path path) {
  return path == Path::kInt4 ? 4 : 8;
}

}  // namespace gradex::sync::route
