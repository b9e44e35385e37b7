"""DiLoCo for Keras 3: the same outer optimizer as gx.DiLoCo (_capi.Outer, outer/), driven by a
callback after every training batch.

    gxt.init()
    model.compile(optimizer=keras.optimizers.AdamW(1e-3), loss=..., jit_compile=False)   # no wrapper
    model.fit(x, y, callbacks=[gxk.callbacks.DiLoCoCallback(period=32, fragments=4, delay=2)])

The inner optimizer is the plain Keras one: ranks train alone, and every `period` batches (per fragment)
each rank's pseudo-gradient theta_global - theta_local is averaged across ranks and an outer Nesterov step
updates theta_global, identical on every rank, which then replaces the local weights (Douillard et al.
2023; Streaming DiLoCo with fragments=F and delay=d). Float32 non-trainable variables (BatchNorm
statistics) are averaged at fragment 0's syncs.

gradex reads and writes host memory in place, and a Keras variable's memory is TensorFlow's: the callback
keeps one float32 host mirror per variable and copies only what the outer step touches: the variables of a
fragment whose exchange starts at this batch into their mirrors, and the mirrors of a fragment merged at
this batch back into the variables. Between syncs nothing is copied. The outer optimizer is created
collectively at the first on_train_begin (gxt.init() must have run); it copies rank 0's weights to every
rank. At the end of training (synchronize_at_end) one last outer step merges every rank's inner steps since
each fragment's last sync (as gx.DiLoCo.synchronize()) and every rank loads the global model, so evaluating
or saving any rank's model gives the same result.
"""
from __future__ import annotations

import weakref
from typing import Any, Callable, Dict, List, Optional

import keras
import numpy as np

from ... import _capi, _errors, _outer_config
from .. import _runtime

_D = _outer_config.DEFAULTS
_STATE_FORMAT = "gradex.keras.DiLoCo/1"


def _close_quietly(box: Dict[str, Optional[_capi.Outer]]) -> None:
    _errors.close_quietly(box.get("outer"))


