#!/usr/bin/env python3
# Regenerates docs/configuration.md from the GRADEX_* registry: python3 scripts/gen_config_doc.py [path/to/gradex-config]
import re
import subprocess, sys, textwrap
binary = sys.argv[1] if len(sys.argv) > 1 else 'build/bin/gradex-config'
lines = subprocess.run([binary], check=True, capture_output=True, text=True).stdout.splitlines()
rows=[]
i=0
while i < len(lines):
    m=re.match(r"^(GRADEX_\w+)=(.*?)    \[(\w+); default '(.*?)'; (.*); (may differ per rank|equal on every rank.*?)\]$", lines[i])
    if m:
        help_=lines[i+1].strip() if i+1 < len(lines) else ''
        rows.append((m.group(1), m.group(4), m.group(5), m.group(6), help_)); i+=2
    else: i+=1
bar='\\|'
out=['# Configuration','',
"Every `GRADEX_*` variable is declared once, in `base/config_vars.cc`, with its type, default, allowed",
"range and help; this page is generated from that registry by `scripts/gen_config_doc.py` (`build/bin/gradex-config` prints the same",
"with each variable's effective value and its source: default, environment or API). A test checks that",
"this page lists every declared variable.",'',
"Values are parsed strictly when an engine is created: `GRADEX_SPARSITY=abc` or `=1.5` fails with a",
"message naming the variable and its allowed range. An unknown `GRADEX_*` name (a typo such as",
"`GRADEX_SPARSTY`) is reported as a warning and ignored. Values passed through the C API",
"(`gradex_engine_options_t` config names/values) win over the environment; a variable set through the",
"API is not read from the environment at all. `gradex_check_config` applies the same parsing without",
"creating an engine (the plugins call it when a lazy object is constructed); there an unknown name passed",
"through the API (`config=`) is an error that names the closest declared variable.",'',
'| variable | default | allowed | ranks | meaning |','|---|---|---|---|---|']
# A table row holds a line of its own: a help text that would make it longer than this goes below the
# table in full, its first sentence in the row (docs keep every line under 1,000 characters).
ROW_MAX = 1000
longer = []
for n,d,r,a,h in rows:
    a = a.replace('may differ per rank', 'may differ').replace('equal on every rank', 'equal')
    row = "| `%s` | `%s` | %s | %s | %s |" % (n, d, r.replace('|', bar), a, h.replace('|', bar))
    if len(row) > ROW_MAX:
        first = re.split(r'(?<=\.)\s(?=[A-Z(])', h, maxsplit=1)[0]
        if len(first) > 300:
            first = first[:300].rsplit(' ', 1)[0] + ' ...'
        anchor = n.lower()
        row = "| `%s` | `%s` | %s | %s | %s ([more](#%s)) |" % (n, d, r.replace('|', bar), a,
                                                          first.replace('|', bar), anchor)
        longer.append((n, h))
    out.append(row)
if longer:
    out += ['', '## The longer help texts', '']
    for n, h in longer:
        para = textwrap.wrap(h, 110, break_long_words=False, break_on_hyphens=False)
        out += ['### %s' % n, ''] + para + ['']
