// Route selection: the one place that writes a job's path (pipeline::Job::path), the map from a
// unit's path to its route object, what a job's route asks of the engine's per-job stages, and
// how the round's jobs are cut into units (pack: the only fusion of dense jobs into buckets, so
// each dense unit is exactly one bucket of sync/data/dense_exchange.h, which sums it as it is).
#include <algorithm>

#include "base/check.h"
#include "sync/data/dense_exchange.h"
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

JobRole role_of(const pipeline::Job& job) {
  JobRole r;
  r.first_average = job.path == Path::kFirstAverage;
  r.selects = job.path == Path::kSparse;
  r.dense_step = job.path == Path::kDgcDenseStep;
  r.summed_in_place = dense_allreduce(job.path);
  return r;
}

void Transfer::pack(pipeline::Unit& unit, const JobWork& work) const {
  unit.message.clear();
  unit.rider_message_bytes = 0;
  auto each = [&](size_t j) {
    pipeline::Job& job = *unit.jobs[j];
    job.payload.clear();
    work.prepare(j, job.payload);
  };
  if (work.spread)
    work.spread(each);
  else
    for (size_t j = 0; j < unit.jobs.size(); ++j)
      each(j);
}

Payloads Transfer::unpack(const pipeline::Unit& unit, const Context& ctx) const {
  (void)unit, (void)ctx;
  return {};
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

namespace {

using pipeline::Job;
using pipeline::PlanOptions;
using pipeline::Unit;

// Greedy packing in round order by the fusion rule: a bucket takes the next job while its wire
// bytes stay within the limit; a job larger than the limit travels alone.
void add_buckets(std::vector<Job>& jobs, Path path, size_t elem, size_t fusion_bytes,
                 std::deque<Unit>& units) {
  const size_t limit = fusion_limit(fusion_bytes, elem);
  Unit* open = nullptr;
  size_t bytes = 0;
  for (Job& j : jobs) {
    if (unit_path(j.path) != path || j.rider) continue;
    const size_t b = j.tensor->numel * elem;
    if (open == nullptr || bytes + b > limit) {
      open = &units.emplace_back();
      open->path = path;
      bytes = 0;
    }
    open->jobs.push_back(&j);
    bytes += b;
  }
}

// Marks the riders (see pipeline::plan); returns whether there are any.
bool choose_riders(std::vector<Job>& jobs, const PlanOptions& options) {
  if (options.rider_bytes == 0) return false;
  if (std::none_of(jobs.begin(), jobs.end(), [](const Job& j) { return j.path == Path::kSparse; }))
    return false;
  uint64_t bytes = 0;
  bool any = false;
  for (Job& j : jobs) {
    const bool dense = j.path == Path::kDense || j.path == Path::kDenseFp32;
    if (!dense || j.id.kind != WorkKind::kGradient || j.absent || !j.tensor->int8_residual.empty())
      continue;
    const DType wire = j.path == Path::kDense ? options.dense_wire : DType::kFloat32;
    const uint64_t b = j.tensor->numel * dtype_size(wire);
    if (bytes + b > options.rider_bytes) break;  // round order: a prefix rides
    bytes += b;
    j.rider = true;
    j.rider_wire = wire;
    any = true;
  }
  return any;
}

}  // namespace

std::deque<Unit> pack(std::vector<Job>& jobs, const PlanOptions& options) {
  std::deque<Unit> units;
  const bool riders = choose_riders(jobs, options);
  add_buckets(jobs, Path::kDense, dtype_size(options.dense_wire), options.fusion_bytes, units);
  // Dense jobs a policy keeps in fp32 on a 16-bit wire (GRADEX_POLICY=auto): buckets of their own.
  add_buckets(jobs, Path::kDenseFp32, 4, options.fusion_bytes, units);
  // The quantized route (sync/data/int8_exchange.h): buckets of their own per code width, counted
  // at one byte per element (4-bit buckets thus hold twice their wire bytes' worth).
  add_buckets(jobs, Path::kInt8, 1, options.fusion_bytes, units);
  add_buckets(jobs, Path::kInt4, 1, options.fusion_bytes, units);
  add_buckets(jobs, Path::kFirstAverage, 4, options.fusion_bytes, units);
  const uint64_t group = options.sparse_group_elements;
  Unit* open = nullptr;
  uint64_t elements = 0;
  for (Job& j : jobs) {
    if (j.path != Path::kSparse) continue;
    const uint64_t n = j.tensor->numel;
    if (open == nullptr || elements >= group || n >= group) {
      open = &units.emplace_back();
      open->path = Path::kSparse;
      open->finish_on_pool = true;  // decoding may overlap the next unit's transfer
      elements = 0;
    }
    open->jobs.push_back(&j);
    elements += n;
  }
  if (riders) {
    Unit& first = *std::find_if(units.begin(), units.end(),
                                [](const Unit& u) { return u.path == Path::kSparse; });
    for (Job& j : jobs)
      if (j.rider) first.jobs.push_back(&j);
  }
  return units;
}

}  // namespace gradex::sync::route
