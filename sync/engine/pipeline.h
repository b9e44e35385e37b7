// The engine's pipeline of stages. One negotiation round's ready work is cut into
// units, each one collective on the wire: a dense fusion bucket, or one DGC tensor (or a group of
// small ones). Every unit goes through three stages:
//
//   prepare   momentum, DGC step + encode, LocalSGD delta        any thread (worker pool)
//   transfer  one ring allreduce / allgatherv                     the progress thread only
//   finish    decode, cast back, complete the unit's handles      any thread (worker pool)
//
// Transfers run in unit order on the calling thread, so every rank issues the same collectives in
// the same order: the order depends only on agreed data (the round's ready list, the tensors'
// sizes, dtypes and policies, the agreed exchange counters) and the options every rank shares.
// While unit i is on the wire, the prepare stage of the next `lookahead` units runs on the pool
// and the finish stage of earlier units may still be running there. Each stage of a unit
// happens-before its next stage; stages of different units touch different tensors, so they need
// no locks between them. A unit's handles complete when its finish stage has written them.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <string>
#include <vector>

#include "base/dtype.h"
#include "comm/communicator.h"
#include "sync/data/tensor_state.h"
#include "sync/negotiation/negotiator.h"
#include "sync/policy/cost_model.h"
#include "sync/route/path.h"

namespace gradex {
class ThreadPool;
}

namespace gradex::sync::pipeline {

// One tensor's work in a round. Fields below "prepare" are written by the stages in order.
struct Job {
  WorkId id;
  TensorState* tensor = nullptr;
  void* data = nullptr;  // the caller's buffer
  float clip = -1.0f;    // the step's clipping factor captured at submission (-1: none)
  uint64_t step = 0;     // the agreed exchange counter of this exchange (gradients)
  // How its bytes travel (route::assign, from agreed data only).
  route::Path path = route::Path::kDense;
  bool absent = false;  // Engine::submit_absent: zeros sent, the tensor's state untouched
  // A dense gradient riding its round's DGC gather (sync/data/gather_rider.h; plan() decides), with
  // its dense route's wire type.
  bool rider = false;
  DType rider_wire = DType::kFloat32;
  // prepare:
  void* values = nullptr;  // what is sent and receives the average (BackendPath::values)
  DType values_dtype = DType::kFloat32;
  std::vector<float> delta;  // LocalSGD: parameters - anchor, sent instead
  // A sparse job prepared beside others (Engine::Executor::prepare_unit spreads a unit over the
  // pool): its payload, framed into the unit's message in job order once every job is prepared.
  std::vector<uint8_t> payload;
  uint64_t saturated = 0;  // a rider's values that saturated its 16-bit wire
  // transfer (dense), finish (riders):
  bool nonfinite_result = false;  // the average holds NaN/Inf
};

// Counters of one unit, added to the engine's Stats when the unit completes.
struct UnitCounters {
  uint64_t wire_bytes = 0;
  uint64_t received_bytes = 0;
  uint64_t saturated = 0;
  std::string first_saturated;  // the first tensor whose 16-bit cast saturated ("" if none)
  double prepare_seconds = 0;   // prepare stage, and the 16-bit casts inside the dense transfer
  double transfer_seconds = 0;  // the collective itself
  double finish_seconds = 0;    // decode, casts back
};

// What a unit's route ran, for the cost model (CodecPlanner::observe_unit): set by the route
// (sync/route/route.h), so that the planner prices what was actually sent.
struct UnitSample {
  Codec codec = Codec::kFp32;  // the codec whose work the unit's stages did
  cost::Terms terms;           // the collective it ran: latencies, bytes on the busiest link
  bool codec_work = true;      // false: no codec's work (LocalSGD's first average)
  // The quantized route: its transfer also holds the owners' sums and re-encodes.
  bool codec_cpu_in_transfer = false;
};

// One collective's worth of jobs.
struct Unit {
  // Its jobs' route::unit_path (plan never mixes paths in a unit, but for riders: dense jobs in a
  // kSparse unit, sync/data/gather_rider.h); never kDgcDenseStep, and kSparse even where the
  // hierarchical exchange carries it (route::path_of decides that).
  route::Path path = route::Path::kDense;
  std::vector<Job*> jobs;             // round order
  std::vector<uint8_t> message;       // sparse: this rank's payloads, framed (engine_stages.cc)
  std::vector<comm::Bytes> received;  // sparse: every rank's message, by rank
  uint64_t rider_message_bytes = 0;   // sparse: the riders' share of `message`, framing included
  bool one_hop = false;  // 8-bit/4-bit: summed in one hop (sync/data/int8_exchange.h), set by
                         // its route
  UnitSample sample;     // set by its route's exchange and finish
  UnitCounters counters;
  // GRADEX_TIMELINE: the unit's description (sync/timeline/unit_args.h), made once by its prepare
  // stage and reused by its other spans; empty when the timeline is off.
  std::string timeline_args;
  // Scheduling (run()): who runs the prepare / finish stage, and their outcomes.
  bool finish_on_pool = false;
  std::atomic<bool> prepare_claimed{false};
  std::atomic<bool> finish_claimed{false};
  std::future<void> prepared;
  std::future<void> finished;

