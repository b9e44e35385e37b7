#!/usr/bin/env python3
"""Real wire bytes of gradex's Adam-aware default on the LM race's model: P local ranks on
loopback train the race's transformer with AdamW through DDP + gx.State(ddp, optimizer=AdamW) + gx.hook for a
few steps, and rank 0 prints gradex's own counters (gx.stats): bytes sent, what a dense fp32 ring allreduce
would have sent, and their ratio. Losses are measured at equal steps by adam_codec_study.py.

  python -m bench.lm.adam_codec_bytes --steps 20 --ranks 2 [--config GRADEX_ADAM_SPARSITY=0.98 ...]
"""
import argparse
import datetime
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

HERE = os.path.dirname(os.path.abspath(__file__))
from bench.lm import corpus  # noqa: E402
from bench.lm import model as lm  # noqa: E402
from gradex._ports import free_port  # noqa: E402


def rank_main(rank, args, port):
    import gradex.torch as gx
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=args.ranks, timeout=datetime.timedelta(seconds=300))
    data = corpus.load(args.data)
    net = lm.make(seed=0, vocab=data["vocab"], d=args.d_model, layers=args.layers, context=args.context)
    ddp = torch.nn.parallel.DistributedDataParallel(net)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3, weight_decay=0.01)
    config = dict(kv.split("=", 1) for kv in args.config)
    state = gx.State(ddp, optimizer=opt, config=config)
    ddp.register_comm_hook(state, gx.hook)
    sampler = corpus.Sampler(data["train"], args.context, args.batch, seed=1000 + rank)
    for _ in range(args.steps):
        x, y = sampler.next()
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(ddp(x).reshape(-1, data["vocab"]), y.reshape(-1)).backward()
        opt.step()
    s = gx.stats(state)
    if rank == 0:
        print(f"RESULT ranks={args.ranks} steps={s['steps']} parameters={lm.parameter_count(net)} "
              f"bytes_sent={s['bytes_sent']} dense_fp32_bytes={s['dense_bytes']} "
              f"ratio={s['dense_bytes'] / max(1, s['bytes_sent']):.1f} sparse_exchanges={s['sparse_exchanges']}",
              flush=True)
        print(gx.explain(state), flush=True)
    state.close()
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--context", type=int, default=64)
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--vocab", type=int, default=16384)
    p.add_argument("--data", default="/tmp/adamcodec_lm_corpus.pt")
    p.add_argument("--config", nargs="*", default=[], help="GRADEX_NAME=value overrides for gx.State")
    args = p.parse_args()
    if not os.path.exists(args.data):
        corpus.save(corpus.build(args.vocab), args.data + ".tmp")
        os.replace(args.data + ".tmp", args.data)
    mp.spawn(rank_main, args=(args, free_port()), nprocs=args.ranks)


if __name__ == "__main__":
    main()
