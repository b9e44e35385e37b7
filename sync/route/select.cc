// Route selection: the one place that writes a job's path (pipeline::Job::path; pipeline::plan
// packs units by it), and the map from a unit's path to its route object.
#include "base/check.h"
#include "sync/route/routes.h"

namespace gradex::sync::route {

const char* path_name(Path path) {
  switch (path) {
    case Path::kDense:
      return "dense";
    case Path::kDgcDenseStep:
      return "DGC dense step";
    case Path::kDenseFp32:
      return "dense fp32";
    case Path::kInt8:
      return "8-bit";
    case Path::kInt4:
      return "4-bit";
    case Path::kFirstAverage:
      return "first average";
    case Path::kSparse:
      return "sparse";
    case Path::kSparseHierarchical:
      return "sparse hierarchical";
  }
  return "?";
}

void assign(pipeline::Job& job, const TensorState& t, bool sparse_step, bool half_on_wire) {
  if (job.id.kind == WorkKind::kAverage) {
    // Parameter averages: the first fp32 (it sets the anchor), later ones on the dense wire.
    job.path = t.anchor.empty() ? Path::kFirstAverage : Path::kDense;
  } else if (sparse_step) {
    job.path = Path::kSparse;
  } else if (is_sparse(t.policy.rung.codec)) {
    job.path = Path::kDgcDenseStep;
  } else if (is_quantized(t.policy.rung.codec)) {
    job.path = t.policy.rung.codec == Codec::kInt4 ? Path::kInt4 : Path::kInt8;
  } else if (own_fp32_buckets(t.policy.rung, half_on_wire)) {
    job.path = Path::kDenseFp32;
  } else {
    job.path = Path::kDense;
  }
}

Path path_of(const pipeline::Job& job) {
  return job.path;
}

Path path_of(const pipeline::Unit& unit, const comm::HostTopology* hosts) {
  GX_CHECK(!unit.jobs.empty());
  const Path p = unit_path(unit.path);
  if (p == Path::kSparse && hosts != nullptr) return Path::kSparseHierarchical;
  return p;
}

const Transfer& select(const pipeline::Unit& unit, const comm::HostTopology* hosts) {
  switch (path_of(unit, hosts)) {
    case Path::kDense:
    case Path::kDgcDenseStep:
      return dense_route();
    case Path::kDenseFp32:
      return dense_fp32_route();
    case Path::kInt8:
      return int8_route();
    case Path::kInt4:
      return int4_route();
    case Path::kFirstAverage:
      return first_average_route();
    case Path::kSparse:
      return sparse_route();
    case Path::kSparseHierarchical:
      return sparse_hierarchical_route();
  }
  GX_CHECK(false);
  return dense_route();
}

}  // namespace gradex::sync::route
