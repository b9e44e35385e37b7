"""Which GRADEX_* variables this gradex build declares, so that a benchmark can use a setting once the
library has it and fall back to today's behaviour (and say so) while it does not: GRADEX_POLICY
(auto|fixed) and GRADEX_HIERARCHICAL (auto|0|1) are the two the benchmarks look for.

The list is what `gradex-bench exchange --print-config` prints (the same table as gradex-config): one
"GRADEX_NAME=value  [...]" line per declared variable."""
import re
import subprocess

POLICY, HIERARCHICAL = "GRADEX_POLICY", "GRADEX_HIERARCHICAL"


def declared(bench):
    """The set of GRADEX_* names gradex-bench `bench` declares; empty when it cannot be asked."""
    try:
        text = subprocess.run([bench, "exchange", "--print-config"], capture_output=True, text=True,
                              timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        return set()
    return parse(text)


def parse(text):
    return {m.group(1) for m in re.finditer(r"^(GRADEX_[A-Z0-9_]+)=", text, re.MULTILINE)}


def policy_env(names, policy):
    """{GRADEX_POLICY: policy} when the build has the variable, else {} (today's one fixed policy)."""
    return {POLICY: policy} if POLICY in names else {}
