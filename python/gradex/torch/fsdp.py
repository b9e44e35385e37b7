"""HSDP with gradex on the replicate dimension: FSDP2 shards over fast links, gradex exchanges across slow ones.

    mesh = init_device_mesh("cpu", (replicas, shards), mesh_dim_names=("replicate", "shard"))
    for block in model.blocks:
        fully_shard(block, mesh=mesh["shard"])          # FSDP2 over the shard dimension only
    fully_shard(model, mesh=mesh["shard"])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    hsdp = gx.HSDP(model, mesh, optimizer=opt)          # gradex over the replicate dimension
    loss.backward(); opt.step(); opt.zero_grad()

FSDP2 reduce-scatters each module's gradients inside the shard group and calls the module's all-reduce hook
(FSDPModule.set_all_reduce_hook) with the rank's flat gradient shard; gradex then averages it across the
replica groups: one engine per replicate group (the ranks holding the same shard index), each parameter's
shard under its own key "<name>/shard<i>of<n>", so the GRADEX_* policy (DGC, Adam codec, 16-bit, 8-bit, 4-bit)
decides per shard and keeps its error feedback per shard. The average lands in place in FSDP2's buffer,
which FSDP2 turns into the sharded gradients.

Overlap: a shard's exchange is submitted from the hook and runs while autograd computes the next modules'
gradients; the backward pass ends (a callback queued with the autograd engine) only when every exchange
has completed, so clipping and the optimizer see the averages. The hook waits for its own exchange
instead whenever FSDP2 reads its buffer right after the hook: a reduce dtype other than the parameters'
(FSDP2 casts a copy), float16 reductions (FSDP2 divides after the hook), gradients accumulated onto an
existing .grad, CUDA tensors, or overlap=False (set it with set_force_sum_reduction_for_comms or
post-accumulate-grad hooks on the sharded parameters, which also read the buffer at once).

Gradient accumulation: set_requires_gradient_sync(False) on the micro-batches before the last one; FSDP2
then neither reduce-scatters nor calls the hook, and the last backward exchanges the accumulated gradient.
Mixed precision (MixedPrecisionPolicy) works as it does for FSDP2: gradex exchanges in the reduce dtype.
set_requires_all_reduce has no effect here (FSDP2 on the shard mesh has no all-reduce of its own).
GRADEX_CLIP_NORM and GRADEX_LOCALSGD_PERIOD are refused: a rank holds neither the whole model's gradient
norm nor whole parameters (clip with torch.nn.utils.clip_grad_norm_; local steps: gx.DiLoCo(mesh=)).
"""
from __future__ import annotations

import json
import threading
import weakref
from typing import Any, Callable, Dict, List, Literal, Optional, Sequence, Set, Tuple, cast

import torch
import torch.distributed as dist

from torch.distributed.device_mesh import DeviceMesh

from .. import _capi, _errors
from . import _bootstrap, _config_check, _fsdp_layout, _horizon, _momentum, _ops

_STATE_FORMAT = "gradex.torch.HSDP/1"


def replicate_layout(mesh: DeviceMesh, replicate_dim: str,
                     shard_dim: str) -> Tuple[dist.ProcessGroup, int, int, DeviceMesh]:
    """(replicate process group, shard index, shard count, shard submesh) of this rank in a 2-D mesh."""
    names = tuple(mesh.mesh_dim_names or ())
    if mesh.ndim != 2 or replicate_dim not in names or shard_dim not in names:
        raise _errors.InvalidArgumentError(
            f"gradex: expected a 2-D DeviceMesh with dimensions '{replicate_dim}' and '{shard_dim}', got "
            f"{mesh.ndim} dimension(s) named {names}")
    return (mesh.get_group(replicate_dim), mesh.get_local_rank(shard_dim), mesh[shard_dim].size(),
            mesh[shard_dim])


