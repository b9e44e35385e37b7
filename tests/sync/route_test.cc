// Route selection (sync/route/route.h) without ranks: every wire path is reached from the policy
// and work kind that should reach it, pipeline::plan never puts two paths in one unit (a DGC dense
// step rides the dense buckets), and each unit's route object is the one of its path.
#include "sync/route/route.h"

#include <gtest/gtest.h>

#include <deque>
#include <map>
#include <string>
#include <vector>

#include "sync/engine/pipeline.h"

namespace gradex::sync::route {
namespace {

struct Case {
  std::string key;
  WorkKind kind;
  Rung rung;
  bool anchored;     // a LocalSGD anchor exists (parameter averages)
  bool sparse_step;  // the DGC schedule says this step is sparse
  Path want;
};

// The cases run on a 16-bit dense wire, where kHalf is that wire and kFp32 travels apart.
constexpr bool kHalfWire = true;
const Rung dense{Codec::kHalf, 0};
const Rung fp32{Codec::kFp32, 0};
const Rung int8{Codec::kInt8, 0};
const Rung dgc{Codec::kDgc, 0.99};

const std::vector<Case>& cases() {
  static const std::vector<Case> c = {
      {"dense", WorkKind::kGradient, dense, false, false, Path::kDense},
      {"fp32", WorkKind::kGradient, fp32, false, false, Path::kDenseFp32},
      {"int8", WorkKind::kGradient, int8, false, false, Path::kInt8},
      {"dgc_sparse", WorkKind::kGradient, dgc, false, true, Path::kSparse},
      {"dgc_warmup", WorkKind::kGradient, dgc, false, false, Path::kDgcDenseStep},
      {"first_average", WorkKind::kAverage, dense, false, false, Path::kFirstAverage},
      {"average", WorkKind::kAverage, dense, true, false, Path::kDense},
      // The 8-bit route is for gradients: a parameter average of an 'int8' tensor is dense.
      {"int8_average", WorkKind::kAverage, int8, true, false, Path::kDense},
  };
  return c;
}

struct Round {
  std::deque<TensorState> tensors;
  std::vector<pipeline::Job> jobs;
  Round() {
    for (const Case& c : cases()) {
      TensorState& t = tensors.emplace_back();
      t.key = c.key;
      t.numel = 1000;
      t.policy.rung = c.rung;
      if (c.anchored) t.anchor.assign(t.numel, 0.0f);
      pipeline::Job j;
      j.id = {c.kind, c.key};
      j.tensor = &t;
      assign(j, t, c.sparse_step, kHalfWire);
      jobs.push_back(std::move(j));
    }
  }
};

TEST(Route, EveryPathIsReachedFromItsPolicy) {
  Round r;
  for (size_t i = 0; i < cases().size(); ++i)
    EXPECT_EQ(path_of(r.jobs[i]), cases()[i].want) << cases()[i].key;
}

// On an fp32 dense wire kFp32 is the dense wire itself (sync/policy/policy.h: canonical_rung): the
// fused buckets, not fp32 buckets of their own. The Adam codec's tensors take DGC's paths.
TEST(Route, OnAnFp32WireFp32IsTheDenseWire) {
  TensorState t;
  t.key = "w";
  t.numel = 1000;
  pipeline::Job j;
  j.id = {WorkKind::kGradient, t.key};
  j.tensor = &t;
  t.policy.rung = fp32;
  assign(j, t, false, false);
  EXPECT_EQ(path_of(j), Path::kDense);
  assign(j, t, false, true);
  EXPECT_EQ(path_of(j), Path::kDenseFp32);
  t.policy.rung = {Codec::kAdam, 0.98};
  assign(j, t, false, false);
  EXPECT_EQ(path_of(j), Path::kDgcDenseStep);
  assign(j, t, true, false);
  EXPECT_EQ(path_of(j), Path::kSparse);
}

TEST(Route, UnitsHoldOnePathAndGetItsRouteObject) {
  comm::HostTopology hosts;  // only its presence matters to selection
  const std::vector<const comm::HostTopology*> layouts = {nullptr, &hosts};
  for (const comm::HostTopology* h : layouts) {
    Round r;
    pipeline::PlanOptions options;
    options.dense_wire = DType::kFloat16;
    std::deque<pipeline::Unit> units = pipeline::plan(r.jobs, options);
    std::map<Path, int> seen;
    for (const pipeline::Unit& u : units) {
      const Path p = path_of(u, h);
      ++seen[p];
      EXPECT_NE(p, Path::kDgcDenseStep);
      for (const pipeline::Job* job : u.jobs) {
        Path jp = path_of(*job);
        if (jp == Path::kDgcDenseStep) jp = Path::kDense;
        if (jp == Path::kSparse && h != nullptr) jp = Path::kSparseHierarchical;
        EXPECT_EQ(jp, p) << job->id.key << " in a " << path_name(p) << " unit";
      }
      EXPECT_EQ(select(u, h).path(), p) << path_name(p);
    }
    const Path sparse = h ? Path::kSparseHierarchical : Path::kSparse;
    for (Path p : {Path::kDense, Path::kDenseFp32, Path::kInt8, Path::kFirstAverage, sparse})
      EXPECT_EQ(seen.count(p), 1u) << path_name(p) << (h ? " (hierarchical)" : "");
    EXPECT_EQ(seen.size(), 5u);
  }
}

// What the engine's per-job stages learn of a job's route: the role matches its path.
TEST(Route, EachJobsRoleIsItsPaths) {
  Round r;
  for (size_t i = 0; i < cases().size(); ++i) {
    const JobRole role = role_of(r.jobs[i]);
    const Path want = cases()[i].want;
    EXPECT_EQ(role.first_average, want == Path::kFirstAverage) << cases()[i].key;
    EXPECT_EQ(role.selects, want == Path::kSparse) << cases()[i].key;
    EXPECT_EQ(role.dense_step, want == Path::kDgcDenseStep) << cases()[i].key;
    EXPECT_EQ(role.summed_in_place, want != Path::kFirstAverage && want != Path::kSparse)
        << cases()[i].key;
  }
}

// The one direct-or-ring rule of the dense buckets, per GRADEX_DENSE_COLLECTIVE and layout, and the
// planner's link paths taken from it: the planner prices a flat bucket as direct exactly where the
// route sends it directly, on any link (a LAN's small buckets go direct too).
TEST(Route, TheDenseDirectOrRingRuleIsOneForTheRouteAndThePlanner) {
  using Mode = EngineOptions::DenseCollective;
  const LinkModel lan = LinkModel::single({50e-6, 1e-9, true}, Tier::kRegion, 4);
  const LinkModel wan = LinkModel::single({25e-3, 8e-9, true}, Tier::kAcross, 4);
  comm::HostTopology two, three;
  two.hosts = {{0, 1}, {2, 3}};
  three.hosts = {{0}, {1, 2}, {3}};
  EngineOptions o;
  for (Mode mode : {Mode::kAuto, Mode::kGather, Mode::kRing, Mode::kDirect}) {
    o.collectives.dense = mode;
    for (const LinkModel* link : {static_cast<const LinkModel*>(nullptr), &lan, &wan}) {
      const uint64_t flat = dense_direct_max_bytes(o, link, nullptr);
      const bool priced = mode == Mode::kAuto || mode == Mode::kGather;
      const uint64_t want = mode == Mode::kDirect       ? UINT64_MAX
                            : priced && link != nullptr ? link->dense_direct_max_bytes()
                                                        : 0;
      EXPECT_EQ(flat, want);
      // The planner's flat buckets: the route's rule, whatever the link.
      EXPECT_EQ(link_paths(link, o, nullptr, true).dense_direct_max_bytes, flat);
      // Across a hierarchy's groups: direct only on a latency-bound link (every bucket between
      // two groups), or when asked for; the planner keeps the flat ring's price there.
      const bool across = mode == Mode::kDirect || (priced && link == &wan);
      EXPECT_EQ(dense_direct_max_bytes(o, link, &two) > 0, across);
      if (priced && link == &wan) {
        EXPECT_EQ(dense_direct_max_bytes(o, link, &two), UINT64_MAX);
        EXPECT_EQ(dense_direct_max_bytes(o, link, &three), wan.dense_direct_max_bytes());
      }
      EXPECT_EQ(link_paths(link, o, &two, true).dense_direct_max_bytes, 0u);
    }
  }
  // A LAN sends its small buckets directly: the planner now prices them so.
  o.collectives.dense = Mode::kAuto;
  EXPECT_GT(link_paths(&lan, o, nullptr, true).dense_direct_max_bytes, uint64_t{64} << 10);
  // The one hop and the unsized gather: flat only, the latter where the gather skips its size
  // round.
  EXPECT_EQ(link_paths(&wan, o, nullptr, true).quantized_one_hop_max_bytes,
            wan.quantized_one_hop_max_bytes());
  EXPECT_EQ(link_paths(&wan, o, &two, true).quantized_one_hop_max_bytes, 0u);
  EXPECT_TRUE(link_paths(&wan, o, nullptr, true).sparse_unsized);
  EXPECT_FALSE(link_paths(&lan, o, nullptr, true).sparse_unsized);
  EXPECT_FALSE(link_paths(&wan, o, nullptr, false).sparse_unsized);
  EXPECT_FALSE(link_paths(&wan, o, &two, true).sparse_unsized);
}

}  // namespace
}  // namespace gradex::sync::route
