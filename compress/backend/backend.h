// The device backend: the operations the engine runs on a tensor's own memory, behind one plain
// host interface (no CUDA or Thrust types), so that the engine drives CPU tensors and CUDA tensors
// with the same code. Implementations, one folder each:
//   kCpu        compress/backend/cpu_backend.cc   the CPU kernels (DgcCompressor, half::, wire::)
//   kThrustOmp  compress/thrust/omp_backend.cc    the CUDA backend's Thrust code on OpenMP (CI)
//   kCuda       compress/cuda/cuda_backend.cc     Thrust/CUB on the GPU, a shared library of its
//                                                 own (libgradex_backend_cuda.so), dlopen'ed by
//                                                 get_backend() when a CUDA tensor first appears
//
// Memory: every pointer an operation takes is in the backend's memory ("device" memory; plain
// host memory for kCpu and kThrustOmp) unless it is named host_*. Buffers are RAII handles.
// Ordering: every operation is queued on a Stream and runs in queue order; operations that return
// a host value (counts, the DGC step's result) wait for their own work only (an event on the
// stream), never for the whole device. Host backends run everything on the calling thread at the
// call, so their streams and events are trivially complete.
//
// Numerics (bit-identical across backends where the maths allows): casts round to nearest even
// and saturate finite values (half::to_half's contract); gather/scatter are copies; add_from_half
// computes out + from16(in) * scale; scatter_add computes out[i] + scale * value per element, in
// call order. The CUDA build turns off FMA contraction so that these hold on the GPU too. The DGC
// step keeps compress/dgc's invariant exactly (sent + v_new == v_old + update, in fp32) on every
// backend; which elements it selects may differ between backends (threshold reuse, ties).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "base/dtype.h"
#include "compress/options.h"

namespace gradex::compress::backend {

enum class DeviceType : int { kCpu = 0, kThrustOmp = 1, kCuda = 2 };
const char* device_type_name(DeviceType type);

// Memory owned by a backend, freed by the destructor. Device buffers live where the backend's
// operations run; staging buffers are host memory the device copies from and to asynchronously
// (pinned on CUDA), the only memory that UCX (host transports) reads and writes.
class Buffer {
 public:
  virtual ~Buffer() = default;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }

 protected:
  Buffer(void* data, size_t bytes) : data_(data), bytes_(bytes) {}

 private:
  void* data_;
  size_t bytes_;
};
using BufferPtr = std::unique_ptr<Buffer>;

class Event;
class Backend;

// An ordered queue of work. native() is the cudaStream_t (as void*) on CUDA, null on host backends.
class Stream {
 public:
  virtual ~Stream() = default;
  virtual void* native() const = 0;
  // Later work on this stream waits until `event` is reached, without blocking the host (the
  // framework's stream waits on gradex's completion event this way).
  virtual void wait(Event& event) = 0;
};
using StreamPtr = std::unique_ptr<Stream>;

class Event {
 public:
  virtual ~Event() = default;
  // Marks the point after all work queued on `stream` so far.
  virtual void record(Stream& stream) = 0;
  // True when the recorded point has been reached (never blocks); true when never recorded.
  virtual bool ready() = 0;
  // Blocks the calling thread until the recorded point is reached.
  virtual void synchronize() = 0;
};
using EventPtr = std::unique_ptr<Event>;

// What a DGC step reports to the host (the selection itself stays in backend memory).
struct DgcStepInfo {
  uint64_t step = 0;     // 0-based step that ran
  double sparsity = 0;   // its target sparsity
  size_t count = 0;      // selected elements
  float threshold = 0;   // smallest selected |v| before masking; +inf when none
  int rounds = 0;        // threshold adaptation passes
  bool exact = false;    // finished with an exact top-k
  size_t saturated = 0;  // values clamped to the 16-bit range
};

// The report of step `step` (target sparsity `sparsity`, `count` elements selected) from the
// selection's own record, which names the other fields alike (dgc::Selection,
// thrust_dgc::StepResult).
template <typename Record>
DgcStepInfo step_info_of(uint64_t step, double sparsity, size_t count, const Record& r) {
  return DgcStepInfo{step, sparsity, count, r.threshold, r.rounds, r.exact, r.saturated};
}

