"""DiLoCo: local training with an outer optimizer over averaged pseudo-gradients (Douillard et al. 2023),
streamed in fragments with delayed merges (Streaming DiLoCo, 2025), pseudo-gradients in 4 (default) or 8 bits (or
as DGC-style top-k entries with error feedback: compression="topk", density=0.01).

    diloco = gx.DiLoCo(model, inner_optimizer, period=100, outer_lr=0.7, outer_momentum=0.9,
                       fragments=1, delay=0, bits=4)
    loss.backward(); inner_optimizer.step(); diloco.step()     # no DDP, no per-step gradient traffic
    diloco.synchronize()   # end of training: every rank's local progress merged, one model on every rank

Every `period` steps (per fragment) each rank's pseudo-gradient theta_global - theta_local is averaged
across ranks and an outer SGD/Nesterov step updates theta_global, identical on every rank; the model then
continues from it. With fragments=F the parameters (in model order) are split into F groups that sync at
staggered steps; with delay=d >= 1 a fragment's exchange runs in the background and is merged d steps
later, so the loop does not wait on the network. Floating-point buffers (BatchNorm statistics) are
averaged at fragment 0's syncs and at synchronize(). synchronize() ends training without losing inner steps:
one last outer step over every fragment with local progress since its last sync, at once and without delay
(keep_local=False instead resets every rank to the global copy, dropping that progress). Creating the outer optimizer is collective and copies
rank 0's parameters and buffers to every rank. It happens at construction when torch.distributed is
initialized (or a store is given); a DiLoCo constructed before init_process_group (like gx.State) creates it
at its first use: the model's first forward pass (a forward pre-hook), the inner optimizer's first step, or
step(), synchronize(), stats(), ..., whichever comes first, on every rank.

An FSDP2 model (fully_shard(..., mesh=mesh["shard"]) on its blocks and root) is passed with its 2-D mesh:
gx.DiLoCo(model, opt, mesh=mesh). FSDP2 then trains inside each replica group (the inner steps); each rank's
outer step runs on its own parameter shards and exchanges them with the ranks of its replicate group, which
hold the same shards in the other replica groups (_diloco_sharded.py); the first replica group's shards are
copied to the others at creation. Buffers, which FSDP2 does not shard, are averaged across the replicate group.

Parameters (their shards) and buffers must be float32 CPU tensors that stay at the same memory address (do not assign
`p.data = ...`): gradex reads and writes them in place. The keyword arguments map to the GRADEX_OUTER_*
variables (docs/configuration.md); `config` sets any other GRADEX_* variable and wins over them.
compression="quant" (the default) sends `bits`-bit codes (4, 8, or 32 for exact fp32); compression="topk"
sends the `density` fraction (default 0.01) of each fragment's pseudo-gradient entries of largest
magnitude, keeping the rest as a residual for the next sync (GRADEX_OUTER_BITS=topk,
GRADEX_OUTER_DENSITY).
"""
from __future__ import annotations

import threading
import weakref
from typing import Any, Dict, List, Literal, Optional

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.utils.hooks import RemovableHandle

from .. import _capi, _errors, _outer_config
from . import _bootstrap, _diloco_sharded as _sharded

_D = _outer_config.DEFAULTS
_STATE_FORMAT = "gradex.torch.DiLoCo/1"


def _create_outer(config: Dict[str, str], store: Any, group: Optional[dist.ProcessGroup] = None) -> _capi.Outer:
    """The outer optimizer over the default group, or over `group` (the replicate group of an FSDP2 model)."""
    if store is None and dist.is_available() and dist.is_initialized():
        store = dist.distributed_c10d._get_default_store()
    if store is not None:
        if not (dist.is_available() and dist.is_initialized()):
            raise _errors.InvalidArgumentError("gradex: a store was given but torch.distributed is not initialized")
        if _bootstrap.is_default_group(group):
            prefix = f"gradex/{next(_bootstrap._counters[''])}/"  # numbered with the default group's engines
            outer = _capi.Outer(dist.get_rank(), dist.get_world_size(), store, prefix, config)
        else:  # numbered with the engines of the same subgroup (_bootstrap.py)
            ranks = _bootstrap.group_ranks(group)
            tag = "g" + "-".join(map(str, ranks)) + "/"
            prefix = f"gradex/{tag}{next(_bootstrap._counters[tag])}/"
            outer = _capi.Outer(ranks.index(dist.get_rank()), len(ranks), store, prefix, config)
    else:
        outer = _capi.Outer(-1, -1, None, None, config)
    with _bootstrap._live_lock:  # gx.stats() without a source, and closing at exit
        _bootstrap._live.append(weakref.ref(outer))
    return outer


