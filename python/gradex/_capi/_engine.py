"""The exchange engine's binding: `Engine` owns one gradex_engine_t."""
from __future__ import annotations

import ctypes
from typing import Optional

from .. import _errors
from ._handle import Handle
from ._library import (DEVICE_CPU, Config, Stats, StatsStruct, check, describe_config_of, lib, lib_with, read_out,
                       read_text, stats_dict, write_in)
from ._store import AnyStore


class Engine(Handle):
    """One gradex engine (gradex_engine_create). Creation is collective: every rank creates its engine at
    the same point, with the same store prefix."""

    _what = "engine"

    def __init__(self, rank: int = -1, world_size: int = -1, store: AnyStore = None, store_prefix: Optional[str] = None,
                 config: Config = None) -> None:
        super().__init__(lib().gradex_engine_create, rank, world_size, store, store_prefix, config)
        self.rank, self.world_size = self._membership()

    def _membership(self) -> tuple[int, int]:
        r, w = ctypes.c_int32(), ctypes.c_int32()
        check(lib().gradex_engine_rank(self._handle(), ctypes.byref(r), ctypes.byref(w)))
        return r.value, w.value

    def _engine(self) -> int:
        return self._handle()

    def close(self) -> None:
        """Finishes outstanding work (bounded by GRADEX_TIMEOUT_S) and releases the engine. Idempotent."""
        self._close_with(lib().gradex_engine_destroy)

    def reconfigure(self, rank: int, world_size: int, store: AnyStore = None, store_prefix: Optional[str] = None) -> None:
        """A new membership without destroying the engine (gradex_engine_reconfigure; collective over the new
        members, a newcomer creates its Engine with the same arguments instead). `store`: a torch-like store or
        a JobStore (None: the one given at creation or at the last reconfiguration); `store_prefix` must be new
        for that store (None: "gradex/"). Work of the old membership in flight fails with AbortedError; state is
        kept per tensor key; a failed engine (dead peer, abort) is usable again afterwards."""
        self._reconfigure_with(lib().gradex_engine_reconfigure, rank, world_size, store, store_prefix)
        self.rank, self.world_size = self._membership()

    def abort(self, reason: object) -> None:
        """From any thread: every handle in flight and every later submission fails with AbortedError carrying
        `reason`, within milliseconds; peers learn it at once. The engine stays usable for reconfigure()."""
        check(lib().gradex_engine_abort(self._engine(), str(reason).encode()))

    def snapshot_state(self) -> None:
        """Records the engine's per-tensor state at the start of a step (gradex_state_snapshot), into buffers
        reused by the next snapshot. StateError after a failure (reconfigure first)."""
        check(lib().gradex_state_snapshot(self._engine()))

    def rollback_state(self) -> None:
        """Restores the last snapshot bit for bit (gradex_state_rollback): a step that did not commit leaves the
        state as if it never ran. Every rank must roll back the same steps."""
        check(lib().gradex_state_rollback(self._engine()))

    def register(self, key: str, numel: int, dtype: int, device: int = DEVICE_CPU, rows: int = 0) -> None:
        """rows: the tensor's output rows (a weight's shape[0]; 0: unknown), so that GRADEX_POLICY=auto
        keeps at least GRADEX_POLICY_MIN_PER_ROW values per row when it sparsifies it."""
        if rows:
            check(lib().gradex_register_tensor_rows(self._engine(), key.encode(), numel, dtype, device, rows))
        else:
            check(lib().gradex_register_tensor(self._engine(), key.encode(), numel, dtype, device))

    def submit(self, key: str, address: int) -> int:
        handle = ctypes.c_uint64()
        check(lib().gradex_submit(self._engine(), key.encode(), address, ctypes.byref(handle)))
        return handle.value

    def wait(self, handle: int) -> None:
        check(lib().gradex_wait(self._engine(), handle))

    def submit_device(self, key: str, address: int, device: int, device_index: int = 0,
                      stream: Optional[int] = None) -> int:
        """gradex_submit_device: `address` in `device`'s memory, ready on `stream` (a cudaStream_t as an
        int; None: the default stream)."""
        handle = ctypes.c_uint64()
        check(lib().gradex_submit_device(self._engine(), key.encode(), address, device, device_index, stream,
                                         ctypes.byref(handle)))
        return handle.value

    def submit_absent(self, key: str, address: int, device: Optional[int] = None, device_index: int = 0,
                      stream: Optional[int] = None) -> int:
        """gradex_submit_absent (device None) or gradex_submit_device_absent: this rank has no gradient of
        `key` this step (gx.join); it contributes zeros and keeps its momentum and DGC state. `address` is
        not read; it receives the average over all ranks."""
        handle = ctypes.c_uint64()
        if device is None:
            check(lib().gradex_submit_absent(self._engine(), key.encode(), address, ctypes.byref(handle)))
        else:
            check(lib().gradex_submit_device_absent(self._engine(), key.encode(), address, device, device_index,
                                                    stream, ctypes.byref(handle)))
        return handle.value

    def handle_event(self, handle: int, stream: Optional[int] = None) -> None:
        """Makes `stream` wait on the device for a completed device handle's result (gradex_handle_event)."""
        check(lib().gradex_handle_event(self._engine(), handle, stream))

    def set_gradient_norm(self, norm: float) -> None:
        """GRADEX_CLIP_NORM > 0: this rank's L2 norm over all gradients of the current step, given before
        the step's first submit; gradients submitted until end_step() are clipped by it (see gradex.h)."""
        check(lib().gradex_set_gradient_norm(self._engine(), float(norm)))

    def set_policy_horizon(self, steps: int) -> None:
        """GRADEX_POLICY=auto: `steps` more exchange steps from the next one (0: unknown), learnt after the
        engine was created; every rank must call it alike before its next step (gradex_set_policy_horizon)."""
        steps = int(steps)
        if steps < 0:
            raise _errors.InvalidArgumentError(f"gradex: a training horizon must be >= 0 steps, got {steps}")
        check(lib().gradex_set_policy_horizon(self._engine(), steps))

    def end_step(self) -> bool:
        """Ends a step; True when LocalSGD says to average parameters now."""
        flag = ctypes.c_int()
        check(lib().gradex_end_step(self._engine(), ctypes.byref(flag)))
        return bool(flag.value)

    def exchanges_gradients(self) -> bool:
        flag = ctypes.c_int()
        check(lib().gradex_exchanges_gradients(self._engine(), ctypes.byref(flag)))
        return bool(flag.value)

    def stats(self, last_step: bool = False) -> Stats:
        """The engine's counters (gradex_stats_t), plus staged_bytes: bytes copied between device and host
        memory for device tensors (what crossed PCIe); exposed_seconds: what the framework waited on gradex (per
        step from its last submission to its last completion, summed); policy_switches: tensors whose codec a
        GRADEX_POLICY=auto plan changed."""
        s = StatsStruct()
        check(lib().gradex_get_stats(self._engine(), int(bool(last_step)), ctypes.byref(s)))
        out = stats_dict(s)
        staged = ctypes.c_uint64()
        check(lib().gradex_get_staged_bytes(self._engine(), int(bool(last_step)), ctypes.byref(staged)))
        out["staged_bytes"] = staged.value
        exposed, switches = ctypes.c_double(), ctypes.c_uint64()
        check(lib().gradex_get_step_report(self._engine(), int(bool(last_step)), ctypes.byref(exposed),
                                           ctypes.byref(switches)))
        out["exposed_seconds"], out["policy_switches"] = exposed.value, switches.value
        return out

    def save_state(self) -> bytes:
        return read_out(lib().gradex_save_state, self._engine())

    def load_state(self, blob: bytes) -> None:
        write_in(lib().gradex_load_state, self._engine(), blob)

    def describe_config(self) -> str:
        return describe_config(self)

    def setting(self, name: str) -> float:
        """The engine's effective value of a numeric GRADEX_* setting (booleans as 0/1)."""
        return setting_number(name, self._engine())

    def explain(self) -> str:
        """Each tensor's codec and why (gradex_explain); with GRADEX_POLICY=auto the newest plan: the agreed
        link, codec and step numbers and per tensor its choice with predicted and measured times."""
        return read_text(lib().gradex_explain, self._engine())

    def delay(self) -> int:
        """The delay D that submissions now get (GRADEX_DELAY; auto's choice once made; gradex_get_delay)."""
        value = ctypes.c_int()
        check(lib().gradex_get_delay(self._engine(), ctypes.byref(value)))
        return value.value

    def delay_drain(self) -> None:
        """Waits for every delayed exchange in flight and drops the averages not yet applied
        (gradex_delay_drain): averaging the parameters next leaves every rank with the same model."""
        check(lib().gradex_delay_drain(self._engine()))


def _settings_lib() -> ctypes.CDLL:
    return lib_with("settings", lambda: {"gradex_get_setting_number": (ctypes.c_int, [
        ctypes.c_void_p, ctypes.c_char_p, ctypes.POINTER(ctypes.c_double)])})


def setting_number(name: str, engine: Optional[int] = None) -> float:
    """A numeric GRADEX_* setting (gradex_get_setting_number): an engine's (its address) or the environment's
    (None). InvalidArgumentError for an undeclared name or a text setting."""
    value = ctypes.c_double()
    check(_settings_lib().gradex_get_setting_number(engine, name.encode(), ctypes.byref(value)))
    return value.value


def describe_config(engine: Optional[Engine] = None) -> str:
    """The effective configuration with help text (engine None: the environment's)."""
    return describe_config_of(engine._engine() if engine is not None else None)