// Per-tensor DGC state (u, v) in backend memory, with compress/dgc's semantics (see
// compress/dgc/compressor.h for the step, the dense step and the schedule).
class DgcState {
 public:
  virtual ~DgcState() = default;
  virtual size_t numel() const = 0;
  virtual const DgcOptions& options() const = 0;
  virtual uint64_t steps_done() const = 0;
  virtual void set_step(uint64_t step) = 0;
  // Density of the next step (the engine's dense-or-sparse decision).
  virtual double density() const = 0;
  // Upper bound on any step's selected count (size of the selection buffers).
  virtual size_t capacity() const = 0;
  // v (numel floats) and u (null when momentum is 0), in backend memory. residual() points at the
  // state's own writable memory (the default load_state writes through it).
  virtual const float* residual() const = 0;
  virtual float* momentum_buffer() = 0;
  // One sparse step over grad (backend memory, numel floats, times grad_scale before it enters u
  // and v). The selection (sorted indices, values exactly representable in value_dtype) is in
  // selected_indices()/selected_values() until the next step. Returns once its counts are known.
  virtual DgcStepInfo step(const float* grad, float grad_scale, Stream& stream) = 0;
  // step() that also leaves `grad` all zeros (it then receives the sparse sum). The default runs
  // step() then backend.fill_zero on `stream`; the CPU backend clears in the pass that reads grad.
  // `backend` is the one that created this state.
  virtual DgcStepInfo step_and_clear(float* grad, float grad_scale, Backend& backend,
                                     Stream& stream);
  virtual const uint32_t* selected_indices() const = 0;
  virtual const float* selected_values() const = 0;
  // One dense step: the same update, then v is written to dense_out (numel floats, backend
  // memory) and zeroed; u is kept. Queued on `stream` (does not wait).
  virtual void step_dense(const float* grad, float* dense_out, float grad_scale,
                          Stream& stream) = 0;
  // Checkpoints in DgcCompressor's blob format (compress/dgc/state.cc), so that a state saved on
  // one backend restores on any other. Both wait for their own copies on
  // `stream`. The defaults (compress/backend/dgc_state_io.cc) copy u and v through host memory
  // and record no threshold history (a restored state's first step adapts from scratch); the CPU
  // backend saves and restores DgcCompressor's complete state. load_state validates the blob
  // completely (StateError / CorruptPayload) before it changes anything. `backend` is the one
  // that created this state.
  virtual std::vector<uint8_t> save_state(Backend& backend, Stream& stream);
  virtual void load_state(const uint8_t* data, size_t size, Backend& backend, Stream& stream);

  // Step transactions (sync/engine/engine_snapshot.cc): snapshot() records this state's complete
  // value inside the state, rollback() restores the last one exactly (false, nothing changed, when
  // none was taken). The defaults go through save_state/load_state; the CPU backend copies
  // DgcCompressor's values into buffers it keeps (no allocation after the first snapshot).
  virtual void snapshot(Backend& backend, Stream& stream) {
    snapshot_blob_ = save_state(backend, stream);
  }
  virtual bool has_snapshot() const { return !snapshot_blob_.empty(); }
  virtual bool rollback(Backend& backend, Stream& stream) {
    if (snapshot_blob_.empty()) return false;
    load_state(snapshot_blob_.data(), snapshot_blob_.size(), backend, stream);
    return true;
  }

 private:
  std::vector<uint8_t> snapshot_blob_;
};
using DgcStatePtr = std::unique_ptr<DgcState>;

// One tensor of a fusion bucket: `numel` floats at `data` (backend memory), placed at element
// `offset` of the bucket.
struct FusionEntry {
  float* data = nullptr;
  size_t numel = 0;
  size_t offset = 0;
};

struct CastCounts {
  size_t saturated = 0;  // finite values clamped to the 16-bit range
  size_t nonfinite = 0;  // NaN or Inf after scaling
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual DeviceType type() const = 0;
  // e.g. "cpu", "thrust-omp", "cuda:0 (NVIDIA H100 80GB HBM3)".
  virtual std::string name() const = 0;
  // True when backend memory is host memory (the engine then skips staging copies).
  virtual bool host_accessible() const = 0;

  // --- memory, streams, events -----------------------------------------------------------------
  virtual BufferPtr allocate(size_t bytes) = 0;          // backend memory, contents undefined
  virtual BufferPtr allocate_staging(size_t bytes) = 0;  // host memory (pinned on CUDA)
  virtual StreamPtr create_stream() = 0;
  // A stream the caller owns (a framework's cudaStream_t; null: the default stream). Not
  // destroyed with the handle.
  virtual StreamPtr wrap_stream(void* native) = 0;
  virtual EventPtr create_event() = 0;
  // Queued copies; either side may be backend or host memory (staging memory for asynchrony).
  virtual void copy(void* dst, const void* src, size_t bytes, Stream& stream) = 0;
  virtual void fill_zero(void* dst, size_t bytes, Stream& stream) = 0;

  // --- DGC --------------------------------------------------------------------------------------
  // Zeroed u and v for numel elements; InvalidArgument for bad options or numel > 2^32.
  DgcStatePtr create_dgc(size_t numel, const DgcOptions& options);

