"""gradex's compressed DDP comm hook under torchft: torchft decides who takes part and whether a step commits,
gradex's policy (DGC, 16-bit, dense; GRADEX_* as for gx.State) moves the gradients between replica groups.

    pg = ProcessGroupGradex(timeout=timedelta(seconds=10))
    manager = torchft.Manager(pg=pg, ...)
    state = gradex.torchft.State(manager, pg, model, optimizer=inner_optimizer, config={...})
    model = gradex.torchft.DistributedDataParallel(manager, model, state)
    optimizer = torchft.optim.OptimizerWrapper(manager, inner_optimizer)

Membership. The State's engine spans the same members as the Manager's ProcessGroupGradex: every
reconfiguration of that group (a new quorum) reconfigures the State's engine through the same store, under a
prefix of its own (Engine.reconfigure): a survivor keeps its per-tensor state (DGC residuals and momenta,
exchange counters, keyed by parameter name), work of the old membership is aborted. A newcomer creates its
engine and starts with empty residuals and momenta: they are this replica's own error feedback, which no peer
has; it takes the agreed exchange counters from the others at its first exchange.

Steps that do not commit. At the first bucket of every step the State waits for the quorum, then looks at
the Manager's step counter: if the previous step did not commit (should_commit() returned False, so the
counter did not move), the engine's state is rolled back to the snapshot taken when that step began
(Engine.rollback_state, bit for bit, also across an abort and a reconfiguration), so a discarded step leaves
gradex's state as if it never ran. Then it snapshots the state for this step (Engine.snapshot_state).

Replicas that do not take part (a replica healing from a peer's checkpoint) contribute exact zeros through
gradex's absent submissions (their own state untouched); every average is rescaled from the members of the
quorum to the participants, as torchft's Manager.allreduce divides its sum by the participants.

A failed exchange (a lost replica) is reported to the Manager and the bucket is returned as it is: backward
completes, should_commit() says no, and the step is discarded everywhere.

The buckets go through gradex.torch's BucketExchanger, as under gx.State: a GradScaler given as `scaler=` is
kept out of the engine's state, and GRADEX_CLIP_NORM clips by this replica's whole-model norm. The step logic
above (rollback, absent submissions, the participants' factor, errors to the Manager) is this module's.
"""
import threading
from datetime import timedelta
from typing import Any, Callable, Optional, Tuple

import torch
from torch.nn import parallel
from torchft.process_group import ProcessGroupDummy

from .. import _capi, _errors, _log
from ..torch import _integration as _gxt
from . import process_group as _pg
from ._manager import ManagerLike

_PREFIX = "gradex/hook/"


class _Generation:
    """The engine of the State's memberships and the exchanger that submits its buckets."""

    def __init__(self, engine: _capi.Engine, model: torch.nn.Module, scaler: Optional[_gxt.GradScalerLike],
                 on_failure: Callable[[BaseException], None]) -> None:
        self.engine = engine
        self.exchanger = _gxt.BucketExchanger(engine, model, dense_iterations=0, end_steps=True, scaler=scaler,
                                              on_failure=on_failure)
        # Every parameter is registered up front, so that a snapshot taken at any step start covers every
        # tensor a rollback may have to restore.
        self.exchanger.keys.register_saved(engine, {name: (p.numel(), str(p.dtype))
                                                    for name, p in model.named_parameters() if p.requires_grad})

    def release(self) -> None:
        """Aborts the engine (exchanges in flight fail at once; the peers learn it at once and go on after
        torchft's next quorum, as when a replica dies), then closes it."""
        try:
            self.engine.abort("gradex.torchft.State closed")
        except _errors.GradexError:
            pass  # already failed
        self.exchanger.close()
        try:
            self.engine.close()
        except _errors.GradexError:
            pass


