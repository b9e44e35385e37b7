/* gradex public C API: the only surface framework plugins use.
 *
 * Contract:
 *  - Every function returns a gradex_status_t; on failure, gradex_last_error() returns a message for the
 *    calling thread (valid until that thread's next gradex call). Output parameters are written only on
 *    success. No C++ exception ever crosses this boundary.
 *  - An engine is bound to one job (rank, world size). Tensors are registered by key (any string: a
 *    parameter name or "bucket.<i>") and matched across ranks by key, whatever order ranks submit in.
 *  - gradex_submit() is non-blocking: compression and communication run on the engine's background
 *    thread. The buffer must stay valid and untouched until gradex_wait() (or a successful
 *    gradex_test()) reports the handle complete; it then holds the average over ranks.
 *  - All blocking calls honour GRADEX_TIMEOUT_S: a dead or stalled peer, or a tensor some rank never
 *    submits, fails the affected handles with a message naming the operation, tensor key and ranks.
 *  - Thread safety: every function may be called from any thread, concurrently (submits from autograd
 *    threads, waits from another); each handle is waited or tested to completion by one thread.
 *  - Memory: host memory through gradex_submit; CUDA memory through gradex_submit_device, where
 *    gradex computes on the device and stages only what crosses the wire (see below).
 *  - Completion is reported through gradex_wait/gradex_test only (no callbacks): a plugin that must
 *    complete framework futures polls or waits on a thread of its own.
 */
#ifndef GRADEX_GRADEX_H_
#define GRADEX_GRADEX_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Bumped on every incompatible change of this header. gradex_engine_create() refuses other versions. */
#define GRADEX_API_VERSION 1

/* The status codes, defined here only: base/error.h, the torch op and python/gradex/_errors.py are
 * checked against this table by tests/base/status_table_check.py. */
typedef enum gradex_status {
  GRADEX_OK = 0,
  GRADEX_ERR_INVALID_ARGUMENT = 1,
  GRADEX_ERR_CONFIG = 2,   /* a GRADEX_* value (environment or API) is invalid */
  GRADEX_ERR_TIMEOUT = 3,  /* a peer stalled or never submitted within GRADEX_TIMEOUT_S */
  GRADEX_ERR_PEER = 4,     /* a peer died or failed */
  GRADEX_ERR_CORRUPT = 5,  /* a received payload failed validation */
  GRADEX_ERR_MISMATCH = 6, /* ranks disagree: tensor keys, sizes, dtypes */
  GRADEX_ERR_TRANSPORT = 7,
  GRADEX_ERR_INTERNAL = 8,
  GRADEX_ERR_STATE = 9,    /* saved state cannot be restored here */
  GRADEX_ERR_VERSION = 10, /* API version mismatch between plugin and library */
  GRADEX_ERR_ABORTED = 11  /* gradex_engine_abort (this rank's or a peer's) or a reconfiguration ended it */
} gradex_status_t;

typedef enum gradex_dtype { GRADEX_FLOAT32 = 0, GRADEX_FLOAT16 = 1, GRADEX_BFLOAT16 = 2 } gradex_dtype_t;

/* Memory the tensor lives in. GRADEX_DEVICE_CUDA tensors are float32 and are submitted with
 * gradex_submit_device; their backend (libgradex_backend_cuda.so) is loaded at the first submission. */
typedef enum gradex_device { GRADEX_DEVICE_CPU = 0, GRADEX_DEVICE_CUDA = 1 } gradex_device_t;

/* A bootstrap store supplied by the framework (e.g. torch.distributed's store). Each callback returns 0
 * on success and non-zero on failure (then gradex reports the operation and key). `get` blocks until the
 * key exists or `timeout_ms` passes, and returns a buffer that gradex releases with `release`. */
typedef struct gradex_store {
  void* context;
  int (*set)(void* context, const char* key, const void* value, size_t length);
  int (*get)(void* context, const char* key, int64_t timeout_ms, void** value, size_t* length);
  void (*release)(void* context, void* value);
  int (*add)(void* context, const char* key, int64_t delta, int64_t* new_value);
} gradex_store_t;

