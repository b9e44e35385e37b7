"""The DiLoCo outer optimizer's binding (gradex_outer_*, additive to API version 1): `Outer`."""
from __future__ import annotations

import ctypes
from typing import List, Optional

from ._handle import Handle
from ._library import Config, Options, Signatures, Stats, StatsStruct, check, lib_with, read_out, stats_dict, write_in
from ._store import AnyStore


def _outer_signatures() -> Signatures:
    status, outer_p = ctypes.c_int, ctypes.c_void_p
    return {
        "gradex_outer_create": (status, [ctypes.POINTER(Options), ctypes.POINTER(ctypes.c_void_p)]),
        "gradex_outer_destroy": (status, [outer_p]),
        "gradex_outer_add_tensor": (status, [outer_p, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_uint64,
                                             ctypes.c_int]),
        "gradex_outer_start": (status, [outer_p]),
        "gradex_outer_step": (status, [outer_p, ctypes.POINTER(ctypes.c_int)]),
        "gradex_outer_synchronize": (status, [outer_p]),
        "gradex_outer_synchronize_all": (status, [outer_p, ctypes.POINTER(ctypes.c_int)]),
        "gradex_outer_get_stats": (status, [outer_p, ctypes.c_int, ctypes.POINTER(StatsStruct)]),
        "gradex_outer_global": (status, [outer_p, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_uint64]),
        "gradex_outer_last_merges": (status, [outer_p, ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t,
                                              ctypes.POINTER(ctypes.c_size_t)]),
        "gradex_outer_fragment_of": (status, [outer_p, ctypes.c_char_p, ctypes.POINTER(ctypes.c_int64)]),
        "gradex_outer_save_state": (status, [outer_p, ctypes.c_void_p, ctypes.c_size_t,
                                             ctypes.POINTER(ctypes.c_size_t)]),
        "gradex_outer_load_state": (status, [outer_p, ctypes.c_void_p, ctypes.c_size_t]),
        "gradex_outer_reconfigure": (status, [outer_p, ctypes.POINTER(Options)]),
        "gradex_outer_start_local": (status, [outer_p, ctypes.c_uint64]),
        "gradex_outer_step_count": (status, [outer_p, ctypes.POINTER(ctypes.c_uint64)]),
        "gradex_outer_save_shared_state": (status, [outer_p, ctypes.c_void_p, ctypes.c_size_t,
                                                    ctypes.POINTER(ctypes.c_size_t)]),
        "gradex_outer_load_shared_state": (status, [outer_p, ctypes.c_void_p, ctypes.c_size_t]),
    }


def _outer_lib() -> ctypes.CDLL:
    """The library with the gradex_outer_* signatures declared."""
    return lib_with("outer", _outer_signatures)


class Outer(Handle):
    """One DiLoCo outer optimizer (gradex_outer_create): its own connections and background thread. Creation
    is collective, like Engine's; `config` holds GRADEX_OUTER_* (and other GRADEX_*) overrides."""

    _what = "DiLoCo optimizer"

    def __init__(self, rank: int = -1, world_size: int = -1, store: AnyStore = None, store_prefix: Optional[str] = None,
                 config: Config = None) -> None:
        super().__init__(_outer_lib().gradex_outer_create, rank, world_size, store, store_prefix, config)

    def _outer(self) -> int:
        return self._handle()

    def close(self) -> None:
        self._close_with(_outer_lib().gradex_outer_destroy)

    def reconfigure(self, rank: int, world_size: int, store: AnyStore = None, store_prefix: Optional[str] = None) -> None:
        """A new membership (gradex_outer_reconfigure), as Engine.reconfigure (store_prefix None: "gradex/outer/");
        every new member must be a survivor holding a started Outer. Unmerged exchanges are dropped; global
        copies, outer momenta, residuals and the fragment schedule are kept."""
        self._reconfigure_with(_outer_lib().gradex_outer_reconfigure, rank, world_size, store, store_prefix)

    def add_tensor(self, key: str, address: int, numel: int, is_buffer: bool) -> None:
        check(_outer_lib().gradex_outer_add_tensor(self._outer(), key.encode(), address, numel, int(is_buffer)))

    def start(self) -> None:
        check(_outer_lib().gradex_outer_start(self._outer()))

    def start_local(self, step: int = 0) -> None:
        """Not collective (gradex_outer_start_local): the global copies are this rank's tensors as they are now,
        the step count `step`; for a member joining peers that started already, which then loads their
        shared state."""
        check(_outer_lib().gradex_outer_start_local(self._outer(), int(step)))

    def step_count(self) -> int:
        """Inner steps ended by step(): the fragment schedule's clock (restored by the state loads)."""
        value = ctypes.c_uint64()
        check(_outer_lib().gradex_outer_step_count(self._outer(), ctypes.byref(value)))
        return value.value

    def step(self) -> int:
        merged = ctypes.c_int()
        check(_outer_lib().gradex_outer_step(self._outer(), ctypes.byref(merged)))
        return merged.value

    def synchronize(self) -> None:
        check(_outer_lib().gradex_outer_synchronize(self._outer()))

    def synchronize_all(self) -> int:
        """gradex_outer_synchronize_all: the final outer step over every fragment with local progress; returns
        the number of fragments exchanged."""
        exchanged = ctypes.c_int()
        check(_outer_lib().gradex_outer_synchronize_all(self._outer(), ctypes.byref(exchanged)))
        return exchanged.value

    def stats(self, last_step: bool = False) -> Stats:
        s = StatsStruct()
        check(_outer_lib().gradex_outer_get_stats(self._outer(), int(bool(last_step)), ctypes.byref(s)))
        return stats_dict(s)

    def global_copy(self, key: str, address: int, numel: int) -> None:
        check(_outer_lib().gradex_outer_global(self._outer(), key.encode(), address, numel))

    def last_merges(self) -> List[int]:
        c = _outer_lib()
        count = ctypes.c_size_t()
        check(c.gradex_outer_last_merges(self._outer(), None, 0, ctypes.byref(count)))
        steps = (ctypes.c_uint64 * max(count.value, 1))()
        check(c.gradex_outer_last_merges(self._outer(), steps, count.value, ctypes.byref(count)))
        return list(steps[:count.value])

    def fragment_of(self, key: str) -> int:
        f = ctypes.c_int64()
        check(_outer_lib().gradex_outer_fragment_of(self._outer(), key.encode(), ctypes.byref(f)))
        return f.value

    def save_state(self) -> bytes:
        return read_out(_outer_lib().gradex_outer_save_state, self._outer())

    def load_state(self, blob: bytes) -> None:
        write_in(_outer_lib().gradex_outer_load_state, self._outer(), blob)

    def save_shared_state(self) -> bytes:
        """The outer state every member holds identically (gradex_outer_save_shared_state): bytes."""
        return read_out(_outer_lib().gradex_outer_save_shared_state, self._outer())

    def load_shared_state(self, blob: bytes) -> None:
        write_in(_outer_lib().gradex_outer_load_shared_state, self._outer(), blob)
