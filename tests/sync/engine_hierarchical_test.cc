// The hierarchical exchange (GRADEX_HIERARCHICAL, comm/hierarchical.h) through the engine, ranks
// as forked processes whose GRADEX_HOST_ID overrides emulate hosts of several ranks: results are
// bit-identical across ranks, equal to the flat exchange for dense tensors (exactly where the sums
// are exact, within rounding otherwise), DGC's error feedback stays exact through the host-level
// re-selection, and a dead same-host peer (shared
// memory, which UCX does not watch) is an error on every rank, not a hang.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

#include "capi/engine_access.h"
#include "process_ranks.h"
#include "rank_checks.h"
#include "sync/data/exchange_layout.h"

using namespace gradex::test;

namespace {

// Four hosts of one rank each, in two declared regions (ranks 0, 1 and 2, 3).
const std::vector<std::string> k4x1 = {"a", "b", "c", "d"};
const std::vector<std::string> kEastWest = {"east", "east", "west", "west"};

// Hosts of the emulated layouts, by rank: 2 hosts x 2 ranks (contiguous), 3 hosts x 2 ranks with
// each host's ranks spread apart (rank order is not host order).
const std::vector<std::string> k2x2 = {"a", "a", "b", "b"};
const std::vector<std::string> k3x2 = {"a", "b", "c", "a", "b", "c"};
// One host of four ranks: every peer is on shared memory, so only the process check can see a
// death.
const std::vector<std::string> k1x4 = {"a", "a", "a", "a"};

void write_floats(const std::string& path, const std::vector<float>& v) {
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size() * 4));
}

std::vector<float> read_floats(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  std::vector<float> v(static_cast<size_t>(in.tellg()) / 4);
  in.seekg(0);
  in.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(v.size() * 4));
  return v;
}

// One engine per rank with its host override; fn runs with it. Each rank writes what `fn` leaves
// in `out` to dir/<tag>.<rank>.
// `regions`, when given, is each rank's GRADEX_REGION.
std::vector<std::string> run_hosts(
    const std::vector<std::string>& hosts, std::vector<std::string> env,
    const std::function<std::string(RankContext&, std::vector<float>& out)>& fn,
    const std::string& dir, const std::string& tag, const std::vector<std::string>& regions = {}) {
  return run_ranks(
      static_cast<int>(hosts.size()), env,
      [&](RankContext& ctx) -> std::string {
        ::setenv("GRADEX_HOST_ID", hosts[static_cast<size_t>(ctx.rank)].c_str(), 1);
        if (!regions.empty())
          ::setenv("GRADEX_REGION", regions[static_cast<size_t>(ctx.rank)].c_str(), 1);
        std::string error;
        if (create_engine(ctx.rank, ctx.world, &ctx.engine, &error) != GRADEX_OK) return error;
        std::vector<float> out;
        std::string result = fn(ctx, out);
        if (result.empty()) write_floats(dir + "/" + tag + "." + std::to_string(ctx.rank), out);
        return result;  // run_ranks destroys ctx.engine
      },
      std::chrono::seconds(180), /*create_engine=*/false);
}

// Waits until every rank of `world` has called it with the same `name` (marker files in `dir`):
// a barrier outside UCX, so a rank can leave knowing no peer still has an operation with it in
// flight. False after 60 s.
bool file_barrier(const std::string& dir, const std::string& name, int rank, int world) {
  std::ofstream(dir + "/" + name + "." + std::to_string(rank)).put('1');
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  for (int r = 0; r < world; ++r)
    while (!std::filesystem::exists(dir + "/" + name + "." + std::to_string(r))) {
      if (std::chrono::steady_clock::now() > deadline) return false;
      ::usleep(2000);
    }
  return true;
}

// Every rank's output file is bit-identical to rank 0's.
std::string identical_across_ranks(const std::string& dir, const std::string& tag, int world) {
  const std::vector<float> first = read_floats(dir + "/" + tag + ".0");
  if (first.empty()) return tag + ": rank 0 wrote nothing";
  for (int r = 1; r < world; ++r) {
    const std::vector<float> v = read_floats(dir + "/" + tag + "." + std::to_string(r));
    if (v.size() != first.size() || std::memcmp(v.data(), first.data(), v.size() * 4) != 0)
      return tag + ": rank " + std::to_string(r) + " differs from rank 0";
  }
  return "";
}