typedef struct gradex_engine_options {
  uint32_t api_version;         /* must be GRADEX_API_VERSION */
  int32_t rank;                 /* < 0: from the environment (RANK / OMPI_COMM_WORLD_RANK) */
  int32_t world_size;           /* < 0: from the environment */
  const gradex_store_t* store;  /* NULL: a TCP store from MASTER_ADDR/MASTER_PORT (rank 0 serves) */
  const char* store_prefix;     /* key prefix inside the store (NULL: "gradex/") */
  /* Configuration set through the API; wins over the environment. Names are GRADEX_* variables. */
  size_t config_count;
  const char* const* config_names;
  const char* const* config_values;
} gradex_engine_options_t;

typedef struct gradex_engine gradex_engine_t;
typedef uint64_t gradex_handle_t;

/* Library's API version (compare with GRADEX_API_VERSION at load time). */
uint32_t gradex_api_version(void);
/* Message of the calling thread's last failed call ("" if none). */
const char* gradex_last_error(void);
/* Fills `options` with defaults (api_version set, rank/world_size from the environment, no store). */
void gradex_engine_options_init(gradex_engine_options_t* options);

/* Creates an engine: validates the configuration, bootstraps and connects every rank. Collective. */
gradex_status_t gradex_engine_create(const gradex_engine_options_t* options, gradex_engine_t** engine);
/* Finishes outstanding work (bounded by the timeout) and releases everything. NULL is ignored. */
gradex_status_t gradex_engine_destroy(gradex_engine_t* engine);

gradex_status_t gradex_engine_rank(const gradex_engine_t* engine, int32_t* rank, int32_t* world_size);

/* ---- Membership changes (additive to API version 1; torchft's quorum changes, docs/pytorch.md
 * "Reconfiguration") ----------------------------------------------------------------------------------
 * gradex_engine_reconfigure gives the engine a new membership without destroying it. Collective over
 * the NEW members: survivors call it, a newcomer calls gradex_engine_create with the same options. Reads
 * options->rank and ->world_size (both required), ->store (NULL: the store given at creation or at the
 * last reconfiguration; an engine bootstrapped through the environment's TCP store must be given one) and
 * ->store_prefix (NULL: "gradex/"). The store must not hold an earlier membership's keys under that
 * prefix (a new store, or a new prefix per membership: reusing the current store and prefix is
 * GRADEX_ERR_INVALID_ARGUMENT). Config entries must be absent or equal to the engine's configuration,
 * else GRADEX_ERR_CONFIG naming the variable. Every handle of the old membership still in flight fails at
 * once with GRADEX_ERR_ABORTED; the old connections close (old peers get an abort notice); the new ones
 * bootstrap; the start-up agreement runs again (GRADEX_ERR_CONFIG on every member when options that must
 * agree differ), and with GRADEX_POLICY=auto the link probe reruns at the first exchange.
 * Kept, by tensor key: registrations, DGC residuals and momenta, dense momenta, exchange counters, LocalSGD
 * anchors, the step count, cost-model measurements. Reset: negotiation (and its cache), auto's plan epochs.
 * A newcomer starts with empty residuals and momenta and takes the agreed exchange counters from the
 * others at its first exchange; it may instead gradex_load_state a state a member saved AFTER the
 * reconfiguration (same world size; note that a copied DGC residual is then sent by both ranks). With
 * LocalSGD a newcomer must load such a state (its step count decides the phase). A failed engine (a dead
 * peer, gradex_engine_abort) is usable again after a successful reconfiguration: that is how survivors
 * continue after a peer dies. A failed reconfiguration leaves the engine failed with its error; it may be
 * reconfigured again. Not concurrently with another reconfiguration or gradex_engine_destroy. */
gradex_status_t gradex_engine_reconfigure(gradex_engine_t* engine, const gradex_engine_options_t* options);
/* Callable from any thread at any time: every handle in flight and every later submission fails with
 * GRADEX_ERR_ABORTED carrying `reason`, within milliseconds, and the peers learn it at once (their handles
 * fail with GRADEX_ERR_ABORTED naming this rank and the reason). Returns once the engine's thread has
 * stopped (unless a reconfiguration or destroy runs meanwhile; they stop it). The engine stays usable for
 * gradex_engine_reconfigure. */
gradex_status_t gradex_engine_abort(gradex_engine_t* engine, const char* reason);

