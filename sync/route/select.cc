// Route selection: the one place that writes and reads the job fields encoding a route
// (pipeline::Job::route, int8, full_precision, dgc_dense_step; pipeline::plan packs units by them)
// and maps a path to its route object.
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
    case Path::kFirstAverage:
      return "first average";
    case Path::kSparse:
      return "sparse";
    case Path::kSparseHierarchical:
      return "sparse hierarchical";
  }
  return "?";
}

void assign(pipeline::Job& job, const TensorState& t, bool sparse_step) {
  using pipeline::Route;
  if (job.id.kind == WorkKind::kAverage) {
    job.route = t.anchor.empty() ? Route::kFirstAverage : Route::kDense;
    return;
  }
  if (sparse_step) {
    job.route = Route::kSparse;
    return;
  }
  job.route = Route::kDense;
  job.dgc_dense_step = t.policy.kind == ExchangeKind::kSparse;
  job.full_precision = t.policy.kind == ExchangeKind::kDense && t.policy.full_precision;
  job.int8 =
      t.policy.kind == ExchangeKind::kDense && t.policy.int8 && job.id.kind == WorkKind::kGradient;
}

Path path_of(const pipeline::Job& job) {
  switch (job.route) {
    case pipeline::Route::kFirstAverage:
      return Path::kFirstAverage;
    case pipeline::Route::kSparse:
      return Path::kSparse;
    case pipeline::Route::kDense:
      break;
  }
  if (job.int8) return Path::kInt8;
  if (job.full_precision) return Path::kDenseFp32;
  if (job.dgc_dense_step) return Path::kDgcDenseStep;
  return Path::kDense;
}

Path path_of(const pipeline::Unit& unit, const comm::HostTopology* hosts) {
  GX_CHECK(!unit.jobs.empty());
  const Path p = path_of(*unit.jobs.front());
  if (p == Path::kDgcDenseStep) return Path::kDense;
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
