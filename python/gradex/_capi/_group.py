"""Exact collectives' binding (gradex_group_*, additive to API version 1): `Group` moves bytes unchanged, by a
pipelined chain broadcast and a ring allgather."""
from __future__ import annotations

import ctypes
from typing import Optional

from ._handle import Handle
from ._library import Config, Options, Signatures, check, lib_with
from ._store import AnyStore


def _group_signatures() -> Signatures:
    status, group_p, size = ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t
    i32_p = ctypes.POINTER(ctypes.c_int32)
    return {
        "gradex_group_create": (status, [ctypes.POINTER(Options), ctypes.POINTER(ctypes.c_void_p)]),
        "gradex_group_destroy": (status, [group_p]),
        "gradex_group_rank": (status, [group_p, i32_p, i32_p]),
        "gradex_group_broadcast": (status, [group_p, ctypes.c_void_p, size, ctypes.c_int32]),
        "gradex_group_allgather": (status, [group_p, ctypes.c_void_p, size, ctypes.c_void_p]),
        "gradex_group_abort": (status, [group_p, ctypes.c_char_p]),
    }


def _group_lib() -> ctypes.CDLL:
    return lib_with("group", _group_signatures)


class Group(Handle):
    """A set of connections for exact collectives (gradex_group_create): bytes travel unchanged, no engine or
    codec in between. Creation is collective, like Engine's (store_prefix None: "gradex/group/"). Calls come
    from one thread at a time, in the same order on every rank. Arguments are agreed first: different sizes
    or roots across ranks raise MismatchError on every rank (the group stays usable); a dead or stalled peer
    raises PeerError / TimeoutError on every rank, abort() AbortedError, and the group is failed after those
    (create a new one)."""

    _what = "group"

    def __init__(self, rank: int = -1, world_size: int = -1, store: AnyStore = None, store_prefix: Optional[str] = None,
                 config: Config = None) -> None:
        super().__init__(_group_lib().gradex_group_create, rank, world_size, store, store_prefix, config)
        r, w = ctypes.c_int32(), ctypes.c_int32()
        check(_group_lib().gradex_group_rank(self._handle(), ctypes.byref(r), ctypes.byref(w)))
        self.rank, self.world_size = r.value, w.value

    def close(self) -> None:
        """Waits (bounded by GRADEX_TIMEOUT_S) for every rank to leave, then releases. Idempotent."""
        self._close_with(_group_lib().gradex_group_destroy)

    def broadcast(self, address: int, nbytes: int, root: int) -> None:
        """Root's `nbytes` bytes at `address` into every rank's `address`, bit for bit (gradex_group_broadcast:
        each rank sends them once, down a pipelined chain)."""
        check(_group_lib().gradex_group_broadcast(self._handle(), address or None, int(nbytes), int(root)))

    def allgather(self, address: int, nbytes: int, out: int) -> None:
        """Every rank's `nbytes` bytes at `address`, in rank order, into `out` (world_size * nbytes bytes)."""
        check(_group_lib().gradex_group_allgather(self._handle(), address or None, int(nbytes), out or None))

    def abort(self, reason: object) -> None:
        """From any thread: the collective in progress (or the next) fails with AbortedError on every rank."""
        check(_group_lib().gradex_group_abort(self._handle(), str(reason).encode()))