def tensor_address(name: str, t: torch.Tensor) -> int:
    if t.dtype != torch.float32 or t.device.type != "cpu" or not t.is_contiguous():
        raise _errors.InvalidArgumentError(
            f"gradex: DiLoCo needs contiguous float32 CPU tensors; '{name}' is {t.dtype} on {t.device}"
            f"{'' if t.is_contiguous() else ', not contiguous'}")
    return t.data_ptr()


class DiLoCo:
    def __init__(self, model: torch.nn.Module, inner_optimizer: Optional[torch.optim.Optimizer] = None,
                 period: int = _D["period"], outer_lr: float = _D["outer_lr"],
                 outer_momentum: float = _D["outer_momentum"], fragments: int = _D["fragments"],
                 delay: int = _D["delay"], bits: int = _D["bits"], nesterov: bool = _D["nesterov"],
                 mixing: float = _D["mixing"], config: _capi.Config = None, store: Optional[_capi.KeyValueStore] = None,
                 compression: str = _D["compression"], density: Optional[float] = _D["density"],
                 mesh: Optional[DeviceMesh] = None,
                 replicate_dim: str = "replicate", shard_dim: str = "shard") -> None:
        if isinstance(model, torch.nn.parallel.DistributedDataParallel):
            raise _errors.InvalidArgumentError(
                "gradex: DiLoCo replaces DistributedDataParallel; pass the plain module (model.module)")
        # An FSDP2 model (DTensor parameters sharded on mesh[shard_dim]): each rank's outer step runs on its
        # own shards, exchanged with the ranks of its replicate group (the same shard in the other replicas).
        self._group, named_parameters = _sharded.outer_tensors(model, mesh, replicate_dim, shard_dim)
        self._fsdp_modules = _sharded.fsdp_modules(model) if self._group is not None else []
        merged = _outer_config.outer_config(period, outer_lr, outer_momentum, fragments, delay, bits, nesterov,
                                            mixing, compression, density, config)
        self.model = model
        self.inner_optimizer = inner_optimizer
        self._config = merged
        self._store = store
        self._params = named_parameters
        self._buffers = [(name, b) for name, b in model.named_buffers() if b.dtype == torch.float32]
        for name, t in self._params + self._buffers:
            tensor_address(name, t.detach())  # rejected now, not at the first step
        self._lock = threading.RLock()
        self._outer: Any = None  # None: not created yet; False: closed
        self._finalizer: Optional[weakref.finalize] = None
        self._first_use_hooks: List[RemovableHandle] = []
        self._pending_load: Optional[bytes] = None  # a state dict loaded before the engine exists
        self.steps = 0
        if store is not None or (dist.is_available() and dist.is_initialized()):
            self._bootstrap()
        else:
            # Lazy: the outer optimizer comes at the first use, at the latest just before the model's first
            # forward pass (or the inner optimizer's first step), so that every rank trains from rank 0's
            # initial parameters exactly as it would with an eager construction.
            owner = weakref.ref(self)

            def before_first_use(*_: object) -> None:
                d = owner()
                if d is not None:
                    d._bootstrap()
            self._first_use_hooks.append(model.register_forward_pre_hook(before_first_use))
            if inner_optimizer is not None:
                self._first_use_hooks.append(inner_optimizer.register_step_pre_hook(before_first_use))

    def _bootstrap(self) -> _capi.Outer:
        """The outer optimizer, created (collectively over the default group, or from RANK/WORLD_SIZE/
        MASTER_ADDR/MASTER_PORT without one) at the first use: it copies rank 0's parameters and buffers to
        every rank."""
        with self._lock:
            if self._outer is False:
                raise _errors.InvalidArgumentError("gradex: this DiLoCo was closed")
            if self._outer is not None:
                return self._outer
            self._remove_first_use_hooks()
            addresses = [(f"param.{n}", tensor_address(n, p.detach()), p.numel(), False) for n, p in self._params]
            addresses += [(f"buffer.{n}", tensor_address(n, b), b.numel(), True) for n, b in self._buffers]
            outer = _create_outer(self._config, self._store, self._group)
            try:
                for key, address, numel, is_buffer in addresses:
                    outer.add_tensor(key, address, numel, is_buffer)
                with torch.no_grad():
                    outer.start()
                if self._pending_load is not None:
                    outer.load_state(self._pending_load)
            except BaseException:
                outer.close()
                raise
            self._pending_load = None
            self._finalizer = weakref.finalize(self, _errors.close_quietly, outer)
            self._outer = outer
            return outer

    def _remove_first_use_hooks(self) -> None:
        for handle in self._first_use_hooks:
            handle.remove()
        self._first_use_hooks = []

    @property
    def started(self) -> bool:
        """Whether the outer optimizer exists (it is created at the first use when DiLoCo was constructed
        before torch.distributed was initialized)."""
        return bool(self._outer)

    @torch.no_grad()
    def step(self) -> int:
        """Ends an inner step (call after inner_optimizer.step()). Returns the number of fragments merged into
        the model by this call. Raises the failure of a background exchange (a dead or stalled peer)."""
        outer = self._bootstrap()
        _sharded.reshard(self._fsdp_modules)
        merged = outer.step()
        self.steps += 1
        return merged

    @torch.no_grad()
    def synchronize(self, keep_local: bool = True) -> int:
        """Collective: every rank then holds the same model (the global copy, also in the module), for the end
        of training, an evaluation or a checkpoint. keep_local=True (the default): the exchanges in flight
        finish, then one more outer step, at once and without delay, merges every rank's inner steps since each
        fragment's last sync, exactly as a scheduled sync would (gradex_outer_synchronize_all); buffers are
        averaged. Training may continue afterwards. Returns the number of fragments this final step exchanged.
        keep_local=False: the exchanges in flight are merged and every rank is reset to the global copy, which
        drops the local progress since each fragment's last sync (up to period - period/fragments + delay
        steps); returns 0."""
        outer = self._bootstrap()
        _sharded.reshard(self._fsdp_modules)
        if keep_local:
            return outer.synchronize_all()
        outer.synchronize()
        return 0

    def global_parameters(self) -> Dict[str, torch.Tensor]:
        """{name: tensor} of the global copy (identical on every rank)."""
        out: Dict[str, torch.Tensor] = {}
        for name, p in self._params:
            t = torch.empty(p.shape, dtype=torch.float32)
            self._bootstrap().global_copy(f"param.{name}", t.data_ptr(), t.numel())
            out[name] = t
        return out

    def last_merges(self) -> List[int]:
        """Per fragment, the step at which it was last merged (0: never)."""
        return self._bootstrap().last_merges()

    def fragment_of(self, name: str) -> int:
        return self._bootstrap().fragment_of(f"param.{name}")

    @property
    def engine(self) -> _capi.Outer:
        """The gx.stats() source: bytes_sent/received, dense_bytes, compression_ratio, parameter_averages
        (fragment syncs), steps, communicate_seconds (background) and decode_seconds (time spent waiting)."""
        return self._bootstrap()

    def stats(self, last_step: bool = False) -> _capi.Stats:
        return self._bootstrap().stats(last_step)

    def state_dict(self) -> Dict[str, Any]:
        """The outer state (global copies, outer momenta, quantization residuals, step count) and the inner
        optimizer's state. Merges pending exchanges first."""
        state = {"format": _STATE_FORMAT, "steps": self.steps, "outer": self._bootstrap().save_state()}
        if self.inner_optimizer is not None:
            state["inner"] = self.inner_optimizer.state_dict()
        return state

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        if not isinstance(state, dict) or state.get("format") != _STATE_FORMAT:
            got = state.get("format") if isinstance(state, dict) else type(state).__name__
            raise _errors.StateError(f"gradex: not a {_STATE_FORMAT} state dict (format {got!r})")
        with self._lock:
            if self._outer:
                self._outer.load_state(state["outer"])
            elif self._outer is None:  # applied when the engine is created, after rank 0's copy
                self._pending_load = bytes(state["outer"])
            else:
                raise _errors.InvalidArgumentError("gradex: this DiLoCo was closed")
        if self.inner_optimizer is not None and "inner" in state:
            self.inner_optimizer.load_state_dict(state["inner"])
        self.steps = int(state["steps"])

    def close(self) -> None:
        """Finishes the exchanges in flight and releases the connections. Idempotent; also done at the end of a
        `with` block and by the garbage collector."""
        with self._lock:
            outer, self._outer = self._outer, False
            self._remove_first_use_hooks()
        if outer:
            if self._finalizer is not None:
                self._finalizer.detach()
            outer.close()

    def __enter__(self) -> DiLoCo:
        return self

    def __exit__(self, *exc: object) -> Literal[False]:
        self.close()
        return False
