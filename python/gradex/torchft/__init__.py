"""gradex as the exchange of torchft (pip install gradex[torchft], which installs torchft-nightly).

    from gradex.torchft import ProcessGroupGradex
    pg = ProcessGroupGradex(timeout=timedelta(seconds=10))          # torchft's collectives on gradex
    manager = torchft.Manager(pg=pg, ...)

    import gradex.torchft as gxft
    state = gxft.State(manager, pg, model, optimizer=opt)            # compressed gradients between replicas
    model = gxft.DistributedDataParallel(manager, model, state)

    with gxft.DiLoCo(manager, model, inner_optimizer, sync_every=100, bits=4):  # gradex's DiLoCo as the
        ...                                                                      # outer loop (4/8-bit)

torchft decides who takes part in a step and whether it commits; gradex moves the bytes. See docs/elastic.md.
"""
try:
    import torchft  # noqa: F401
except ImportError as exc:  # an optional extra: say how to get it
    raise ImportError("gradex.torchft needs torchft: pip install 'gradex[torchft]' (installs torchft-nightly)") \
        from exc

from .diloco import DiLoCo
from .hook import DistributedDataParallel, State, hook
from .process_group import ProcessGroupGradex, advertised_reconfigure_handle

__all__ = ["ProcessGroupGradex", "State", "hook", "DistributedDataParallel", "DiLoCo",
           "advertised_reconfigure_handle"]
