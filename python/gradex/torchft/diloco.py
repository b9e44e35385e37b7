"""gradex's DiLoCo as the outer loop of a torchft job: torchft decides who takes part in each outer sync,
whether it commits, and heals a replica that joins; gradex's outer optimizer (outer/) averages the
pseudo-gradients in 4 (default) or 8 bits and applies the outer Nesterov step.

    pg = gradex.torchft.ProcessGroupGradex(timeout=timedelta(seconds=10))
    manager = torchft.Manager(pg=pg, use_async_quorum=False, load_state_dict=load, state_dict=save, ...)
    with gradex.torchft.DiLoCo(manager, model, inner_optimizer, sync_every=100, bits=4) as diloco:
        for x, y in data:
            inner_optimizer.zero_grad()
            loss_fn(model(x), y).backward()
            inner_optimizer.step()          # every sync_every / fragments steps: an outer sync

As torchft.local_sgd.DiLoCo, it hooks the inner optimizer's step. At a step that starts an outer sync it asks
torchft for a quorum (Manager.start_quorum: a new quorum reconfigures the outer optimizer's connections, a
replica behind the others heals from a peer), then starts the exchange of the fragment due; at the step that
merges it (fragment_sync_delay steps later, 0: the same step) it asks whether the sync commits
(Manager.should_commit). A sync that does not commit (a replica died during it, too few replicas) is rolled
back: the outer state (global copies, outer momenta, residuals, step count) returns to what it was before the
sync began and the parameters to what they were before the merge (local progress is kept); the next inner
step starts it again, with the next quorum.

Membership. The outer optimizer spans the members of the Manager's ProcessGroupGradex and follows its
reconfigurations (its own connections under the quorum's store). A survivor keeps its outer state. A replica
that joins creates its outer optimizer when the quorum forms and then receives the outer state (global copies,
outer momenta, step count, fragment schedule; gradex_outer_save_shared_state) from a healthy peer through
torchft's recovery, with the model and inner optimizer state of the Manager's own state_dict functions (which
must hold the model and the inner optimizer, as for torchft's DiLoCo). Its residuals start at zero: they are
its own error feedback.
"""
from __future__ import annotations

import weakref
from datetime import timedelta
from typing import Any, Dict, List, Literal, Optional

import torch
from torch.utils.hooks import RemovableHandle

from .. import _capi, _errors, _outer_config
from ..torch import _integration as _gxt
from . import process_group as _pg
from ._manager import ManagerLike

_PREFIX = "gradex/diloco/"
_STATE_KEY = "gradex.torchft.DiLoCo"
_STATE_FORMAT = "gradex.torchft.DiLoCo/1"


class _Attempt:
    """One outer sync from its quorum to its commit decision."""

    def __init__(self, launch_step: int, merge_step: int) -> None:
        self.launch_step = launch_step
        self.merge_step = merge_step
        self.snapshot: Optional[bytes] = None  # this rank's full outer state before the sync (Outer.save_state)
        self.failed = False  # no exchange could start (no quorum, a failed reconfiguration)


def _close_quietly(holder: List[Optional[_capi.Outer]]) -> None:
    outer, holder[0] = holder[0], None
    _errors.close_quietly(outer)  # the peers may be gone; nothing is left to tell them


