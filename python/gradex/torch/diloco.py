"""DiLoCo: local training with an outer optimizer over averaged pseudo-gradients (Douillard et al. 2023),
streamed in fragments with delayed merges (Streaming DiLoCo, 2025), pseudo-gradients in 8 or 4 bits (or
as DGC-style top-k entries with error feedback: compression="topk", density=0.01).

    diloco = gx.DiLoCo(model, inner_optimizer, period=100, outer_lr=0.7, outer_momentum=0.9,
                       fragments=1, delay=0, bits=8)
    loss.backward(); inner_optimizer.step(); diloco.step()     # no DDP, no per-step gradient traffic
    diloco.synchronize()   # every rank then holds the global model (evaluation, checkpoint)

Every `period` steps (per fragment) each rank's pseudo-gradient theta_global - theta_local is averaged
across ranks and an outer SGD/Nesterov step updates theta_global, identical on every rank; the model then
continues from it. With fragments=F the parameters (in model order) are split into F groups that sync at
staggered steps; with delay=d >= 1 a fragment's exchange runs in the background and is merged d steps
later, so the loop does not wait on the network. Floating-point buffers (BatchNorm statistics) are
averaged at fragment 0's syncs and at synchronize(). Construction is collective (like gx.State) and copies
rank 0's parameters and buffers to every rank.

Parameters and buffers must be float32 CPU tensors that stay at the same memory address (do not assign
`p.data = ...`): gradex reads and writes them in place. The keyword arguments map to the GRADEX_OUTER_*
variables (docs/configuration.md); `config` sets any other GRADEX_* variable and wins over them.
compression="quant" (the default) sends `bits`-bit codes (4, 8, or 32 for exact fp32); compression="topk"
sends the `density` fraction (default 0.01) of each fragment's pseudo-gradient entries of largest
magnitude, keeping the rest as a residual for the next sync (GRADEX_OUTER_BITS=topk,
GRADEX_OUTER_DENSITY).
"""
import weakref

import torch
import torch.distributed as dist

from .. import _capi, _errors
from . import _bootstrap

_STATE_FORMAT = "gradex.torch.DiLoCo/1"


def _int_arg(name, value):
    if isinstance(value, bool) or not isinstance(value, int):
        raise _errors.ConfigError(f"gradex: DiLoCo {name} must be an integer, got {value!r}")
    return value


def _float_arg(name, value):
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _errors.ConfigError(f"gradex: DiLoCo {name} must be a number, got {value!r}")
    return repr(float(value))


def _close_quietly(outer):
    try:
        outer.close()
    except _errors.GradexError:
        pass  # garbage collection: nobody is left to tell


def _create_outer(config, store):
    if store is None and dist.is_available() and dist.is_initialized():
        store = dist.distributed_c10d._get_default_store()
    if store is not None:
        if not (dist.is_available() and dist.is_initialized()):
            raise _errors.InvalidArgumentError("gradex: a store was given but torch.distributed is not initialized")
        prefix = f"gradex/{next(_bootstrap._counters[''])}/"  # numbered with the default group's engines
        outer = _capi.Outer(dist.get_rank(), dist.get_world_size(), store, prefix, config)
    else:
        outer = _capi.Outer(-1, -1, None, None, config)
    with _bootstrap._live_lock:  # gx.stats() without a source, and closing at exit
        _bootstrap._live.append(weakref.ref(outer))
    return outer


def _tensor_address(name, t):
    if t.dtype != torch.float32 or t.device.type != "cpu" or not t.is_contiguous():
        raise _errors.InvalidArgumentError(
            f"gradex: DiLoCo needs contiguous float32 CPU tensors; '{name}' is {t.dtype} on {t.device}"
            f"{'' if t.is_contiguous() else ', not contiguous'}")
    return t.data_ptr()


