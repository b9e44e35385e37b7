// What negotiation (sync/negotiation/negotiator.h) talks about: a unit of work named by kind and
// key, and what one rank announces about it. Separate so that the cache and the message codec can
// use them.
#pragma once

#include <cstdint>
#include <string>

#include "base/dtype.h"

namespace gradex::sync {

enum class WorkKind : uint8_t { kGradient = 0, kAverage = 1 };

struct WorkId {
  WorkKind kind;
  std::string key;
  bool operator<(const WorkId& o) const { return kind != o.kind ? kind < o.kind : key < o.key; }
  bool operator==(const WorkId& o) const { return kind == o.kind && key == o.key; }
};

struct Announcement {
  WorkId id;
  uint64_t numel = 0;
  DType dtype = DType::kFloat32;
  // Gradient: the tensor's exchange counter on this rank. Parameter average: 1 when this rank
  // holds a LocalSGD anchor for it (it averaged the tensor before), else 0.
  uint64_t step = 0;
  bool nonfinite = false;  // this rank's gradient holds NaN/Inf
};

}  // namespace gradex::sync
