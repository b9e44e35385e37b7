// The DGC step on every backend: compress/dgc's invariant exactly (sent + v_new == v_old + update
// in fp32, u masked where sent), the count bounds, the threshold property of the selected set, and
// the dense step; bit-identical state across backends where the selection algorithm is the same
// (threshold reuse off). Odd, zero and multi-chunk sizes; NaN/Inf gradients.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <tuple>

#include "backend_util.h"
#include "compress/backend/backend.h"
#include "compress/dgc/schedule.h"
#include "compress/dgc/select.h"
#include "compress/half/cast.h"
#include "test_util.h"

namespace gradex::compress {
namespace {

using backend::DeviceType;
using test::Device;

struct Snapshot {
  std::vector<float> u, v;
};

Snapshot snapshot(Device& dev, backend::DgcState& s) {
  Snapshot out;
  out.v = dev.download(s.residual(), s.numel());
  if (s.momentum_buffer()) out.u = dev.download<float>(s.momentum_buffer(), s.numel());
  return out;
}

// v_old + update and the new u, computed the way compress/dgc/kernels.cc does (fp32, no FMA).
Snapshot reference_update(const Snapshot& old, const std::vector<float>& g, float scale,
                          const DgcOptions& o) {
  Snapshot r = old;
  for (size_t i = 0; i < g.size(); ++i) {
    const float gi = g[i] * scale;
    if (o.momentum == 0.0f) {
      r.v[i] = old.v[i] + gi;
      continue;
    }
    const float ui = o.momentum * old.u[i] + gi;
    r.u[i] = ui;
    r.v[i] = o.nesterov ? old.v[i] + (gi + o.momentum * ui) : old.v[i] + ui;
  }
  return r;
}

// Checks one sparse step against the invariant; returns the selection as (indices, values).
void check_sparse_step(Device& dev, backend::DgcState& s, const Snapshot& old,
                       const std::vector<float>& g, float scale, const backend::DgcStepInfo& info,
                       std::vector<uint32_t>* idx_out, std::vector<float>* val_out) {
  const DgcOptions& o = s.options();
  const size_t n = s.numel();
  const Snapshot want = reference_update(old, g, scale, o);
  const Snapshot now = snapshot(dev, s);
  std::vector<uint32_t> idx = dev.download(s.selected_indices(), info.count);
  std::vector<float> val = dev.download(s.selected_values(), info.count);
  const dgc::CountBounds cb = dgc::count_bounds(o, n, info.sparsity);
  ASSERT_LE(info.count, cb.cap);
  ASSERT_LE(info.count, s.capacity());
  std::vector<float> sent(n, 0.0f);
  std::vector<char> selected(n, 0);
  for (size_t j = 0; j < idx.size(); ++j) {
    ASSERT_LT(idx[j], n);
    if (j > 0) {
      ASSERT_LT(idx[j - 1], idx[j]) << "indices not strictly increasing";
    }
    sent[idx[j]] = val[j];
    selected[idx[j]] = 1;
    bool sat = false;
    ASSERT_TRUE(test::same_bits(half::round_to(val[j], o.value_dtype, &sat), val[j]))
        << "value not representable in " << dtype_name(o.value_dtype);
  }
  size_t nonzero = 0;
  float min_sel = std::numeric_limits<float>::infinity(), max_unsel = 0;
  for (size_t i = 0; i < n; ++i) {
    const float full = want.v[i];
    const float mag = std::fabs(full);
    if (std::isfinite(full)) {
      // The invariant, bit for bit.
      ASSERT_TRUE(test::same_bits(sent[i] + now.v[i], full))
          << "element " << i << ": sent " << sent[i] << " + residual " << now.v[i]
          << " != " << full;
    } else if (std::isnan(full)) {
      ASSERT_FALSE(selected[i]) << "NaN selected at " << i;
      ASSERT_TRUE(std::isnan(now.v[i]));
    } else {  // Inf: sent whole (residual NaN) or kept
      ASSERT_TRUE(selected[i] ? sent[i] == full : now.v[i] == full) << i;
    }
    if (!now.u.empty()) {
      ASSERT_TRUE(selected[i] ? now.u[i] == 0.0f
                              : test::same_bits(now.u[i], want.u[i]) ||
                                    (std::isnan(now.u[i]) && std::isnan(want.u[i])))
          << i;
    }
    if (mag >= dgc::kMinThreshold) ++nonzero;  // NaN compares false
    if (selected[i])
      min_sel = std::min(min_sel, mag);
    else if (mag == mag)
      max_unsel = std::max(max_unsel, mag);
  }
  // Count bounds: the accept window, or every non-zero element when there are fewer than `low`.
  if (!info.exact) {
    ASSERT_TRUE((info.count >= cb.low && info.count <= cb.high) ||
                (info.count == nonzero && nonzero < cb.low))
        << info.count << " outside [" << cb.low << ", " << cb.high << "], " << nonzero
        << " non-zero";
  } else {
    ASSERT_EQ(info.count, std::min(cb.k, nonzero));
  }
  // The selected set is a top set: nothing unselected is larger than anything selected.
  if (info.count > 0) {
    ASSERT_GE(min_sel, max_unsel);
    ASSERT_EQ(info.threshold, min_sel);
  } else {
    ASSERT_TRUE(std::isinf(info.threshold));
  }
  if (idx_out) *idx_out = idx;
  if (val_out) *val_out = val;
}

using Param = std::tuple<DeviceType, size_t>;
class BackendDgc : public ::testing::TestWithParam<Param> {
 protected:
  backend::BackendPtr b = backend::get_backend(std::get<0>(GetParam()));
  size_t n = std::get<1>(GetParam());
  Device dev{*b};

