#!/usr/bin/env python3
# Regenerates docs/configuration.md from the GRADEX_* registry: python3 scripts/gen_config_doc.py [path/to/gradex-config]
import re
import subprocess, sys
binary = sys.argv[1] if len(sys.argv) > 1 else 'build/bin/gradex-config'
lines = subprocess.run([binary], check=True, capture_output=True, text=True).stdout.splitlines()
rows=[]
i=0
while i < len(lines):
    m=re.match(r"^(GRADEX_\w+)=(.*?)    \[(\w+); default '(.*?)'; (.*)\]$", lines[i])
    if m:
        help_=lines[i+1].strip() if i+1 < len(lines) else ''
        rows.append((m.group(1), m.group(4), m.group(5), help_)); i+=2
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
'| variable | default | allowed | meaning |','|---|---|---|---|']
for n,d,r,h in rows:
    out.append("| `%s` | `%s` | %s | %s |" % (n, d, r.replace('|', bar), h.replace('|', bar)))
out+=['','## How they combine','',
"- **Policy per tensor** (first match wins): a `GRADEX_SPARSITY_OVERRIDES` entry; fewer elements than",
"  `GRADEX_DENSE_THRESHOLD` -> dense; otherwise DGC at `GRADEX_SPARSITY`. `GRADEX_SPARSITY=0` makes",
"  everything dense.",
"- **Dense tensors** are fused into `GRADEX_FUSION_MB` buckets and sent as `GRADEX_HALF_TYPE` when",
"  `GRADEX_FP16=1` (pre-divided by the world size, saturating), else fp32.",
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
"  network devices for the others. UCX's own `UCX_*` variables still reach UCX itself.",'']
open('docs/configuration.md','w').write('\n'.join(out))
print('docs/configuration.md: %d variables' % len(rows))