// Dense steps of three tensors (one larger than a fusion bucket); `out` gets every average of the
// last step, concatenated.
std::function<std::string(RankContext&, std::vector<float>&)> dense_steps(bool integers) {
  return [integers](RankContext& ctx, std::vector<float>& out) -> std::string {
    const std::vector<uint64_t> sizes = {5, 30001, 120000};
    for (size_t t = 0; t < sizes.size(); ++t)
      RANK_OK(gradex_register_tensor(ctx.engine, ("t" + std::to_string(t)).c_str(), sizes[t],
                                     GRADEX_FLOAT32, GRADEX_DEVICE_CPU));
    for (int step = 0; step < 3; ++step) {
      std::vector<std::vector<float>> data(sizes.size());
      std::vector<gradex_handle_t> handles(sizes.size());
      for (size_t t = 0; t < sizes.size(); ++t) {
        data[t] = test_vector(7 + t, ctx.rank, step, sizes[t]);
        if (integers)
          for (float& x : data[t])
            x = std::round(x * 1000);
        RANK_OK(gradex_submit(ctx.engine, ("t" + std::to_string(t)).c_str(), data[t].data(),
                              &handles[t]));
      }
      for (size_t t = 0; t < sizes.size(); ++t)
        RANK_OK(gradex_wait(ctx.engine, handles[t]));
      if (integers) {
        // Integer sums are exact in any order: the average is float(sum) / P bit for bit.
        for (size_t t = 0; t < sizes.size(); ++t)
          for (uint64_t i = 0; i < sizes[t]; ++i) {
            float sum = 0;
            for (int r = 0; r < ctx.world; ++r)
              sum += std::round(test_vector(7 + t, r, step, sizes[t])[i] * 1000);
            RANK_REQUIRE(data[t][i] == sum / static_cast<float>(ctx.world),
                         "t" << t << "[" << i << "] " << data[t][i]);
            if (i > 50) break;  // the reference recomputes vectors: check a prefix densely
          }
      }
      RANK_OK(gradex_end_step(ctx.engine, nullptr));
      if (step == 2) {
        out.clear();
        for (auto& d : data)
          out.insert(out.end(), d.begin(), d.end());
      }
    }
    return "";
  };
}

// Largest |a - b| / max(1, |b|).
double worst_relative(const std::vector<float>& a, const std::vector<float>& b) {
  double worst = a.size() == b.size() ? 0 : 1e30;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i)
    worst =
        std::max(worst, std::fabs(double(a[i]) - b[i]) / std::max(1.0, std::fabs(double(b[i]))));
  return worst;
}

const std::vector<std::string> kDenseFp32 = {"GRADEX_FP16=0", "GRADEX_SPARSITY=0",
                                             "GRADEX_FUSION_MB=0.2", "GRADEX_RING_CHUNK_KB=16"};

}  // namespace

TEST(EngineHierarchical, DenseFp32IsIdenticalAcrossRanksAndMatchesFlat) {
  const ScratchDir scratch("hierarchical");
  const std::string& dir = scratch.path();
  ASSERT_FALSE(dir.empty());
  for (const auto* hosts : {&k2x2, &k3x2}) {
    const int world = static_cast<int>(hosts->size());
    auto env = kDenseFp32;
    auto hier = env, flat = env;
    hier.push_back("GRADEX_HIERARCHICAL=auto");
    flat.push_back("GRADEX_HIERARCHICAL=0");
    const std::string w = std::to_string(world);
    ASSERT_EQ(failures(run_hosts(*hosts, hier, dense_steps(true), dir, "int_h" + w)), "");
    ASSERT_EQ(failures(run_hosts(*hosts, hier, dense_steps(false), dir, "f_h" + w)), "");
    ASSERT_EQ(failures(run_hosts(*hosts, flat, dense_steps(false), dir, "f_flat" + w)), "");
    EXPECT_EQ(identical_across_ranks(dir, "int_h" + w, world), "");
    EXPECT_EQ(identical_across_ranks(dir, "f_h" + w, world), "");
    EXPECT_EQ(identical_across_ranks(dir, "f_flat" + w, world), "");
    // Another summation order than the flat ring's: equal within fp32 rounding of P terms.
    EXPECT_LT(worst_relative(read_floats(dir + "/f_h" + w + ".0"),
                             read_floats(dir + "/f_flat" + w + ".0")),
              1e-6);
  }
}