/* Step transactions for a commit protocol (torchft's should_commit): call gradex_state_snapshot at the start
 * of a step and gradex_state_rollback when the step does not commit; the engine's state is then as if the
 * step never ran, bit for bit (DGC residuals, momenta and adaptive thresholds, dense momenta, exchange
 * counters, LocalSGD anchors, the step count; statistics are not rolled back). Both wait for exchanges in
 * flight (bounded by the timeout). The snapshot's buffers are kept and reused by the next snapshot.
 * Snapshot after a fatal error is GRADEX_ERR_STATE (reconfigure first); rollback works after one (a failed
 * step rolls back) and resets tensors registered since the snapshot. Rollback without a snapshot, or after
 * GRADEX_POLICY=auto switched a tensor's policy, is GRADEX_ERR_STATE and changes nothing. Every rank must
 * roll back the same steps. */
gradex_status_t gradex_state_snapshot(gradex_engine_t* engine);
gradex_status_t gradex_state_rollback(gradex_engine_t* engine);

/* Registers a gradient tensor (idempotent when called again with identical arguments; an error when the
 * same key is registered with different ones). Registration is local; cross-rank agreement is checked
 * when the tensor is first exchanged. */
gradex_status_t gradex_register_tensor(gradex_engine_t* engine, const char* key, uint64_t numel,
                                       gradex_dtype_t dtype, gradex_device_t device);

/* Submits this step's gradient of a registered tensor. On completion `data` holds the average over ranks
 * of what each rank sends: with GRADEX_MOMENTUM = m > 0 gradex owns momentum, so that is each rank's
 * momentum u = m*u + g (Nesterov: g + m*u; DGC tensors: their sparse update), i.e. SGD with momentum's
 * step when the optimizer runs with momentum 0; with m = 0 the plain average. When any rank's gradient
 * of the tensor holds NaN/Inf, every rank learns it before any state changes: no rank updates its
 * momentum or residual, and GRADEX_NONFINITE=propagate gives every rank an all-NaN result, =error fails
 * the handle on every rank, =zero replaces the bad values by 0 first. During LocalSGD's local phase
 * nothing is exchanged: `data` is left as it is with m = 0, or becomes this rank's momentum with m > 0. */
gradex_status_t gradex_submit(gradex_engine_t* engine, const char* key, void* data,
                              gradex_handle_t* handle);

/* ---- Device memory (additive to API version 1) ------------------------------------------------------
 * gradex_submit for a gradient in `device`'s memory: `data` is a device pointer of a tensor registered
 * with that device (GRADEX_DEVICE_CPU: host memory, as gradex_submit), `device_index` the CUDA device
 * and `stream` the cudaStream_t (NULL: the legacy default stream) on which the gradient is ready; the
 * call records an event on it and returns at once (no host wait). DGC's residual and momentum stay on
 * the device; only the encoded payloads and 16-bit dense buckets cross PCIe. The handle completes
 * (gradex_wait/gradex_test) once the average is queued on gradex's own stream: before the framework
 * reads `data`, order its stream after gradex's with gradex_handle_event. Submitting the same key
 * from another device than its first submission is an error. */
gradex_status_t gradex_submit_device(gradex_engine_t* engine, const char* key, void* data,
                                     gradex_device_t device, int device_index, void* stream,
                                     gradex_handle_t* handle);
/* Makes `stream` (a cudaStream_t; NULL: the default stream) wait on the device for a device handle's
 * result, without blocking the host. Call it after gradex_wait, or after gradex_test reported the handle
 * done, and before the tensor is submitted again; GRADEX_ERR_INVALID_ARGUMENT for a handle still in
 * flight or one this engine never issued. For a host-path handle there is nothing to order (GRADEX_OK). */
gradex_status_t gradex_handle_event(gradex_engine_t* engine, gradex_handle_t handle, void* stream);
/* *available = 1 when tensors on (device, device_index) can be exchanged by this gradex (the CUDA
 * backend library, runtime and device load), else 0 with the reason in gradex_last_error(). */
gradex_status_t gradex_device_available(gradex_device_t device, int device_index, int* available);
/* Bytes copied between device memory and host staging memory (cumulative, or the last step's), i.e.
 * what crossed PCIe for device tensors: DGC selections, received payloads, 16-bit dense buckets. */
gradex_status_t gradex_get_staged_bytes(gradex_engine_t* engine, int last_step, uint64_t* bytes);
/* What the framework waited and what the policy changed (cumulative, or the last step's; additive to API
 * version 1): `exposed_seconds`, per step the time from its last submission to its last completion when that
 * came later (a backward pass waiting on its buckets, an optimizer step on its gradients), summed;
 * `policy_switches`, tensors whose codec a GRADEX_POLICY=auto plan changed (its first plan included). */