class DiLoCo:
    """gradex's DiLoCo over a torchft Manager (see the module docstring).

    manager: a torchft Manager with use_async_quorum=False (as torchft's DiLoCo requires) over a
    ProcessGroupGradex (or pass that group as process_group=). model: the module trained (float32 CPU
    parameters that stay at their address; an FSDP2 model sharded inside the replica group, with a Manager per
    rank of the group: each rank's outer step runs on its own shards). inner_optimizer: its optimizer (hooked by `with`).
    sync_every: H, inner steps between two syncs of a fragment; fragments: F, syncs staggered every H/F steps
    (F must divide H); fragment_sync_delay: d < H/F steps between the start of a sync and its merge (the
    exchange runs in the background meanwhile); fragment_update_alpha: a, parameters = (1 - a) * global +
    a * local at a merge. outer_lr, outer_momentum, nesterov: the outer optimizer (Nesterov SGD). bits: 4 or 8
    (block-quantized with error feedback) or 32 (exact); compression="topk" with density= for top-k.
    config: other GRADEX_* settings of the outer optimizer."""

    def __init__(self, manager: ManagerLike, model: torch.nn.Module, inner_optimizer: torch.optim.Optimizer, sync_every: int,
                 *, fragments: int = 1, fragment_sync_delay: int = 0, fragment_update_alpha: float = 0.0,
                 outer_lr: float = 0.7, outer_momentum: float = 0.9, nesterov: bool = True, bits: int = 4,
                 compression: str = "quant", density: Optional[float] = None, config: _capi.Config = None,
                 process_group: Optional[_pg.ProcessGroupGradex] = None) -> None:
        if getattr(manager, "_use_async_quorum", False):
            raise ValueError("gradex: DiLoCo needs a synchronous quorum: create the Manager with "
                             "use_async_quorum=False (as torchft's DiLoCo)")
        pg = process_group if process_group is not None else getattr(manager, "_pg", None)
        if not isinstance(pg, _pg.ProcessGroupGradex):
            raise _errors.InvalidArgumentError(
                "gradex: gradex.torchft.DiLoCo needs the Manager's ProcessGroupGradex (its quorum is the outer "
                f"optimizer's membership), not {type(pg).__name__}")
        if isinstance(model, torch.nn.parallel.DistributedDataParallel):
            raise _errors.InvalidArgumentError("gradex: DiLoCo replaces DDP; pass the plain module")
        for name, value in (("sync_every", sync_every), ("fragments", fragments),
                            ("fragment_sync_delay", fragment_sync_delay)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise _errors.ConfigError(f"gradex: DiLoCo {name} must be an integer, got {value!r}")
        if fragments < 1 or sync_every < fragments or sync_every % fragments:
            raise _errors.ConfigError(f"gradex: DiLoCo sync_every ({sync_every}) must be a multiple of fragments "
                                      f"({fragments})")
        if not 0 <= fragment_sync_delay < sync_every // fragments:
            raise _errors.ConfigError(
                f"gradex: DiLoCo fragment_sync_delay must be in [0, sync_every / fragments = "
                f"{sync_every // fragments}): one fragment's sync at a time, got {fragment_sync_delay}")
        if not 0.0 <= float(fragment_update_alpha) <= 1.0:
            raise _errors.ConfigError("gradex: DiLoCo fragment_update_alpha must be in [0, 1], got "
                                      f"{fragment_update_alpha!r}")
        self._config = _outer_config.outer_config(sync_every, outer_lr, outer_momentum, fragments,
                                                  fragment_sync_delay, bits, nesterov, fragment_update_alpha,
                                                  compression, density, config)
        self._period, self._fragments, self._delay = sync_every, fragments, fragment_sync_delay
        self._manager = manager
        self.model = model
        self.inner_optimizer = inner_optimizer
        # An FSDP2 model (fully_shard on the replica group's own mesh): the outer optimizer owns this rank's
        # parameter shards, and the Manager's process group spans the ranks of the same group rank in the other
        # replica groups, which hold the same shards.
        self._fsdp_modules = _gxt.fsdp_modules(model)
        self._params = _gxt.local_parameters(model)
        self._buffers = [(n, b) for n, b in model.named_buffers() if b.dtype == torch.float32]
        self._tensors = [(f"param.{n}", p.detach(), False) for n, p in self._params]
        self._tensors += [(f"buffer.{n}", b, True) for n, b in self._buffers]
        for key, t, _ in self._tensors:
            _gxt.tensor_address(key, t)  # rejected now, not at the first quorum
        # torchft's DiLoCo takes its first global copy at construction; the outer optimizer is created at the
        # first quorum, so the parameters of now are kept until then.
        with torch.no_grad():
            self._initial: Optional[List[torch.Tensor]] = [p.detach().clone() for _, p in self._params]
        self._holder: List[Optional[_capi.Outer]] = [None]  # the _capi.Outer, once the first quorum formed
        self._finalizer = weakref.finalize(self, _close_quietly, self._holder)
        self._steps = 0  # inner steps ended (the outer optimizer's step count, mirrored before it exists)
        self._attempt: Optional[_Attempt] = None
        self._hooks: List[RemovableHandle] = []
        self._closed = False
        self.commits = 0  # outer syncs committed
        self.rollbacks = 0  # outer syncs that did not commit (rolled back)
        self.heals = 0  # outer states received from a peer
        pg.add_membership_listener(self._on_membership)
        manager.register_state_dict_fn(_STATE_KEY, self._load_state_dict, self._state_dict)

    # --- membership and recovery (on torchft's quorum thread, while the training thread waits for it) ------

    @property
    def _outer(self) -> Optional[_capi.Outer]:
        return self._holder[0]

    def _on_membership(self, store_addr: str, rank: int, world_size: int, timeout: timedelta) -> None:
        if self._closed:
            return
        store = _pg.create_store_client(store_addr, timeout)
        outer = self._outer
        if outer is not None:  # a survivor: its outer state is kept
            outer.reconfigure(rank, world_size, store, _PREFIX)
            return
        config = dict(self._config)
        config["GRADEX_TIMEOUT_S"] = f"{max(timeout.total_seconds(), 0.01):g}"
        outer = _capi.Outer(rank, world_size, store, _PREFIX, config)
        try:
            for key, t, is_buffer in self._tensors:
                outer.add_tensor(key, t.data_ptr(), t.numel(), is_buffer)
            # The global copies start from the parameters at construction (the training thread is waiting
            # for this quorum, so the parameters can be swapped for the call).
            assert self._initial is not None  # kept until the outer optimizer exists
            with torch.no_grad():
                live = [p.detach().clone() for _, p in self._params]
                try:
                    for (_, p), first in zip(self._params, self._initial):
                        p.copy_(first)
                    outer.start_local(self._steps)
                finally:
                    for (_, p), value in zip(self._params, live):
                        p.copy_(value)
        except BaseException:
            outer.close()
            raise
        self._holder[0] = outer
        self._initial = None

    def _state_dict(self) -> Dict[str, Any]:
        """The Manager's state_dict entry: the shared outer state (what every member holds identically)."""
        outer = self._outer
        blob = outer.save_shared_state() if outer is not None else None
        return {"format": _STATE_FORMAT,
                "shared": torch.frombuffer(bytearray(blob), dtype=torch.uint8) if blob else None}

    def _load_state_dict(self, state: Dict[str, Any]) -> None:
        """The Manager's load_state_dict entry (a replica healing from a peer): loads the peer's shared outer
        state; corrupt or mismatched state raises (gradex.CorruptError / gradex.StateError) and changes
        nothing."""
        if not isinstance(state, dict) or state.get("format") != _STATE_FORMAT:
            got = state.get("format") if isinstance(state, dict) else type(state).__name__
            raise _errors.StateError(f"gradex: not a {_STATE_FORMAT} state (format {got!r})")
        shared = state.get("shared")
        if shared is None:
            return  # the peer had not formed a quorum yet: nothing to take
        outer = self._outer
        if outer is None:
            raise _errors.StateError("gradex: DiLoCo received an outer state before its first quorum")
        outer.load_shared_state(shared.numpy().tobytes() if isinstance(shared, torch.Tensor) else bytes(shared))
        self._steps = outer.step_count()
        self.heals += 1

    # --- the inner optimizer's hooks (training thread) --------------------------------------------------

    def __enter__(self) -> DiLoCo:
        self._hooks.append(self.inner_optimizer.register_step_pre_hook(self._before_inner_step))
        self._hooks.append(self.inner_optimizer.register_step_post_hook(self._after_inner_step))
        return self

    def __exit__(self, *exc: object) -> Literal[False]:
        for hook in self._hooks:
            hook.remove()
        self._hooks = []
        return False

    def _before_inner_step(self, *_: object) -> None:
        self._manager.disallow_state_dict_read()  # a peer's recovery may read the parameters otherwise

    def _due(self, step: int) -> bool:
        return any(step % self._period == _outer_config.fragment_offset(f, self._fragments, self._period)
                   for f in range(self._fragments))

    @torch.no_grad()
    def _after_inner_step(self, *_: object) -> None:
        self._manager.allow_state_dict_read()
        _gxt.reshard(self._fsdp_modules)  # an evaluation's forward pass may have left the root unsharded
        if self._attempt is None and self._due(self._steps + 1):
            self._begin_sync()
        attempt = self._attempt
        step = self._steps + 1
        merging = attempt is not None and step >= attempt.merge_step
        before_merge = [t.clone() for _, t, _ in self._tensors] if merging else None
        failed = attempt is not None and attempt.failed
        outer = self._outer
        if not failed and outer is not None:
            try:
                outer.step()
                self._steps = step
            except _errors.GradexError as exc:  # a lost peer: torchft discards the sync
                self._manager.report_error(exc)
                failed = True
        elif outer is None and attempt is None:
            self._steps = step  # before the first quorum: the clock runs, nothing is exchanged
        if attempt is not None and (merging or failed):
            self._end_sync(attempt, before_merge)

    def _begin_sync(self) -> None:
        """A new quorum for the sync due at the next step, then this rank's outer state as it is before it."""
        manager = self._manager
        manager.start_quorum()  # reconfigures the outer optimizer; a replica behind heals here
        step = self._steps + 1
        attempt = _Attempt(step, step + self._delay)
        outer = self._outer
        if outer is None or manager.errored() is not None or not self._due(step):
            attempt.failed = True
        else:
            try:
                attempt.snapshot = outer.save_state()
            except _errors.GradexError as exc:  # failed and not reconfigured since
                manager.report_error(exc)
                attempt.failed = True
        self._attempt = attempt

    def _end_sync(self, attempt: _Attempt, before_merge: Optional[List[torch.Tensor]]) -> None:
        self._attempt = None
        if self._manager.should_commit():
            self.commits += 1
            return
        self.rollbacks += 1
        outer = self._outer
        if attempt.snapshot is not None:
            assert outer is not None  # the snapshot was taken from it
            outer.load_state(attempt.snapshot)  # also on a failed outer optimizer; exchanges in flight dropped
            self._steps = outer.step_count()
        if before_merge is not None:
            for (_, t, _), value in zip(self._tensors, before_merge):
                t.copy_(value)

    # --- inspection -----------------------------------------------------------------------------------

    @property
    def in_flight(self) -> bool:
        """Whether an outer sync has started and not yet been committed or rolled back."""
        return self._attempt is not None

    def shared_state(self) -> Optional[bytes]:
        """The shared outer state as bytes (bit-identical on every replica after a committed sync); None before
        the first quorum."""
        outer = self._outer
        return outer.save_shared_state() if outer is not None else None

    def global_parameters(self) -> Dict[str, torch.Tensor]:
        """{name: tensor} of the global copy (identical on every replica)."""
        outer = self._outer
        if outer is None:
            raise _errors.StateError("gradex: DiLoCo has no global copy before its first quorum")
        out = {}
        for name, p in self._params:
            t = torch.empty(p.shape, dtype=torch.float32)
            outer.global_copy(f"param.{name}", t.data_ptr(), t.numel())
            out[name] = t
        return out

    def stats(self) -> Optional[_capi.Stats]:
        """The outer optimizer's counters (gx.stats): bytes_sent/received, dense_bytes, compression_ratio,
        parameter_averages (fragment syncs merged), communicate_seconds, decode_seconds."""
        outer = self._outer
        return outer.stats() if outer is not None else None

    @property
    def engine(self) -> Optional[_capi.Outer]:
        return self._outer

    def close(self) -> None:
        """Releases the outer optimizer's connections (waits for the peers to leave too, within the timeout)."""
        self._closed = True
        self.__exit__(None, None, None)
        self._finalizer()
