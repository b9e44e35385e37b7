"""DistributedGradientTape: a tf.GradientTape whose gradient() returns averages over the ranks.

    with tf.GradientTape() as tape:
        loss = ...
    tape = gxt.DistributedGradientTape(tape)
    grads = tape.gradient(loss, model.trainable_variables)   # eager or inside tf.function

All gradients of one gradient() call go through one grouped op, each under its own key (the variable's
path), so the engine's policy applies per variable. None gradients are exchanged as zeros (every rank
submits every key) and come back as the average; IndexedSlices are densified. Each gradient() call ends
one engine step.

Engines: without `config`/`engine` the tape uses gxt.init()'s default gradient engine; `config=` selects the
engine cached for that configuration (building a tape every step creates one engine, once); `engine=` takes
one from gxt.engine(). A tape does not know the optimizer, so gradex adds momentum only when GRADEX_MOMENTUM
is set explicitly (said once on the "gradex" logger).
"""
from __future__ import annotations

from typing import Any, Optional

import tensorflow as tf

from .. import _capi, _errors
from . import _exchange, _runtime


class DistributedGradientTape:
    def __init__(self, tape: tf.GradientTape, config: _capi.Config = None, prefix: str = "grad",
                 engine: Optional[_runtime.Engine] = None) -> None:
        if isinstance(tape, DistributedGradientTape):
            raise _errors.InvalidArgumentError("gradex: the tape is already a DistributedGradientTape")
        self._gradex_ref = _runtime.engine_for(config, engine, "DistributedGradientTape")
        if engine is None:
            _runtime.say_no_optimizer(config)
        self._tape = tape
        self._prefix = prefix

    def __enter__(self) -> DistributedGradientTape:
        self._tape.__enter__()
        return self

    def __exit__(self, *exc: object) -> Optional[bool]:
        return self._tape.__exit__(*exc)

    def __getattr__(self, name: str) -> Any:  # watch, stop_recording, reset, jacobian, ...
        return getattr(self._tape, name)

    def gradient(self, target: Any, sources: Any, output_gradients: Any = None,
                 unconnected_gradients: tf.UnconnectedGradients = tf.UnconnectedGradients.NONE) -> Any:
        grads = self._tape.gradient(target, sources, output_gradients=output_gradients,
                                    unconnected_gradients=unconnected_gradients)
        flat_sources = tf.nest.flatten(sources)
        flat_grads = tf.nest.flatten(grads, expand_composites=False)
        keys = _exchange.unique_keys(self._prefix, [_exchange.variable_key(v) for v in flat_sources])
        dense = [_exchange.dense(g, v, k) for g, v, k in zip(flat_grads, flat_sources, keys)]
        averaged = _exchange.exchange(dense, keys, self._gradex_ref)
        with tf.control_dependencies(averaged):
            _exchange.end_step(self._gradex_ref)
        return tf.nest.pack_sequence_as(grads, averaged)

    @property
    def engine(self) -> _runtime.Engine:
        """The engine this tape exchanges through (a gxt.engine() object)."""
        return self._gradex_ref

    def stats(self, last_step: bool = False) -> _capi.Stats:
        return self._gradex_ref.stats(last_step)