gradex_status_t gradex_get_step_report(gradex_engine_t* engine, int last_step, double* exposed_seconds,
                                       uint64_t* policy_switches);

/* ---- Absent contributions (uneven inputs; additive to API version 1) --------------------------------
 * gradex_submit / gradex_submit_device for a rank that has no gradient of `key` this step (it ran out of
 * data: gx.join). The exchange runs on every rank exactly as for a gradient (same collectives, same
 * units: the other ranks see an ordinary exchange), but this rank contributes exact zeros: a DGC tensor
 * sends an empty selection, a dense tensor zeros. Its momentum, DGC residual and DGC momentum are left
 * untouched (a joined rank carries no stale state into the others' averages); the tensor's exchange
 * counter advances as for any exchange. The contribution is never non-finite and never clipped. `data`
 * is not read: when the handle completes it holds the average over all ranks, i.e. the sum of the other
 * ranks' contributions divided by the world size (rescale by world / ranks present for their mean).
 * GRADEX_ERR_INVALID_ARGUMENT during LocalSGD's local phase (nothing is exchanged there). */
gradex_status_t gradex_submit_absent(gradex_engine_t* engine, const char* key, void* data,
                                     gradex_handle_t* handle);
gradex_status_t gradex_submit_device_absent(gradex_engine_t* engine, const char* key, void* data,
                                            gradex_device_t device, int device_index, void* stream,
                                            gradex_handle_t* handle);

/* Submits parameters to be averaged across ranks (LocalSGD). `key` must be registered. `data` is host
 * memory, also for a key registered as GRADEX_DEVICE_CUDA (parameters are staged by the plugin). */
gradex_status_t gradex_average(gradex_engine_t* engine, const char* key, void* data,
                               gradex_handle_t* handle);

/* Blocks until the handle completes; returns its status. A handle is released by wait, or by a test that
 * reports it done. */
gradex_status_t gradex_wait(gradex_engine_t* engine, gradex_handle_t handle);
/* Non-blocking: *done = 1 when complete (then returns its status and releases it), else 0. */
gradex_status_t gradex_test(gradex_engine_t* engine, gradex_handle_t handle, int* done);

/* Gradient clipping by the whole model's norm (GRADEX_CLIP_NORM = C > 0; ignored when it is 0).
 * Call once per step, BEFORE the first gradex_submit of that step, with this rank's L2 norm over every
 * gradient it will submit in the step (the norm of their concatenation, as torch's clip_grad_norm_
 * computes it; dense and DGC tensors alike). Every gradient submitted after the call until
 * gradex_end_step is scaled by min(1, C / sqrt(world size) / norm) before any momentum or residual sees
 * it (the DGC paper's local clipping, applied on every rank with its own norm). A NaN/Inf norm means no
 * clipping (a non-finite gradient is handled by GRADEX_NONFINITE). In a step without this call each
 * tensor is clipped by its own norm at the same limit (a warning is logged once). Fails with
 * GRADEX_ERR_INVALID_ARGUMENT for a negative norm. */
gradex_status_t gradex_set_gradient_norm(gradex_engine_t* engine, double norm);

/* Ends a training step (call once per step, after the optimizer step). *average_now = 1 when LocalSGD is
 * active and parameters should be averaged now (every GRADEX_LOCALSGD_PERIOD steps after its warm-up). */
gradex_status_t gradex_end_step(gradex_engine_t* engine, int* average_now);

/* 1 when submitted gradients of this step are exchanged; 0 in LocalSGD's local phase. */
gradex_status_t gradex_exchanges_gradients(gradex_engine_t* engine, int* exchanges);

typedef struct gradex_stats {
  uint64_t steps;              /* completed steps (gradex_end_step calls) */
  uint64_t tensors;            /* tensor exchanges completed */
  uint64_t bytes_sent;         /* data bytes this rank put on the wire (payloads, dense buckets) */
  uint64_t bytes_received;
  uint64_t dense_bytes;        /* what a dense fp32 ring allreduce would have sent for the same work */
  uint64_t sparse_exchanges;   /* tensor exchanges that went sparse (DGC) */
  uint64_t dense_fallbacks;    /* DGC tensors sent dense because that was cheaper this step */
  uint64_t saturated;          /* values clamped to the 16-bit range */
  uint64_t nonfinite;          /* NaN/Inf values seen in submitted gradients */
  uint64_t parameter_averages; /* LocalSGD averaging rounds */
  double compress_seconds;     /* in compression and casts */
  double communicate_seconds;  /* in collectives */
  double decode_seconds;       /* decoding and accumulating received payloads */
  double compression_ratio;    /* dense_bytes / bytes_sent (0 when nothing was sent) */
  uint64_t control_bytes;      /* negotiation messages (which tensors are ready where); not in bytes_sent */
} gradex_stats_t;

