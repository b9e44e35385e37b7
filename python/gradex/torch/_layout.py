"""Engine keys for the parameters inside DDP's gradient buckets.

The hook exchanges a bucket per parameter, so that the engine's policy (dense below
GRADEX_DENSE_THRESHOLD, DGC with per-layer top-k above it, GRADEX_SPARSITY_OVERRIDES by name) decides per
tensor. Each parameter's gradient view is keyed by the parameter's name in the module given to gx.State
("fc.weight"); such keys do not depend on how DDP groups parameters into buckets, so buckets may be rebuilt
(DDP's first iteration, a different bucket_cap_mb on resume) without losing compressor state.

Without a module the key is "bucket<index>.param<position>". Those keys are only stable once DDP has
rebuilt its buckets after the first iteration, so that iteration is averaged with a plain allreduce, and a
later change of a bucket's parameters is an error naming the position (the state would belong to another
parameter).
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Set, Tuple

import torch

from .. import _capi, _errors
from . import _bootstrap, _ops


def output_rows(tensor: torch.Tensor) -> int:
    """A 2-D+ parameter's output rows in PyTorch's [out, in, ...] layout (a Linear's out_features, a
    conv's out_channels), 0 for vectors and scalars: GRADEX_POLICY=auto's per-row floor then keeps an
    output layer's every row represented when it sparsifies (GRADEX_POLICY_MIN_PER_ROW)."""
    return int(tensor.shape[0]) if tensor.dim() >= 2 and tensor.numel() > 0 else 0


def module_parameter_names(module: Optional[torch.nn.Module]
                           ) -> Tuple[Optional[Dict[int, str]], List[torch.nn.Parameter]]:
    """{id(parameter): name} of a module (or of a DDP wrapper's inner module), and the parameters (kept
    alive with the mapping so that ids cannot be reused)."""
    if module is None:
        return None, []
    if not isinstance(module, torch.nn.Module):
        raise _errors.InvalidArgumentError(
            f"gradex: the model given to gx.State must be a torch.nn.Module, not {type(module).__name__}")
    inner = module.module if isinstance(module, torch.nn.parallel.DistributedDataParallel) else module
    named = list(inner.named_parameters())
    return {id(p): name for name, p in named}, [p for _, p in named]


class BucketKeys:
    """Keys of the parameters of each bucket, registered with the engine once."""

    def __init__(self, module: Optional[torch.nn.Module]) -> None:
        self._names, self._params = module_parameter_names(module)
        self._by_name = {self._names[id(p)]: p for p in self._params} if self._names else {}
        # bucket index -> (tuple of parameter ids, [keys])
        self.buckets: Dict[int, Tuple[Tuple[int, ...], List[str]]] = {}
        # key -> (numel, torch dtype), as registered with the engine
        self.registered: Dict[str, Tuple[int, torch.dtype]] = {}
        self.on_device: Set[str] = set()  # keys registered as CUDA memory (_ops.memory_of): submitted on the GPU

    @property
    def named(self) -> bool:
        return self._names is not None

    def keys(self, index: int, parameters: Sequence[torch.Tensor], gradients: Sequence[torch.Tensor]) -> List[str]:
        """The keys of a bucket's parameters, in bucket order; computed once per bucket layout."""
        ids = tuple(id(p) for p in parameters)
        cached = self.buckets.get(index)
        if cached is not None and cached[0] == ids:
            return cached[1]
        if cached is not None and not self.named:
            raise _errors.MismatchError(self._changed_message(index, cached, parameters))
        keys = [self._key(index, position, p) for position, p in enumerate(parameters)]
        for key, g in zip(keys, gradients):
            self._check_shape(key, g.numel(), g.dtype)
        self.buckets[index] = (ids, keys)
        return keys

    def _key(self, index: int, position: int, parameter: torch.Tensor) -> str:
        if self._names is None:
            return f"bucket{index}.param{position}"
        name = self._names.get(id(parameter))
        if name is None:
            raise _errors.InvalidArgumentError(
                f"gradex: DDP bucket {index} holds a parameter of shape {tuple(parameter.shape)} that is not a "
                f"parameter of the model given to gx.State (pass the DDP module or the module it wraps)")
        return name

    def _check_shape(self, key: str, numel: int, dtype: torch.dtype) -> None:
        known = self.registered.get(key)
        if known is not None and known != (numel, dtype):
            raise _errors.MismatchError(
                f"gradex: parameter '{key}' changed from {known[0]} {known[1]} elements to {numel} {dtype} "
                f"after gradex registered it")

    def _changed_message(self, index: int, cached: Tuple[Tuple[int, ...], List[str]],
                         parameters: Sequence[torch.Tensor]) -> str:
        old_keys = cached[1]
        for position in range(max(len(old_keys), len(parameters))):
            old = old_keys[position] if position < len(old_keys) else None
            new = parameters[position] if position < len(parameters) else None
            if old is None or new is None or id(new) != cached[0][position]:
                now = "no parameter" if new is None else f"a parameter of shape {tuple(new.shape)}"
                return (f"gradex: DDP bucket {index} changed its layout after gradex registered it: "
                        f"'{old or f'bucket{index}.param{position}'}' now holds {now}. Without parameter "
                        f"names, keys are bucket positions and must stay fixed after the first iteration; "
                        f"pass the model (gx.State(ddp)) to key gradients by parameter name instead")
        return f"gradex: DDP bucket {index} changed its layout after gradex registered it"

    def register_all(self, engine: _capi.Engine, keys: Sequence[str], gradients: Sequence[torch.Tensor]) -> None:
        """Registers keys not yet known to the engine."""
        for key, g in zip(keys, gradients):
            if key not in self.registered:
                self._register(engine, key, g.numel(), g.dtype, _ops.memory_of(g), output_rows(g))

    def register_saved(self, engine: _capi.Engine, saved: Dict[str, Tuple[int, str]]) -> None:
        """Registers {key: (numel, dtype name)} from a state dict (before the first iteration)."""
        for key, (numel, dtype_name) in sorted(saved.items()):
            dtype = getattr(torch, str(dtype_name).replace("torch.", ""))
            self._check_shape(key, int(numel), dtype)
            if key not in self.registered:
                # The parameter's own memory when the model is known; else host memory (CUDA gradients
                # of such keys are then staged, which is always correct).
                param = self._by_name.get(key)
                memory = _ops.memory_of(param) if param is not None else _capi.DEVICE_CPU
                rows = output_rows(param) if param is not None and param.numel() == int(numel) else 0
                self._register(engine, key, int(numel), dtype, memory, rows)

    def _register(self, engine: _capi.Engine, key: str, numel: int, dtype: torch.dtype, memory: int,
                  rows: int = 0) -> None:
        engine.register(key, numel, _bootstrap.dtype_code(dtype), memory, rows)
        self.registered[key] = (numel, dtype)
        if memory == _capi.DEVICE_CUDA:
            self.on_device.add(key)