TEST(EngineHierarchical, Dense16BitIsIdenticalAcrossRanksAndNearFlat) {
  const ScratchDir scratch("hierarchical");
  const std::string& dir = scratch.path();
  ASSERT_FALSE(dir.empty());
  for (const char* half : {"fp16", "bf16"}) {
    const std::vector<std::string> env = {"GRADEX_FP16=1", std::string("GRADEX_HALF_TYPE=") + half,
                                          "GRADEX_SPARSITY=0", "GRADEX_FUSION_MB=0.2"};
    auto hier = env, flat = env;
    hier.push_back("GRADEX_HIERARCHICAL=1");
    flat.push_back("GRADEX_HIERARCHICAL=0");
    const std::string tag = std::string(half) + "_";
    ASSERT_EQ(failures(run_hosts(k3x2, hier, dense_steps(false), dir, tag + "h")), "");
    ASSERT_EQ(failures(run_hosts(k3x2, flat, dense_steps(false), dir, tag + "flat")), "");
    EXPECT_EQ(identical_across_ranks(dir, tag + "h", 6), "");
    // One 16-bit rounding per addition on either path: within a few units of the 16-bit type.
    const double ulp = std::string(half) == "fp16" ? 1.0 / 1024 : 1.0 / 128;
    EXPECT_LT(worst_relative(read_floats(dir + "/" + tag + "h.0"),
                             read_floats(dir + "/" + tag + "flat.0")),
              8 * ulp);
  }
}

// The quantized route (4-bit and 8-bit blocks with error feedback) under the layout: its encoded
// phases among the local shards' owners, fp32 sums inside each host. Bit-identical on every rank
// and within the codec's rounding of the exact average (values in [-1, 1): a 4-bit block of host
// sums steps by at most 2 * 2 / 7, and the average is re-encoded once more).
TEST(EngineHierarchical, QuantizedRouteIsIdenticalAcrossRanksAndNearTheAverage) {
  const ScratchDir scratch("hierarchical");
  const std::string& dir = scratch.path();
  ASSERT_FALSE(dir.empty());
  for (const auto* hosts : {&k2x2, &k3x2}) {
    const int world = static_cast<int>(hosts->size());
    const std::string w = std::to_string(world);
    auto exact = kDenseFp32;
    exact.push_back("GRADEX_HIERARCHICAL=0");
    ASSERT_EQ(failures(run_hosts(*hosts, exact, dense_steps(false), dir, "exact" + w)), "");
    for (const char* codec : {"int4", "int8"}) {
      const std::string tag = std::string(codec) + "_" + w;
      const std::vector<std::string> env = {std::string("GRADEX_SPARSITY_OVERRIDES=*:") + codec,
                                            "GRADEX_FUSION_MB=0.2", "GRADEX_HIERARCHICAL=1"};
      ASSERT_EQ(failures(run_hosts(*hosts, env, dense_steps(false), dir, tag)), "");
      EXPECT_EQ(identical_across_ranks(dir, tag, world), "");
      const double bound = std::string(codec) == "int4" ? 0.3 : 0.03;
      EXPECT_LT(worst_relative(read_floats(dir + "/" + tag + ".0"),
                               read_floats(dir + "/exact" + w + ".0")),
                bound)
          << tag;
    }
  }
}