/* Cumulative counters (last_step = 0) or those of the last completed step (last_step = 1). */
gradex_status_t gradex_get_stats(gradex_engine_t* engine, int last_step, gradex_stats_t* stats);

/* Compressor state (residuals, momenta, step counters) for checkpoints. Call with buffer NULL to learn
 * the size. Saving waits for outstanding handles. Loading checks the format version, world size and
 * tensor set, and fails with GRADEX_ERR_STATE otherwise. */
gradex_status_t gradex_save_state(gradex_engine_t* engine, void* buffer, size_t capacity, size_t* length);
gradex_status_t gradex_load_state(gradex_engine_t* engine, const void* buffer, size_t length);

/* The effective configuration, with help text, as printed by gradex-config. Call with buffer NULL to learn
 * the size (including the terminating NUL). engine NULL: the environment's configuration. */
gradex_status_t gradex_describe_config(gradex_engine_t* engine, char* buffer, size_t capacity,
                                       size_t* length);

/* ---- Codec policy (additive to API version 1) -------------------------------------------------------
 * gradex_register_tensor with the tensor's output rows (e.g. a weight's shape[0] in PyTorch's
 * [out, in, ...] layout; 0: unknown, as gradex_register_tensor), so that GRADEX_POLICY=auto never
 * sparsifies it below GRADEX_POLICY_MIN_PER_ROW values per row. rows must divide numel. */
gradex_status_t gradex_register_tensor_rows(gradex_engine_t* engine, const char* key, uint64_t numel,
                                            gradex_dtype_t dtype, gradex_device_t device, uint64_t rows);
/* Each tensor's codec and why; with GRADEX_POLICY=auto the newest plan: the agreed link, codec and step
 * numbers, and per tensor its choice with predicted and measured times (what gradex-bench plan prints).
 * Call with buffer NULL to learn the size (including the terminating NUL). */
gradex_status_t gradex_explain(gradex_engine_t* engine, char* buffer, size_t capacity, size_t* length);

/* GRADEX_POLICY=auto: the training's horizon learnt after the engine was created (e.g. from Keras's model.fit:
 * epochs x steps per epoch), as GRADEX_POLICY_HORIZON_STEPS would give it: `steps` more exchange steps from the
 * next one (0: unknown, no horizon rule). Every rank must make the same call before it submits the next step's
 * gradients; the engine then re-plans at that step on every rank. No effect under GRADEX_POLICY=fixed.
 * (Additive to API version 1.) */
gradex_status_t gradex_set_policy_horizon(gradex_engine_t* engine, uint64_t steps);

/* ---- Delayed exchange, GRADEX_DELAY (additive to API version 1) -------------------------------------
 * With a delay D > 0 (GRADEX_DELAY=1..8, or auto once it chose D > 0: sync/delay/delay_rule.h) gradex_submit
 * and gradex_submit_absent return a handle that is already complete: `data` holds
 * g_t + (avg_{t-D} - g_{t-D}) (Delayed Gradient Averaging; g_t alone for a tensor's first D steps), and
 * the exchange of g_t runs while the next step computes. gradex_save_state then includes the averages
 * not yet applied (resume is bit-identical). CUDA tensors take D = 0.
 * gradex_delay_drain waits for every exchange in flight and drops the averages not yet applied, so that
 * averaging the parameters next (gx.synchronize) leaves every rank with the same model; the following D
 * steps apply local gradients only, as at the start. *delay: the D that submissions now get. */
gradex_status_t gradex_delay_drain(gradex_engine_t* engine);
gradex_status_t gradex_get_delay(gradex_engine_t* engine, int* delay);

