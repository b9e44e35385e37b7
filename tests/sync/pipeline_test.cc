// The pipeline's planner and scheduler alone (sync/engine/pipeline.h), with stages that record what
// ran where: the units every rank cuts, transfers in unit order on the calling thread, each unit's
// stages in order, the next unit's prepare overlapping a transfer, and no stage running after
// run() returns, whatever fails.
#include "sync/engine/pipeline.h"

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <stdexcept>
#include <thread>

#include "base/thread_pool.h"
#include "compress/dgc/parallel.h"

namespace gradex::sync::pipeline {
namespace {

using route::Path;

struct Round {
  std::deque<TensorState> tensors;
  std::vector<Job> jobs;
  void add(const std::string& key, uint64_t numel, Path path) {
    TensorState& t = tensors.emplace_back();
    t.key = key;
    t.numel = numel;
    Job j;
    j.id = {WorkKind::kGradient, key};
    j.tensor = &t;
    j.path = path;
    jobs.push_back(std::move(j));
  }
};

std::vector<std::vector<std::string>> keys_of(const std::deque<Unit>& units) {
  std::vector<std::vector<std::string>> out;
  for (const Unit& u : units) {
    out.emplace_back();
    for (const Job* j : u.jobs)
      out.back().push_back(j->id.key);
  }
  return out;
}

TEST(PipelinePlan, DenseBucketsFirstThenFirstAveragesThenSparseGroups) {
  Round r;
  r.add("a", 100, Path::kSparse);  // 100 elements: grouped with the next
  r.add("b", 300, Path::kDense);   // 600 wire bytes at 2 bytes per element
  r.add("c", 50, Path::kSparse);   // group of a, c: 150 >= 120 closes it
  r.add("d", 200, Path::kDense);   // 600 + 400 > 800: a new bucket
  r.add("e", 1000, Path::kDense);  // larger than a bucket: alone
  r.add("f", 500, Path::kSparse);  // larger than a group: alone
  r.add("g", 10, Path::kFirstAverage);
  r.add("h", 30, Path::kSparse);         // the last group, unfilled
  r.add("i", 100, Path::kDense);         // 2000 + 200 > 800: a new bucket
  r.add("j", 150, Path::kFirstAverage);  // 4 bytes per element: 40 + 600 <= 800
  PlanOptions o;
  o.fusion_bytes = 800;
  o.dense_wire = DType::kFloat16;
  o.sparse_group_elements = 120;
  std::deque<Unit> units = plan(r.jobs, o);
  using K = std::vector<std::vector<std::string>>;
  EXPECT_EQ(keys_of(units), (K{{"b"}, {"d"}, {"e"}, {"i"}, {"g", "j"}, {"a", "c"}, {"f"}, {"h"}}));
  const Path routes[] = {Path::kDense,        Path::kDense,  Path::kDense,  Path::kDense,
                         Path::kFirstAverage, Path::kSparse, Path::kSparse, Path::kSparse};
  for (size_t i = 0; i < units.size(); ++i) {
    EXPECT_EQ(units[i].path, routes[i]) << "unit " << i;
    EXPECT_EQ(units[i].finish_on_pool, routes[i] == Path::kSparse) << "unit " << i;
  }
  EXPECT_EQ(units[5].elements(), 150u);
  EXPECT_EQ(units[5].keys(), "'a', 'c'");

  o.sparse_group_elements = 0;  // every sparse tensor alone
  o.dense_wire = DType::kFloat32;
  o.fusion_bytes = 1 << 20;  // one bucket
  units = plan(r.jobs, o);
  EXPECT_EQ(keys_of(units), (K{{"b", "d", "e", "i"}, {"g", "j"}, {"a"}, {"c"}, {"f"}, {"h"}}));
}

// Riders (sync/data/gather_rider.h): with a byte budget and a DGC job in the round, a prefix (round
// order) of the dense gradients that fit rides the first sparse unit after its DGC jobs, each with
// its route's wire type; absent ones, parameter averages, DGC dense steps and 8-bit residual
// holders never ride; without a DGC job, or without a budget, nothing rides.
TEST(PipelinePlan, DenseGradientsRideTheFirstSparseUnitWithinTheBudget) {
  Round r;
  r.add("a", 100, Path::kDense);     // 200 bytes at 2 bytes per element
  r.add("b", 50, Path::kDenseFp32);  // 200 bytes: 400
  r.add("c", 1000, Path::kSparse);
  r.add("d", 10, Path::kDgcDenseStep);  // its bucket
  r.add("e", 20, Path::kDense);         // absent: its bucket
  r.jobs.back().absent = true;
  r.add("f", 30, Path::kDense);  // 60 bytes: 460
  r.add("g", 40, Path::kDense);  // 8-bit residuals to fold: its bucket
  r.tensors.back().int8_residual.assign(40, 0.0f);
  r.add("h", 2000, Path::kSparse);
  r.add("i", 100, Path::kDense);  // 460 + 200 > 600: the budget ends here
  r.add("j", 1, Path::kDense);    // a prefix rides: after i, nothing does
  PlanOptions o;
  o.fusion_bytes = 1 << 20;
  o.dense_wire = DType::kFloat16;
  o.sparse_group_elements = 1500;
  o.rider_bytes = 600;
  std::deque<Unit> units = plan(r.jobs, o);
  using K = std::vector<std::vector<std::string>>;
  EXPECT_EQ(keys_of(units), (K{{"d", "e", "g", "i", "j"}, {"c", "a", "b", "f"}, {"h"}}));
  EXPECT_EQ(units[1].path, Path::kSparse);
  for (const Job& j : r.jobs) {
    const bool rides = j.id.key == "a" || j.id.key == "b" || j.id.key == "f";
    EXPECT_EQ(j.rider, rides) << j.id.key;
    if (rides) {
      EXPECT_EQ(j.rider_wire, j.id.key == "b" ? DType::kFloat32 : DType::kFloat16) << j.id.key;
    }
  }

  for (Job& j : r.jobs)
    j.rider = false;
  o.rider_bytes = 0;
  units = plan(r.jobs, o);
  EXPECT_EQ(keys_of(units), (K{{"a", "d", "e", "f", "g", "i", "j"}, {"b"}, {"c"}, {"h"}}));

  Round dense_only;
  dense_only.add("x", 10, Path::kDense);
  o.rider_bytes = 1 << 20;
  units = plan(dense_only.jobs, o);
  EXPECT_EQ(keys_of(units), (K{{"x"}}));
  EXPECT_FALSE(dense_only.jobs[0].rider);
}

// Stages that log (unit, stage, thread) and can be told to fail or to wait.
struct Recorder {
  std::mutex mutex;
  std::condition_variable cv;
  std::vector<std::string> log;
  std::map<std::string, std::thread::id> where;
  int fail_prepare = -1, fail_transfer = -1, fail_finish = -1;
  bool hold_transfer_until_next_prepares = false;