// DGC with the host-level re-selection: bit-identical across ranks, at most one host's worth of
// selected values per host in the average (the flat exchange carries one rank's worth per rank),
// and what was delivered plus what stays in the residuals is what was submitted (the values the
// re-selection drops return to the owner's residual).
TEST(EngineHierarchical, SparseReselectsPerHostAndConservesMass) {
  const ScratchDir scratch("hierarchical");
  const std::string& dir = scratch.path();
  ASSERT_FALSE(dir.empty());
  const uint64_t n = 50000;
  const int steps = 5;
  auto sparse = [&](RankContext& ctx, std::vector<float>& out) -> std::string {
    RANK_OK(gradex_register_tensor(ctx.engine, "w", n, GRADEX_FLOAT32, GRADEX_DEVICE_CPU));
    RANK_OK(gradex_register_tensor(ctx.engine, "w2", n / 2, GRADEX_FLOAT32, GRADEX_DEVICE_CPU));
    std::vector<double> submitted(n, 0), delivered(n, 0);
    uint64_t most_nonzero = 0;
    out.clear();
    for (int step = 0; step < steps; ++step) {
      std::vector<float> g = test_vector(3, ctx.rank, step, n);
      std::vector<float> g2 = test_vector(4, ctx.rank, step, n / 2);
      for (uint64_t i = 0; i < n; ++i)
        submitted[i] += g[i];
      gradex_handle_t h, h2;
      RANK_OK(gradex_submit(ctx.engine, "w", g.data(), &h));
      RANK_OK(gradex_submit(ctx.engine, "w2", g2.data(), &h2));
      RANK_OK(gradex_wait(ctx.engine, h));
      RANK_OK(gradex_wait(ctx.engine, h2));
      uint64_t nonzero = 0;
      for (uint64_t i = 0; i < n; ++i) {
        delivered[i] += g[i];
        nonzero += g[i] != 0;
      }
      most_nonzero = std::max(most_nonzero, nonzero);
      out.insert(out.end(), g.begin(), g.end());
      out.insert(out.end(), g2.begin(), g2.end());
      RANK_OK(gradex_end_step(ctx.engine, nullptr));
    }
    // ~1% per rank (DGC keeps 0.8-1.3 k): one such set per host after the re-selection.
    const char* hosts_env = std::getenv("TEST_HOSTS");
    const uint64_t hosts = hosts_env ? std::strtoull(hosts_env, nullptr, 10) : 1;
    RANK_REQUIRE(most_nonzero <= hosts * n * 13 / 1000,
                 most_nonzero << " non-zero elements in an average of " << hosts << " hosts");
    gradex_stats_t s;
    RANK_OK(gradex_get_stats(ctx.engine, 0, &s));
    RANK_REQUIRE(s.sparse_exchanges == 2 * steps, "sparse exchanges " << s.sparse_exchanges);
    std::vector<float> residual = gradex::capi::engine_of(ctx.engine).residual_of("w");
    RANK_REQUIRE(residual.size() == n, "residual size " << residual.size());
    std::vector<float> sent(n);
    for (uint64_t i = 0; i < n; ++i)
      sent[i] = static_cast<float>(submitted[i] - residual[i]);
    RANK_OK(gradex_register_tensor(ctx.engine, "check", n, GRADEX_FLOAT32, GRADEX_DEVICE_CPU));
    gradex_handle_t h;
    RANK_OK(gradex_submit(ctx.engine, "check", sent.data(), &h));
    RANK_OK(gradex_wait(ctx.engine, h));
    double worst = 0;
    for (uint64_t i = 0; i < n; ++i)
      worst = std::max(worst, std::fabs(sent[i] - delivered[i]));
    RANK_REQUIRE(worst < 1e-5, "delivered + residuals != submitted: worst error " << worst);
    return "";
  };
  const std::vector<std::string> env = {"GRADEX_SPARSITY=0.99",
                                        "GRADEX_MOMENTUM=0",
                                        "GRADEX_FP16=0",
                                        "GRADEX_DENSE_THRESHOLD=1000",
                                        "GRADEX_SPARSITY_OVERRIDES=check:dense",
                                        "GRADEX_WARMUP_STEPS=0"};
  const std::vector<std::string> k2x3 = {"a", "a", "a", "b", "b", "b"};
  const std::vector<std::string> uneven = {"a", "b", "a", "a"};  // 3 + 1, interleaved
  for (const auto* hosts : {&k2x2, &k3x2, &k2x3, &uneven}) {
    const int world = static_cast<int>(hosts->size());
    const std::string w = std::to_string(world) + "_" + std::to_string(hosts == &k2x3) +
                          std::to_string(hosts == &uneven);
    const size_t host_count = hosts == &k3x2 ? 3 : 2;
    auto hier = env;
    hier.push_back("GRADEX_HIERARCHICAL=auto");
    hier.push_back("TEST_HOSTS=" + std::to_string(host_count));
    ASSERT_EQ(failures(run_hosts(*hosts, hier, sparse, dir, "s_h" + w)), "");
    EXPECT_EQ(identical_across_ranks(dir, "s_h" + w, world), "");
  }
  // fp16 values on the wire: the host sums are rounded to fp16 and the rounding returns to the
  // owner's residual too.
  auto half = env;
  half.push_back("GRADEX_SPARSE_VALUES=fp16");
  half.push_back("TEST_HOSTS=2");
  ASSERT_EQ(failures(run_hosts(k2x2, half, sparse, dir, "s_half")), "");
  EXPECT_EQ(identical_across_ranks(dir, "s_half", 4), "");
}

