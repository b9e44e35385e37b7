"""The configuration of an engine that averages exactly: what the front ends' exact-average engines are
created with (gradex.torch.collectives, gradex.tensorflow's collective engine, torchft's ProcessGroupGradex),
so that none of them compresses, delays, clips or adds momentum to what it averages.

fp32 on the wire, nothing sparsified (not by GRADEX_SPARSITY, its per-tensor overrides or a warm-up), no
momentum, no LocalSGD period, no delay (GRADEX_DELAY in the environment is the gradient engines'), no
clipping, non-finite values propagated as they are, the fixed policy (the auto policy would pick codecs), and
no periodic statistics line. Whatever else the environment sets (transport, timeouts, threads) still applies;
a front end adds its own keys (torchft: GRADEX_TIMEOUT_S).
"""
from __future__ import annotations

from types import MappingProxyType
from typing import Dict, Mapping

EXACT_AVERAGE_CONFIG: Mapping[str, str] = MappingProxyType({
    "GRADEX_FP16": "0", "GRADEX_SPARSITY": "0", "GRADEX_SPARSITY_OVERRIDES": "", "GRADEX_WARMUP_STEPS": "0",
    "GRADEX_MOMENTUM": "0", "GRADEX_LOCALSGD_PERIOD": "0", "GRADEX_CLIP_NORM": "0",
    "GRADEX_NONFINITE": "propagate", "GRADEX_POLICY": "fixed", "GRADEX_STATS_EVERY": "0", "GRADEX_DELAY": "0"})


def exact_average_config(**extra: str) -> Dict[str, str]:
    """A copy of EXACT_AVERAGE_CONFIG with `extra` GRADEX_* settings added (they win)."""
    return {**EXACT_AVERAGE_CONFIG, **extra}