  void note(const std::string& what) {
    std::lock_guard<std::mutex> lock(mutex);
    log.push_back(what);
    where[what] = std::this_thread::get_id();
    cv.notify_all();
  }
  bool seen(const std::string& what) {
    std::lock_guard<std::mutex> lock(mutex);
    return where.count(what) > 0;
  }
  size_t index(const std::string& what) {
    std::lock_guard<std::mutex> lock(mutex);
    for (size_t i = 0; i < log.size(); ++i)
      if (log[i] == what) return i;
    return SIZE_MAX;
  }
  Stages stages(std::deque<Unit>& units) {
    auto id = [&units](const Unit& u) {
      for (size_t i = 0; i < units.size(); ++i)
        if (&units[i] == &u) return static_cast<int>(i);
      return -1;
    };
    Stages s;
    s.prepare = [this, id](Unit& u) {
      const int i = id(u);
      note("prepare " + std::to_string(i));
      if (i == fail_prepare) throw std::runtime_error("prepare " + std::to_string(i));
    };
    s.transfer = [this, id, &units](Unit& u) {
      const int i = id(u);
      note("transfer " + std::to_string(i));
      if (i == fail_transfer) throw std::runtime_error("transfer " + std::to_string(i));
      if (hold_transfer_until_next_prepares && i + 1 < static_cast<int>(units.size())) {
        std::unique_lock<std::mutex> lock(mutex);
        const std::string next = "prepare " + std::to_string(i + 1);
        cv.wait_for(lock, std::chrono::seconds(20), [&] { return where.count(next) > 0; });
      }
    };
    s.finish = [this, id](Unit& u) {
      const int i = id(u);
      note("finish " + std::to_string(i));
      if (i == fail_finish) throw std::runtime_error("finish " + std::to_string(i));
    };
    return s;
  }
};

std::deque<Unit> make_units(int n, bool finish_on_pool) {
  std::deque<Unit> units(static_cast<size_t>(n));
  for (Unit& u : units)
    u.finish_on_pool = finish_on_pool;
  return units;
}

// Parallel compression's knobs scale with the pool: a unit is spread only with threads to spread
// over, two or more jobs and enough work; the lookahead grows by one unit per 8 threads; a tensor
// is split inside its DGC step from a 1/(2T) share of a 16 MB group, never below 2^17 elements.
TEST(PipelineSpread, KnobsScaleWithThePool) {
  using namespace gradex::sync::pipeline;
  EXPECT_FALSE(spread_prepare(1, 10, uint64_t{1} << 24));
  EXPECT_FALSE(spread_prepare(4, 1, uint64_t{1} << 24));
  EXPECT_FALSE(spread_prepare(4, 10, kSpreadMinElements - 1));
  EXPECT_TRUE(spread_prepare(2, 2, kSpreadMinElements));
  EXPECT_EQ(lookahead_for(1), 1);
  EXPECT_EQ(lookahead_for(7), 1);
  EXPECT_EQ(lookahead_for(8), 2);
  EXPECT_EQ(lookahead_for(16), 3);
  namespace dgc = gradex::compress::dgc;
  const uint64_t group = (uint64_t{16} << 20) / 4;
  EXPECT_EQ(dgc::split_min_elements(1, group), group / 2);
  EXPECT_EQ(dgc::split_min_elements(2, group), group / 4);
  EXPECT_EQ(dgc::split_min_elements(16, group), size_t{1} << 17);
  EXPECT_EQ(dgc::split_min_elements(64, group), dgc::kMinSplitElements);
  EXPECT_EQ(dgc::split_min_elements(4, 0), dgc::kMinSplitElements);
}

TEST(PipelineRun, StagesInOrderTransfersOnTheCallerAndPrepareOverlapsTransfer) {
  for (int threads : {1, 2, 4}) {
    ThreadPool pool(threads);
    for (bool on_pool : {false, true}) {
      std::deque<Unit> units = make_units(6, on_pool);
      Recorder rec;
      rec.hold_transfer_until_next_prepares = threads > 1;
      run(units, rec.stages(units), pool, 1);
      const auto caller = std::this_thread::get_id();
      for (int i = 0; i < 6; ++i) {
        const std::string p = "prepare " + std::to_string(i), t = "transfer " + std::to_string(i),
                          f = "finish " + std::to_string(i);
        ASSERT_TRUE(rec.seen(p) && rec.seen(t) && rec.seen(f)) << "unit " << i;
        EXPECT_LT(rec.index(p), rec.index(t)) << "unit " << i;
        EXPECT_LT(rec.index(t), rec.index(f)) << "unit " << i;
        EXPECT_EQ(rec.where[t], caller);
        if (i > 0) {
          EXPECT_LT(rec.index("transfer " + std::to_string(i - 1)), rec.index(t));
        }
        // With workers, unit i+1 prepared while unit i was on the wire (the transfer waited for
        // it): that prepare ran on a worker.
        if (threads > 1 && i > 0) {
          EXPECT_LT(rec.index(p), rec.index(t)) << "unit " << i;
          EXPECT_NE(rec.where[p], caller) << "unit " << i << " was not prepared ahead";
        }
      }
      EXPECT_EQ(rec.log.size(), 18u);  // every stage exactly once
    }
  }
}

// A failing stage stops the walk: units after it are not transferred, units transferred before
// it are finished, no stage runs after run() returns, and the earliest failing unit's exception
// is the one rethrown. With workers a failed finish stops the walk at the next transfer after it
// is noticed; with none it is noticed at once (the pool runs the task inside submit()).
TEST(PipelineRun, FailuresStopTheWalkAndNoStageOutlivesRun) {
  struct Case {
    int fail_prepare, fail_transfer, fail_finish;
    const char* error;
  };
  for (int threads : {1, 3}) {
    ThreadPool pool(threads);
    for (const Case& c :
         {Case{3, -1, -1, "prepare 3"}, Case{-1, 2, -1, "transfer 2"}, Case{-1, -1, 1, "finish 1"},
          Case{0, -1, -1, "prepare 0"}, Case{-1, 3, 1, "finish 1"}}) {
      const std::string what = std::string(c.error) + ", threads " + std::to_string(threads);
      std::deque<Unit> units = make_units(6, true);
      Recorder rec;
      rec.fail_prepare = c.fail_prepare;
      rec.fail_transfer = c.fail_transfer;
      rec.fail_finish = c.fail_finish;
      std::string error;
      try {
        run(units, rec.stages(units), pool, 1);
      } catch (const std::runtime_error& e) {
        error = e.what();
      }
      EXPECT_EQ(error, c.error) << what;
      const size_t logged = rec.log.size();
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      EXPECT_EQ(rec.log.size(), logged) << what << ": a stage ran after run() returned";
      // Transfers are a prefix 0..last; each one transferred is finished unless its own transfer
      // failed.
      int last = -1;
      for (int i = 0; i < 6; ++i)
        if (rec.seen("transfer " + std::to_string(i))) last = i;
      for (int i = 0; i < 6; ++i) {
        const bool transferred = i <= last;
        EXPECT_EQ(rec.seen("transfer " + std::to_string(i)), transferred) << what << " " << i;
        EXPECT_EQ(rec.seen("finish " + std::to_string(i)), transferred && i != c.fail_transfer)
            << what << " " << i;
      }
      // Where the walk stopped.
      if (c.fail_prepare >= 0) {
        EXPECT_EQ(last, c.fail_prepare - 1) << what;
      }
      if (c.fail_transfer >= 0 && c.fail_finish < 0) {
        EXPECT_EQ(last, c.fail_transfer) << what;
      }
      if (c.fail_finish >= 0 && threads == 1) {
        EXPECT_EQ(last, c.fail_finish) << what;
      }
      if (c.fail_finish >= 0) {
        EXPECT_GE(last, c.fail_finish) << what;
      }
    }
  }
}

}  // namespace
}  // namespace gradex::sync::pipeline