  // --- 16-bit casts (dense path) -----------------------------------------------------------------
  // out[i] = to16(in[i] * scale), type fp16 or bf16; waits for the counts.
  CastCounts to_half(const float* in, uint16_t* out, size_t n, DType type, float scale,
                     Stream& stream);
  // out[i] = from16(in[i]) * scale, or out[i] += that when `add`. Queued.
  void from_half(const uint16_t* in, float* out, size_t n, DType type, float scale, bool add,
                 Stream& stream);
  // NaN or Inf elements of x (the negotiation's non-finite flag); waits for the count.
  size_t count_nonfinite(const float* x, size_t n, Stream& stream);
  // Sum of x[i]^2 accumulated in double (the clipping norm's square); NaN when x holds NaN or
  // Inf. Summation order differs between backends (equal to rounding, not bit for bit). Waits.
  double sum_squares(const float* x, size_t n, Stream& stream);
  // Replaces NaN and Inf elements of x by +0 (GRADEX_NONFINITE=zero). Queued.
  void zero_nonfinite(float* x, size_t n, Stream& stream);

  // --- momentum outside DGC's sparse steps -------------------------------------------------------
  // In place over n floats, s = grad_scale: u <- m*u + s*g; g <- u (Nesterov: g <- s*g + m*u with
  // the new u); m == 0: g <- s*g and u is not touched (may be null). Queued.
  void apply_momentum(float* g, float* u, size_t n, float momentum, bool nesterov, float grad_scale,
                      Stream& stream);

  // --- dense fusion ------------------------------------------------------------------------------
  // bucket[e.offset + j] = e.data[j] for every entry (gather) and back (scatter). Entries must not
  // overlap in the bucket. Queued.
  void gather(const FusionEntry* entries, size_t count, float* bucket, Stream& stream);
  void scatter(const float* bucket, const FusionEntry* entries, size_t count, Stream& stream);

  // --- received sparse payloads ------------------------------------------------------------------
  // out[indices[j]] += scale * values[j] for j < count; indices strictly increasing and < numel
  // (decoded and validated by wire::decode). indices/values in backend memory. Queued.
  void scatter_add(const uint32_t* indices, const float* values, size_t count, float* out,
                   size_t numel, float scale, Stream& stream);

 protected:
  // The operations above, as each backend implements them. The public calls check the arguments
  // first, the same way for every backend (validate.h: InvalidArgument naming the backend and
  // the call), so these receive only arguments that passed; to_half is not called for n == 0.
  virtual DgcStatePtr do_create_dgc(size_t numel, const DgcOptions& options) = 0;
  virtual CastCounts do_to_half(const float* in, uint16_t* out, size_t n, DType type, float scale,
                                Stream& stream) = 0;
  virtual void do_from_half(const uint16_t* in, float* out, size_t n, DType type, float scale,
                            bool add, Stream& stream) = 0;
  virtual size_t do_count_nonfinite(const float* x, size_t n, Stream& stream) = 0;
  virtual double do_sum_squares(const float* x, size_t n, Stream& stream) = 0;
  virtual void do_zero_nonfinite(float* x, size_t n, Stream& stream) = 0;
  virtual void do_apply_momentum(float* g, float* u, size_t n, float momentum, bool nesterov,
                                 float grad_scale, Stream& stream) = 0;
  virtual void do_gather(const FusionEntry* entries, size_t count, float* bucket,
                         Stream& stream) = 0;
  virtual void do_scatter(const float* bucket, const FusionEntry* entries, size_t count,
                          Stream& stream) = 0;
  virtual void do_scatter_add(const uint32_t* indices, const float* values, size_t count,
                              float* out, size_t numel, float scale, Stream& stream) = 0;
};
using BackendPtr = std::shared_ptr<Backend>;

// The backend for a device type, created once per (type, index) and shared. kCpu always works;
// kThrustOmp when this build found Thrust and OpenMP; kCuda loads libgradex_backend_cuda.so on
// first use. Throws InvalidArgument naming what is missing (no Thrust build, no CUDA library, no
// CUDA runtime or device, device_index out of range).
BackendPtr get_backend(DeviceType type, int device_index = 0);

// True when get_backend(type, 0) would succeed (never throws).
bool backend_available(DeviceType type);

// The ABI between get_backend() and the CUDA library: it exports
//   extern "C" int gradex_backend_cuda_abi();                              // kCudaBackendAbi
//   extern "C" Backend* gradex_backend_cuda_create(int device, char* err, size_t err_size);
// (null plus a message on failure). Bump when Backend's layout changes.
// 2: DgcState::save_state / load_state. 3: DgcState::step_and_clear. 4: DgcOptions gained
// residual_dct_chunk (create_dgc takes DgcOptions). 5: the operations' argument checks moved into
// Backend's public (non-virtual) calls; the backend implements the protected do_* calls.
constexpr int kCudaBackendAbi = 5;

}  // namespace gradex::compress::backend
