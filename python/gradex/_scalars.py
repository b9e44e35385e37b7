"""What gradex did over a window of steps, as scalars for TensorBoard and experiment loggers: the one rule of the
Lightning and Keras callbacks and of gx.log_scalars (framework-neutral: it reads the counters gx.stats returns).

Tags, all under "gradex/", each over the window since the previous report of the same source:
- sent_mb_per_step: bytes this rank sent per step, in MB (1e6 bytes);
- compression_ratio: what a dense fp32 ring allreduce would have sent over what was sent;
- codec_mix/sparse, codec_mix/dense_fallback, codec_mix/dense: shares of the tensor exchanges that went DGC, that
  a DGC tensor sent dense (warm-up or a cheaper dense step), and that were dense by policy;
- exposed_ms_per_step: what the framework waited on gradex per step (from each step's last submission to its last
  completion: the exchange time the backward pass did not hide);
- exchange_ms_per_step, encode_ms_per_step, decode_ms_per_step: time in collectives, compression, decoding;
- plan_changes: tensors whose codec the auto policy's plans changed in the window.
"""
from __future__ import annotations

from typing import Dict, Mapping, Optional, Protocol, Union

Number = Union[int, float]


class ScalarWriter(Protocol):
    """Where gx.log_scalars writes: torch.utils.tensorboard.SummaryWriter or anything with add_scalar(tag,
    value, step)."""

    def add_scalar(self, tag: str, scalar_value: float, global_step: int, /) -> object: ...


def scalars(now: Mapping[str, Number], before: Optional[Mapping[str, Number]] = None) -> Dict[str, float]:
    """The scalars of the window from the counters `before` (None: the start) to `now`; empty when no step
    completed in between."""
    def delta(name: str) -> float:
        return float(now.get(name, 0)) - float((before or {}).get(name, 0))

    steps = delta("steps")
    if steps <= 0:
        return {}
    sent, tensors = delta("bytes_sent"), delta("tensors")
    sparse, fallbacks = delta("sparse_exchanges"), delta("dense_fallbacks")
    share = (lambda n: n / tensors) if tensors > 0 else (lambda n: 0.0)
    return {
        "gradex/sent_mb_per_step": sent / steps / 1e6,
        "gradex/compression_ratio": delta("dense_bytes") / sent if sent > 0 else 0.0,
        "gradex/codec_mix/sparse": share(sparse),
        "gradex/codec_mix/dense_fallback": share(fallbacks),
        "gradex/codec_mix/dense": share(max(tensors - sparse - fallbacks, 0.0)),
        "gradex/exposed_ms_per_step": delta("exposed_seconds") * 1e3 / steps,
        "gradex/exchange_ms_per_step": delta("communicate_seconds") * 1e3 / steps,
        "gradex/encode_ms_per_step": delta("compress_seconds") * 1e3 / steps,
        "gradex/decode_ms_per_step": delta("decode_seconds") * 1e3 / steps,
        "gradex/plan_changes": delta("policy_switches"),
    }


class Window:
    """Scalars since the previous take(): keeps the counters of the last report."""

    def __init__(self) -> None:
        self._before: Optional[Dict[str, Number]] = None

    def take(self, now: Mapping[str, Number]) -> Dict[str, float]:
        values = scalars(now, self._before)
        if values:
            self._before = dict(now)
        return values
