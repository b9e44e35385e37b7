// gradex_outer_synchronize_all (the end of training that keeps local progress), ranks as forked
// processes over real UCX: against a reference of the whole streaming schedule computed in the test
// (exact fp32 exchanges, outer Nesterov momentum, delayed merges, exchanges in flight at the final
// sync rebased), bit-identical models on every rank with 4-bit exchanges, a checkpoint restored
// before the final sync gives the same final model, and argument errors.
#include <gtest/gtest.h>

#include <cstring>
#include <deque>
#include <fstream>

#include "process_ranks.h"
#include "rank_checks.h"

using namespace gradex::test;

namespace {

// Two fragments with period 8: w0 alone (fragment 0), w1 and w2 (fragment 1).
constexpr int kTensors = 3;
const uint64_t kSizes[kTensors] = {1000, 37, 515};
const char* const kKeys[kTensors] = {"w0", "w1", "w2"};

using Tensors = std::vector<std::vector<float>>;

Tensors initial(int rank) {
  Tensors w;
  for (int t = 0; t < kTensors; ++t)
    w.push_back(test_vector(99, rank, t, kSizes[t]));
  return w;
}

// One inner SGD step towards a rank-specific target.
void inner_step(Tensors& w, int rank, int step) {
  for (size_t t = 0; t < w.size(); ++t)
    for (size_t i = 0; i < w[t].size(); ++i) {
      float target = 0.5f * static_cast<float>(rank) + 0.01f * static_cast<float>(i % 7);
      w[t][i] -= 0.1f * (w[t][i] - target + 0.05f * test_value(5, rank, step, i));
    }
}

// The fragments' flat vectors of one rank's tensors, and back.
std::vector<float> flat(const Tensors& w, int f) {
  std::vector<float> out;
  for (int t = f == 0 ? 0 : 1; t < (f == 0 ? 1 : kTensors); ++t)
    out.insert(out.end(), w[t].begin(), w[t].end());
  return out;
}
void unflat(Tensors& w, int f, const std::vector<float>& v) {
  size_t at = 0;
  for (int t = f == 0 ? 0 : 1; t < (f == 0 ? 1 : kTensors); ++t) {
    std::copy(v.begin() + static_cast<long>(at), v.begin() + static_cast<long>(at + w[t].size()),
              w[t].begin());
    at += w[t].size();
  }
}

// DiLoCo with exact fp32 exchanges (GRADEX_OUTER_BITS=32), every rank simulated: what the outer
// optimizer must compute (outer/fragment_exchange.h, outer_optimizer.h), written out plainly.
struct Reference {
  static constexpr int kPeriod = 8, kFragments = 2, kDelay = 3;
  static constexpr float kLr = 0.7f, kMomentum = 0.5f;
  int world;
  std::vector<Tensors> local;                   // per rank
  std::vector<std::vector<float>> global, mom;  // per fragment
  std::vector<uint64_t> last_merge = std::vector<uint64_t>(kFragments, 0);
  struct InFlight {
    int fragment;
    uint64_t launch, merge;
    std::vector<float> next;
    std::vector<std::vector<float>> at_launch;  // per rank
  };
  std::deque<InFlight> in_flight;
  uint64_t step = 0;

  explicit Reference(int world_size) : world(world_size) {
    for (int r = 0; r < world; ++r)
      local.push_back(initial(0));  // start(): rank 0's values everywhere
    for (int f = 0; f < kFragments; ++f) {
      global.push_back(flat(local[0], f));
      mom.emplace_back(global.back().size(), 0.0f);
    }
  }

