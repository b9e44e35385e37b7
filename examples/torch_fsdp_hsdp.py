"""HSDP on CPU with FSDP2 inside each replica group and gradex across them, on scikit-learn's bundled digits.

A 2-D mesh of 4 ranks: 2 replica groups (think: two sites on a slow link) x 2 shards (ranks on a fast link).
Run with:

    .venv/bin/torchrun --nproc-per-node 4 examples/torch_fsdp_hsdp.py --mode gradex

--mode native: torch's own HSDP (fully_shard on the 2-D mesh: gloo reduce-scatter inside, all-reduce across).
--mode gradex: fully_shard on mesh["shard"] and gx.HSDP across mesh["replicate"] (the GRADEX_* policy
  compresses each parameter shard; AdamW gets the Adam codec).
--mode diloco: fully_shard on mesh["shard"] and gx.DiLoCo(mesh=mesh): each replica group trains on its own
  and only 4-bit pseudo-gradients of each shard cross the replicate dimension every --period steps.
The lines that differ from the native run are marked "gradex:".
"""
import argparse
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

import gradex.torch as gx

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_ddp_digits import load_digits  # noqa: E402


def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 512), torch.nn.ReLU()),
        torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.ReLU()),
        torch.nn.Linear(512, 10))


def train(mode: str, steps: int = 300, batch: int = 16, lr: float = 1e-3, period: int = 20) -> float:
    """Trains on this rank's part of the data; returns the test accuracy in %."""
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("replicate", "shard"))
    model = make_model()
    shard_mesh = mesh if mode == "native" else mesh["shard"]  # gradex: FSDP2 on the shard dimension only
    for block in list(model)[:-1]:
        fully_shard(block, mesh=shard_mesh)
    fully_shard(model, mesh=shard_mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    helper = None
    if mode == "gradex":
        helper = gx.HSDP(model, mesh, optimizer=opt)  # gradex: the replicate dimension's exchange
    elif mode == "diloco":
        helper = gx.DiLoCo(model, opt, mesh=mesh, period=period, bits=4, fragments=2, delay=1,
                           outer_momentum=0.5)  # gradex: the replicate dimension's outer optimizer
    train_x, train_y, test_x, test_y = load_digits()
    shard_x, shard_y = train_x[rank::world], train_y[rank::world]
    gen = torch.Generator().manual_seed(rank)
    for _ in range(steps):
        pick = torch.randint(0, len(shard_y), (batch,), generator=gen)
        loss = F.cross_entropy(model(shard_x[pick]), shard_y[pick])
        loss.backward()
        opt.step()
        opt.zero_grad()
        if mode == "diloco":
            helper.step()  # gradex: after every inner step
    if mode == "diloco":
        helper.synchronize()  # gradex: one model on every replica
    with torch.no_grad():
        correct = (model(test_x).argmax(1) == test_y).float().mean().item() * 100.0
    if helper is not None:
        if rank == 0:
            print(f"gradex sent {gx.stats(helper)['bytes_sent']} bytes from rank 0 "
                  f"({gx.stats(helper)['dense_bytes']} for dense fp32)")
        helper.close()
    return correct


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=("native", "gradex", "diloco"), default="gradex")
    parser.add_argument("--steps", type=int, default=300)
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    if dist.get_world_size() % 2:
        raise SystemExit("run on an even number of ranks (2 replica groups)")
    accuracy = train(args.mode, steps=args.steps)
    if dist.get_rank() == 0:
        print(f"{args.mode}: test accuracy {accuracy:.1f}%")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
