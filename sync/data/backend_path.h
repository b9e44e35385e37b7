// What the engine does to a gradient's data, stage by stage: the only place where sync/ touches
// tensor memory, always through the tensor's backend (compress/backend/backend.h): the CPU backend
// for host tensors, the CUDA backend for CUDA tensors. The engine calls one function per stage of
// its pipeline of units (sync/engine/pipeline.h):
//   register   attach()            backend + DGC codec (compress/backend/dgc_codec.h) or momentum
//   submit     on_submit()         the caller's stream is ready: an event recorded on it
//   inspect    scan_nonfinite()    count_nonfinite / zero_nonfinite (the negotiation's flag);
//                                  a 16-bit tensor's fp32 values are filled here
//   routing    sparse_step()       DGC's dense-or-sparse decision from the agreed counter
//   prepare    prepare()           clipping (grad_scale; own norm: sum_squares), momentum, DGC's
//                                  dense step, or its sparse step encoded into the unit's message
//   transfer   stage_dense()       a dense unit: one fusion bucket, cast to the wire type on each
//              unstage_dense()     tensor's backend into host memory for the route's allreduce,
//              stage_int8() ...    and back (the routes run the collectives; sparse units travel
//                                  as host bytes, framed by their route)
//   finish     finish()            sparse: every rank's payload summed in rank order; 16-bit
//                                  tensors cast back; then the completion event
//   LocalSGD   local_step()        momentum in place, no exchange
//   state      save_dgc()/...      u and v through host memory, in DgcCompressor's blob format
// Every rank lays out every unit the same way whichever tensors it keeps on a device, so ranks
// always agree on lengths and summation order.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "base/config.h"
#include "comm/communicator.h"
#include "compress/backend/backend.h"
#include "compress/backend/dgc_codec.h"
#include "compress/wire/codec.h"
#include "compress/wire/message.h"
#include "sync/data/dense_exchange.h"
#include "sync/data/int8_exchange.h"
#include "sync/data/tensor_state.h"
#include "sync/engine/options.h"

namespace gradex::sync {

// A quantized unit staged for int8_allreduce (BackendPath::stage_int8).
struct Int8Staging {
  std::vector<Int8Item> items;
  std::vector<std::vector<float>> host;  // device tensors' values
};

class BackendPath {
 public:
  BackendPath(const config::Config& config, const EngineOptions& options, int world_size);
  ~BackendPath();
  BackendPath(const BackendPath&) = delete;
  BackendPath& operator=(const BackendPath&) = delete;

  // Registration: gives `t` its BackendTensor: host tensors (any dtype) on the host backend,
  // `cuda` tensors (float32 only: InvalidArgument otherwise) on the CUDA backend, bound at their
  // first submission.
  void attach(TensorState& t, bool cuda);
  // A new membership (Engine::reconfigure; no stage running): the averages divide by it.
  void set_world_size(int world_size) { world_size_ = world_size; }
  // Submission of `t` (caller's thread, engine lock held): checks that the call matches the
  // tensor's memory (cuda: gradex_submit_device), binds a CUDA tensor's backend, records the ready
  // event on `stream` (the caller's cudaStream_t; null: the default stream) and gives the handle
  // a fresh completion event.
  void on_submit(TensorState& t, bool cuda_call, int device_index, void* stream, uint64_t handle);
  // Makes `stream` wait for a completed handle's event (no host wait). False when the handle has
  // no event here (a host tensor's handle: nothing to order; or its tensor was submitted again).
  bool handle_event(uint64_t handle, void* stream);

