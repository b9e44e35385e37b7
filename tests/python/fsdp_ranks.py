"""Rank functions for the FSDP2 tests: a small model sharded with fully_shard on a 2-D (replicate x shard)
mesh of gloo CPU ranks, trained by native HSDP (FSDP2 on the 2-D mesh) and by FSDP2 on the shard dimension
with gradex across the replicate dimension, from the same initial weights on the same data."""
import torch


def make_model(seed=0, width=256):
    """Blocks of Linear + Tanh and an output layer. Sharded over 2 ranks, the two hidden weights' shards have
    4,096 and 32,768 elements: at or above the dense threshold the compressed tests set (4,096), so the policy
    compresses them; the biases and the output layer stay dense."""
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Sequential(torch.nn.Linear(32, width), torch.nn.Tanh()),
        torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.Tanh()),
        torch.nn.Linear(width, 8))


def mesh_2x2():
    from torch.distributed.device_mesh import init_device_mesh
    return init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard"))


def shard(model, mesh, mp_policy=None):
    """fully_shard on each block and the root over `mesh` (the 2-D mesh: native HSDP; mesh['shard']: FSDP)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    kwargs = {"mesh": mesh, "mp_policy": mp_policy or MixedPrecisionPolicy()}
    for block in list(model)[:-1]:
        fully_shard(block, **kwargs)
    fully_shard(model, **kwargs)
    return model


def task(seed=7):
    """A fixed random teacher: regression targets of a random two-layer network (the same on every rank)."""
    gen = torch.Generator().manual_seed(seed)
    w1, w2 = torch.randn(32, 64, generator=gen), torch.randn(64, 8, generator=gen) / 8
    return lambda x: torch.tanh(x @ w1) @ w2


def batch(rank, step, size=16):
    gen = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(size, 32, generator=gen)


def full_parameters(model):
    """Every parameter gathered to its full value (collective), as CPU tensors by name."""
    return {n: p.full_tensor().detach().clone() for n, p in model.named_parameters()}


def train(model, opt, teacher, rank, steps, start=0, accumulate=1, loss_log=None):
    for step in range(start, start + steps):
        for micro in range(accumulate):
            if accumulate > 1:
                model.set_requires_gradient_sync(micro == accumulate - 1)
            x = batch(rank, step * accumulate + micro)
            loss = torch.nn.functional.mse_loss(model(x), teacher(x)) / accumulate
            loss.backward()
        opt.step()
        opt.zero_grad()
        if loss_log is not None:
            loss_log.append(float(loss) * accumulate)


def held_out_loss(model, teacher):
    gen = torch.Generator().manual_seed(99)
    x = torch.randn(512, 32, generator=gen)
    with torch.no_grad():
        return float(torch.nn.functional.mse_loss(model(x), teacher(x)))


def digest(tensors):
    """Exact fingerprints of tensors by name (bit patterns, for comparisons across processes)."""
    return {n: t.contiguous().view(torch.int32).sum().item() if t.dtype == torch.float32
            else t.float().contiguous().view(torch.int32).sum().item() for n, t in tensors.items()}


def local_shards(model):
    return {n: p.to_local().detach().clone() for n, p in model.named_parameters()}
