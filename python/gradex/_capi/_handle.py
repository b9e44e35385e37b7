"""What every collective handle (Engine, Outer, Group) shares: creation through a store, reconfiguration to a
new membership, closing, and keeping alive what the core holds pointers to."""
from __future__ import annotations

import ctypes
from typing import Callable, List, Optional

from .. import _errors
from ._library import Config, Options, check, last_error, new_options, set_config
from ._store import AnyStore, HeldStore, hold

# gradex_*_create(options, &handle) and gradex_*_reconfigure(handle, options).
CreateFn = Callable[["ctypes._CArgObject", "ctypes._CArgObject"], int]
ReconfigureFn = Callable[[int, "ctypes._CArgObject"], int]
DestroyFn = Callable[[int], int]


def check_with_store(status: int, held: HeldStore) -> None:
    """check() with the store adapter's last failure appended (why a bootstrap through it failed)."""
    if status != 0:
        message = last_error()
        failure = held.last_failure if held is not None else None
        if failure:
            message += f" ({failure})"
        raise _errors.error_for_status(status, message)


class Handle:
    """A core object created collectively through a store. Subclasses name it (`_what`, for errors) and
    pass their C create / destroy / reconfigure functions."""

    _what = "handle"

    def __init__(self, create: CreateFn, rank: int, world_size: int, store: AnyStore, store_prefix: Optional[str],
                 config: Config) -> None:
        options = new_options(rank, world_size)
        # The core keeps pointers to the store and the prefix for the handle's life.
        self._store: HeldStore = hold(store)
        self._failed_stores: List[HeldStore] = []
        if self._store is not None:
            options.store = self._store.pointer()
        self._prefix = store_prefix.encode() if store_prefix else None
        options.store_prefix = self._prefix
        arrays = set_config(options, config)  # noqa: F841 - alive until the call returns
        out = ctypes.c_void_p()
        check_with_store(create(ctypes.byref(options), ctypes.byref(out)), self._store)
        self._ptr: Optional[int] = out.value

    @property
    def address(self) -> int:
        """The C handle as an integer (what the op libraries take); 0 once closed."""
        return self._ptr or 0

    def _handle(self) -> int:
        if not self._ptr:
            raise _errors.InvalidArgumentError(f"gradex: the {self._what} is closed")
        return self._ptr

    def _close_with(self, destroy: DestroyFn) -> None:
        ptr, self._ptr = self._ptr, None
        if ptr:
            check(destroy(ptr))

    def _reconfigure_with(self, reconfigure: ReconfigureFn, rank: int, world_size: int, store: AnyStore,
                          store_prefix: Optional[str]) -> None:
        """A new membership: rank, world size, the store (None: the current one) and the prefix (None: the C
        default). The C side keeps one store, the membership's: a success releases the earlier adapters (each
        may hold a connection: keeping them all leaked one descriptor per quorum change); a failure keeps both,
        as either may still be called."""
        options: Options = new_options(rank, world_size)
        held = hold(store)
        if held is not None:
            options.store = held.pointer()
        prefix = store_prefix.encode() if store_prefix else None
        options.store_prefix = prefix
        status = reconfigure(self._handle(), ctypes.byref(options))
        if held is not None:
            earlier = [] if status == 0 else [self._store] + self._failed_stores
            self._failed_stores = [a for a in earlier if a is not None]
            self._store = held
        check_with_store(status, held)
