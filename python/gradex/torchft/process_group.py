"""ProcessGroupGradex: a torchft ProcessGroup whose collectives run on a gradex engine.

    from gradex.torchft import ProcessGroupGradex
    pg = ProcessGroupGradex(timeout=timedelta(seconds=10))
    manager = torchft.Manager(pg=pg, ...)

Constructed like torchft's ProcessGroupGloo and reconfigured the same way: torchft's Manager hands every
quorum's ordered reconfigure handles to `reconfigure(opts)`; this group's rank is the index of its own handle,
and every member bootstraps its engine through the first handle's store under the quorum's id (torchft's
`_rendezvous`). The group keeps one engine for its life: a survivor of a quorum change reconfigures it
(Engine.reconfigure), a newcomer creates it; both are collective over the new quorum. Between two quorums the
group runs one *generation* (the engine's current membership and the threads that drive it); a reconfiguration,
an abort or a failed operation ends it: its pending operations fail at once with the reason and the engine is
aborted (Engine.abort: its work in flight fails within milliseconds, the peers learn it at once).

Operations run in issue order on one worker thread per generation, so every rank drives its engine with the
same sequence of keys. Results:
- allreduce of float32/float16/bfloat16 with AVG or SUM: the engine's fp32 ring average (SUM: times the world
  size; one rounding more than a ring sum, the same bits on every rank);
- every other reduction (integer and bool tensors, float64, MIN/MAX/PRODUCT, bitwise ops), allgather,
  broadcast, alltoall and reduce_scatter: exact, through the generation's gradex group (bytes unchanged: a
  chain broadcast, a ring allgather; created at the generation's first such operation, on every member at the
  same point of the operation sequence), reduced in rank order;
- send/recv: through the quorum's store (point to point, no collective), for the Manager's checkpoint
  transport over a process group and small tensors; the store server lives in the first member's process.
A failed operation (a lost peer, a timeout) fails its Work and future, makes errored() report the group as
aborted, and fails every later operation until the next reconfigure, as torchft expects.
"""
from __future__ import annotations

import atexit
import collections
import concurrent.futures
import json
import threading
import weakref
from datetime import timedelta
from typing import Any, Callable, Dict, List, Optional, Sequence, Set

import torch
from torch.distributed import TCPStore
from torch.distributed.distributed_c10d import ReduceOp
from torchft.process_group import ProcessGroup, _rendezvous, create_store_client

from .. import _capi, _errors
from .._exact_config import exact_average_config
from ..torch import _integration as _gxt
from . import _exact, _work

_BACKEND_NAME = "torchft-gradex"
_PREFIX = "gradex/pg/"  # under the quorum's store prefix (torchft/<quorum id>/)
_GROUP_PREFIX = "gradex/pg-group/"  # the generation's exact collectives' group, under the same prefix
_releasing: List[threading.Thread] = []  # threads releasing retired engines; joined at interpreter exit


def _join_releases() -> None:
    """Lets retired engines finish closing before the C++ runtime tears down under their threads."""
    for thread in list(_releasing):
        thread.join()


atexit.register(_join_releases)
_FLOAT_AVERAGED = (torch.float32, torch.float16, torch.bfloat16)


def engine_config(timeout: timedelta) -> Dict[str, str]:
    """The collectives' engine configuration: gradex's exact-average settings with the group's timeout for
    every wait (a dead peer fails an operation within it)."""
    return exact_average_config(GRADEX_TIMEOUT_S=f"{max(timeout.total_seconds(), 0.01):g}")


def group_config(timeout: timedelta, extra: _capi.Config) -> Dict[str, str]:
    """The exact collectives' group configuration: the connection settings of `extra` (a group reads no
    other), the group's timeout for every wait."""
    config = {str(k): str(v) for k, v in (extra or {}).items()}
    config["GRADEX_TIMEOUT_S"] = f"{max(timeout.total_seconds(), 0.01):g}"
    return config