  // The averaged contributions (rank-order fp32 sum from 0, / P) and the outer Nesterov step.
  std::vector<float> outer_step(int f, const std::vector<std::vector<float>>& contributions) {
    const auto& g = global[static_cast<size_t>(f)];
    auto& m = mom[static_cast<size_t>(f)];
    std::vector<float> next(g.size());
    for (size_t i = 0; i < g.size(); ++i) {
      float sum = 0.0f;
      for (int r = 0; r < world; ++r)
        sum += contributions[static_cast<size_t>(r)][i];
      const float average = sum / static_cast<float>(world);
      const float delta = g[i] - average;
      m[i] = kMomentum * m[i] + delta;
      const float u = delta + kMomentum * m[i];
      next[i] = average + (delta - kLr * u);
    }
    return next;
  }

  void install(int f) {
    for (int r = 0; r < world; ++r)
      unflat(local[static_cast<size_t>(r)], f, global[static_cast<size_t>(f)]);
    last_merge[static_cast<size_t>(f)] = step;
  }

  void train_step() {
    ++step;
    for (int r = 0; r < world; ++r)
      inner_step(local[static_cast<size_t>(r)], r, static_cast<int>(step));
    while (!in_flight.empty() && in_flight.front().merge <= step) {
      global[static_cast<size_t>(in_flight.front().fragment)] = in_flight.front().next;
      install(in_flight.front().fragment);
      in_flight.pop_front();
    }
    for (int f = 0; f < kFragments; ++f) {
      if (static_cast<int>(step % kPeriod) != f * kPeriod / kFragments) continue;
      InFlight x{f, step, step + kDelay, {}, {}};
      for (int r = 0; r < world; ++r)
        x.at_launch.push_back(flat(local[static_cast<size_t>(r)], f));
      x.next = outer_step(f, x.at_launch);
      in_flight.push_back(std::move(x));
    }
  }

  // The final sync: returns the number of fragments exchanged.
  int synchronize_all() {
    std::vector<std::vector<std::vector<float>>> contributions(kFragments);
    std::vector<bool> handled(kFragments, false);
    for (auto& x : in_flight) {
      const auto f = static_cast<size_t>(x.fragment);
      global[f] = x.next;
      last_merge[f] = step;
      handled[f] = true;
      if (x.launch == step) continue;  // no inner step since it started
      for (int r = 0; r < world; ++r) {
        std::vector<float> now = flat(local[static_cast<size_t>(r)], x.fragment), c(now.size());
        for (size_t i = 0; i < c.size(); ++i)
          c[i] = global[f][i] + (now[i] - x.at_launch[static_cast<size_t>(r)][i]);
        contributions[f].push_back(c);
      }
    }
    in_flight.clear();
    for (int f = 0; f < kFragments; ++f)
      if (!handled[static_cast<size_t>(f)] && last_merge[static_cast<size_t>(f)] != step)
        for (int r = 0; r < world; ++r)
          contributions[static_cast<size_t>(f)].push_back(flat(local[static_cast<size_t>(r)], f));
    int exchanged = 0;
    for (int f = 0; f < kFragments; ++f) {
      if (!contributions[static_cast<size_t>(f)].empty()) {
        global[static_cast<size_t>(f)] = outer_step(f, contributions[static_cast<size_t>(f)]);
        ++exchanged;
        last_merge[static_cast<size_t>(f)] = step;
      }
      for (int r = 0; r < world; ++r)
        unflat(local[static_cast<size_t>(r)], f, global[static_cast<size_t>(f)]);
    }
    return exchanged;
  }
};

std::string add_tensors(gradex_outer_t* outer, Tensors& w) {
  for (int t = 0; t < kTensors; ++t)
    RANK_OK(gradex_outer_add_tensor(outer, kKeys[t], w[t].data(), w[t].size(), 0));
  return "";
}

uint64_t fnv(const Tensors& w) {
  uint64_t h = 1469598103934665603ull;
  for (const auto& v : w) {
    const auto* p = reinterpret_cast<const uint8_t*>(v.data());
    for (size_t i = 0; i < 4 * v.size(); ++i)
      h = (h ^ p[i]) * 1099511628211ull;
  }
  return h;
}

}  // namespace