  uint64_t elements() const;
  // "'a', 'b', ..." (at most 8 keys): for error messages.
  std::string keys() const;
};

struct PlanOptions {
  size_t fusion_bytes = 64u << 20;     // GRADEX_FUSION_MB
  DType dense_wire = DType::kFloat16;  // wire type of kDense buckets
  uint64_t sparse_group_elements = 0;  // GRADEX_SPARSE_GROUP_MB / 4 bytes (0: one tensor each)
  // Riders (sync/data/gather_rider.h): at most this many wire bytes of dense gradients ride the
  // round's first DGC unit (0: none).
  uint64_t rider_bytes = 0;
};

// Cuts `jobs` (the round's order) into units, in the order they travel (the routes' packing,
// route::pack, sync/route/select.cc: the only fusion of dense jobs into buckets):
//   1. kDense and kDgcDenseStep jobs in round order, packed greedily into buckets of at most
//      fusion_bytes wire bytes (a larger tensor travels alone) — the fusion rule of
//      sync/data/dense_exchange.h, so each unit is exactly one bucket of the dense exchange;
//      kDenseFp32 jobs (fp32 on a 16-bit wire) after them, packed the same way in buckets of their
//      own; then kInt8 and kInt4 jobs (the quantized route, a bucket per width), packed the same
//      way at one byte per element;
//   2. kFirstAverage jobs, packed the same way with 4-byte elements;
//   3. kSparse jobs in round order, consecutive ones grouped until a group holds at least
//      sparse_group_elements elements (a larger tensor travels alone).
// With rider_bytes and at least one kSparse job, the kDense and kDenseFp32 gradients (neither
// absent nor carrying 8-bit residuals) ride the first kSparse unit instead, in round order while
// their wire bytes stay within rider_bytes, after that unit's DGC jobs; the rest go to buckets.
// Dense work goes first: small buckets complete before the large DGC tensors' payloads travel, and
// the DGC tensors compress on the pool meanwhile.
std::deque<Unit> plan(std::vector<Job>& jobs, const PlanOptions& options);

// What a unit's stages do; supplied by the engine.
struct Stages {
  std::function<void(Unit&)> prepare;   // any thread
  std::function<void(Unit&)> transfer;  // the calling thread of run()
  std::function<void(Unit&)> finish;    // any thread; completes the unit's handles
};

// Runs every unit through its stages (see the top of this file). The prepare stage of units
// i+1..i+lookahead is submitted to `pool` while unit i transfers; a prepare that no worker has
// started by the time its unit is due runs on the calling thread instead (so a busy or empty pool
// costs overlap, never progress). The finish stage of a unit with finish_on_pool goes to the pool
// when the next unit is already prepared (its transfer can start at once); otherwise, and for
// the other units, it runs on the calling thread right after the transfer. Returns when every stage
// that was started has ended (a prepare no worker has started is cancelled; a finish no worker has
// started runs on the calling thread). A finish stage that failed on the pool stops the walk before
// the next transfer. The exception of the earliest failing unit is rethrown (the cause; later
// failures, such as a timeout waiting for a peer that stopped on the same unit, are its
// consequences); units already finished stay finished.
void run(std::deque<Unit>& units, const Stages& stages, ThreadPool& pool, int lookahead);

// Whether a unit's prepare stage is spread over a pool of `threads`
// (Engine::Executor::prepare_unit): its `jobs` (those whose backend allows it) run at once, largest
// first, when there are two or more and they compute on at least kSpreadMinElements elements
// together; below that, waking workers costs about what it saves.
constexpr uint64_t kSpreadMinElements = uint64_t{1} << 16;
inline bool spread_prepare(int threads, size_t jobs, uint64_t work_elements) {
  return threads > 1 && jobs > 1 && work_elements >= kSpreadMinElements;
}

// The engine's lookahead for a pool of `threads`: 1, and one more unit per 8 threads. A unit's
// prepare stage is itself spread over the pool (Engine::Executor::prepare_unit); on a wide pool the
// tail of one unit's prepare (its largest tensor's last chunks) leaves threads idle that the next
// unit's prepare can use.
int lookahead_for(int threads);

}  // namespace gradex::sync::pipeline