/* ---- DiLoCo outer optimization (additive to API version 1) -------------------------------------------
 * Ranks train locally with any optimizer; every GRADEX_OUTER_PERIOD steps each fragment's pseudo-gradient
 * (theta_global - theta_local) is averaged across ranks (4/8-bit block-quantized with error feedback, or
 * exact fp32) and an outer SGD/Nesterov step updates theta_global, bit-identical on every rank (see
 * outer/outer_optimizer.h). A gradex_outer_t has its own connections and background thread; it needs
 * no engine. Its settings are the GRADEX_OUTER_* variables (environment or options->config_*). Calls on
 * one gradex_outer_t must come from one thread at a time. Registered tensors are fp32 host memory that the
 * caller owns and keeps at the same address until gradex_outer_destroy. */
typedef struct gradex_outer gradex_outer_t;

/* Collective: connects every rank (options as for gradex_engine_create; store_prefix NULL means
 * "gradex/outer/"). */
gradex_status_t gradex_outer_create(const gradex_engine_options_t* options, gradex_outer_t** outer);
/* Finishes exchanges in flight (bounded by the timeout), leaves and releases. NULL is ignored. */
gradex_status_t gradex_outer_destroy(gradex_outer_t* outer);
/* A new membership, as gradex_engine_reconfigure (same options rules; store_prefix NULL means
 * "gradex/outer/"), collective over the new members: the survivors call this, a newcomer calls
 * gradex_outer_create with the same store and prefix at the same time, registers the same tensors,
 * starts with gradex_outer_start_local and loads a member's gradex_outer_save_shared_state. Exchanges not
 * yet merged are dropped; kept: fragments and their schedule, step count, global copies, outer momenta,
 * contribution residuals (4/8-bit owners' requantization residuals restart at zero). A failed object is
 * usable again after a successful reconfiguration. */
gradex_status_t gradex_outer_reconfigure(gradex_outer_t* outer, const gradex_engine_options_t* options);
/* Registers a float32 tensor, in model (layer) order, before gradex_outer_start. is_buffer = 1: a buffer
 * (e.g. BatchNorm statistics) that is averaged, not optimized. */
gradex_status_t gradex_outer_add_tensor(gradex_outer_t* outer, const char* key, float* data, uint64_t numel,
                                        int is_buffer);
/* Collective: splits the parameters into GRADEX_OUTER_FRAGMENTS fragments and copies rank 0's values into
 * every rank's tensors and global copy. */
gradex_status_t gradex_outer_start(gradex_outer_t* outer);
/* Not collective, in place of gradex_outer_start: splits the parameters into fragments as it does; every
 * rank's global copies are its own tensors as they are now and its step count is `step` (inner steps
 * already taken). For a rank joining members that started already (it then loads their
 * gradex_outer_save_shared_state), or when the caller has made every rank's tensors and step identical. */
gradex_status_t gradex_outer_start_local(gradex_outer_t* outer, uint64_t step);
/* Inner steps ended by gradex_outer_step: the clock of the fragment schedule (restored by the loads). */
gradex_status_t gradex_outer_step_count(gradex_outer_t* outer, uint64_t* step);
/* Ends an inner step (after the inner optimizer's step): merges exchanges due now and starts those of the
 * fragments due now. *merged (may be NULL) = fragments merged into the tensors by this call. A failed
 * background exchange (dead or stalled peer) is returned here (and by every later call). */
gradex_status_t gradex_outer_step(gradex_outer_t* outer, int* merged);
/* Collective: finishes and merges every exchange in flight, averages the buffers and writes the global copy
 * into the parameters, so every rank holds the same model (for evaluation or a checkpoint). */
gradex_status_t gradex_outer_synchronize(gradex_outer_t* outer);
/* Collective: as gradex_outer_synchronize, without dropping local progress (for the end of training).
 * Exchanges in flight finish and their global copies are installed while each rank keeps its inner steps
 * since they started; then one outer step runs over every fragment with inner steps since its local copy
 * was last taken or replaced, all at once and with no delay, exactly as a scheduled exchange would (same
 * codec and outer momentum: bit-identical on every rank); buffers are averaged; the parameters become the
 * global copy. Training may continue on the usual schedule. *exchanged (may be NULL) = fragments exchanged
 * by this call. Errors: GRADEX_ERR_INVALID_ARGUMENT before gradex_outer_start; a failed exchange's status
 * (GRADEX_ERR_PEER, GRADEX_ERR_TIMEOUT, ...), also one that failed earlier in the background. */