// Final syncs at steps that meet every case (an exchange in flight with and without inner steps
// since it started, a fragment merged at this step, one with steps since its last merge, a second
// final sync at the same step), with training continuing after each on the usual schedule.
TEST(OuterFinalSync, MatchesReferenceOfTheWholeSchedule) {
  const int world = 3;
  auto results = run_ranks(
      world,
      {"GRADEX_OUTER_PERIOD=8", "GRADEX_OUTER_FRAGMENTS=2", "GRADEX_OUTER_DELAY=3",
       "GRADEX_OUTER_LR=0.7", "GRADEX_OUTER_MOMENTUM=0.5", "GRADEX_OUTER_BITS=32",
       "GRADEX_TIMEOUT_S=30"},
      [&](RankContext& ctx) -> std::string {
        gradex_outer_t* outer = nullptr;
        RANK_OK(create_outer(ctx.rank, world, &outer));
        Tensors w = initial(ctx.rank);
        std::string err = add_tensors(outer, w);
        if (!err.empty()) return err;
        RANK_OK(gradex_outer_start(outer));
        int64_t f0 = -1, f1 = -1;
        RANK_OK(gradex_outer_fragment_of(outer, "w0", &f0));
        RANK_OK(gradex_outer_fragment_of(outer, "w1", &f1));
        RANK_REQUIRE(f0 == 0 && f1 == 1, "fragments " << f0 << " " << f1);
        Reference ref(world);
        // (final sync after step, fragments it exchanges): 9: fragment 0 in flight since 8,
        // fragment 1 merged at 7; 12: fragment 1 started at 12 (only committed), fragment 0 has
        // steps since the final sync at 9; 12 again: nothing left; 16 and 20: one each; 30:
        // fragment 1 in flight since 28, fragment 0 merged at 27 on the regular schedule.
        const std::vector<std::pair<int, int>> finals = {{9, 2},  {12, 1}, {12, 0},
                                                         {16, 1}, {20, 1}, {30, 2}};
        int step = 0;
        for (const auto& [at, want] : finals) {
          while (step < at) {
            ++step;
            inner_step(w, ctx.rank, step);
            RANK_OK(gradex_outer_step(outer, nullptr));
            ref.train_step();
          }
          int exchanged = -1;
          RANK_OK(gradex_outer_synchronize_all(outer, &exchanged));
          const int want_ref = ref.synchronize_all();
          RANK_REQUIRE(want_ref == want, "reference exchanged " << want_ref << " at " << at);
          RANK_REQUIRE(exchanged == want, "step " << at << ": exchanged " << exchanged);
          for (int t = 0; t < kTensors; ++t) {
            RANK_REQUIRE(w[t] == ref.local[static_cast<size_t>(ctx.rank)][t],
                         "step " << at << ": tensor " << kKeys[t] << " differs from the reference");
            std::vector<float> g(kSizes[t]);
            RANK_OK(gradex_outer_global(outer, kKeys[t], g.data(), g.size()));
            RANK_REQUIRE(g == w[t], "step " << at << ": global copy differs from the model");
          }
          uint64_t last[2];
          size_t count = 0;
          RANK_OK(gradex_outer_last_merges(outer, last, 2, &count));
          RANK_REQUIRE(last[0] == ref.last_merge[0] && last[1] == ref.last_merge[1],
                       "step " << at << ": last merges " << last[0] << "," << last[1]);
        }
        RANK_OK(gradex_outer_destroy(outer));
        return "";
      },
      std::chrono::seconds(120), false);
  EXPECT_EQ(failures(results), "");
}