class DiLoCo:
    def __init__(self, model, inner_optimizer=None, period=100, outer_lr=0.7, outer_momentum=0.9,
                 fragments=1, delay=0, bits=8, nesterov=True, mixing=0.0, config=None, store=None,
                 compression="quant", density=None):
        if isinstance(model, torch.nn.parallel.DistributedDataParallel):
            raise _errors.InvalidArgumentError(
                "gradex: DiLoCo replaces DistributedDataParallel; pass the plain module (model.module)")
        if bits not in (4, 8, 32) or isinstance(bits, bool):
            raise _errors.ConfigError(f"gradex: DiLoCo bits must be 4, 8 or 32, got {bits!r}")
        if compression not in ("quant", "topk"):
            raise _errors.ConfigError(f"gradex: DiLoCo compression must be 'quant' or 'topk', got {compression!r}")
        if density is not None:
            if compression != "topk":
                raise _errors.ConfigError(
                    f"gradex: DiLoCo density={density!r} applies only to compression='topk', got {compression!r}")
            if (isinstance(density, bool) or not isinstance(density, (int, float))
                    or not 0.0 < float(density) <= 1.0):
                raise _errors.ConfigError(f"gradex: DiLoCo density must be a number in (0, 1], got {density!r}")
        merged = {
            "GRADEX_OUTER_PERIOD": _int_arg("period", period),
            "GRADEX_OUTER_LR": _float_arg("outer_lr", outer_lr),
            "GRADEX_OUTER_MOMENTUM": _float_arg("outer_momentum", outer_momentum),
            "GRADEX_OUTER_FRAGMENTS": _int_arg("fragments", fragments),
            "GRADEX_OUTER_DELAY": _int_arg("delay", delay),
            "GRADEX_OUTER_BITS": "topk" if compression == "topk" else bits,
            "GRADEX_OUTER_NESTEROV": int(bool(nesterov)),
            "GRADEX_OUTER_MIXING": _float_arg("mixing", mixing),
        }
        if density is not None:
            merged["GRADEX_OUTER_DENSITY"] = repr(float(density))
        merged.update(config or {})
        self.model = model
        self.inner_optimizer = inner_optimizer
        self._params = [(name, p) for name, p in model.named_parameters()]
        self._buffers = [(name, b) for name, b in model.named_buffers() if b.dtype == torch.float32]
        addresses = [(f"param.{n}", _tensor_address(n, p.detach()), p.numel(), False) for n, p in self._params]
        addresses += [(f"buffer.{n}", _tensor_address(n, b), b.numel(), True) for n, b in self._buffers]
        self._outer = _create_outer(merged, store)
        self._finalizer = weakref.finalize(self, _close_quietly, self._outer)
        try:
            for key, address, numel, is_buffer in addresses:
                self._outer.add_tensor(key, address, numel, is_buffer)
            self._outer.start()
        except BaseException:
            self._outer.close()
            raise
        self.steps = 0

    @torch.no_grad()
    def step(self):
        """Ends an inner step (call after inner_optimizer.step()). Returns the number of fragments merged into
        the model by this call. Raises the failure of a background exchange (a dead or stalled peer)."""
        merged = self._outer.step()
        self.steps += 1
        return merged

    @torch.no_grad()
    def synchronize(self):
        """Collective: finishes pending exchanges, averages the buffers and loads the global model into the
        module on every rank (identical everywhere). Local progress since each fragment's last sync is
        dropped; call it right after a sync step (step % period == 0 with one fragment) to lose nothing."""
        self._outer.synchronize()

    def global_parameters(self):
        """{name: tensor} of the global copy (identical on every rank)."""
        out = {}
        for name, p in self._params:
            t = torch.empty(p.shape, dtype=torch.float32)
            self._outer.global_copy(f"param.{name}", t.data_ptr(), t.numel())
            out[name] = t
        return out

    def last_merges(self):
        """Per fragment, the step at which it was last merged (0: never)."""
        return self._outer.last_merges()

    def fragment_of(self, name):
        return self._outer.fragment_of(f"param.{name}")

    @property
    def engine(self):
        """The gx.stats() source: bytes_sent/received, dense_bytes, compression_ratio, parameter_averages
        (fragment syncs), steps, communicate_seconds (background) and decode_seconds (time spent waiting)."""
        return self._outer

    def stats(self, last_step=False):
        return self._outer.stats(last_step)

    def state_dict(self):
        """The outer state (global copies, outer momenta, quantization residuals, step count) and the inner
        optimizer's state. Merges pending exchanges first."""
        state = {"format": _STATE_FORMAT, "steps": self.steps, "outer": self._outer.save_state()}
        if self.inner_optimizer is not None:
            state["inner"] = self.inner_optimizer.state_dict()
        return state

    def load_state_dict(self, state):
        if not isinstance(state, dict) or state.get("format") != _STATE_FORMAT:
            got = state.get("format") if isinstance(state, dict) else type(state).__name__
            raise _errors.StateError(f"gradex: not a {_STATE_FORMAT} state dict (format {got!r})")
        self._outer.load_state(state["outer"])
        if self.inner_optimizer is not None and "inner" in state:
            self.inner_optimizer.load_state_dict(state["inner"])
        self.steps = int(state["steps"])

    def close(self):
        """Finishes the exchanges in flight and releases the connections. Idempotent; also done at the end of a
        `with` block and by the garbage collector."""
        self._finalizer.detach()
        self._outer.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False