def _reduce_op(opts: Any) -> Any:
    """The RedOpType of a ReduceOp, a RedOpType or an options object (ReduceOp objects compare equal to a
    RedOpType only from their own side, so everything below compares RedOpTypes)."""
    op = opts if isinstance(opts, (ReduceOp, ReduceOp.RedOpType)) else opts.reduceOp
    return op if isinstance(op, ReduceOp.RedOpType) else op.op


class _Generation:
    """One engine and the threads that drive it, for one membership."""

    def __init__(self, engine: _capi.Engine, store_addr: str, timeout: timedelta,
                 group_config: Dict[str, str]) -> None:
        self.engine = engine
        self._group: Optional[_capi.Group] = None
        self._group_config = group_config
        self.rank, self.world_size = engine.rank, engine.world_size
        self.store_addr = store_addr
        self.timeout = timeout
        self.collectives = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="gradex_pg")
        self.p2p = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="gradex_pg_p2p")
        self.p2p_store: Any = None
        self.store: Any = None  # the store the engine bootstrapped through (set by reconfigure)
        self.sequence: collections.Counter = collections.Counter()  # (direction, peer, tag) -> messages so far
        self.pending: Set[_work.Operation] = set()
        self.lock = threading.Lock()
        self.error: Optional[BaseException] = None
        self.engine_aborted = False

    def group(self) -> _capi.Group:
        """The generation's group of exact collectives, created at its first use (on the worker thread, which
        every member reaches at the same operation: creation is collective)."""
        with self.lock:
            if self.error is not None:
                raise self.error
        if self._group is None:
            self._group = _capi.Group(self.rank, self.world_size, self.store, _GROUP_PREFIX, self._group_config)
            if self.error is not None:  # aborted while it was being created
                self._group.abort(str(self.error))
        return self._group

    def abort(self, error: BaseException) -> None:
        """Fails every pending operation with `error`, makes later ones fail at once, and aborts the engine (its
        work in flight fails within milliseconds; the peers learn it at once). The engine and the workers stay
        for the next reconfiguration. Idempotent."""
        with self.lock:
            if self.error is None:
                self.error = error
            pending, self.pending = list(self.pending), set()
            first, self.engine_aborted = not self.engine_aborted, True
        for operation in pending:
            operation.fail(self.error)
        if first and self.engine.address:
            try:
                self.engine.abort(str(error))
            except _errors.GradexError:
                pass  # already failed: the close or reconfigure that follows deals with it
        group = self._group
        if first and group is not None and group.address:
            try:
                group.abort(str(error))
            except _errors.GradexError:
                pass

    def retire(self, error: BaseException, keep_engine: bool = False) -> Optional[_capi.Engine]:
        """Ends the generation: abort(error), then waits for the workers to stop. keep_engine: returns the
        engine, for Engine.reconfigure; else the engine is closed on a thread of its own (joined at interpreter
        exit)."""
        self.abort(error)

        def stop_workers() -> None:
            self.collectives.shutdown(wait=True)
            self.p2p.shutdown(wait=True)

        def close_group() -> None:
            try:
                _errors.close_quietly(self._group)  # aborted above: closes at once
            finally:
                self._group = None

        if keep_engine:
            stop_workers()
            close_group()
            return self.engine

        def release() -> None:
            stop_workers()
            close_group()
            try:
                self.engine.close()
            except _errors.GradexError:
                pass  # the peers are gone; nothing is left to tell them

        thread = threading.Thread(target=release, name="gradex_pg_release", daemon=True)
        thread.start()
        _releasing[:] = [t for t in _releasing if t.is_alive()] + [thread]
        return None