  // inspect: the gradient's NaN/Inf count (replaced by 0 with `zero`).
  uint64_t scan_nonfinite(TensorState& t, void* data, bool zero);
  // Routing (progress thread, before the pipeline runs): whether a DGC tensor's exchange number
  // `step` is a sparse one.
  bool sparse_step(TensorState& t, uint64_t step);
  // Whether this tensor's prepare and finish stages may run at the same time as other tensors'
  // of the same stage (a unit's tensors spread over the pool): true on the CPU backend, whose
  // streams are ordering tokens and whose operations finish inside their call. A device backend's
  // stage lane is one stream, fed in order by one thread.
  bool concurrent_stages(const TensorState& t) const;
  // The fp32 values the stages compute on: `data` itself, or a 16-bit tensor's fp32 copy.
  float* values(TensorState& t, void* data);
  // The pipeline's prepare stage (any thread; sync/engine/pipeline.h), after the tensor's ready
  // event: clipping and momentum (dense policy), or DGC's dense step, or DGC's sparse step with its
  // selection encoded, appended to `payload_out` (the unit's message).
  void prepare(TensorState& t, void* data, float step_clip, uint64_t step, bool sparse,
               std::vector<uint8_t>& payload_out);
  // The prepare stage of an absent contribution (Engine::submit_absent): the values become exact
  // zeros (a sparse step appends an empty selection to `payload_out`); no clipping, and u, v and
  // DGC's state are left as they are.
  void prepare_absent(TensorState& t, void* data, uint64_t step, bool sparse,
                      std::vector<uint8_t>& payload_out);
  // A gradient some rank found non-finite (progress thread): NaN fill (propagate), nothing else
  // changes; records the completion event.
  void skip(TensorState& t, void* data, bool fill_nan);
  // A dense unit's stage work around its collective (progress thread; sync/data/dense_exchange.cc):
  // tensor[i] is items[i]'s tensor when the item is a gradient (its values in backend memory),
  // else null (a LocalSGD parameter average in host memory, any dtype, run on the CPU backend).
  // The items are one fusion bucket (the dense route's unit). stage_dense casts them into one
  // host bucket of the wire type (16-bit: divided by `world` first); the route sums it over the
  // ranks (route::dense_allreduce); unstage_dense writes the averages back.
  DenseBucket stage_dense(std::vector<DenseItem>& items, const std::vector<TensorState*>& tensor,
                          int world, const DenseExchangeOptions& options, DenseCounters& counters);
  void unstage_dense(DenseBucket& bucket, std::vector<DenseItem>& items,
                     const std::vector<TensorState*>& tensor, const DenseExchangeOptions& options,
                     DenseCounters& counters);
  // A quantized unit's stage work around its collective (progress thread; sync/data/int8_path.cc):
  // values[i] is tensors[i]'s fp32 values in backend memory; stage_int8 brings them to host
  // memory with the tensors' residuals ready for the layout (absent[i]: an absent contribution's
  // zeros, sent without the tensor's own residual; `hierarchy` null: flat) as int8_allreduce's
  // items; the route runs int8_allreduce (sync/route/int8.cc); unstage_int8 writes them back.
  Int8Staging stage_int8(const std::vector<TensorState*>& tensors,
                         const std::vector<float*>& values, const std::vector<bool>& absent,
                         int world, int rank, const comm::HostTopology* hierarchy);
  void unstage_int8(Int8Staging& staging, const std::vector<TensorState*>& tensors,
                    const std::vector<float*>& values);
  // A tensor leaving the quantized route (8 or 4 bits): its residuals added into `values` (backend
  // memory, the values about to be sent on another route) and dropped (progress thread).
  void int8_fold(TensorState& t, float* values, int world);
  // A tensor switched from the 8-bit route to DGC (engine lock held, before routing): its
  // residuals are added into DGC's residual and dropped.
  void int8_to_dgc_residual(TensorState& t, int world);
  // The finish stage (any thread): a sparse step's average of every rank's payload (rank order)
  // into the values; a 16-bit tensor's values cast back into `data`; the completion event.
  void finish(TensorState& t, void* data, const std::vector<compress::wire::PayloadSpan>& payloads,
              bool sparse);
  // A dense gradient riding a DGC unit's gather (sync/data/gather_rider.h), after prepare(): its
  // values in full as one payload of `wire` values appended to `payload_out` (prepare stage).
  // Returns the count of values that saturated a 16-bit wire.
  uint64_t encode_rider(TensorState& t, void* data, DType wire, std::vector<uint8_t>& payload_out);
  // Its finish stage: the average of every rank's payload (rank order) into the values, then as
  // finish(). Returns whether the average holds NaN or Inf.
  bool finish_rider(TensorState& t, void* data,
                    const std::vector<compress::wire::PayloadSpan>& payloads, DType wire);
  // The hierarchical exchange's DGC re-selection (progress thread, between prepare and finish):
  // `dropped` (host memory) is added into this rank's residual of the DGC tensor; returns once
  // done.
  void return_to_residual(TensorState& t, const compress::wire::DecodedPayload& dropped);
  // LocalSGD's local phase (caller's thread): momentum and clipping in place. Returns the NaN/Inf
  // count (momentum untouched when > 0 and not `zero`); records the completion event.
  uint64_t local_step(TensorState& t, void* data, float step_clip, bool zero);

