"""The stores a collective handle bootstraps through: a framework's key-value store presented to the core
(StoreAdapter) and the core's own TCP store of the job (JobStore, gradex_store_*; additive to API version 1)."""
from __future__ import annotations

import ctypes
import datetime
import threading
from typing import TYPE_CHECKING, Dict, List, Optional, Protocol, Union

from .. import _errors
from ._library import (AddFn, Config, GetFn, Options, ReleaseFn, SetFn, Signatures, StoreStruct, check, last_error,
                       lib_with, new_options, set_config)

if TYPE_CHECKING:
    StorePointer = ctypes._Pointer[StoreStruct]


class KeyValueStore(Protocol):
    """What StoreAdapter needs of a store: torch.distributed.Store's set/get/wait/add."""

    def set(self, key: str, value: bytes, /) -> None: ...

    def get(self, key: str, /) -> bytes: ...

    def wait(self, keys: List[str], timeout: datetime.timedelta, /) -> None: ...

    def add(self, key: str, amount: int, /) -> int: ...


class _StoreCallbacks:
    """What the engine's store callbacks run on: the store, the buffers handed to the engine and the last failure.
    It references no callback object, so an adapter and its callbacks form no reference cycle: the store (and the
    connection it holds) is released as soon as its adapter is dropped, not at the next full garbage collection
    (one connection per quorum change stayed open until then)."""

    def __init__(self, store: KeyValueStore) -> None:
        self.store = store
        self.buffers: Dict[int, ctypes.Array[ctypes.c_char]] = {}  # address -> buffer lent until release
        self.lock = threading.Lock()
        self.last_failure: Optional[str] = None

    def _fail(self, what: str, key: bytes, exc: BaseException) -> int:
        self.last_failure = f"store {what} '{key.decode(errors='replace')}': {type(exc).__name__}: {exc}"
        return 1

    def on_set(self, _ctx: Optional[int], key: bytes, value: Optional[int], length: int) -> int:
        try:
            self.store.set(key.decode(), ctypes.string_at(value, length) if length and value else b"")
            return 0
        except BaseException as exc:  # noqa: BLE001 - nothing may propagate into C
            return self._fail("set", key, exc)

    def on_get(self, _ctx: Optional[int], key: bytes, timeout_ms: int,
               value_out: ctypes._Pointer[ctypes.c_void_p], length_out: ctypes._Pointer[ctypes.c_size_t]) -> int:
        try:
            k = key.decode()
            if timeout_ms >= 0:
                self.store.wait([k], datetime.timedelta(milliseconds=timeout_ms))
            data = bytes(self.store.get(k))
            buf = ctypes.create_string_buffer(data, max(len(data), 1))
            address = ctypes.addressof(buf)
            with self.lock:
                self.buffers[address] = buf
            value_out[0] = address
            length_out[0] = len(data)
            return 0
        except BaseException as exc:  # noqa: BLE001
            return self._fail("get", key, exc)

    def on_release(self, _ctx: Optional[int], value: Optional[int]) -> None:
        with self.lock:
            self.buffers.pop(value or 0, None)

    def on_add(self, _ctx: Optional[int], key: bytes, delta: int, new_value: ctypes._Pointer[ctypes.c_int64]) -> int:
        try:
            new_value[0] = int(self.store.add(key.decode(), int(delta)))
            return 0
        except BaseException as exc:  # noqa: BLE001
            return self._fail("add", key, exc)


class StoreAdapter:
    """Presents a key-value store to the engine as a gradex_store_t.

    `store` needs set(key, bytes), get(key) -> bytes, wait([key], timedelta) and add(key, int) -> int, as
    torch.distributed.Store has. Callbacks never raise into C: a failure returns non-zero (the engine then
    reports the operation and key) and is kept in `last_failure` for diagnostics.
    """

    def __init__(self, store: KeyValueStore) -> None:
        self._callbacks = _StoreCallbacks(store)
        # The CFUNCTYPE objects must live as long as the engine may call them (as long as this adapter).
        self._set = SetFn(self._callbacks.on_set)
        self._get = GetFn(self._callbacks.on_get)
        self._release = ReleaseFn(self._callbacks.on_release)
        self._add = AddFn(self._callbacks.on_add)
        self.struct = StoreStruct(None, self._set, self._get, self._release, self._add)

    @property
    def last_failure(self) -> Optional[str]:
        return self._callbacks.last_failure

    def pointer(self) -> StorePointer:
        return ctypes.pointer(self.struct)


def _store_signatures() -> Signatures:
    return {
        "gradex_store_connect": (ctypes.c_int, [ctypes.POINTER(Options), ctypes.POINTER(ctypes.POINTER(StoreStruct))]),
        "gradex_store_destroy": (ctypes.c_int, [ctypes.POINTER(StoreStruct)]),
    }


class JobStore:
    """The job's TCP store in the core (gradex_store_connect): rank 0 serves it on MASTER_ADDR:MASTER_PORT,
    every connection proves GRADEX_JOB_SECRET when one is set. Collective. Pass it as Engine(store=...) to
    bootstrap several engines through it (each under its own prefix); set/get/add serve small plugin-level
    agreements. Close it after the engines that use it."""

    last_failure: Optional[str] = None

    def __init__(self, rank: int = -1, world_size: int = -1, config: Config = None) -> None:
        c = lib_with("store", _store_signatures)
        options = new_options(rank, world_size)
        arrays = set_config(options, config)  # noqa: F841 - alive until the call returns
        out = ctypes.POINTER(StoreStruct)()
        check(c.gradex_store_connect(ctypes.byref(options), ctypes.byref(out)))
        self._ptr: Optional[StorePointer] = out

    def pointer(self) -> StorePointer:
        if not self._ptr:
            raise _errors.InvalidArgumentError("gradex: the job store is closed")
        return self._ptr

    def set(self, key: str, value: bytes) -> None:
        value = bytes(value)
        s = self.pointer().contents
        if s.set(s.context, key.encode(), value, len(value)) != 0:
            raise _errors.TransportError(f"gradex: store set of '{key}' failed: {last_error()}")

    def get(self, key: str, timeout_ms: int) -> bytes:
        s = self.pointer().contents
        value, length = ctypes.c_void_p(), ctypes.c_size_t()
        if s.get(s.context, key.encode(), int(timeout_ms), ctypes.byref(value), ctypes.byref(length)) != 0:
            raise _errors.TimeoutError(f"gradex: store get of '{key}' failed: {last_error()}")
        try:
            return ctypes.string_at(value, length.value) if length.value else b""
        finally:
            s.release(s.context, value)

    def add(self, key: str, delta: int) -> int:
        s = self.pointer().contents
        out = ctypes.c_int64()
        if s.add(s.context, key.encode(), int(delta), ctypes.byref(out)) != 0:
            raise _errors.TransportError(f"gradex: store add to '{key}' failed: {last_error()}")
        return out.value

    def close(self) -> None:
        ptr, self._ptr = self._ptr, None
        if ptr:
            check(lib_with("store", _store_signatures).gradex_store_destroy(ptr))


# A store as a handle takes it: a framework's store (adapted), the core's job store, or None (the environment's).
AnyStore = Union[KeyValueStore, JobStore, None]
# What the core holds a pointer to for a handle's membership.
HeldStore = Union[StoreAdapter, JobStore, None]


def hold(store: AnyStore) -> HeldStore:
    """The object whose pointer the core gets for `store` (a JobStore as is, else a new StoreAdapter)."""
    if store is None or isinstance(store, JobStore):
        return store
    return StoreAdapter(store)