// A same-host peer on shared memory dies between steps: every surviving rank's wait fails with a
// peer error naming it (the process check, comm/topology/host_identity.h), long before
// GRADEX_TIMEOUT_S would end a hang; the run_ranks watchdog (180 s) would report a hang as a
// failure.
TEST(EngineHierarchical, DeadSameHostPeerIsAnErrorEverywhere) {
  const ScratchDir scratch("hierarchical");
  const std::string& dir = scratch.path();
  ASSERT_FALSE(dir.empty());
  const std::vector<const std::vector<std::string>*> layouts = {&k2x2, &k3x2, &k1x4};
  for (size_t layout = 0; layout < layouts.size(); ++layout) {
    auto results = run_hosts(
        *layouts[layout],
        {"GRADEX_FP16=0", "GRADEX_SPARSITY=0", "GRADEX_HIERARCHICAL=1", "GRADEX_TIMEOUT_S=120"},
        [&](RankContext& ctx, std::vector<float>& out) -> std::string {
          const uint64_t n = 100000;
          RANK_OK(gradex_register_tensor(ctx.engine, "w", n, GRADEX_FLOAT32, GRADEX_DEVICE_CPU));
          std::vector<float> g = test_vector(1, ctx.rank, 0, n);
          gradex_handle_t h;
          RANK_OK(gradex_submit(ctx.engine, "w", g.data(), &h));
          RANK_OK(gradex_wait(ctx.engine, h));
          RANK_OK(gradex_end_step(ctx.engine, nullptr));
          // Rank 3 leaves only once every rank has finished the first step: a receiver's
          // completion can precede its sender's (UCX's rendezvous acknowledgement), and a death
          // inside that window is a legitimate failure of the first step, not what this test asks.
          RANK_REQUIRE(file_barrier(dir, "stepped." + std::to_string(layout), ctx.rank, ctx.world),
                       "the file barrier after the first step timed out");
          if (ctx.rank == 3) ::_exit(0);  // shares host "a" or "b" with rank 0 or 2 / rank 0
          gradex_status_t st = gradex_submit(ctx.engine, "w", g.data(), &h);
          if (st == GRADEX_OK) st = gradex_wait(ctx.engine, h);
          const std::string message = gradex_last_error();
          RANK_REQUIRE(st == GRADEX_ERR_PEER, "status " << st << ": " << message);
          RANK_REQUIRE(message.find("rank 3") != std::string::npos, message);
          out.assign(1, 0.0f);
          return "";
        },
        dir, "dead");
    EXPECT_EQ(failures(results), "");
  }
}

// Regions as the hierarchical exchange's groups (sync/data/exchange_layout.h).
TEST(ExchangeLayout, RegionTopologyGroupsRanksByRegion) {
  const gradex::comm::HostTopology t = gradex::sync::region_topology({0, 1, 0, 1, 1});
  ASSERT_EQ(t.host_count(), 2);
  EXPECT_EQ(t.hosts[0], (std::vector<int>{0, 2}));
  EXPECT_EQ(t.hosts[1], (std::vector<int>{1, 3, 4}));
  EXPECT_EQ(t.local_index, (std::vector<int>{0, 0, 1, 1, 2}));
  EXPECT_TRUE(gradex::comm::hierarchy_pays(t));
}