  // `steps` steps of `o` (every third one dense when dense_every); checks each.
  void run(DgcOptions o, int steps, bool dense_every = false, bool wild = false) {
    backend::DgcStatePtr s = b->create_dgc(n, o);
    auto out = b->allocate(n * 4);
    for (int step = 0; step < steps; ++step) {
      std::vector<float> g = test::random_grad(n, 1000 + step, 1.0f + step % 3, 11);
      if (wild && n > 8) {
        g[n / 2] = std::numeric_limits<float>::quiet_NaN();
        g[n / 3] = std::numeric_limits<float>::infinity();
        g[1] = -std::numeric_limits<float>::infinity();
      }
      auto gd = dev.upload(g);
      const Snapshot old = snapshot(dev, *s);
      const float scale = step % 2 ? 0.5f : 1.0f;
      if (dense_every && step % 3 == 2) {
        s->step_dense(gd->as<float>(), out->as<float>(), scale, *dev.stream);
        const Snapshot want = reference_update(old, g, scale, o);
        std::vector<float> sent = dev.download(out->as<float>(), n);
        const Snapshot now = snapshot(dev, *s);
        for (size_t i = 0; i < n; ++i) {
          ASSERT_TRUE(test::same_bits(sent[i], want.v[i]) ||
                      (std::isnan(sent[i]) && std::isnan(want.v[i])));
          ASSERT_TRUE(test::same_bits(now.v[i], 0.0f));
          if (!now.u.empty()) {
            ASSERT_TRUE(test::same_bits(now.u[i], want.u[i]) ||
                        (std::isnan(now.u[i]) && std::isnan(want.u[i])));
          }
        }
        continue;
      }
      backend::DgcStepInfo info = s->step(gd->as<float>(), scale, *dev.stream);
      ASSERT_EQ(info.step, static_cast<uint64_t>(step));
      ASSERT_NO_FATAL_FAILURE(check_sparse_step(dev, *s, old, g, scale, info, nullptr, nullptr))
          << "step " << step;
    }
    EXPECT_EQ(s->steps_done(), static_cast<uint64_t>(steps));
  }
};

TEST_P(BackendDgc, MomentumStepsKeepTheInvariant) {
  DgcOptions o;
  o.sparsity = 0.99;
  o.warmup_steps = 4;
  run(o, 8);
}

TEST_P(BackendDgc, NesterovFp16ValuesAndDenseStepsKeepTheInvariant) {
  DgcOptions o;
  o.nesterov = true;
  o.value_dtype = DType::kFloat16;
  o.sparsity = 0.999;
  run(o, 7, /*dense_every=*/true);
}

TEST_P(BackendDgc, PlainBf16ExactSelectionKeepsTheInvariant) {
  DgcOptions o;
  o.momentum = 0;
  o.value_dtype = DType::kBFloat16;
  o.exact_selection = true;
  o.sparsity = 0.9;
  run(o, 5);
}

TEST_P(BackendDgc, MultiChunkWithACappedCount) {
  DgcOptions o;
  o.sparsity = 0.95;
  o.threads = 2;
  o.parallel_min_elements = 4096;  // the CPU backend splits anything larger into chunks
  o.max_selected = std::max<size_t>(1, n / 40);
  run(o, 5);
}

TEST_P(BackendDgc, NanAndInfGradientsNeverBreakFiniteElements) {
  DgcOptions o;
  o.sparsity = 0.99;
  run(o, 4, /*dense_every=*/false, /*wild=*/true);
}

INSTANTIATE_TEST_SUITE_P(Sizes, BackendDgc,
                         ::testing::Combine(::testing::ValuesIn(test::test_backends()),
                                            ::testing::Values(size_t{0}, size_t{1}, size_t{7},
                                                              size_t{65}, size_t{4099},
                                                              size_t{300001})),
                         [](const ::testing::TestParamInfo<Param>& info) {
                           return test::backend_param_name({std::get<0>(info.param), info.index}) +
                                  "_n" + std::to_string(std::get<1>(info.param));
                         });

// Without threshold reuse the CPU compressor and the Thrust step run the same selection, so every
// backend must produce the same selections and state as the CPU backend, bit for bit.
class BackendDgcAgreement : public ::testing::TestWithParam<DeviceType> {};

TEST_P(BackendDgcAgreement, SelectionsAndStateMatchTheCpuBackend) {
  for (DType vt : {DType::kFloat32, DType::kFloat16}) {
    DgcOptions o;
    o.reuse_threshold = false;
    o.value_dtype = vt;
    o.sparsity = 0.995;
    o.warmup_steps = 3;
    const size_t n = 123457;
    auto cpu = backend::get_backend(DeviceType::kCpu);
    auto other = backend::get_backend(GetParam());
    Device dc{*cpu}, dother{*other};
    auto sc = cpu->create_dgc(n, o);
    auto so = other->create_dgc(n, o);
    for (int step = 0; step < 6; ++step) {
      std::vector<float> g = test::random_grad(n, 70 + step, 1.0f, 17);
      auto gc = dc.upload(g);
      auto go = dother.upload(g);
      backend::DgcStepInfo a = sc->step(gc->as<float>(), 1.0f, *dc.stream);
      backend::DgcStepInfo c = so->step(go->as<float>(), 1.0f, *dother.stream);
      ASSERT_EQ(a.count, c.count) << "step " << step;
      ASSERT_EQ(a.rounds, c.rounds);
      ASSERT_EQ(a.exact, c.exact);
      ASSERT_EQ(a.saturated, c.saturated);
      ASSERT_EQ(a.threshold, c.threshold);
      ASSERT_EQ(dc.download(sc->selected_indices(), a.count),
                dother.download(so->selected_indices(), c.count));
      std::vector<float> va = dc.download(sc->selected_values(), a.count);
      std::vector<float> vc = dother.download(so->selected_values(), c.count);
      ASSERT_EQ(0, std::memcmp(va.data(), vc.data(), a.count * 4));
      std::vector<float> ra = dc.download(sc->residual(), n),
                         rc = dother.download(so->residual(), n);
      ASSERT_EQ(0, std::memcmp(ra.data(), rc.data(), n * 4)) << "v differs at step " << step;
      std::vector<float> ua = dc.download<float>(sc->momentum_buffer(), n);
      std::vector<float> uc = dother.download<float>(so->momentum_buffer(), n);
      ASSERT_EQ(0, std::memcmp(ua.data(), uc.data(), n * 4)) << "u differs at step " << step;
    }
  }
}

TEST_P(BackendDgcAgreement, SetStepMovesTheScheduleAlike) {
  DgcOptions o;
  o.warmup_steps = 8;
  o.sparsity = 0.999;
  auto a = backend::get_backend(DeviceType::kCpu)->create_dgc(1000, o);
  auto c = backend::get_backend(GetParam())->create_dgc(1000, o);
  for (uint64_t s : {0, 3, 7, 8, 100}) {
    a->set_step(s);
    c->set_step(s);
    EXPECT_EQ(a->density(), c->density()) << s;
  }
  EXPECT_EQ(a->capacity(), c->capacity());
  EXPECT_EQ(a->capacity(), dgc::count_bounds(o, 1000, 0.75).cap);  // the warm-up's first stage
}

std::vector<DeviceType> non_cpu_backends() {
  std::vector<DeviceType> all = test::test_backends();
  all.erase(all.begin());
  return all;
}

INSTANTIATE_TEST_SUITE_P(All, BackendDgcAgreement, ::testing::ValuesIn(non_cpu_backends()),
                         test::backend_param_name);

}  // namespace
}  // namespace gradex::compress