def advertised_reconfigure_handle(pg: ProcessGroupGradex, host: str) -> str:
    """torchft's reconfigure handle of `pg` (any torchft ProcessGroup: its id, the rendezvous store it serves,
    its global rank) with the store advertised at `host` instead of socket.gethostname(). The store server is
    created on first use, as torchft does, and listens on every interface."""
    host = host.strip("[]")
    if pg._rendezvous_store is None:
        pg._rendezvous_store = TCPStore(host_name=host, port=0, is_master=True, wait_for_workers=False)
    if ":" in host:
        host = f"[{host}]"  # IPv6: create_store_client takes the port after the last colon
    return json.dumps({"id": pg._handle_id(), "store": f"{host}:{pg._rendezvous_store.port}",
                       "global_rank": pg._global_rank})


class ProcessGroupGradex(ProcessGroup):
    """A reconfigurable torchft process group over a gradex engine (see the module docstring).

    timeout: how long any operation, the engine's bootstrap and a reconfiguration may wait for a peer.
    config: further GRADEX_* settings for the group's engine (transport choices, GRADEX_SHM...); the exactness
    settings of engine_config() always win.
    host: the address the peers reach this process at, advertised in its reconfigure handle for the rendezvous
    store it serves (torchft advertises socket.gethostname(), which need not resolve to a reachable address
    from another host or network namespace). None: socket.gethostname(), as torchft does."""

    def __init__(self, timeout: timedelta = timedelta(seconds=60), config: _capi.Config = None,
                 host: Optional[str] = None) -> None:
        super().__init__(0, 1)
        if host is not None and (not isinstance(host, str) or not host.strip("[]") or "/" in host):
            raise ValueError(f"gradex: ProcessGroupGradex host must be a host name or address, got {host!r}")
        self._advertised_host = host.strip("[]") if host is not None else None
        self._timeout = timeout
        self._extra_config = {str(k): str(v) for k, v in (config or {}).items()}
        self._generation: Optional[_Generation] = None
        self._issue_lock = threading.Lock()
        # Garbage collection and interpreter exit retire the engine too: torchft drops a failed replica's
        # group without shutting it down, and an engine left running would keep its peers waiting.
        self._holder: List[Optional[_Generation]] = [None]
        # an engine whose reconfiguration failed, kept for the next one
        self._spare_engine: Optional[_capi.Engine] = None
        self._finalizer = weakref.finalize(self, _retire_held, self._holder)
        # callables(store_addr, rank, world_size, timeout) told of every membership
        self._listeners: List[Callable[[str, int, int, timedelta], None]] = []

    # --- membership ---------------------------------------------------------------------------------

    def get_reconfigure_handle(self) -> str:
        """torchft's handle, with the rendezvous store advertised at `host` when one was given."""
        if self._advertised_host is None:
            return super().get_reconfigure_handle()
        return advertised_reconfigure_handle(self, self._advertised_host)

    def reconfigure(self, opts: Any) -> _work.GradexWork:
        """Joins the membership of torchft's ordered handles (blocks until the engine is up; raises on
        failure, e.g. a missing peer after the timeout)."""
        rendezvous = _rendezvous(opts, self._handle_id())
        timeout = opts.timeout if getattr(opts, "timeout", None) else self._timeout
        with self._issue_lock:
            old, self._generation = self._generation, None
            self._holder[0] = None
        engine, self._spare_engine = self._spare_engine, None
        if old is not None:
            engine = old.retire(RuntimeError(f"gradex: process group aborted: reconfigured for quorum "
                                             f"{rendezvous.uuid}"), keep_engine=True)
        _gxt.load_ops()
        store = create_store_client(rendezvous.store_addr, timeout)
        # The listeners' engines bootstrap through the same quorum under prefixes of their own, independent of
        # this group's engine: they are re-formed concurrently with it (in series, every engine's wire-up and
        # start-up agreement added to a rejoining replica's wait).
        told = _Listeners(self._listeners, rendezvous.store_addr, rendezvous.rank, rendezvous.world_size, timeout)
        try:
            if engine is not None:  # a survivor: same engine, new members (collective with newcomers' creation)
                try:
                    engine.reconfigure(rendezvous.rank, rendezvous.world_size, store, _PREFIX)
                except _errors.GradexError:
                    self._spare_engine = engine  # failed, and reconfigurable again at the next quorum
                    raise
            else:
                config = dict(self._extra_config)
                config.update(engine_config(timeout))
                engine = _capi.Engine(rendezvous.rank, rendezvous.world_size, store, _PREFIX, config)
        finally:
            listener_error = told.join()  # a failed engine above is the error to report; the listeners end first
        generation = _Generation(engine, rendezvous.store_addr, timeout, group_config(timeout, self._extra_config))
        generation.store = store  # the engine's adapter holds it too; kept for p2p after bootstrap
        with self._issue_lock:
            self._generation = generation
            self._holder[0] = generation
        if listener_error is not None:
            raise listener_error
        return _work.completed_work(None)

    def add_membership_listener(self, listener: Callable[[str, int, int, timedelta], None]) -> None:
        """Calls listener(store_addr, rank, world_size, timeout) at every reconfiguration, on a thread of its
        own while this group's engine is re-formed (gradex's torchft comm hook re-forms its own engine over the
        same quorum this way); reconfigure() returns once every listener has returned and raises the first
        listener's exception (after the group's own engine is up) when one raised."""
        self._listeners.append(listener)

    def _retire(self, error: BaseException) -> None:
        with self._issue_lock:
            generation, self._generation = self._generation, None
            self._holder[0] = None
        if generation is not None:
            generation.retire(error)

    def _abort_generation(self, reason: str) -> None:
        """Aborts the current generation after a failure (errored() then reports it until reconfigure)."""
        with self._issue_lock:
            generation = self._generation
        if generation is not None:
            generation.abort(RuntimeError(f"gradex: process group aborted: {reason}"))

    def abort(self, errored: bool = True) -> None:
        self._abort_generation("abort() called")

    def shutdown(self) -> None:
        self._retire(RuntimeError("gradex: process group shut down"))
        spare, self._spare_engine = self._spare_engine, None
        if spare is not None:
            spare.close()

    def errored(self) -> Optional[BaseException]:
        generation = self._generation
        return generation.error if generation is not None else None

    def set_timeout(self, timeout: timedelta) -> None:
        """The limit for waits on operations issued from now on (the engine's own limit is set at the next
        reconfigure)."""
        self._timeout = timeout

    def size(self) -> int:
        generation = self._generation
        if generation is None:
            raise RuntimeError("gradex: process group not initialized (torchft has not reconfigured it yet)")
        return generation.world_size

    def getBackendName(self) -> str:
        return _BACKEND_NAME

    def __repr__(self) -> str:
        generation = self._generation
        where = f"rank={generation.rank}, world_size={generation.world_size}" if generation else "unconfigured"
        return f"ProcessGroupGradex({where})"

    # --- issuing ------------------------------------------------------------------------------------

    def _issue(self, name: str, result: Any, body: Callable[[_Generation], None],
               p2p: bool = False) -> _work.GradexWork:
        """Queues body(generation) on the generation's worker; returns its Work."""
        operation = _work.Operation(name, result)
        with self._issue_lock:
            generation = self._generation
            if generation is None:
                operation.fail(RuntimeError(f"gradex: {name}: process group not initialized"))
                return _work.GradexWork(self, operation)
            with generation.lock:
                if generation.error is not None:
                    operation.fail(generation.error)
                    return _work.GradexWork(self, operation)
                generation.pending.add(operation)
            executor = generation.p2p if p2p else generation.collectives

            def run() -> None:
                if operation.wait_done(0):
                    return  # failed by an abort before it started
                try:
                    body(generation)
                except Exception as exc:  # every failure goes to the operation's future, none is lost
                    error = exc if isinstance(exc, RuntimeError) else RuntimeError(f"gradex: {name}: {exc}")
                    aborted = RuntimeError(f"gradex: process group aborted after {name} failed: {exc}")
                    with generation.lock:  # errored() says so before anyone sees the operation fail
                        if generation.error is None:
                            generation.error = aborted
                    operation.fail(error)
                    generation.abort(aborted)
                else:
                    operation.succeed()
                finally:
                    with generation.lock:
                        generation.pending.discard(operation)

            try:
                executor.submit(run)
            except RuntimeError as exc:  # the generation was retired meanwhile
                operation.fail(generation.error or exc)
        return _work.GradexWork(self, operation)

    # --- reductions ---------------------------------------------------------------------------------

    @staticmethod
    def _reduce_into(generation: _Generation, tensor: torch.Tensor, op: Any) -> None:
        """Reduces `tensor` over the generation's ranks in place (see the module docstring)."""
        if op in (ReduceOp.SUM, ReduceOp.AVG) and tensor.dtype in _FLOAT_AVERAGED:
            values = tensor.detach().to("cpu", torch.float32).reshape(-1).clone()
            _exact.average_(generation.engine, values)
            if op == ReduceOp.SUM:
                values *= generation.world_size
            with torch.no_grad():
                tensor.copy_(values.view(tensor.shape))
            return
        gathered = _exact.allgather(generation.group(), tensor)
        with torch.no_grad():
            tensor.copy_(_combine(gathered, op, tensor.dtype).view(tensor.shape))

    def allreduce(self, tensors: List[torch.Tensor], opts: Any) -> _work.GradexWork:
        op = _reduce_op(opts)
        _check_op(op, tensors)

        def body(generation: _Generation) -> None:
            for t in tensors:
                self._reduce_into(generation, t, op)
        return self._issue("allreduce", tensors, body)

    def allreduce_coalesced(self, tensors: List[torch.Tensor], opts: Any) -> _work.GradexWork:
        return self.allreduce(tensors, opts)

    def reduce_scatter(self, output_tensors: List[torch.Tensor], input_tensors: List[List[torch.Tensor]],
                       opts: Any) -> _work.GradexWork:
        op = _reduce_op(opts)

        def body(generation: _Generation) -> None:
            for out, inputs in zip(output_tensors, input_tensors):
                stacked = torch.stack([t.detach().cpu() for t in inputs])
                self._reduce_into(generation, stacked, op)
                with torch.no_grad():
                    out.copy_(stacked[generation.rank].view(out.shape))
        return self._issue("reduce_scatter", output_tensors, body)

    def reduce_scatter_tensor_coalesced(self, output_tensors: List[torch.Tensor], input_tensors: List[torch.Tensor],
                                        opts: Any) -> _work.GradexWork:
        op = _reduce_op(opts)

        def body(generation: _Generation) -> None:
            for out, inp in zip(output_tensors, input_tensors):
                whole = inp.detach().cpu().clone().reshape(generation.world_size, -1)
                self._reduce_into(generation, whole, op)
                with torch.no_grad():
                    out.copy_(whole[generation.rank].view(out.shape))
        return self._issue("reduce_scatter_tensor_coalesced", output_tensors, body)

    # --- gathers and broadcasts ---------------------------------------------------------------------

    def allgather(self, output_tensors: List[List[torch.Tensor]], input_tensor: List[torch.Tensor],
                  opts: Any) -> _work.GradexWork:
        def body(generation: _Generation) -> None:
            for outs, inp in zip(output_tensors, input_tensor):
                if len(outs) != generation.world_size:
                    raise _errors.InvalidArgumentError(
                        f"gradex: allgather needs {generation.world_size} output tensors, got {len(outs)}")
                _exact.check_same_layout(generation.group(), [inp], "allgather")
                for out, got in zip(outs, _exact.allgather(generation.group(), inp)):
                    with torch.no_grad():
                        out.copy_(got)
        return self._issue("allgather", output_tensors, body)

    def allgather_into_tensor_coalesced(self, output_tensors: List[torch.Tensor], input_tensors: List[torch.Tensor],
                                        opts: Any) -> _work.GradexWork:
        def body(generation: _Generation) -> None:
            for out, inp in zip(output_tensors, input_tensors):
                gathered = _exact.allgather(generation.group(), inp)
                with torch.no_grad():
                    out.copy_(torch.cat([g.reshape(-1) for g in gathered]).view(out.shape))
        return self._issue("allgather_into_tensor_coalesced", output_tensors, body)

    def broadcast(self, tensor_list: List[torch.Tensor], opts: Any) -> _work.GradexWork:
        root = opts.rootRank

        def body(generation: _Generation) -> None:
            if not 0 <= root < generation.world_size:
                raise _errors.InvalidArgumentError(
                    f"gradex: broadcast root {root} is not a rank of [0, {generation.world_size})")
            _exact.broadcast(generation.group(), tensor_list, root)
        return self._issue("broadcast", tensor_list, body)

    def barrier(self, opts: Any = None) -> _work.GradexWork:
        def body(generation: _Generation) -> None:
            _exact.average_(generation.engine, torch.zeros(1, dtype=torch.float32))
        return self._issue("barrier", None, body)

    def alltoall_base(self, output_buffer: torch.Tensor, input_buffer: torch.Tensor,
                      output_split_sizes: List[int], input_split_sizes: List[int], opts: Any) -> _work.GradexWork:
        def body(generation: _Generation) -> None:
            world, me = generation.world_size, generation.rank
            rows = input_buffer.shape[0] if input_buffer.dim() else 1
            row_elems = input_buffer.numel() // max(rows, 1)
            splits = list(input_split_sizes) or [rows // world] * world
            meta = torch.tensor([rows] + splits, dtype=torch.int64)
            metas = _exact.allgather(generation.group(), meta)
            longest = max(int(m[0]) for m in metas)
            padded = torch.zeros((longest, row_elems), dtype=input_buffer.dtype)
            padded[:rows] = input_buffer.detach().cpu().reshape(rows, row_elems)
            inputs = _exact.allgather(generation.group(), padded)
            parts = []
            for k in range(world):
                ks = [int(x) for x in metas[k][1:]]
                start = sum(ks[:me])
                parts.append(inputs[k][start:start + ks[me]])
            with torch.no_grad():
                output_buffer.copy_(torch.cat(parts).view(output_buffer.shape))
        return self._issue("alltoall_base", [output_buffer], body)

    # --- point to point (through the quorum's store) ------------------------------------------------

    def _p2p_store(self, generation: _Generation) -> Any:
        if generation.p2p_store is None:
            generation.p2p_store = create_store_client(generation.store_addr, generation.timeout)
        return generation.p2p_store

    def _next_p2p_sequence(self, direction: str, peer: int, tag: int) -> Optional[int]:
        """The number of this (direction, peer, tag) message in the current generation, counted alike at both
        ends so that their store keys match; None without a generation (the operation then fails at issue)."""
        with self._issue_lock:
            generation = self._generation
            if generation is None:
                return None
            seq: int = generation.sequence[(direction, peer, tag)]
            generation.sequence[(direction, peer, tag)] += 1
            return seq

    def send(self, tensors: List[torch.Tensor], dst_rank: int, tag: int) -> _work.GradexWork:
        seq = self._next_p2p_sequence("send", dst_rank, tag)
        payload = b"".join(_exact.as_bytes(t).numpy().tobytes() for t in tensors)

        def body(generation: _Generation) -> None:
            key = f"gradex/p2p/{generation.rank}-{dst_rank}/{tag}/{seq}"
            self._p2p_store(generation).set(key, payload)
        return self._issue("send", tensors, body, p2p=True)

    def recv(self, tensors: List[torch.Tensor], src_rank: int, tag: int) -> _work.GradexWork:
        seq = self._next_p2p_sequence("recv", src_rank, tag)

        def body(generation: _Generation) -> None:
            key = f"gradex/p2p/{src_rank}-{generation.rank}/{tag}/{seq}"
            store = self._p2p_store(generation)
            store.wait([key], generation.timeout)
            data = store.get(key)
            store.delete_key(key)
            expected = sum(t.numel() * t.element_size() for t in tensors)
            if len(data) != expected:
                raise _errors.MismatchError(f"gradex: recv from rank {src_rank} (tag {tag}) got {len(data)} "
                                            f"bytes, the receiving tensors hold {expected}")
            raw = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.zeros(0, dtype=torch.uint8)
            offset = 0
            for t in tensors:
                n = t.numel() * t.element_size()
                with torch.no_grad():
                    t.copy_(_exact.from_bytes(raw[offset:offset + n], t))
                offset += n
        return self._issue("recv", tensors, body, p2p=True)


class _Listeners:
    """The membership listeners of one reconfiguration, each called on a thread of its own (started at
    construction), and the first exception one of them raised."""

    def __init__(self, listeners: Sequence[Callable[[str, int, int, timedelta], None]], store_addr: str, rank: int,
                 world_size: int, timeout: timedelta) -> None:
        self._errors: List[BaseException] = []
        self._threads = [threading.Thread(target=self._call, args=(listener, store_addr, rank, world_size, timeout),
                                          name="gradex_pg_listener", daemon=True) for listener in listeners]
        for thread in self._threads:
            thread.start()

    def _call(self, listener: Callable[[str, int, int, timedelta], None], *args: Any) -> None:
        try:
            listener(*args)
        except BaseException as exc:  # noqa: BLE001 - handed to the reconfiguring thread by join()
            self._errors.append(exc)

    def join(self) -> Optional[BaseException]:
        """Waits for every listener; the first exception raised, or None."""
        for thread in self._threads:
            thread.join()
        return self._errors[0] if self._errors else None


def _retire_held(holder: List[Optional[_Generation]]) -> None:
    generation, holder[0] = holder[0], None
    if generation is not None:
        generation.retire(RuntimeError("gradex: process group released"))


def _check_op(op: Any, tensors: Sequence[torch.Tensor]) -> None:
    supported = (ReduceOp.SUM, ReduceOp.AVG, ReduceOp.MIN, ReduceOp.MAX, ReduceOp.PRODUCT, ReduceOp.BAND,
                 ReduceOp.BOR, ReduceOp.BXOR)
    if op not in supported:
        raise _errors.InvalidArgumentError(f"gradex: ProcessGroupGradex does not support reduce op {op}")
    if op == ReduceOp.AVG and any(not t.is_floating_point() for t in tensors):
        raise _errors.InvalidArgumentError("gradex: ReduceOp.AVG needs floating-point tensors")


def _combine(gathered: List[torch.Tensor], op: Any, dtype: torch.dtype) -> torch.Tensor:
    """The reduction of every rank's tensor, in rank order (the same bits on every rank)."""
    if op in (ReduceOp.MIN, ReduceOp.MAX):
        stacked = torch.stack(gathered)
        return (stacked.amin(0) if op == ReduceOp.MIN else stacked.amax(0)).to(dtype)
    if op in (ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR):
        result = gathered[0].clone()
        for g in gathered[1:]:
            result = result & g if op == ReduceOp.BAND else result | g if op == ReduceOp.BOR else result ^ g
        return result
    accumulate = torch.float64 if dtype.is_floating_point else torch.int64
    if dtype.is_complex:
        accumulate = torch.complex128
    result = gathered[0].to(accumulate).clone()
    for g in gathered[1:]:
        result = result * g.to(accumulate) if op == ReduceOp.PRODUCT else result + g.to(accumulate)
    if op == ReduceOp.AVG:
        result = result / len(gathered)
    return result.to(dtype)
