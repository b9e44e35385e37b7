"""What every gradex wrapper of a Keras optimizer offers, Keras 3's (_optimizer.py) and tf-keras's
(_legacy.py) alike: the engine it exchanges through, its compressor state for checkpoints, and a
configuration that still records the momentum gradex took over (keras/_momentum.py).

Both classes are mixins placed before a Keras optimizer class in the bases, so `super().get_config()` is the
optimizer's.
"""
from __future__ import annotations

from typing import Any, Dict

from .. import _runtime


class OwnedMomentumConfig:
    """get_config() of an optimizer whose momentum gradex took over: the optimizer runs at momentum 0, its
    configuration (and so a checkpoint) says the momentum the user gave."""

    def get_config(self) -> Dict[str, Any]:
        config: Dict[str, Any] = super().get_config()  # type: ignore[misc]  # the Keras optimizer's
        owned = getattr(self, "_gradex_owned_momentum", 0.0)
        if owned:
            config["momentum"] = owned
        return config


class WrapperAccessors(OwnedMomentumConfig):
    """The public accessors of gxk.DistributedOptimizer; `_gradex_ref` is set by the wrapper's setup."""

    _gradex_ref: _runtime.Engine

    @property
    def gradex_engine(self) -> _runtime.Engine:
        """The engine this optimizer exchanges through (a gxt.engine() object)."""
        return self._gradex_ref

    def gradex_state(self) -> bytes:
        """This wrapper's compressor state (bytes) for checkpoints."""
        return self._gradex_ref.save_state()

    def load_gradex_state(self, blob: bytes) -> None:
        self._gradex_ref.load_state(blob)