class DiLoCoCallback(keras.callbacks.Callback):
    """Keras DiLoCo. The arguments are gx.DiLoCo's (docs/configuration.md, GRADEX_OUTER_*); `config` sets
    any other GRADEX_* variable and wins over them. Compile the model with its plain optimizer (not
    gxk.DistributedOptimizer: DiLoCo exchanges no gradients) and steps_per_execution=1."""

    def __init__(self, period: int = _D["period"], outer_lr: float = _D["outer_lr"],
                 outer_momentum: float = _D["outer_momentum"], fragments: int = _D["fragments"],
                 delay: int = _D["delay"], bits: int = _D["bits"], nesterov: bool = _D["nesterov"],
                 mixing: float = _D["mixing"], compression: str = _D["compression"],
                 density: Optional[float] = _D["density"], config: _capi.Config = None,
                 synchronize_at_end: bool = True) -> None:
        super().__init__()
        self._config = _outer_config.outer_config(period, outer_lr, outer_momentum, fragments, delay, bits,
                                                  nesterov, mixing, compression, density, config)
        self._period = int(self._config["GRADEX_OUTER_PERIOD"])
        self._fragments = int(self._config["GRADEX_OUTER_FRAGMENTS"])
        self._delay = int(self._config["GRADEX_OUTER_DELAY"])
        self._mixing = float(self._config["GRADEX_OUTER_MIXING"]) != 0.0
        self.synchronize_at_end = bool(synchronize_at_end)
        self._box: Dict[str, Optional[_capi.Outer]] = {"outer": None}  # what the finalizer closes (it must not hold this object)
        self._finalizer = weakref.finalize(self, _close_quietly, self._box)
        # [key, variable, host mirror, fragment or None for a buffer]
        self._entries: List[List[Any]] = []
        self._pending_load: Optional[bytes] = None
        self._closed = False
        self.steps = 0

    # --- creation -------------------------------------------------------------------------------------

    def _bootstrap(self) -> _capi.Outer:
        outer = self._box["outer"]
        if outer is not None:
            return outer
        if self._closed:
            raise _errors.InvalidArgumentError("gradex: this DiLoCoCallback was closed")
        if self.model is None:
            raise _errors.InvalidArgumentError("gradex: DiLoCoCallback has no model yet (pass it to model.fit)")
        if int(getattr(self.model, "steps_per_execution", 1) or 1) != 1:
            raise _errors.InvalidArgumentError(
                "gradex: DiLoCoCallback needs steps_per_execution=1 (it ends an inner step after every batch)")
        trainable = list(self.model.trainable_variables)
        if not trainable:
            raise _errors.InvalidArgumentError("gradex: DiLoCoCallback: the model has no trainable variables "
                                               "(build it, or call fit, first)")
        seen = {id(v) for v in trainable}
        buffers = [v for v in self.model.non_trainable_variables
                   if id(v) not in seen and str(v.dtype) == "float32"]
        for v in trainable:
            if str(v.dtype) != "float32":
                raise _errors.InvalidArgumentError(
                    f"gradex: DiLoCoCallback needs float32 variables; '{v.path}' is {v.dtype}")
        entries = []
        for i, v in enumerate(trainable):
            entries.append([f"param.{i}.{v.path}", v, np.array(v.numpy(), dtype=np.float32, order="C"), 0])
        for i, v in enumerate(buffers):
            entries.append([f"buffer.{i}.{v.path}", v, np.array(v.numpy(), dtype=np.float32, order="C"), None])
        outer = _runtime.new_outer(self._config)
        try:
            for key, _, mirror, fragment in entries:
                outer.add_tensor(key, mirror.ctypes.data, mirror.size, fragment is None)
            outer.start()  # rank 0's values into every rank's mirrors
            for entry in entries:
                if entry[3] is not None:
                    entry[3] = outer.fragment_of(entry[0])
            if self._pending_load is not None:
                outer.load_state(self._pending_load)
                self._pending_load = None
        except BaseException:
            outer.close()
            raise
        self._entries = entries
        self._box["outer"] = outer
        self._copy_out(lambda fragment: True)
        return outer

    # --- copies between the variables and the mirrors -------------------------------------------------

    def _copy_in(self, wanted: Callable[[Optional[int]], bool]) -> None:
        for _, v, mirror, fragment in self._entries:
            if wanted(fragment):
                mirror[...] = v.numpy()

    def _copy_out(self, wanted: Callable[[Optional[int]], bool]) -> None:
        for _, v, mirror, fragment in self._entries:
            if wanted(fragment):
                v.assign(mirror)

    # --- Keras hooks ------------------------------------------------------------------------------------

    def on_train_begin(self, logs: Optional[Dict[str, object]] = None) -> None:
        self._bootstrap()

    def on_train_batch_end(self, batch: int, logs: Optional[Dict[str, object]] = None) -> None:
        self.step()

    def on_train_end(self, logs: Optional[Dict[str, object]] = None) -> None:
        if self.synchronize_at_end:
            self.synchronize()

    # --- the DiLoCo object --------------------------------------------------------------------------------

    def step(self) -> int:
        """Ends an inner step (model.fit calls it after every batch). Returns the number of fragments merged
        into the model by this call; raises the failure of a background exchange (a dead or stalled peer)."""
        outer = self._bootstrap()
        step = self.steps + 1
        phase = step % self._period
        starting = {f for f in range(self._fragments) if _outer_config.fragment_offset(f, self._fragments,
                                                                                      self._period) == phase}
        # An exchange reads the local weights of its fragment (and fragment 0's the buffers) when it starts;
        # a merge with mixing reads them too.
        merging = starting if self._delay == 0 else (
            {f for f in range(self._fragments) if step > self._delay and _outer_config.fragment_offset(
                f, self._fragments, self._period) == (step - self._delay) % self._period} if self._mixing else set())
        self._copy_in(lambda f: f in starting or (f is None and 0 in starting) or (self._mixing and f in merging))
        merged = outer.step()
        self.steps = step
        if merged:
            done = {f for f, last in enumerate(outer.last_merges()) if last == step}
            self._copy_out(lambda f: (f in done) or (f is None and 0 in done))
        return merged

    def synchronize(self, keep_local: bool = True) -> int:
        """Collective: loads the global model into the Keras model on every rank (identical everywhere), as
        gx.DiLoCo.synchronize(). keep_local=True (the default, and what synchronize_at_end runs): one last
        outer step merges every rank's inner steps since each fragment's last sync first; returns the number of
        fragments it exchanged. keep_local=False: the exchanges in flight are merged and the local progress
        since each fragment's last sync is dropped; returns 0."""
        outer = self._bootstrap()
        exchanged = 0
        if keep_local:
            self._copy_in(lambda f: True)  # the final step reads every fragment's local weights and the buffers
            exchanged = outer.synchronize_all()
        else:
            outer.synchronize()
        self._copy_out(lambda f: True)
        return exchanged

    def global_weights(self) -> List[Any]:
        """[numpy array] of the global copy of every trainable variable, in model.trainable_variables order
        (identical on every rank)."""
        outer = self._bootstrap()
        out: List[Any] = []
        for key, _, mirror, fragment in self._entries:
            if fragment is not None:
                a = np.empty_like(mirror)
                outer.global_copy(key, a.ctypes.data, a.size)
                out.append(a)
        return out

    def last_merges(self) -> List[int]:
        return self._bootstrap().last_merges()

    def stats(self, last_step: bool = False) -> _capi.Stats:
        """bytes_sent/received, dense_bytes, compression_ratio, parameter_averages (fragment syncs), ..."""
        return self._bootstrap().stats(last_step)

    def state_dict(self) -> Dict[str, Any]:
        """The outer state (global copies, outer momenta, residuals, step count). Merges pending exchanges
        first. The Keras optimizer's own state is saved with the model, as usual."""
        return {"format": _STATE_FORMAT, "steps": self.steps, "outer": self._bootstrap().save_state()}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        if not isinstance(state, dict) or state.get("format") != _STATE_FORMAT:
            got = state.get("format") if isinstance(state, dict) else type(state).__name__
            raise _errors.StateError(f"gradex: not a {_STATE_FORMAT} state dict (format {got!r})")
        if self._box["outer"] is not None:
            self._box["outer"].load_state(state["outer"])
        elif self._closed:
            raise _errors.InvalidArgumentError("gradex: this DiLoCoCallback was closed")
        else:  # applied at the first on_train_begin, after rank 0's copy
            self._pending_load = bytes(state["outer"])
        self.steps = int(state["steps"])

    def close(self) -> None:
        """Finishes the exchanges in flight and releases the connections. Idempotent; gxt.shutdown() and the
        garbage collector do it too."""
        self._closed = True
        outer, self._box["outer"] = self._box["outer"], None
        self._finalizer.detach()
        if outer:
            outer.close()
