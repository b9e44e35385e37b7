// The one place where GRADEX_* variables are declared. Add new variables here and nowhere else.
#include <limits>

#include "base/config.h"

namespace gradex::config {

namespace {
constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kMaxCount = 9.0e15;  // element counts: exactly representable in a double
// Agreement (base/config.h), short for the table.
constexpr Agreement kPerRank = Agreement::kPerRank;
constexpr Agreement kEngine = Agreement::kEngine;
constexpr Agreement kOuter = Agreement::kOuter;
constexpr Agreement kAllRanks = Agreement::kAllRanks;
}  // namespace

const std::vector<VarSpec>& registry() {
  // clang-format off
  static const std::vector<VarSpec> vars = {
    // --- transport and bootstrap ---
    {"GRADEX_TIMEOUT_S", VarType::kFloat, "300", 0, 86400, true, false, nullptr, kPerRank,
     "Seconds any blocking operation (bootstrap, collective, wait) may take before it fails with an "
     "error naming the operation and the peer."},
    {"GRADEX_IFACE", VarType::kString, "", 0, 0, false, false, nullptr, kPerRank,
     "Network device(s) UCX may use, e.g. 'eth0' or 'eth0,eth1' (passed to UCX as its net device "
     "list). Empty: UCX decides (shared memory inside a host, tcp across hosts)."},
    {"GRADEX_RING_CHUNK_KB", VarType::kInt, "256", 1, 1048576, false, false, nullptr, kAllRanks,
     "Pipelining chunk of the ring collectives, in KiB: each ring step is sent in chunks of this size "
     "so that reduction overlaps transfer."},
    {"GRADEX_STRIPES", VarType::kChoice, "auto", 0, 0, false, false, "auto|1|2|3|4|5|6|7|8", kAllRanks,
     "TCP connections to each peer, over which the ring collectives spread their chunks (striping: "
     "each connection is its own flow with its own window, which on a long path the kernel's "
     "socket buffers cap). auto: 1 on one host; across hosts rank 0 times a round trip to its "
     "farthest peer at start-up and every rank opens as many connections to each peer on another "
     "host as the kernel's socket buffer maximum needs to carry 10 Gbit/s at that round trip, at "
     "most 4 (1 on a LAN). N: N connections to every peer not reached through shared memory."},
    {"GRADEX_ALLGATHER_INLINE_KB", VarType::kInt, "4", 0, 1024, false, false, nullptr, kEngine,
     "Allgathervs (negotiation rounds, DGC payloads) whose payloads are at most this many KiB take "
     "one round trip: each payload travels in one message with its size, into receives of this "
     "size posted for every peer. A larger payload announces its size in that message and follows "
     "in a second round (0: every payload does, the two-round exchange). Each rank keeps one "
     "receive buffer of this size per peer. Above UCX tcp's 8 KiB send segment, a message that "
     "reaches a rank before it enters the collective takes UCX's slower unexpected-message path: "
     "4 KiB kept ResNet-50 DGC steps at parity with the two-round exchange where 16-64 KiB made "
     "them 6-30% slower (docs/benchmarks.md)."},
    {"GRADEX_TCP_PACING", VarType::kBool, "1", 0, 0, false, false, nullptr, kPerRank,
     "gradex's own TCP connections to other hosts are paced by the kernel (SO_MAX_PACING_RATE, "
     "no rate cap: Linux 4.20+ then spreads each window over the round trip, no fq qdisc needed). "
     "Unpaced, each flow sends its window in one burst; the bursts of several flows at once (an "
     "exchange with every peer, the lanes of a delayed exchange) overflow shallow switch and "
     "shaper queues, and every drop costs a round trip: on the emulated 1 Gbit/s, 50 ms path "
     "pacing cut the drops 4x and took an MLP's steps/s from 2.12 to 4.84 (4.03 to 6.58 with "
     "GRADEX_DELAY=auto; docs/wan.md). 0: the "
     "kernel's default. Connections inside a host and other libraries' sockets are never touched."},
    {"GRADEX_SHM", VarType::kBool, "0", 0, 0, false, false, nullptr, kPerRank,
     "Ranks on the same host (same kernel and network namespace) exchange through shared memory: "
     "about 3x the bus bandwidth of loopback tcp here. Off by default: UCX 1.13 cannot report the "
     "death of a shared-memory peer, and a stopped (SIGSTOP) peer was seen to hang another rank's "
     "cleanup inside UCX. With 0 every peer uses tcp with immediate failure detection. The "
     "hierarchical exchange (GRADEX_HIERARCHICAL) uses shared memory inside hosts unless this is "
     "set to 0 explicitly; a dead shared-memory peer is then found by a process check within about "
     "100 ms."},
    {"GRADEX_HOST_ID", VarType::kString, "", 0, 0, false, false, nullptr, kPerRank,
     "Names this rank's host: ranks with equal values count as one host (shared memory between "
     "them, one host of the hierarchical exchange). Empty: derived from the hostname, boot id and "
     "network namespace. For tests that emulate several hosts with the processes of one machine."},
    {"GRADEX_HIERARCHICAL", VarType::kChoice, "auto", 0, 0, false, false, "auto|0|1", kEngine,
     "Hierarchical exchange: dense buckets are reduced inside each host (shared memory), summed "
     "across hosts by one ring per local rank over its shard, and copied back inside the host; "
     "DGC selections are summed inside each host and re-selected by an owner rank (what it drops "
     "returns to its residual), so one payload per host and tensor crosses hosts; 8-bit and "
     "4-bit units go encoded to each shard's owner inside the host, whose host sum crosses hosts "
     "among the owners, and come back as the owners' result encodings. Same-host peers then use shared memory (unless GRADEX_SHM=0 is set), watched by a process "
     "check. auto: on when the job spans at least two hosts and some host holds at least two "
     "ranks; 1: always (one host: reduce inside it only); 0: the flat ring over all ranks."},
    {"GRADEX_HIERARCHY_TIER", VarType::kChoice, "auto", 0, 0, false, false, "auto|host|region",
     kEngine,
     "The groups the hierarchical exchange (GRADEX_HIERARCHICAL) reduces inside before the slow "
     "tier. host: the machines (GRADEX_HOST_ID). region: groups of hosts whose round trips cluster "
     "(measured at start-up between every pair of hosts, a WAN's tens of ms against a LAN's "
     "fraction of one), or as GRADEX_REGION declares: inside a region over its fast links, one "
     "payload per region and lane across. auto: regions when they are declared, or when the job "
     "has at least 3 hosts and the measured regions are at least 5 ms apart, some region holds "
     "two hosts or more and every region as many ranks as the others (a smaller region would run "
     "the missing lanes one after another); else hosts."},
    {"GRADEX_REGION", VarType::kString, "", 0, 0, false, false, nullptr, kPerRank,
     "Declares this rank's region: ranks with equal names form one region of the hierarchical "
     "exchange (GRADEX_HIERARCHY_TIER), without measuring round trips. Set it on every rank or on "
     "none (a job with some ranks declaring and others not stops at start-up naming both)."},
    {"GRADEX_STALL_WARN_S", VarType::kFloat, "60", 0, 86400, false, false, nullptr, kPerRank,
     "When some ranks have submitted a tensor and others have not for this many seconds, rank 0 "
     "logs which ranks are late and which keys they miss (then at most once per this interval), "
     "long before the GRADEX_TIMEOUT_S error. 0: off."},
    {"GRADEX_JOB_SECRET", VarType::kString, "", 0, 0, false, false, nullptr, kPerRank,
     "A secret shared by every rank of the job. When set, the gradex TCP store and its clients "
     "authenticate each other, published UCX addresses carry an HMAC, and every pair of ranks "
     "proves knowledge of the secret (HMAC-SHA256 challenge-response) before any data is exchanged; "
     "a client or rank without it is refused. Never printed (gradex-config shows '<hidden>'). "
     "Prefer GRADEX_JOB_SECRET_FILE: the environment is visible to other processes of the user. "
     "See docs/security.md for what the secret covers."},
    {"GRADEX_JOB_SECRET_FILE", VarType::kString, "", 0, 0, false, false, nullptr, kPerRank,
     "Path of a file holding the job secret (a trailing newline is ignored), for secrets that "
     "must not sit in the environment. Setting both this and GRADEX_JOB_SECRET, an unreadable "
     "file or an empty secret is an error."},
    {"GRADEX_SEAL", VarType::kChoice, "auto", 0, 0, false, false, "auto|on|off", kAllRanks,
     "Whether every message between ranks (gradients of every route, parameters, negotiation, "
     "aborts, the outer optimizer's traffic) is authenticated and encrypted with keys of its "
     "connection: ephemeral X25519 per pair of ranks bound to the job secret, HKDF-SHA256, then "
     "AES-256-GCM (ChaCha20-Poly1305 on CPUs without AES instructions), with sequence numbers that "
     "refuse replayed, reordered and injected messages. auto: sealed whenever a job secret is set. "
     "on: sealed, and a start-up error without a secret. off: in clear even with a secret (a "
     "warning). See docs/security.md."},
    {"GRADEX_LOG_LEVEL", VarType::kChoice, "warn", 0, 0, false, false, "error|warn|info|debug", kPerRank,
     "How much gradex writes to stderr."},
    {"GRADEX_LIBRARY", VarType::kString, "", 0, 0, false, false, nullptr, kPerRank,
     "Path of the libgradex.so the Python package loads (read by the package before any engine "
     "exists). Empty: the one installed beside the package. For trying another build of the "
     "library (a debug or coverage build) under an installed package."},
    {"GRADEX_STATS_EVERY", VarType::kInt, "0", 0, 1e9, false, false, nullptr, kPerRank,
     "Every N completed steps rank 0 logs one line with the last N steps' compression ratio, MB "
     "sent, exchange milliseconds and saturated/non-finite counts (at info level, whatever "
     "GRADEX_LOG_LEVEL says). 0: off."},
    {"GRADEX_TIMELINE", VarType::kString, "", 0, 0, false, false, nullptr, kPerRank,
     "A directory (created if missing) where every rank writes a Chrome-trace / Perfetto JSON "
     "timeline of its steps, rank<r>.json (a process's further engines: rank<r>.<n>.json): "
     "submissions, negotiation rounds, each unit's encode, transfer (route, codec, bytes) and "
     "decode, every peer's sends and receives with bytes, completions, waits and the time the "
     "framework waited on gradex. Buffered, flushed every second and at shutdown; "
     "`gradex-bench timeline DIR` merges the ranks onto one clock. Empty: off."},
    // --- policy ---
    {"GRADEX_DENSE_THRESHOLD", VarType::kInt, "16384", 0, kMaxCount, false, false, nullptr, kEngine,
     "GRADEX_POLICY=fixed: tensors with fewer elements than this are exchanged dense (fused into "
     "buckets); larger ones use DGC. Setting it selects the fixed policy when GRADEX_POLICY is not "
     "given."},
    {"GRADEX_FUSION_MB", VarType::kFloat, "64", 0, 4096, false, false, nullptr, kEngine,
     "Size of the fusion buckets for dense tensors, in MiB (0: no fusion, one allreduce per tensor)."},
    {"GRADEX_FP16", VarType::kBool, "1", 0, 0, false, false, nullptr, kEngine,
     "Dense exchanges (and LocalSGD averaging) use 16-bit values on the wire (see "
     "GRADEX_HALF_TYPE); 0 sends fp32."},
    {"GRADEX_HALF_TYPE", VarType::kChoice, "fp16", 0, 0, false, false, "fp16|bf16", kEngine,
     "The 16-bit type used when GRADEX_FP16=1: fp16 (more precision) or bf16 (fp32's range)."},
    {"GRADEX_SPARSITY_OVERRIDES", VarType::kString, "", 0, 0, false, false, nullptr, kEngine,
     "Per-tensor policy by name pattern, comma-separated 'pattern:value' pairs, first match wins; "
     "value is a sparsity in [0, 1), 'dense', 'int8' (dense with 8-bit codes and error "
     "feedback on both hops of a reduce-scatter + allgather) or 'int4' (the same with 4-bit "
     "codes), e.g. 'embed:0.99,fc:0.999,bn:dense,head:int8'. A pattern "
     "without glob characters matches as a substring of the tensor name; one with '*', '?' or "
     "'[...]' matches the whole name as a shell glob (fnmatch)."},
    {"GRADEX_NONFINITE", VarType::kChoice, "propagate", 0, 0, false, false, "propagate|zero|error", kEngine,
     "What to do with NaN/Inf in a submitted gradient. Every rank learns in negotiation that some "
     "rank's gradient of a tensor is non-finite, and then no rank changes that tensor's momentum or "
     "residual: propagate gives every rank an all-NaN average (so AMP's grad scaler skips the step "
     "everywhere); error fails the tensor's handle on every rank, naming the ranks; zero replaces the "
     "bad values by 0 on the rank that has them, and the step proceeds normally. Always counted."},
    // --- DGC ---
    {"GRADEX_POLICY", VarType::kChoice, "auto", 0, 0, false, false, "auto|fixed", kEngine,
     "How each tensor's codec is chosen. fixed: GRADEX_SPARSITY_OVERRIDES, then dense below "
     "GRADEX_DENSE_THRESHOLD, then DGC at GRADEX_SPARSITY. auto (the default; CUDA tensors keep "
     "the fixed policy): "
     "from a measured cost model (link latency and bandwidth probed at start-up and refined from "
     "every collective, codec costs measured at start-up and corrected by what each codec's units "
     "measure, when each tensor "
     "becomes ready, the measured step tail), all ranks using rank 0's numbers: the least "
     "compression (fp32, 16-bit, 8-bit with error feedback, DGC at a GRADEX_POLICY_LADDER "
     "sparsity) whose communication stays "
     "hidden behind the backward pass, harder only as far as the link requires. The first plan is "
     "made at the first exchange from the probe and the registered sizes (no compute measured yet: "
     "as hard as the link requires, no harder than GRADEX_POLICY_RAMP_STEPS' early-training cap), "
     "refined at step 4, at each quarter of that ramp and every GRADEX_POLICY_INTERVAL steps. "
     "Overrides win in both. Left unset while GRADEX_SPARSITY, GRADEX_WARMUP_STEPS or "
     "GRADEX_DENSE_THRESHOLD is given, the fixed policy those settings describe runs (logged once); "
     "a setting of the policy not running (GRADEX_POLICY=auto with those, fixed with a "
     "GRADEX_POLICY_* setting other than the horizon) is an error naming both."},
    {"GRADEX_POLICY_INTERVAL", VarType::kInt, "20", 1, 1e9, false, false, nullptr, kEngine,
     "GRADEX_POLICY=auto: steps between re-evaluations after the first two plans (steps 0 and "
     "min(4, this)); a tensor's codec changes only when its exchange counter reaches such a step "
     "(an agreed step)."},
    {"GRADEX_POLICY_LADDER", VarType::kString, "0.9,0.99,0.999", 0, 0, false, false, nullptr, kEngine,
     "GRADEX_POLICY=auto: the DGC sparsities it may choose, ascending, comma-separated, each in "
     "(0, 1)."},
    {"GRADEX_POLICY_SLACK", VarType::kFloat, "0.05", 0, 10, false, false, nullptr, kEngine,
     "GRADEX_POLICY=auto: communication may end this fraction of the step's compute time after the "
     "backward pass and still count as hidden (the plugins wait for every average before the "
     "optimizer step, so that much is the step's delay)."},
    {"GRADEX_POLICY_DENSE_STEPS", VarType::kInt, "0", 0, 1e15, false, false, nullptr, kEngine,
     "GRADEX_POLICY=auto: no DGC before this exchange step (a hard dense warm-up, whatever it "
     "costs; 0: none, the plans alone decide, dense wherever the link or compute allows)."},
    {"GRADEX_POLICY_RAMP_STEPS", VarType::kInt, "100", 0, 1e15, false, false, nullptr, kEngine,
     "GRADEX_POLICY=auto: the fidelity ramp of early training. Over the first this many exchange "
     "steps the most DGC sparsity a plan may choose follows DGC's warm-up (75%, 93.75%, 98.4%, "
     "99.6% in quarters, capped by GRADEX_POLICY_LADDER's top); the choice stays cost-aware below "
     "the cap (dense where the link hides it), and a plan is made at each quarter. 0: no ramp."},
    {"GRADEX_POLICY_HORIZON_STEPS", VarType::kInt, "0", 0, 1e15, false, false, nullptr, kEngine,
     "GRADEX_POLICY=auto: how many exchange steps the training will run (0: unknown). Error "
     "feedback delays a coordinate's update by about 1/density steps and what is left in the "
     "residuals at the end is never applied, so with a horizon the most DGC sparsity at step t is "
     "1 - 10/(horizon - t): a short training is compressed little or not at all, a long one "
     "hardly until its last steps, which are dense. No cap past the horizon."},
    {"GRADEX_POLICY_MIN_SELECTED", VarType::kInt, "128", 1, kMaxCount, false, false, nullptr, kEngine,
     "GRADEX_POLICY=auto: a DGC sparsity is allowed for a tensor only when it keeps at least this "
     "many values a step (per-layer top-k of a few values, e.g. 20 of a 2048x10 output layer at "
     "99.9%, was seen to cost accuracy)."},
    {"GRADEX_POLICY_INT8", VarType::kBool, "0", 0, 0, false, false, nullptr, kEngine,
     "GRADEX_POLICY=auto: the 8-bit rung (dense, 8-bit codes with error feedback, half of 16-bit's "
     "bytes; sync/data/int8_exchange.h) between 16-bit and DGC. Opt-in: with 4 ranks on 2 shared "
     "cores at 1 Gbit/s the 8-bit exchange measured slower than the 16-bit ring although it sends "
     "half the bytes (it is CPU-bound there), and the cost model does not predict that yet. The "
     "'int8' override of GRADEX_SPARSITY_OVERRIDES works either way. Unset under an Adam-family "
     "optimizer (GRADEX_OPTIMIZER=adam) it is on, and takes the Adam codec's place on the ladder: "
     "see GRADEX_ADAM_SPARSITY."},
    {"GRADEX_POLICY_INT4", VarType::kBool, "1", 0, 0, false, false, nullptr, kEngine,
     "GRADEX_POLICY=auto: the 4-bit rung before DGC's (dense, 4-bit codes with error feedback on "
     "the 8-bit route, a quarter of 16-bit's bytes), taken where 16-bit (and 8-bit, when on) would "
     "not hide; the 'int4' override of GRADEX_SPARSITY_OVERRIDES works either way. Under SGD it "
     "reached the LAN race's target at 1 Gbit/s 1.4-1.6x sooner than the ladder without it on all "
     "four tasks (two seeds each, at DDP's steps, within 0.2 points of DDP's final accuracy where "
     "DGC's capped rungs ended up to 1.8 points below). Unset under an Adam-family optimizer "
     "(GRADEX_OPTIMIZER=adam) it is on while the Adam codec is off the ladder (see "
     "GRADEX_ADAM_SPARSITY)."},
    {"GRADEX_POLICY_FIDELITY_INT8", VarType::kBool, "1", 0, 0, false, false, nullptr, kEngine,
     "GRADEX_POLICY=auto: where a fidelity cap (the early-training ramp of "
     "GRADEX_POLICY_RAMP_STEPS, the end-of-training rule of GRADEX_POLICY_HORIZON_STEPS) leaves no "
     "DGC rung that sends less than the 16-bit ring (at 4 ranks: the ramp's first quarter, the "
     "horizon's last dense steps), the 8-bit rung (every coordinate, 8-bit codes with error "
     "feedback, about half the bytes) is on the ladder even without GRADEX_POLICY_INT8; the cost "
     "model takes it only where a dense 16-bit step would not hide and 8-bit is cheaper. Across 4 "
     "hosts at 100 Mbit/s, 25 ms it took two race tasks to their targets 1.5-1.6x sooner than "
     "16-bit under the caps, at the same steps and final accuracy. 0: 16-bit under the caps. "
     "Unset under an Adam-family optimizer (GRADEX_OPTIMIZER=adam) it is off: there the 8-bit "
     "rung is on the ladder at every step unless GRADEX_POLICY_INT8=0, and with that setting "
     "(Adam codec and 16-bit under the caps) it had ended AdamW 1.1-1.4 points lower on two race "
     "tasks."},
    {"GRADEX_POLICY_MIN_PER_ROW", VarType::kFloat, "1", 0, 1e9, false, false, nullptr, kEngine,
     "GRADEX_POLICY=auto: for tensors registered with their row count "
     "(gradex_register_tensor_rows), a DGC sparsity must keep at least this many values per row."},
    // Agreed although it looks local: the probe is collective (rank 0 ping-pongs with its peers)
    // and its numbers are the ones every rank plans from.
    {"GRADEX_POLICY_PROBE", VarType::kBool, "1", 0, 0, false, false, nullptr, kEngine,
     "GRADEX_POLICY=auto: measure the link with a short probe in the engine's start (rank 0 with "
     "one peer per peer class: ping-pongs of 8 B to 256 KiB, none to a peer the start timed 10 ms "
     "or more away, then streams and incast bursts); 0: start from defaults and learn from the "
     "collectives only."},
    {"GRADEX_POLICY_LEARN_LINK", VarType::kBool, "1", 0, 0, false, false, nullptr, kEngine,
     "GRADEX_POLICY=auto: refit the link's latency and rate, each codec's measured-over-"
     "predicted factor and the step's calibration from the collectives' timings as training "
     "runs; 0 plans from the start-up probe's numbers and the codecs' calibrated costs only. The "
     "delayed exchange's lanes (GRADEX_DELAY >= 2) set 0: their collectives share the link with "
     "each other's, so each lane's timings read it slower than it is, and a lane's step ends "
     "before its exchange does."},
    {"GRADEX_SPARSITY", VarType::kFloat, "0.999", 0, 1, false, true, nullptr, kEngine,
     "GRADEX_POLICY=fixed: target DGC sparsity after warm-up, the fraction of elements NOT sent "
     "each step. Setting it selects the fixed policy when GRADEX_POLICY is not given."},
    {"GRADEX_WARMUP_STEPS", VarType::kInt, "0", 0, 1e9, false, false, nullptr, kEngine,
     "Steps over which sparsity ramps exponentially 0.75, 0.9375, 0.984375, 0.996 to "
     "GRADEX_SPARSITY (0: the target from the first step). GRADEX_POLICY=fixed's: setting it "
     "selects the fixed policy when GRADEX_POLICY is not given."},
    {"GRADEX_MOMENTUM", VarType::kFloat, "0", 0, 1, false, true, nullptr, kEngine,
     "Momentum m owned by gradex (u = m*u + g). With m > 0 gradex applies momentum on every path: "
     "dense-policy tensors and DGC's dense warm-up steps send u (SGD with momentum on the average), "
     "DGC's sparse steps use momentum correction, LocalSGD's local steps get it in place; the "
     "optimizer must then run with momentum 0. m = 0 (the default): gradients are exchanged as they "
     "are (plain error-feedback top-k for DGC) and the optimizer's own momentum applies, so an "
     "optimizer that keeps its own first moment (Adam, AdamW, ...) is never changed. The PyTorch "
     "plugin sets it from the optimizer it is given (SGD's momentum, which it then takes over)."},
    {"GRADEX_NESTEROV", VarType::kBool, "0", 0, 0, false, false, nullptr, kEngine,
     "Nesterov momentum on every path: send g + m*u instead of u (DGC: v += g + m*u)."},
    {"GRADEX_OPTIMIZER", VarType::kChoice, "unknown", 0, 0, false, false, "unknown|sgd|adam|other", kEngine,
     "The optimizer family that consumes the averaged gradients, as the plugins learn it (gx.State("
     "optimizer=), gx.DistributedOptimizer, the Keras optimizer). adam: an optimizer that keeps its "
     "own moments (Adam, AdamW, NAdam, RAdam, LAMB, Lion, Adafactor, RMSprop with momentum, Keras "
     "beta_1 optimizers): tensors the policy compresses use the Adam codec (top-k of a decaying "
     "first-moment buffer with error feedback, GRADEX_ADAM_DECAY) at GRADEX_ADAM_SPARSITY instead of "
     "DGC at GRADEX_SPARSITY. unknown, sgd, other: DGC as before. other (the plugins set it for "
     "Muon, Dion, Shampoo, SOAP, GaLore, Adagrad, RMSprop without momentum and unknown classes) "
     "and adam also keep GRADEX_DELAY=auto at 0: the delayed exchange's correction carries "
     "through SGD's linear update only."},
    {"GRADEX_ADAM_SPARSITY", VarType::kFloat, "0.98", 0, 1, false, true, nullptr, kEngine,
     "Sparsity of the Adam codec (GRADEX_OPTIMIZER=adam): the fraction of a compressed tensor's "
     "elements NOT sent each step (GRADEX_SPARSITY_OVERRIDES entries still win; 0: dense). When "
     "GRADEX_SPARSITY is set explicitly and this is not, GRADEX_SPARSITY applies. GRADEX_POLICY=auto "
     "puts the Adam codec on its ladder only when this (or GRADEX_SPARSITY) is set or "
     "GRADEX_POLICY_INT8=0; by default its compressed rungs under Adam are 8-bit and then 4-bit "
     "with error feedback (GRADEX_POLICY_INT4); 8-bit alone "
     "at 100 Mbit/s ended AdamW at most 0.5 points below DDP's final accuracy on two race "
     "tasks (two seeds) where the Adam codec ended 0.5-1.2 below (at 0.68-0.73x the codec's steps "
     "per second)."},
    {"GRADEX_ADAM_DECAY", VarType::kFloat, "0.9", 0, 1, false, false, nullptr, kEngine,
     "Decay b of the Adam codec's local buffer m <- b*m + g, of which the top-k is sent and "
     "subtracted: what is not sent fades by b per step. 1: DGC's error-feedback top-k without "
     "momentum."},
    {"GRADEX_ADAM_TRANSFORM", VarType::kChoice, "dct", 0, 0, false, false, "dct|none", kEngine,
     "Where the Adam codec keeps its buffer and selects: dct, the coefficients of a chunked 2-D "
     "DCT of the tensor's [rows, cols] view (DeMo's transform, GRADEX_ADAM_DCT_CHUNK; every element "
     "receives part of the average each step); none, the elements themselves (the codec before "
     "the DCT). A checkpoint restores only under the transform and chunk that saved it."},
    {"GRADEX_ADAM_DCT_CHUNK", VarType::kInt, "64", 1, 256, false, false, nullptr, kEngine,
     "Largest block side of the Adam codec's chunked DCT (GRADEX_ADAM_TRANSFORM=dct): each "
     "dimension is cut into blocks of its largest divisor not above this."},
    {"GRADEX_CLIP_NORM", VarType::kFloat, "0", 0, kInf, false, false, nullptr, kEngine,
     "Gradient clipping on each rank before momentum and accumulation, at clip_norm * "
     "world_size^-1/2 of the norm of the whole step's gradient, which the plugin passes through "
     "gradex_set_gradient_norm before the step's first submit (without it, each tensor's own norm). "
     "Dense and DGC tensors alike. 0: off."},
    {"GRADEX_SAMPLE_RATIO", VarType::kFloat, "0.01", 0, 1, true, false, nullptr, kPerRank,
     "Fraction of elements sampled to estimate the DGC selection threshold."},
    {"GRADEX_SPARSE_VALUES", VarType::kChoice, "fp16", 0, 0, false, false, "fp32|fp16|bf16", kEngine,
     "Type of the values in sparse payloads. 16-bit values keep their rounding error in the residual."},
    {"GRADEX_INDEX_CODING", VarType::kChoice, "auto", 0, 0, false, false, "auto|varint|rice|bitmap", kPerRank,
     "Index coding of sparse payloads; auto picks the smallest for each payload."},
    {"GRADEX_SPARSE_COLLECTIVE", VarType::kChoice, "auto", 0, 0, false, false, "auto|ring|direct", kEngine,
     "How the sparse payloads of a round are gathered: ring (each link carries one payload at a "
     "time; two rounds), direct (every rank sends to every other at once: P-1 payloads on each "
     "uplink, which overflows switch ports at 8 hosts and more; one round trip, the receivers "
     "learning each payload's length on arrival) or auto: direct, or for the payloads above "
     "the inline maximum (GRADEX_ALLGATHER_INLINE_KB) the ring where the cost model (the link "
     "probe's alpha and beta, agreed from rank 0, and every rank's payload size) predicts it "
     "faster, counting an overflow of GRADEX_PORT_QUEUE_MS across hosts as a retransmission "
     "timeout; on a latency-bound link (5 ms or more) auto skips the size round from the second "
     "gather on, pricing the previous gather's sizes. Same results either way."},
    {"GRADEX_DENSE_COLLECTIVE", VarType::kChoice, "auto", 0, 0, false, false, "auto|ring|direct|gather", kEngine,
     "How a dense bucket is summed: ring (2(P-1) message latencies, one message in and out of each "
     "rank at a time), direct (a reduce-scatter to each segment's owner and an allgather from it: "
     "2 message latencies whatever the world size, P-1 messages into each rank at once; two ranks "
     "swap their buffers in 1) or auto: "
     "direct where the link model (the link probe's alpha and beta, agreed from rank 0, with "
     "GRADEX_PORT_QUEUE_MS's incast term across hosts) predicts it at least 10% faster, as on links "
     "whose latency outweighs a bucket's bytes. Same bits either way (the owner sums in the ring's "
     "order). On a latency-bound link (5 ms or more) auto also lets a round's small dense "
     "gradients ride its DGC gather instead of a collective of their own: every rank's values in "
     "full, summed in rank order on every rank (the same bits everywhere, not the ring's), while "
     "the extra bytes received cost less than the two message latencies saved. gather: every dense "
     "gradient of a round that has a DGC unit rides it, whatever its size. The hierarchical "
     "exchange takes the same choice for its step across hosts or regions (auto: direct there "
     "only on a latency-bound link, always between two groups); nothing rides it."},
    {"GRADEX_PORT_QUEUE_MS", VarType::kFloat, "1", 0, 1000, false, false, nullptr, kEngine,
     "How much traffic a switch port between hosts buffers, in milliseconds at the link's measured "
     "bandwidth. The auto collectives send payloads directly only while what one rank receives at "
     "once fits it (beyond, TCP incast drops packets and waits for retransmission timeouts), and "
     "cap the inline maximum across hosts to fit it. Left unset, the link probe also measures two "
     "incast bursts (1 MiB, then 4 MiB from every rank on another host than rank 0 at once, each "
     "at most 16 MiB in all and what the link's fit moves in 0.5 s) and prices arrivals up to a "
     "burst's size at what the smallest burst at least that large cost beyond its transfer; set, "
     "the value is taken as written and no burst is measured. Ignored when every rank is on one "
     "host."},
    {"GRADEX_BACKEND", VarType::kChoice, "cpu", 0, 0, false, false, "cpu|thrust-omp|classic", kPerRank,
     "Which backend computes on tensors in host memory: cpu (the CPU kernels) or thrust-omp (the "
     "CUDA backend's Thrust code on OpenMP; the same results, slow, for tests). classic is the old "
     "name of cpu, kept so existing settings still parse. CUDA tensors always use the CUDA backend."},
    {"GRADEX_SPARSE_GROUP_MB", VarType::kFloat, "16", 0, 4096, false, false, nullptr, kEngine,
     "DGC tensors ready together travel in groups of consecutive tensors (key order) holding at "
     "least this many MB of fp32 gradient; a larger tensor travels alone (0: every DGC tensor "
     "alone). Each group is one allgatherv: the next group compresses on the worker pool while "
     "one is on the wire, and a group's handles complete as soon as it is decoded. Smaller groups "
     "overlap more but each costs a collective (about 0.2 ms of CPU per rank here)."},
    {"GRADEX_ZSTD_LEVEL", VarType::kInt, "0", 0, 22, false, false, nullptr, kPerRank,
     "zstd level applied to payloads where it shrinks them (0: off)."},
    {"GRADEX_THREADS", VarType::kInt, "0", 0, 256, false, false, nullptr, kPerRank,
     "Threads of gradex's worker pool (one per process, created at first use, never per call): "
     "compression (a unit's tensors spread over it, large tensors split), 16-bit casts and sums of "
     "large tensors (0: the hardware's, at most 8). Results do not depend on it."},
    // --- delayed exchange (sync/delay/) ---
    {"GRADEX_DELAY", VarType::kChoice, "0", 0, 0, false, false, "auto|0|1|2|3|4|5|6|7|8", kEngine,
     "Delayed Gradient Averaging: with D > 0 a tensor's exchange of step t runs while step t+1 "
     "computes, and the gradient a step gets is g_t + (avg_{t-D} - g_{t-D}) (its own gradient alone "
     "for the first D steps): every rank applies the same averaged past and differs only by its last "
     "D local gradients. Codecs, error feedback and momentum run on the exchanged copy as with 0. "
     "Host tensors only (CUDA tensors keep 0). D >= 2 runs D lanes (engines of their own), so that D "
     "exchanges of a tensor are in flight. auto: measures steps 5-10 without delay (2-5 where the "
     "start's round trips say the path is long) and, from the numbers agreed over ranks, keeps 0 when the framework waited at most 5% of a step's compute on "
     "gradex, else takes the least D that hides the wait, at most 2; at most 1 on a link that is not "
     "latency-bound, and 0 there where the ranks outnumber their host's cores (gx.explain says why). "
     "0: no delay. Refused with LocalSGD and DiLoCo (1-8), and by torchft's reconfigure and step "
     "transactions while D > 0; gx.synchronize() drains it."},
    {"GRADEX_DELAY_RULE", VarType::kChoice, "correct", 0, 0, false, false, "correct|stale", kEngine,
     "What a delayed step (GRADEX_DELAY > 0) applies: correct, g_t + (avg_{t-D} - g_{t-D}) (Delayed "
     "Gradient Averaging's local correction: this step's own gradient is not lost); stale, avg_{t-D} "
     "alone (plain staleness, kept for comparison: docs/tuning.md)."},
    // --- LocalSGD ---
    {"GRADEX_LOCALSGD_PERIOD", VarType::kInt, "0", 0, 1e6, false, false, nullptr, kEngine,
     "LocalSGD: when > 0, gradients are not exchanged and parameters are averaged every H steps."},
    {"GRADEX_LOCALSGD_WARMUP_STEPS", VarType::kInt, "0", 0, 1e9, false, false, nullptr, kEngine,
     "LocalSGD: fully synchronous steps before local steps begin (post-local SGD)."},
    // --- DiLoCo outer optimization (outer/) ---
    {"GRADEX_OUTER_PERIOD", VarType::kInt, "100", 1, 1e6, false, false, nullptr, kOuter,
     "DiLoCo: inner steps H between two synchronizations of a fragment (its pseudo-gradient "
     "theta_global - theta_local is averaged and an outer optimizer step applied)."},
    {"GRADEX_OUTER_LR", VarType::kFloat, "0.7", 0, 10, true, false, nullptr, kOuter,
     "DiLoCo: outer learning rate applied to the averaged pseudo-gradient."},
    {"GRADEX_OUTER_MOMENTUM", VarType::kFloat, "0.9", 0, 1, false, true, nullptr, kOuter,
     "DiLoCo: outer momentum (0: plain outer SGD)."},
    {"GRADEX_OUTER_NESTEROV", VarType::kBool, "1", 0, 0, false, false, nullptr, kOuter,
     "DiLoCo: Nesterov momentum for the outer step (0: heavy ball)."},
    {"GRADEX_OUTER_FRAGMENTS", VarType::kInt, "1", 1, 4096, false, false, nullptr, kOuter,
     "DiLoCo: the model is split into this many fragments of contiguous tensors; fragment f "
     "synchronizes at steps t with t mod H = floor(f * H / F) (Streaming DiLoCo). At most the "
     "number of parameter tensors."},
    {"GRADEX_OUTER_DELAY", VarType::kInt, "0", 0, 1e6, false, false, nullptr, kOuter,
     "DiLoCo: inner steps between the start of a fragment's exchange (in the background) and its "
     "merge into the model; must be below GRADEX_OUTER_PERIOD. With delay >= 1 the training loop "
     "waits on the network only when an exchange takes longer than that many steps."},
    {"GRADEX_OUTER_MIXING", VarType::kFloat, "0", 0, 1, false, true, nullptr, kOuter,
     "DiLoCo: at a merge the local copy becomes (1 - a) * theta_global + a * theta_local (a = "
     "this value; 0 replaces the local copy by the global one)."},
    {"GRADEX_OUTER_BITS", VarType::kChoice, "4", 0, 0, false, false, "4|8|32|topk", kOuter,
     "DiLoCo: pseudo-gradients travel as 4- or 8-bit block-quantized codes with error feedback "
     "(summed in fp32), as exact fp32 (32), or as the top-k entries of each fragment's "
     "pseudo-gradient by magnitude with error feedback (topk: fp32 values and indices, "
     "allgathered and summed in rank order; see GRADEX_OUTER_DENSITY). 4 bits lost nothing "
     "against 8 on the LM race's transformer at half the bytes (docs/benchmarks.md)."},
    {"GRADEX_OUTER_DENSITY", VarType::kFloat, "0.01", 0, 1, true, false, nullptr, kOuter,
     "DiLoCo with GRADEX_OUTER_BITS=topk: fraction of each fragment's elements sent per "
     "synchronization (k = ceil(density * elements)); 1 sends every non-zero entry."},
    {"GRADEX_OUTER_BLOCK", VarType::kInt, "64", 2, 65536, false, false, nullptr, kOuter,
     "DiLoCo: elements per quantization block (one scale each); must be even."},
    {"GRADEX_OUTER_SCALE", VarType::kChoice, "fp32", 0, 0, false, false, "fp32|fp16", kOuter,
     "DiLoCo: type of the per-block quantization scales."},
    {"GRADEX_OUTER_ROUNDING", VarType::kChoice, "nearest", 0, 0, false, false,
     "nearest|stochastic", kOuter,
     "DiLoCo: quantization rounding; stochastic draws from a counter-based generator seeded by "
     "GRADEX_OUTER_SEED and the rank, so every run is reproducible."},
    {"GRADEX_OUTER_SEED", VarType::kInt, "0", 0, 9.0e15, false, false, nullptr, kOuter,
     "DiLoCo: seed of stochastic rounding."},
    // --- tests ---
    {"GRADEX_TEST_SEAL_TAMPER", VarType::kString, "", 0, 0, false, false, nullptr, kPerRank,
     "Test hook: 'KIND:N' alters the N-th sealed message this rank sends as an attacker on the path "
     "would (flip: one bit; truncate: its last byte cut; replay: the previous message to the same "
     "peer sent again in its place; forge: sealed under a key nobody derived). The receiving rank "
     "must refuse it. Empty: off."},
    {"GRADEX_TEST_FAIL_ROUND", VarType::kInt, "0", 0, 1e9, false, false, nullptr, kPerRank,
     "Test only: this rank's engine fails on its own (an InternalError in its progress thread) "
     "just before its N-th negotiation round, as a bug or a corrupt payload would; the other "
     "ranks must then fail at once naming it (0: never)."},
    {"GRADEX_TEST_DELAY_LANES", VarType::kChoice, "0", 0, 0, false, false, "0|1|late|long",
     kPerRank,
     "Test only: GRADEX_DELAY=auto treats the link as latency-bound, so that a test on one machine "
     "reaches its switch to several exchanges in flight (lanes) mid-run. 1: the lanes connect "
     "from the first registration and take over at the decision; late: they connect only at the "
     "decision and take over at the next step (D = 1 meanwhile), as lanes that had not connected "
     "in time; long: as 1, where the start said the path is long (the short window, its "
     "agreement travelling during the next step). Set it alike on every rank or on none."},
  };
  // clang-format on
  return vars;
}

}  // namespace gradex::config