def check_sharded_on(model: torch.nn.Module, shard_mesh: DeviceMesh, owner: str) -> None:
    """Raises InvalidArgumentError unless every DTensor parameter of the model lives on `shard_mesh`."""
    from torch.distributed.tensor import DTensor
    expected = shard_mesh.mesh.tolist()
    for name, p in model.named_parameters():
        if not isinstance(p, DTensor):
            continue
        if p.device_mesh.ndim != 1 or p.device_mesh.mesh.tolist() != expected:
            raise _errors.InvalidArgumentError(
                f"gradex: parameter '{name}' is sharded over ranks {p.device_mesh.mesh.tolist()}, not over the "
                f"shard dimension's ranks {expected}: call fully_shard(module, mesh=mesh['shard']) (not the "
                f"2-D mesh) so that {owner} owns the replicate dimension")


def broadcast_across_replicas(tensors: Sequence[torch.Tensor], group: dist.ProcessGroup) -> None:
    """Copies the first replica group's values of `tensors` (local shards) to the other replica groups."""
    source = dist.get_global_rank(group, 0)
    with torch.no_grad():
        for t in tensors:
            dist.broadcast(t, src=source, group=group)


class HSDP:
    """gradex on the replicate dimension of an FSDP2 model (see the module's docstring).

    model: the root module, after fully_shard(..., mesh=mesh[shard_dim]) on it and its blocks.
    mesh: the 2-D DeviceMesh (replicate_dim x shard_dim). optimizer: the optimizer that trains the model,
    so that momentum follows it (_momentum.py: gradex takes an SGD optimizer's momentum over, adds none to
    optimizers that keep their own). config: GRADEX_* overrides that win over the environment.
    overlap: submit exchanges from the hook and finish them at the end of backward (see above).
    sync_parameters: copy the first replica group's parameter shards to the others at construction (as
    DDP does), so that the replicas start equal. horizon_steps: as for gx.State.

    Construction is collective over the ranks of each replicate group (it creates the engine). close()
    (or leaving a `with` block) finishes outstanding exchanges and releases the engine."""

    def __init__(self, model: torch.nn.Module, mesh: DeviceMesh, *, replicate_dim: str = "replicate",
                 shard_dim: str = "shard", optimizer: Optional[torch.optim.Optimizer] = None,
                 config: _capi.Config = None, overlap: bool = True, sync_parameters: bool = True,
                 horizon_steps: Optional[int] = None) -> None:
        config = {str(k): str(v) for k, v in (config or {}).items()}
        config = _horizon.with_horizon(config, horizon_steps, "gx.HSDP")
        _config_check.check(config)
        self._group, self._shard_index, self._shard_count, shard_mesh = replicate_layout(mesh, replicate_dim,
                                                                                          shard_dim)
        modules = _fsdp_layout.fsdp_modules(model)
        if not modules:
            raise _errors.InvalidArgumentError("gradex: the model has no fully_shard module: call fully_shard "
                                               "on it (and its blocks) before gradex.torch.HSDP")
        for m in modules:  # a forward pass before (an evaluation) leaves the root's parameters unsharded
            m.reshard()
        check_sharded_on(model, shard_mesh, "gx.HSDP")
        names = {id(p): n for n, p in model.named_parameters()}
        module_names = {id(m): n or "<root>" for n, m in model.named_modules()}
        self._layouts = [(module_names[id(m)], _fsdp_layout.module_layout(m, names, self._shard_index,
                                                                           self._shard_count))
                         for m in modules]
        self._config, self._takeover = _momentum.decide(optimizer, config, "gx.HSDP")
        self._overlap = bool(overlap)
        self._lock = threading.Lock()
        self._pending: List[int] = []  # tickets of this backward pass's exchanges
        self._callback_queued = False
        self._registered: Dict[str, Tuple[int, torch.dtype]] = {}  # key -> (numel, dtype) as registered with the engine
        self._on_device: Set[str] = set()  # keys registered as CUDA memory
        self.iteration = 0  # backward passes that exchanged gradients
        self._engine: Any = None  # the Engine, created below; None once closed
        try:
            if sync_parameters:
                broadcast_across_replicas([cast(Any, p).to_local() for _, p in model.named_parameters()], self._group)
            self._engine = _bootstrap.create_engine(self._config, None, self._group)
        except BaseException:
            if self._takeover is not None:
                self._takeover.release()
            raise
        self._finalizer = weakref.finalize(self, _errors.close_quietly, self._engine)
        self._refuse_unsupported()
        for module, (module_name, layout) in zip(modules, self._layouts):
            if layout:
                module.set_all_reduce_hook(self._make_hook(module_name, layout))

    def _refuse_unsupported(self) -> None:
        """GRADEX_CLIP_NORM clips by a rank's whole-model gradient norm and GRADEX_LOCALSGD_PERIOD averages whole
        parameters; a rank of a sharded model holds neither."""
        problems = []
        if _momentum.gradex_clip_norm(self._engine, self._config) > 0:
            problems.append("GRADEX_CLIP_NORM > 0 (clip the FSDP2 model's gradients with "
                            "torch.nn.utils.clip_grad_norm_ after backward instead)")
        if _momentum.engine_setting(self._engine, self._config, "GRADEX_LOCALSGD_PERIOD", 0) > 0:
            problems.append("GRADEX_LOCALSGD_PERIOD > 0 (for local steps across replica groups use "
                            "gx.DiLoCo(model, opt, mesh=mesh))")
        if problems:
            self.close()
            raise _errors.InvalidArgumentError("gradex: gx.HSDP does not support " + "; ".join(problems))

    @property
    def engine(self) -> Optional[_capi.Engine]:
        return self._engine

    @property
    def process_group(self) -> Optional[dist.ProcessGroup]:
        """The replicate group this rank's engine spans."""
        return self._group

    def stats(self, last_step: bool = False) -> _capi.Stats:
        return self._engine.stats(last_step)

    def _make_hook(self, module_name: str,
                   layout: List[_fsdp_layout.ShardSlice]) -> Callable[[torch.Tensor], None]:
        owner = weakref.ref(self)  # FSDP2 keeps the hook; it must not keep the engine alive

        def all_reduce_hook(reduce_output: torch.Tensor) -> None:
            hsdp = owner()
            if hsdp is None:
                raise _errors.StateError("gradex: the gx.HSDP of this model was garbage collected; keep it "
                                         "alive for as long as the model trains")
            hsdp._exchange(module_name, layout, reduce_output)
        return all_reduce_hook

    def _exchange(self, module_name: str, layout: List[_fsdp_layout.ShardSlice], flat: torch.Tensor) -> None:
        if self._engine is None:
            raise _errors.InvalidArgumentError("gradex: this gx.HSDP was closed")
        _fsdp_layout.check_size(layout, flat, module_name)
        for s in layout:
            if s.numel and s.key not in self._registered:
                self._register(s.key, s.numel, flat.dtype, _ops.memory_of(flat), s.rows)
        tickets = [_ops.submit(self._engine.address, s.key, flat.narrow(0, s.offset, s.numel),
                               on_device=s.key in self._on_device)
                   for s in layout if s.numel]
        wait_now = not self._overlap or not self._reads_later(layout, flat)
        with self._lock:
            self._pending.extend(tickets)
            queue = not self._callback_queued
            self._callback_queued = True
        if queue:
            try:
                torch.autograd.Variable._execution_engine.queue_callback(self._finish_backward)
            except RuntimeError:  # not inside a backward pass: nothing to wait for but this exchange
                self._finish_backward()
                return
        if wait_now:
            self._wait_pending()

    def _register(self, key: str, numel: int, dtype: torch.dtype, memory: int, rows: int) -> None:
        self._engine.register(key, numel, _bootstrap.dtype_code(dtype), memory, rows)
        self._registered[key] = (numel, dtype)
        if memory == _capi.DEVICE_CUDA:  # float32 CUDA shards: exchanged on the GPU (_ops.memory_of)
            self._on_device.add(key)

    @staticmethod
    def _reads_later(layout: List[_fsdp_layout.ShardSlice], flat: torch.Tensor) -> bool:
        """Whether FSDP2 only views `flat` as the sharded gradients after the hook (then the exchange may
        complete later, before backward ends)."""
        if flat.is_cuda or flat.dtype == torch.float16:
            return False
        return all(s.parameter.dtype == flat.dtype and s.parameter.grad is None for s in layout)

    def _wait_pending(self) -> None:
        with self._lock:
            tickets, self._pending = self._pending, []
        _ops.wait_all(tickets)

    def _finish_backward(self) -> None:
        """End of a backward pass that exchanged gradients: every exchange has landed, the step ends."""
        with self._lock:
            self._callback_queued = False
        self._wait_pending()
        self._engine.end_step()
        self.iteration += 1

    @property
    def _member(self) -> str:
        """This rank's place in the mesh, the key of its state: each rank's compressor state is its own."""
        return (f"replica{dist.get_rank(group=self._group)}of{dist.get_world_size(self._group)}"
                f".shard{self._shard_index}of{self._shard_count}")

    def state_dict(self) -> Dict[str, Any]:
        """This rank's compressor state (residuals, momenta, step counters, keyed by shard) under a key naming
        the rank's place in the mesh ("replica0of2.shard1of2"), so that it can go into the same
        torch.distributed.checkpoint (DCP) save as FSDP2's sharded state dict: DCP keeps one copy of a
        non-tensor value per key, and every rank's key differs. Take it between steps."""
        return {"format": _STATE_FORMAT, self._member: {
            # The registered shards as JSON text: one value for DCP (which would flatten a dict into keys that a
            # fresh state_dict(), the template DCP loads into, does not have yet).
            "iteration": self.iteration,
            "tensors": json.dumps({k: [n, str(d)] for k, (n, d) in sorted(self._registered.items())}),
            "engine": self._engine.save_state()}}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Restores state_dict()'s output (torch.save'd per rank, or loaded by DCP into a fresh state_dict()),
        taken on the same mesh shape with the same GRADEX_* policy: each rank takes the entry of its place."""
        if state.get("format") != _STATE_FORMAT:
            raise _errors.StateError(f"gradex: not a {_STATE_FORMAT} state dict (format {state.get('format')!r})")
        if self._member not in state:
            present = sorted(k for k in state if k != "format")
            raise _errors.StateError(f"gradex: the state has no entry for this rank ({self._member}); it holds "
                                     f"{present}")
        state = state[self._member]
        for key, (numel, dtype_name) in sorted(json.loads(state["tensors"]).items()):
            dtype = getattr(torch, str(dtype_name).replace("torch.", ""))
            known = self._registered.get(key)
            if known is not None and known != (int(numel), dtype):
                raise _errors.MismatchError(f"gradex: shard '{key}' has {known[0]} {known[1]} elements here, "
                                            f"{numel} {dtype_name} in the state")
            if known is None:
                owner = self._slice_of(key)
                local = owner.parameter.to_local() if owner else None
                # The memory of the reduce buffer the hook will hand over: the shard's device, the saved dtype.
                memory = (_ops.memory_of(torch.empty(0, dtype=dtype, device=local.device)) if local is not None
                          else _capi.DEVICE_CPU)
                self._register(key, int(numel), dtype, memory, owner.rows if owner else 0)
        self._engine.load_state(state["engine"])
        self.iteration = int(state["iteration"])

    def _slice_of(self, key: str) -> Optional[_fsdp_layout.ShardSlice]:
        for _, layout in self._layouts:
            for s in layout:
                if s.key == key:
                    return s
        return None

    def close(self) -> None:
        """Finishes outstanding exchanges, releases the engine and gives an SGD optimizer whose momentum gradex
        took over its momentum back. Idempotent."""
        if self._engine is None:
            return
        try:
            self._wait_pending()
        finally:
            if self._takeover is not None:
                self._takeover.release()
                self._takeover = None
            self._finalizer.detach()
            self._engine.close()
            self._engine = None

    def __enter__(self) -> HSDP:
        return self

    def __exit__(self, *exc: object) -> Literal[False]:
        self.close()
        return False
