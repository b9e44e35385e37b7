"""The PyTorch baselines: what stock DDP does with the same gradients, over gloo.

Each mode is a DDP model whose parameters have the profile's shapes; one step injects this rank's
gradients into backward() (no arithmetic: the autograd function hands its stored gradient to each
parameter) and DDP does the rest exactly as in training: bucketing (25 MB buckets, reverse
registration order), the communication hook per bucket, waiting for every bucket, writing the
averaged gradients back into .grad.
"""
import torch
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
from torch.nn.parallel import DistributedDataParallel


class _Inject(torch.autograd.Function):
    """loss = 0 * param in forward; backward hands `grad` to the parameter as its gradient."""

    @staticmethod
    def forward(ctx, param, grad):
        ctx.grad = grad
        return param.new_zeros(())

    @staticmethod
    def backward(ctx, _):
        grad, ctx.grad = ctx.grad, None  # drop our reference so autograd may adopt the tensor
        return grad, None


class GradientModel(torch.nn.Module):
    def __init__(self, profile):
        super().__init__()
        # Parameter names may contain dots, which Module attributes cannot: register a ParameterList
        # in profile order (DDP buckets in reverse registration order, as for the real model).
        self.params = torch.nn.ParameterList(
            torch.nn.Parameter(torch.zeros(shape)) for _, shape in profile.tensors)

    def forward(self, grads):
        return torch.stack([_Inject.apply(p, g) for p, g in zip(self.params, grads)]).sum()


def _noop_hook(_, bucket):
    """Returns the bucket untouched: measures DDP's own cost (bucket copies) without communication."""
    future: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    future.set_result(bucket.buffer())
    return future


def serialized_hook(hook):
    """The hook, returning only once its bucket is done. PowerSGD issues its second and third gloo
    allreduce from future callbacks (on gloo's threads), which may interleave differently with the
    next bucket's first allreduce on different ranks: collectives then mismatch ("Received data size
    doesn't match expected size"). Finishing each bucket before DDP hands over the next one keeps
    the order identical everywhere; it only gives up overlap between buckets' communication."""
    def serialized(state, bucket):
        future = hook(state, bucket)
        future.wait()
        return future
    return serialized


def _powersgd(rank):
    def register(ddp):
        # start_powerSGD_iter=2 is the smallest DDP allows (its buckets are rebuilt after step 1);
        # the harness's warm-up steps cover these two vanilla allreduce steps.
        state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=rank,
                                            start_powerSGD_iter=2, use_error_feedback=True,
                                            warm_start=True)
        ddp.register_comm_hook(state, serialized_hook(powerSGD_hook.powerSGD_hook))
    return register


# name -> (description, hook registration, whether the output is the exact average).
MODES = {
    "gloo_fp32": ("DDP default: gloo allreduce of fp32 buckets", lambda ddp: None, True),
    "torch_fp16": ("DDP fp16_compress_hook: pre-divide, fp16 gloo allreduce, cast back",
                   lambda ddp: ddp.register_comm_hook(None, default_hooks.fp16_compress_hook), True),
    "powersgd_r1": ("DDP PowerSGD hook, rank 1, error feedback, warm start", _powersgd(1), False),
    "powersgd_r4": ("DDP PowerSGD hook, rank 4, error feedback, warm start", _powersgd(4), False),
    "ddp_nocomm": ("DDP with a hook that returns the bucket as is: the harness's own cost",
                   lambda ddp: ddp.register_comm_hook(None, _noop_hook), False),
}


def make_ddp(profile, mode):
    """A fresh DDP model for `mode`. init_sync=False: the parameters are zeros everywhere already,
    so the initial 100 MB broadcast would only cost setup time."""
    model = GradientModel(profile)
    ddp = DistributedDataParallel(model, init_sync=False)
    MODES[mode][1](ddp)
    return ddp