gradex_status_t gradex_outer_synchronize_all(gradex_outer_t* outer, int* exchanged);
/* Counters: steps, parameter_averages (fragment exchanges merged), bytes_sent/received, dense_bytes (an fp32
 * ring allreduce of the same tensors), compression_ratio, nonfinite, communicate_seconds (background) and
 * decode_seconds (time the caller waited on exchanges). last_step is not supported (must be 0). */
gradex_status_t gradex_outer_get_stats(gradex_outer_t* outer, int last_step, gradex_stats_t* stats);
/* Copies the global copy of parameter `key` (numel elements) into `out`. */
gradex_status_t gradex_outer_global(gradex_outer_t* outer, const char* key, float* out, uint64_t numel);
/* Per fragment, the step of its last merge (0: never); *count = number of fragments; steps may be NULL. */
gradex_status_t gradex_outer_last_merges(gradex_outer_t* outer, uint64_t* steps, size_t capacity,
                                         size_t* count);
/* Fragment of a registered tensor (-1 for buffers). */
gradex_status_t gradex_outer_fragment_of(gradex_outer_t* outer, const char* key, int64_t* fragment);
/* Global copies, outer momenta, residuals and the step count (buffer NULL: the size). Saving merges the
 * exchanges in flight first; loading checks format, world size and tensor set (GRADEX_ERR_STATE). A
 * failed object may load (a rollback to a state saved before an exchange that failed): its exchanges in
 * flight are waited for and dropped, and it stays failed until gradex_outer_reconfigure. */
gradex_status_t gradex_outer_save_state(gradex_outer_t* outer, void* buffer, size_t capacity, size_t* length);
gradex_status_t gradex_outer_load_state(gradex_outer_t* outer, const void* buffer, size_t length);
/* The outer state that every member holds identically (buffer NULL: the size): step count, last merges and
 * per fragment its round, global copy and outer momentum; no residuals and nothing that depends on rank or
 * world size, so any member of any membership can load it (a newcomer takes it from a healthy peer).
 * Versioned ("GRXS", format 1) and CRC-32C checksummed. Saving is refused with exchanges in flight or after
 * a failure (GRADEX_ERR_STATE). Loading checks version, checksum (GRADEX_ERR_CORRUPT), GRADEX_OUTER_PERIOD,
 * _FRAGMENTS, _DELAY, _BITS and the tensor set (GRADEX_ERR_STATE) before changing anything; it keeps this
 * rank's contribution residuals (a newcomer's are zero) and zeroes 4/8-bit owners' requantization
 * residuals. */
gradex_status_t gradex_outer_save_shared_state(gradex_outer_t* outer, void* buffer, size_t capacity,
                                               size_t* length);
gradex_status_t gradex_outer_load_shared_state(gradex_outer_t* outer, const void* buffer, size_t length);

/* ---- Configuration check (additive to API version 1) -------------------------------------------------
 * Validates GRADEX_* settings in this process exactly as gradex_engine_create parses them (the
 * environment, overridden by the `count` name/value pairs given), without creating an engine or touching
 * the network. An undeclared name among `names` is an error here (GRADEX_ERR_CONFIG), as is an invalid
 * value; gradex_last_error() then names the variable and its allowed range (for a misspelt name, the
 * closest declared one). A NULL name or value is GRADEX_ERR_INVALID_ARGUMENT. */
gradex_status_t gradex_check_config(size_t count, const char* const* names, const char* const* values);

/* ---- Launch information and a shared job store (additive to API version 1) ---------------------------
 * What the launcher says about this process (comm/rendezvous/launch.h: torchrun, Open MPI, MPICH /
 * Intel MPI / PMI, Slurm; the innermost launcher wins). A rank or size given without the other is
 * GRADEX_ERR_CONFIG, as are malformed values. No launcher: rank 0 of 1, local rank 0 of 1, launcher
 * "none". */
typedef struct gradex_launch_info {
  int32_t rank;
  int32_t world_size;
  int32_t local_rank;   /* -1: the launcher does not say */
  int32_t local_size;   /* ranks on this host; -1: the launcher does not say */
  uint16_t master_port; /* MASTER_PORT, else 20000 + SLURM_JOB_ID mod 10000, else 29500 */
  char master_addr[256];
  char launcher[32];    /* "torchrun", "Open MPI", "MPICH/Intel MPI", "Slurm" or "none" */
} gradex_launch_info_t;
gradex_status_t gradex_launch_info(gradex_launch_info_t* info);

