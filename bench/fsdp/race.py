#!/usr/bin/env python3
"""The sharded race: a small word-level transformer (bench/lm/model.py) under FSDP2 HSDP on 2 replica groups x 2
shards (4 gloo CPU ranks on this host), trained with AdamW by three methods for the same number of steps:

  native   torch's HSDP: fully_shard on the 2-D mesh (gloo reduce-scatter in a shard group, gloo all-reduce
           across replica groups)
  gradex   fully_shard on mesh["shard"], gx.HSDP across mesh["replicate"] (the GRADEX_* policy; AdamW: the
           Adam codec where the policy compresses)
  diloco   fully_shard on mesh["shard"], gx.DiLoCo(mesh=mesh): 4-bit streamed pseudo-gradients across replica
           groups every --period steps (2 fragments, delay 1, outer momentum 0.5)

    .venv/bin/python bench/fsdp/race.py --steps 200

Held-out loss is measured every --eval-every steps (its time is not counted). The target is native HSDP's
final held-out loss; each method's time to target is the training clock at its first evaluation at or below
it (nan: never); --target-loss sets another (to compare runs under other GRADEX_* settings). The ranks' links are loopback: nothing is shaped, so the replicate dimension is as fast as
the shard dimension here; the race measures each method's cost and its loss at equal steps, not a slow link.
Prints a Markdown table and a RESULT line.
"""
import argparse
import math
import os
import pathlib
import socket
import sys
import time

import torch
import torch.multiprocessing as mp

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "lm"))
import corpus  # noqa: E402
import model as lm_model  # noqa: E402

METHODS = ("native", "gradex", "diloco")
SHAPE = {"vocab": 4096, "d": 128, "layers": 2, "heads": 4, "context": 32}


def _shard(model, mesh):
    from torch.distributed.fsdp import fully_shard
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)


def _rank(rank, world, port, method, args, data_path, out):
    os.environ.update({"GRADEX_TIMEOUT_S": "120"})
    torch.set_num_threads(1)
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    import gradex.torch as gx
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    mesh = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("replicate", "shard"))
    data = corpus.load(data_path)
    model = lm_model.make(seed=0, **SHAPE)
    _shard(model, mesh if method == "native" else mesh["shard"])
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    helper = None
    if method == "gradex":
        helper = gx.HSDP(model, mesh, optimizer=opt)
    elif method == "diloco":
        helper = gx.DiLoCo(model, opt, mesh=mesh, period=args.period, bits=4, fragments=2, delay=1,
                           outer_momentum=0.5)
    sampler = corpus.Sampler(data["train"], SHAPE["context"], args.batch, seed=100 + rank)
    held_out = corpus.eval_batches(data["held_out"], SHAPE["context"], args.eval_batches, args.batch)
    curve, clock = [], 0.0
    for step in range(1, args.steps + 1):
        dist.barrier()
        start = time.perf_counter()
        x, y = sampler.next()
        lm_model.loss_of(model, x, y).backward()
        opt.step()
        opt.zero_grad()
        if helper is not None and method == "diloco":
            helper.step()
        clock += time.perf_counter() - start
        if step % args.eval_every == 0 or step == args.steps:
            if method == "diloco" and step == args.steps:
                start = time.perf_counter()
                helper.synchronize()
                clock += time.perf_counter() - start
            # DiLoCo between syncs: each replica's own model; the loss averaged over the ranks.
            loss = torch.tensor([lm_model.held_out_loss(model, held_out)])
            dist.all_reduce(loss)
            curve.append((step, clock, float(loss) / world))
    sent = gx.stats(helper)["bytes_sent"] if helper is not None else float("nan")
    if method == "gradex" and rank == 0:
        print(f"gradex HSDP on rank 0, each shard's codec:\n{gx.explain(helper)}", file=sys.stderr)
    if helper is not None:
        helper.close()
    if rank == 0:
        out.put((curve, sent))
    dist.barrier()
    dist.destroy_process_group()


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--period", type=int, default=8)
    parser.add_argument("--eval-every", type=int, default=25)
    parser.add_argument("--eval-batches", type=int, default=4)
    parser.add_argument("--corpus-bytes", type=int, default=2 << 20)
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--target-loss", type=float, default=None,
                        help="the loss to race to (default: native HSDP's final held-out loss in this run)")
    parser.add_argument("--log-dir", default="/tmp/gradex-fsdp-race")
    args = parser.parse_args()
    os.makedirs(args.log_dir, exist_ok=True)
    data_path = os.path.join(args.log_dir, f"corpus.{SHAPE['vocab']}.{args.corpus_bytes}.pt")
    if not os.path.exists(data_path):
        corpus.save(corpus.build(SHAPE["vocab"], args.corpus_bytes), data_path)
    ctx = mp.get_context("spawn")
    results = {}
    for method in args.methods.split(","):
        out, port, started = ctx.Queue(), _free_port(), time.time()
        procs = [ctx.Process(target=_rank, args=(r, 4, port, method, args, data_path, out)) for r in range(4)]
        for p in procs:
            p.start()
        results[method] = out.get(timeout=3600)
        for p in procs:
            p.join()
        curve, sent = results[method]
        print(f"{method}: final held-out loss {curve[-1][2]:.4f}, training clock {curve[-1][1]:.1f} s, "
              f"rank 0 sent {sent:.0f} bytes ({time.time() - started:.0f} s)", file=sys.stderr)
    if args.target_loss is not None:
        target = args.target_loss
    elif "native" in results:
        target = results["native"][0][-1][2]
    else:
        raise SystemExit("--target-loss is needed without the native method")
    print(f"| method ({args.steps} steps, 2 x 2 ranks, loopback) | final held-out loss | training clock (s) | "
          f"s/step | time to target (s) | rank 0 bytes sent |\n|---|---|---|---|---|---|")
    fields = []
    for method, (curve, sent) in results.items():
        reached = next((t for _, t, loss in curve if loss <= target), math.nan)
        step, clock, loss = curve[-1]
        print(f"| {method} | {loss:.4f} | {clock:.1f} | {clock / step:.3f} | {reached:.1f} | {sent:.0f} |")
        fields += [f"final_loss_{method}={loss:.4f}", f"ttt_{method}={reached:.2f}", f"clock_{method}={clock:.2f}"]
    print("RESULT " + " ".join(fields))


if __name__ == "__main__":
    main()