  // GRADEX_POLICY=auto's switch of a tensor's policy to `to` (progress thread, before routing,
  // engine lock held), keeping error feedback exact on the tensor's own backend:
  //   dense -> DGC    its momentum u is copied into the new DGC state's u; the residual starts 0;
  //   DGC -> DGC at another sparsity   the whole state (u, v, step) moves, through the backend's
  //                   save_state/load_state;
  //   DGC -> dense    the DGC state stays: prepare() then takes DGC's dense step, which sends
  //                   u + v, empties v and keeps u (the residual is flushed through the dense
  //                   path).
  // The tensor's backend must be bound (true for any tensor in a round).
  void switch_policy(TensorState& t, const AppliedPolicy& to);

  // Checkpoints and diagnostics (engine idle): host copies in DgcCompressor's formats. A tensor
  // has DGC state when its policy is DGC or when it kept its state across a switch to dense.
  bool has_dgc(const TensorState& t) const;
  std::vector<uint8_t> save_dgc(TensorState& t);
  // Throws unless the blob restores into t; returns its step counter. load_dgc into a tensor
  // without DGC state (GRADEX_POLICY=auto adopting a saved state) gives it a codec at
  // GRADEX_SPARSITY, its dense policy unchanged.
  uint64_t validate_dgc(const TensorState& t, const uint8_t* blob, size_t size) const;
  void load_dgc(TensorState& t, const uint8_t* blob, size_t size);
  std::vector<float> residual(TensorState& t);
  std::vector<float> momentum(TensorState& t);
  void load_momentum(TensorState& t, const float* values, size_t n);

  // Step transactions (Engine::snapshot_state / rollback_state; engine idle). A bound DGC state
  // keeps its own snapshot (DgcState::snapshot): snapshot_dgc returns false, taking none, when the
  // tensor's backend is not bound yet (the engine then keeps its save_dgc blob). Momentum is
  // copied into `out` (a host tensor's by memcpy: `out` keeps its capacity; empty: none yet).
  bool snapshot_dgc(TensorState& t);
  bool dgc_snapshot_taken(const TensorState& t) const;
  void rollback_dgc(TensorState& t);
  void copy_momentum(TensorState& t, std::vector<float>& out);
  void restore_momentum(TensorState& t, const std::vector<float>& values);

  // Bytes copied between a device and host memory so far (0 on host backends).
  uint64_t staged_bytes() const { return staged_bytes_.load(); }

 private:
  struct Lane;
  // One stream per backend and stage, so that stages running at once on different threads never
  // share a stream or a lane's buffers. Work passes from one stage to the next through the
  // tensor's ready event (recorded at the end of each stage, waited for at the start of the next).
  enum class Stage { kProgress, kPrepare, kFinish };
  Lane& lane(compress::backend::Backend& backend, Stage stage = Stage::kProgress);
  void bind(TensorState& t, compress::backend::BackendPtr backend);
  // The DGC options of a tensor at `sparsity` (the engine clips, so no clipping inside DGC).
  compress::DgcOptions dgc_options(double sparsity) const;
  // A tensor's sparse codec on its bound backend: DGC, or with GRADEX_OPTIMIZER=adam the Adam
  // codec (compress/backend/adam_codec.h: top-k of a decaying first-moment buffer).
  std::unique_ptr<compress::backend::DgcCodec> make_codec(
      const TensorState& t, const compress::DgcOptions& options) const;
  void wait_ready(TensorState& t, Lane& lane);
  float clip_factor(float step_clip, TensorState& t, const float* values, Lane& lane);
  void apply_momentum(TensorState& t, float* values, float scale, Lane& lane);
  // A 16-bit tensor's fp32 values back into its caller's buffer.
  void store_values(TensorState& t, void* data, Lane& lane);
  std::vector<float> download(TensorState& t, const float* src, size_t n);
  void upload(TensorState& t, float* dst, const float* src, size_t n);

  const config::Config& config_;
  EngineOptions options_;
  int world_size_;
  compress::backend::DeviceType host_backend_;  // for host tensors
  std::mutex mu_;                               // lanes_ and events_
  std::map<std::pair<compress::backend::Backend*, Stage>, std::unique_ptr<Lane>> lanes_;
  struct HandleEvent {
    std::shared_ptr<compress::backend::Event> event;
    compress::backend::BackendPtr backend;
  };
  std::map<uint64_t, HandleEvent> events_;
  std::atomic<bool> warned_no_norm_{false};
  std::atomic<uint64_t> staged_bytes_{0};
  // Parameter averages in a dense unit (sync/data/dense_exchange.cc; progress thread only).
  compress::backend::BufferPtr staging_;
  bool staging_pinned_ = false;
  std::vector<float> host_scratch_;
};

}  // namespace gradex::sync