// 4-bit codes: the final model is bit-identical on every rank; a state saved before the final sync
// and restored reaches the same final model; the local progress reaches it (it is not the global
// copy a plain synchronize would install).
TEST(OuterFinalSync, FourBitIdenticalAcrossRanksAndResumable) {
  const int world = 3;
  char tmpl[] = "/tmp/gradex_final_sync_XXXXXX";
  const std::string dir = ::mkdtemp(tmpl);
  auto results = run_ranks(
      world,
      {"GRADEX_OUTER_PERIOD=8", "GRADEX_OUTER_FRAGMENTS=2", "GRADEX_OUTER_DELAY=3",
       "GRADEX_OUTER_BITS=4", "GRADEX_OUTER_ROUNDING=stochastic", "GRADEX_OUTER_BLOCK=32",
       "GRADEX_TIMEOUT_S=30"},
      [&](RankContext& ctx) -> std::string {
        gradex_outer_t* outer = nullptr;
        RANK_OK(create_outer(ctx.rank, world, &outer));
        RANK_REQUIRE(gradex_outer_synchronize_all(outer, nullptr) == GRADEX_ERR_INVALID_ARGUMENT,
                     "synchronize_all before start accepted");
        RANK_REQUIRE(std::string(gradex_last_error()).find("start") != std::string::npos,
                     gradex_last_error());
        Tensors w = initial(ctx.rank);
        std::string err = add_tensors(outer, w);
        if (!err.empty()) return err;
        RANK_OK(gradex_outer_start(outer));
        for (int step = 1; step <= 13; ++step) {
          inner_step(w, ctx.rank, step);
          RANK_OK(gradex_outer_step(outer, nullptr));
        }
        size_t n = 0;
        RANK_OK(gradex_outer_save_state(outer, nullptr, 0, &n));
        std::vector<uint8_t> blob(n);
        RANK_OK(gradex_outer_save_state(outer, blob.data(), blob.size(), &n));
        const Tensors saved = w;  // after the save, which merged the exchange in flight
        uint64_t finals[2] = {0, 0};
        for (int run = 0; run < 2; ++run) {
          if (run == 1) {
            w = saved;
            RANK_OK(gradex_outer_load_state(outer, blob.data(), blob.size()));
          }
          for (int step = 14; step <= 22; ++step) {  // fragment 1 in flight since 20 at the end
            inner_step(w, ctx.rank, step);
            RANK_OK(gradex_outer_step(outer, nullptr));
          }
          std::vector<float> g0(kSizes[0]);
          RANK_OK(gradex_outer_global(outer, "w0", g0.data(), g0.size()));
          int exchanged = -1;
          RANK_OK(gradex_outer_synchronize_all(outer, &exchanged));
          RANK_REQUIRE(exchanged == 2, "exchanged " << exchanged);
          RANK_REQUIRE(w[0] != g0, "the final sync installed the old global copy of fragment 0");
          for (int t = 0; t < kTensors; ++t) {
            std::vector<float> g(kSizes[t]);
            RANK_OK(gradex_outer_global(outer, kKeys[t], g.data(), g.size()));
            RANK_REQUIRE(g == w[t], "global copy differs from the model");
          }
          finals[run] = fnv(w);
        }
        RANK_REQUIRE(finals[0] == finals[1], "the restored run ended elsewhere");
        std::ofstream(dir + "/rank" + std::to_string(ctx.rank)) << finals[0] << "\n";
        gradex_stats_t s;
        RANK_OK(gradex_outer_get_stats(outer, 0, &s));
        RANK_REQUIRE(s.compression_ratio > 5.0, "compression " << s.compression_ratio);
        RANK_OK(gradex_outer_destroy(outer));
        return "";
      },
      std::chrono::seconds(120), false);
  ASSERT_EQ(failures(results), "");
  const std::string first = read_text_file(dir + "/rank0");
  EXPECT_FALSE(first.empty());
  for (int r = 1; r < world; ++r)
    EXPECT_EQ(read_text_file(dir + "/rank" + std::to_string(r)), first) << "rank " << r;
}

TEST(OuterFinalSync, NullOuterRejected) {
  EXPECT_EQ(gradex_outer_synchronize_all(nullptr, nullptr), GRADEX_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(gradex_last_error()).find("outer"), std::string::npos);
}