/* Collective: connects to the job's TCP store (rank 0 serves it on MASTER_ADDR:MASTER_PORT), the store
 * gradex_engine_create makes when options->store is NULL, but as an object that several engines share:
 * pass it as options->store (with a store_prefix of each engine's own). It authenticates with
 * GRADEX_JOB_SECRET (docs/security.md) and waits GRADEX_TIMEOUT_S for the server. `options`: rank and
 * world_size (< 0: from the launcher), config_* as for gradex_engine_create; options->store must be NULL.
 * World size 1 needs no server (an in-process store). Destroy it after every engine that uses it. */
gradex_status_t gradex_store_connect(const gradex_engine_options_t* options, gradex_store_t** store);
/* Closes a store from gradex_store_connect (rank 0: stops serving). NULL is ignored. */
gradex_status_t gradex_store_destroy(gradex_store_t* store);

/* ---- Exact collectives: broadcast and allgather of bytes (additive to API version 1) -------------------
 * A gradex_group_t is a set of connections over which bytes travel unchanged: no engine, no codec, no
 * background thread. For what must arrive bit for bit (parameters and optimizer state at start-up, metrics,
 * torchft's exact collectives). Created collectively like an engine (options as for gradex_engine_create;
 * store_prefix NULL means "gradex/group/"); of the configuration, the connection settings apply
 * (GRADEX_TIMEOUT_S, GRADEX_IFACE, GRADEX_SHM, GRADEX_STRIPES, GRADEX_RING_CHUNK_KB, GRADEX_JOB_SECRET,
 * GRADEX_SEAL). Collectives on one group are called by one thread at a time, in the same order on every
 * rank. Every collective first agrees on its arguments in one round trip: a rank whose byte count or root
 * differs from another's, or that passed a NULL buffer, fails the call on every rank with
 * GRADEX_ERR_MISMATCH (or GRADEX_ERR_INVALID_ARGUMENT) naming the ranks and their values; the group stays
 * usable. A dead or stalled peer fails the call on every rank (GRADEX_ERR_PEER / GRADEX_ERR_TIMEOUT), and
 * gradex_group_abort (any thread) fails it with GRADEX_ERR_ABORTED; after those the group is failed: every
 * later collective returns the same error (create a new group). */
typedef struct gradex_group gradex_group_t;

gradex_status_t gradex_group_create(const gradex_engine_options_t* options, gradex_group_t** group);
/* Waits (bounded by the timeout) for every rank to leave, then releases. A failed group is released at
 * once. NULL is ignored. */
gradex_status_t gradex_group_destroy(gradex_group_t* group);
gradex_status_t gradex_group_rank(const gradex_group_t* group, int32_t* rank, int32_t* world_size);
/* Copies `bytes` bytes of rank `root`'s `data` into every other rank's `data`, bit for bit. The bytes
 * travel down a chain root -> root+1 -> ... in GRADEX_RING_CHUNK_KB pieces, each forwarded as it arrives:
 * every rank, the root included, sends them once. */
gradex_status_t gradex_group_broadcast(gradex_group_t* group, void* data, size_t bytes, int32_t root);
/* Every rank's `bytes` bytes of `data`, in rank order, into `out` (world_size * bytes bytes; `data` may be
 * out + rank * bytes), around the ring: every rank sends (world_size - 1) * bytes. */
gradex_status_t gradex_group_allgather(gradex_group_t* group, const void* data, size_t bytes, void* out);
/* From any thread: the collective in progress (or the next one) fails on this rank and its peers with
 * GRADEX_ERR_ABORTED carrying `reason` (NULL: none), within milliseconds. The group is failed afterwards. */
gradex_status_t gradex_group_abort(gradex_group_t* group, const char* reason);

/* ---- Typed settings (additive to API version 1) ------------------------------------------------------
 * The effective value of a numeric GRADEX_* setting (integer, float or boolean as 0/1) of `engine`'s
 * configuration, or of the environment's when `engine` is NULL, as gradex_describe_config shows it.
 * GRADEX_ERR_INVALID_ARGUMENT naming the variable for an undeclared name or a setting that is not a number
 * (text, choice). */
gradex_status_t gradex_get_setting_number(const gradex_engine_t* engine, const char* name, double* value);

#ifdef __cplusplus
}
#endif

#endif /* GRADEX_GRADEX_H_ */