out+=['','## Which policy runs: the settings you give win','',
"`GRADEX_POLICY=auto` is the default. A setting you write is honoured or rejected at start-up, never",
"silently overridden by that default:",'',
"- **Settings of the fixed policy** (`GRADEX_SPARSITY`, `GRADEX_WARMUP_STEPS`, `GRADEX_DENSE_THRESHOLD`)",
"  given while `GRADEX_POLICY` is not: the engine runs `GRADEX_POLICY=fixed`, the policy they describe, and",
"  rank 0 says so once in the log. `GRADEX_SPARSITY=0.99` thus gives DGC at 99% after the warm-up on every",
"  plugin, and `GRADEX_SPARSITY=0 GRADEX_FP16=0 GRADEX_MOMENTUM=0.9` is momentum SGD on the dense fp32 average.",
"- **Contradictions fail at start-up** (engine creation, and `gradex_check_config` where a plugin builds a",
"  lazy object), naming both settings and where each came from: `GRADEX_POLICY=auto` with a fixed-policy",
"  setting; `GRADEX_POLICY=fixed` with a setting only auto reads (`GRADEX_POLICY_LADDER`, `_RAMP_STEPS`,",
"  `_INTERVAL`, `_SLACK`, `_DENSE_STEPS`, `_MIN_SELECTED`, `_MIN_PER_ROW`, `_INT8`, `_INT4`, `_PROBE`, `_FIDELITY_INT8`); settings of",
"  both policies while `GRADEX_POLICY` is not given.",
"- **Settings both policies read** (`GRADEX_FP16`, `GRADEX_HALF_TYPE`, `GRADEX_MOMENTUM`,",
"  `GRADEX_SPARSITY_OVERRIDES`, `GRADEX_OPTIMIZER`, `GRADEX_ADAM_SPARSITY`, ...) are constraints of either:",
"  with `GRADEX_FP16=0` auto never sends 16-bit, an override pins its tensors, `GRADEX_ADAM_SPARSITY` is",
"  the Adam rung's sparsity. `GRADEX_POLICY_HORIZON_STEPS` states the training's length and is accepted",
"  under either policy.",
"- **The program's choice for its own engine**: a `GRADEX_POLICY` passed through the API (`config=`, or the",
"  plugins' exact collectives engines, which run fixed and dense) makes the environment's settings of the",
"  other policy inapplicable to that engine rather than a contradiction.",
"- **Every rank resolves the same policy or none starts**: the resolved `GRADEX_POLICY` is part of the",
"  start-up agreement, so a rank whose environment sets `GRADEX_SPARSITY` while another's does not fails",
"  with both values named.",'',
'## How they combine','',
"- **Policy per tensor** under `GRADEX_POLICY=fixed` (first match wins): a `GRADEX_SPARSITY_OVERRIDES` entry;",
"  fewer elements than `GRADEX_DENSE_THRESHOLD` -> dense; otherwise DGC at `GRADEX_SPARSITY`.",
"  `GRADEX_SPARSITY=0` makes everything dense. Under auto, the cost model chooses (`GRADEX_POLICY` above).",
"- **Dense tensors** are fused into `GRADEX_FUSION_MB` buckets and sent as `GRADEX_HALF_TYPE` when",
"  `GRADEX_FP16=1` (pre-divided by the world size, saturating), else fp32. Tensors with an `int8`",
"  override (or the auto policy's 8-bit rung) take the dense 8-bit route instead: 128-element blocks",
"  of 8-bit codes with an fp32 scale (1.03 bytes per element), error feedback on both the rank's",
"  encoding and the shard owner's re-encoding, bit-identical averages on every rank (gradex's",
"  momentum applies as on any dense tensor).",
"- **DGC tensors** follow the warm-up ramp (`GRADEX_WARMUP_STEPS`); a step whose density is at least",
"  1/(2 x world size) goes dense automatically. The step of the ramp is the tensor's exchange counter,",
"  which every rank agrees on in negotiation.",
"- **Momentum** (`GRADEX_MOMENTUM` = m > 0; the default 0 adds none, so any optimizer is left as it is)",
"  is gradex's on every path and replaces the optimizer's: dense tensors and DGC's dense steps send",
"  u = m*u + g (SGD with momentum on the average, to fp32 rounding), DGC's sparse steps use momentum",
"  correction starting from that u, LocalSGD's local steps get it in place. The PyTorch plugin sets it",
"  from the optimizer it is given (it takes SGD's momentum over and never adds any to Adam-family",
"  optimizers); with m > 0 set by hand, run SGD with momentum 0.",
"- **Clipping** (`GRADEX_CLIP_NORM` = C > 0): each rank scales its gradients by",
"  min(1, C / sqrt(world size) / norm), norm being that rank's whole-step gradient norm passed with",
"  `gradex_set_gradient_norm` before the step's first submit (else each tensor's own norm).",
"- **Non-finite gradients** (`GRADEX_NONFINITE`): a NaN/Inf on any rank is flagged in negotiation, so",
"  every rank skips that tensor's state update and applies the same policy.",
"- **LocalSGD** (`GRADEX_LOCALSGD_PERIOD` > 0): after `GRADEX_LOCALSGD_WARMUP_STEPS` synchronous steps,",
"  gradients stay local and parameters are averaged every H steps; during the warm-up the policy above",
"  applies. See docs/architecture.md.",
"- **Transport**: `GRADEX_SHM=1` keeps same-host ranks on shared memory; `GRADEX_IFACE` restricts the",
"  network devices for the others. UCX's own `UCX_*` variables still reach UCX itself, and win over the two",
"  settings gradex gives its own UCX configuration (never the environment): non-blocking TCP connects",
"  (`TCP_CONN_NB`: a rank's endpoints connect at once, not a round trip each) and, where no peer of a rank",
"  can be shared memory, eager sends of every size (`RNDV_THRESH=inf`: no rendezvous round trip per message).",'',
'## Options every rank must share','',
"The **ranks** column says which variables must be equal on every rank. Each declaration in",
"`base/config_vars.cc` states it (an `Agreement`: per rank, engine, DiLoCo or both), so a new variable",
"decides once. When an engine starts, right after its ranks connect and before any gradient moves,",
"every rank sends a canonical digest to every other (`sync/negotiation/agreement.h`): the versions of what crosses",
"between ranks (`gradex.api_version`, the payload `gradex.wire_version`, the",
"`gradex.negotiation_version`, the digest's own format) and the exact value of every variable marked",
"`equal (engine)`; a DiLoCo optimizer (`gradex_outer_create`) does the same for the variables marked",
"`(DiLoCo)`. Any difference is a `ConfigError` on every rank that names each differing entry with every",
"value and the ranks holding it, e.g.",'',
"    ranks disagree on options that must be equal on every rank of the engine (...):",
"    GRADEX_HALF_TYPE: 'fp16' on ranks [0], 'bf16' on ranks [1]",'',
"It comes about 0.1 s after start-up here (bootstrap included). Numbers are compared exactly (the",
"shortest of 15 or 17 significant digits that reads back to the same double).",'',
"Why each variable is where it is:",'',
"- **Equal, because ranks would otherwise issue different collectives or sum different bytes**:",
"  `GRADEX_DENSE_THRESHOLD`, `GRADEX_SPARSITY_OVERRIDES`, `GRADEX_SPARSITY`, `GRADEX_WARMUP_STEPS`",
"  (policy and schedule decide dense ring or sparse allgather), `GRADEX_FUSION_MB`,",
"  `GRADEX_SPARSE_GROUP_MB` (how tensors are packed into collectives), `GRADEX_FP16`,",
"  `GRADEX_HALF_TYPE` (fp16 and bf16 have the same length: one rank's bits would be summed as the",
"  other type, silently), `GRADEX_SPARSE_COLLECTIVE` (ring or direct), `GRADEX_RING_CHUNK_KB` (each",
"  ring step's chunks are separate messages), `GRADEX_ALLGATHER_INLINE_KB` (the size of every posted",
"  one-round receive), `GRADEX_PORT_QUEUE_MS` (auto's direct-or-ring choice), `GRADEX_LOCALSGD_PERIOD`,",
"  `GRADEX_LOCALSGD_WARMUP_STEPS` (when ranks exchange gradients and when they average parameters),",
"  and for DiLoCo every `GRADEX_OUTER_*` codec and schedule setting (period, fragments, delay, bits,",
"  density, block, scale).",
"- **Equal, because ranks would otherwise train different algorithms without any error**:",
"  `GRADEX_MOMENTUM`, `GRADEX_NESTEROV` (who owns momentum and its rule), `GRADEX_CLIP_NORM`,",
"  `GRADEX_NONFINITE` (one rank would fail a step that another averages as NaN),",
"  `GRADEX_SPARSE_VALUES` (the precision of the sparse exchange), and the DiLoCo outer step",
"  (`GRADEX_OUTER_LR`, `GRADEX_OUTER_MOMENTUM`, `GRADEX_OUTER_NESTEROV`, `GRADEX_OUTER_MIXING`,",
"  `GRADEX_OUTER_ROUNDING`, `GRADEX_OUTER_SEED`: the merged model must be the same everywhere).",
"- **May differ**: `GRADEX_IFACE`, `GRADEX_SHM` (each host's own network devices and transports; the",
"  results do not depend on them), `GRADEX_THREADS`, `GRADEX_BACKEND` (how one rank computes its own",
"  share; the backends give the same results), `GRADEX_LOG_LEVEL`, `GRADEX_STALL_WARN_S` (what one",
"  rank reports; only rank 0's matters), `GRADEX_TIMEOUT_S` (how long this rank waits; key timeouts",
"  are decided by rank 0's clock alone, so differing values cannot split a verdict),",
"  `GRADEX_SAMPLE_RATIO` (how this rank estimates its own top-k threshold; any valid selection is",
"  summed correctly), `GRADEX_INDEX_CODING`, `GRADEX_ZSTD_LEVEL` (every payload names its own coding",
"  and compression, so receivers decode any mix), `GRADEX_JOB_SECRET`, `GRADEX_JOB_SECRET_FILE` (the",
"  secret is proven pairwise by HMAC at connection, docs/security.md; it is never put in a digest,",
"  and the file's path is per host), and `GRADEX_TEST_FAIL_ROUND` (a test hook for one rank).",'',
"Beyond options, parameter averages (LocalSGD) carry in negotiation whether the rank holds an",
"anchor: ranks that hold one and ranks that do not (restored from checkpoints of different steps)",
"fail with a `MismatchError` naming both groups instead of summing full parameters with deltas.",
"Bad values on one rank (a `ConfigError` before it connects) are not covered: that rank stops, and",
"the others time out in the bootstrap (`GRADEX_TIMEOUT_S`).",'']
open('docs/configuration.md','w').write('\n'.join(out))
print('docs/configuration.md: %d variables' % len(rows))