TEST(ExchangeLayout, NearestRegionRoundTripIsTheSmallestAcrossRegions) {
  // Hosts 0, 1 in region 0 (0.5 ms apart), host 2 in region 1: 40 ms from host 0, 60 from host 1
  // (one direction measured lower: the larger counts).
  const std::vector<std::vector<double>> rtt = {{0, 0.5, 40}, {0.5, 0, 60}, {45, 60, 0}};
  const gradex::comm::HostTopology hosts = gradex::comm::host_topology({"a", "b", "c"}, 3);
  EXPECT_DOUBLE_EQ(gradex::sync::nearest_region_rtt_ms(rtt, hosts, {0, 0, 1}), 45.0);
  EXPECT_TRUE(std::isinf(gradex::sync::nearest_region_rtt_ms(rtt, hosts, {0, 0, 0})));
}

// Four hosts of one rank each: the host layout has nothing to reduce inside a host (flat), the
// declared regions make two groups of two. Results stay exact (integer sums) and bit-identical;
// GRADEX_HIERARCHY_TIER=host keeps the flat exchange; measured on loopback (every host a fraction
// of a millisecond from the others) auto finds no WAN and stays flat; regions of unequal size are
// used only when GRADEX_HIERARCHY_TIER=region says so.
TEST(EngineHierarchical, DeclaredRegionsAreTheGroupsAndResultsStayExact) {
  const ScratchDir scratch("hierarchical");
  const std::string& dir = scratch.path();
  ASSERT_FALSE(dir.empty());
  auto expect_layout = [](const std::string& want,
                          std::function<std::string(RankContext&, std::vector<float>&)> inner) {
    return [want, inner](RankContext& ctx, std::vector<float>& out) -> std::string {
      const std::string layout = gradex::capi::engine_of(ctx.engine).layout_description();
      RANK_REQUIRE(layout.rfind(want, 0) == 0,
                   "layout '" << layout << "', expected '" << want << "...'");
      return inner(ctx, out);
    };
  };
  const std::string regions = "hierarchical over regions (declared): rank -> region 0 0 1 1";
  ASSERT_EQ(failures(run_hosts(k4x1, kDenseFp32, expect_layout(regions, dense_steps(true)), dir,
                               "int_regions", kEastWest)),
            "");
  EXPECT_EQ(identical_across_ranks(dir, "int_regions", 4), "");
  auto host_tier = kDenseFp32;
  host_tier.push_back("GRADEX_HIERARCHY_TIER=host");
  ASSERT_EQ(failures(run_hosts(k4x1, host_tier, expect_layout("flat (4 host(s)", dense_steps(true)),
                               dir, "int_hosts", kEastWest)),
            "");
  EXPECT_EQ(identical_across_ranks(dir, "int_hosts", 4), "");
  ASSERT_EQ(
      failures(run_hosts(k4x1, kDenseFp32, expect_layout("flat (4 host(s)", dense_steps(true)), dir,
                         "int_measured")),
      "");
  // Regions of unequal size (3 ranks and 1): auto keeps the hosts (flat here), the region tier
  // forced uses them.
  const std::vector<std::string> uneven = {"east", "east", "east", "west"};
  ASSERT_EQ(
      failures(run_hosts(k4x1, kDenseFp32, expect_layout("flat (4 host(s)", dense_steps(true)), dir,
                         "int_uneven_auto", uneven)),
      "");
  auto region_tier = kDenseFp32;
  region_tier.push_back("GRADEX_HIERARCHY_TIER=region");
  ASSERT_EQ(failures(run_hosts(
                k4x1, region_tier,
                expect_layout("hierarchical over regions (declared): rank -> region 0 0 0 1",
                              dense_steps(true)),
                dir, "int_uneven_region", uneven)),
            "");
  EXPECT_EQ(identical_across_ranks(dir, "int_uneven_region", 4), "");
  // A DGC run through the regions' re-selection: every rank ends with the same averages.
  auto dgc = std::vector<std::string>{"GRADEX_POLICY=fixed", "GRADEX_SPARSITY=0.99",
                                      "GRADEX_DENSE_THRESHOLD=1000", "GRADEX_FP16=0"};
  ASSERT_EQ(failures(run_hosts(k4x1, dgc, expect_layout(regions, dense_steps(false)), dir,
                               "dgc_regions", kEastWest)),
            "");
  EXPECT_EQ(identical_across_ranks(dir, "dgc_regions", 4), "");
}