class State:
    """The comm hook's state: the Manager, gradex's engine over the Manager's quorum, step snapshots.

    manager: the torchft Manager. process_group: the ProcessGroupGradex given to the Manager (its
    reconfigurations re-form this State's engine). model: the module whose parameter names key the gradients.
    config: GRADEX_* overrides for the engine (checked here). optimizer: the optimizer that trains the model,
    for gradex's momentum rule (as for gx.State). scaler: the torch.amp.GradScaler that scales the loss, if any
    (as for gx.State)."""

    def __init__(self, manager: ManagerLike, process_group: _pg.ProcessGroupGradex, model: torch.nn.Module, *,
                 config: _capi.Config = None, optimizer: Optional[torch.optim.Optimizer] = None,
                 scaler: Optional[_gxt.GradScalerLike] = None) -> None:
        if not isinstance(process_group, _pg.ProcessGroupGradex):
            raise _errors.InvalidArgumentError(
                "gradex: gradex.torchft.State needs the Manager's ProcessGroupGradex (its quorum is the State's "
                f"membership), not {type(process_group).__name__}")
        config = {str(k): str(v) for k, v in (config or {}).items()}
        _gxt.check_config(config)
        _gxt.ScaleDomain(scaler)  # a bad scaler is rejected here, not at the first quorum
        self._config, self._takeover = _gxt.decide_momentum(optimizer, config, "the gradex torchft hook")
        self._manager = manager
        self._model = model.module if isinstance(model, parallel.DistributedDataParallel) else model
        self._scaler = scaler
        self._lock = threading.Lock()
        self._generation: Optional[_Generation] = None
        self._in_step = False
        # (manager step when taken, engine) of the engine's last snapshot
        self._snapshot: Optional[Tuple[int, _capi.Engine]] = None
        self._scale = 1.0
        self._absent = False
        self.rollbacks = 0  # steps whose gradex state was rolled back (they did not commit)
        process_group.add_membership_listener(self._on_membership)

    # --- membership -------------------------------------------------------------------------------

    def _on_membership(self, store_addr: str, rank: int, world_size: int, timeout: timedelta) -> None:
        """Called by the ProcessGroupGradex after each reconfiguration, on the thread that reconfigures it
        (every member does so for the same quorum): a survivor reconfigures its engine (per-tensor state kept,
        work of the old membership aborted), a newcomer creates one; both are collective over the quorum."""
        store = _pg.create_store_client(store_addr, timeout)
        with self._lock:
            generation = self._generation
        if generation is not None:
            generation.engine.reconfigure(rank, world_size, store, _PREFIX)
            return
        config = dict(self._config)
        config["GRADEX_TIMEOUT_S"] = f"{max(timeout.total_seconds(), 0.01):g}"
        _gxt.load_ops()
        engine = _capi.Engine(rank, world_size, store, _PREFIX, config)
        with self._lock:
            self._generation = _Generation(engine, self._model, self._scaler, self._on_failure)

    @property
    def engine(self) -> Optional[_capi.Engine]:
        """The engine of the current quorum (None before the first one)."""
        generation = self._generation
        return generation.engine if generation is not None else None

    # --- steps ------------------------------------------------------------------------------------

    def _begin_step(self) -> Optional[_Generation]:
        manager = self._manager
        manager.wait_quorum()
        step = manager.current_step()
        generation = self._generation
        snapshot, self._snapshot = self._snapshot, None
        if snapshot is not None and snapshot[0] == step and generation is not None \
                and snapshot[1] is generation.engine:
            generation.engine.rollback_state()  # the previous step did not commit
            self.rollbacks += 1
        if generation is None or manager.errored() is not None:
            return None
        try:
            generation.engine.snapshot_state()
        except _errors.GradexError as exc:  # a failed engine, not reconfigured since: the step cannot run
            manager.report_error(exc)
            return None
        self._snapshot = (step, generation.engine)
        participants = manager.num_participants()
        self._absent = not manager.is_participating()
        self._scale = generation.engine.world_size / participants if participants else 0.0
        return generation

    def exchange(self, bucket: torch.distributed.GradBucket) -> torch.futures.Future[torch.Tensor]:
        if not self._in_step:
            self._in_step = True
            self._step_generation = self._begin_step()
        generation = self._step_generation
        if bucket.is_last():
            self._in_step = False
        if generation is None:
            return _completed(bucket.buffer())
        if self._manager.errored() is not None:
            return generation.exchanger.skip(bucket)
        return generation.exchanger.exchange(bucket, absent=self._absent, factor=self._scale)

    def _on_failure(self, exc: BaseException) -> None:
        """A lost replica: torchft discards the step."""
        _log.warn_once(("torchft-hook-failed", id(self)), "gradex: torchft hook: exchange failed, the step is "
                       "discarded: %s", exc)
        self._manager.report_error(exc)

    def close(self) -> None:
        """Releases the engine (idempotent); the other replicas see this replica leave, as if it had died."""
        with self._lock:
            generation, self._generation = self._generation, None
            if self._takeover is not None:
                self._takeover.release()
                self._takeover = None
        if generation is not None:
            generation.release()


# The annotations are evaluated (no `from __future__ import annotations` here): DDP's register_comm_hook
# compares them with dist.GradBucket and torch.futures.Future[torch.Tensor].
def hook(state: State, bucket: torch.distributed.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP comm hook: gradex's exchange of the bucket between the replica groups of torchft's quorum."""
    return state.exchange(bucket)


class DistributedDataParallel(parallel.DistributedDataParallel):
    """torchft's fault-tolerant DDP with gradex's hook: as torchft.ddp.DistributedDataParallel (a dummy group
    takes DDP's initial broadcast, the Manager syncs weights; buckets are never rebuilt), with gradients
    exchanged by `state` (a gradex.torchft.State)."""

    def __init__(self, manager: ManagerLike, module: torch.nn.Module, state: State, **kwargs: Any) -> None:
        super().__init__(module, process_group=ProcessGroupDummy(0, 1), find_unused_parameters=True, **kwargs)
        self.register_comm_hook(state, hook)


def _completed(buffer: torch.Tensor) -> torch.futures.Future:
    future: torch.futures.Future = torch.futures.Future(devices=[buffer.device] if buffer.is_cuda else None)
    future.set_result(buffer)
    return future
