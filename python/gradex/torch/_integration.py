"""The interface gradex.torch offers the integrations built on it (gradex.torchft): everything they use of
gradex.torch's machinery, under names that stay stable while the modules behind them change.

gradex.torch's underscore modules are private to gradex.torch; an integration imports this module only, so
that moving or renaming one of them means editing this file, not the integrations. What is here:

- the op library (libgradex_torch_ops.so): load_ops, submit, submit_absent, wait, wait_all;
- the exact transport of bytes through a gradex group (exact: broadcasts, gathers, layout checks);
- the exchange of a DDP model's buckets (BucketExchanger, with the GradScaler's interface GradScalerLike and
  its check ScaleDomain), bucket keys of a DDP model (BucketKeys), the thread that completes exchanges
  (Completer);
- the checks of a configuration the torch hook also applies (check_config) and the momentum-ownership rule
  (decide_momentum, from gradex._optimizer_family through gradex.torch._momentum);
- DiLoCo over FSDP modules (fsdp_modules, local_parameters, reshard) and the parameter-memory check
  (tensor_address).
"""
from . import _exact as exact
from ._amp import GradScalerLike, ScaleDomain
from ._buckets import BucketExchanger
from ._completion import Completer
from ._config_check import check as check_config
from ._diloco_sharded import fsdp_modules, local_parameters, reshard
from ._layout import BucketKeys
from ._momentum import decide as decide_momentum
from ._ops import load as load_ops
from ._ops import submit, submit_absent, wait, wait_all
from .diloco import tensor_address

__all__ = ["BucketExchanger", "BucketKeys", "Completer", "GradScalerLike", "ScaleDomain", "check_config",
           "decide_momentum", "exact", "fsdp_modules", "load_ops", "local_parameters", "reshard", "submit",
           "submit_absent", "tensor_address", "wait", "wait_all"]
