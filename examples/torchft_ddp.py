"""Fault-tolerant data-parallel training across replica groups with torchft, gradex exchanging the gradients.

torchft (pip install 'gradex[torchft]') forms a quorum of replica groups every step through its Lighthouse,
discards steps that do not commit and heals a replica that (re)joins from a healthy peer; gradex moves the
gradients between the groups (DGC with --mode dgc, exact fp32 through torchft's own DDP with --mode pg).
Start a Lighthouse, then one process (or torchrun) per replica group; kill one and start it again at will:

    torchft_lighthouse --min_replicas 2 --quorum_tick_ms 100 --join_timeout_ms 5000 &
    for g in 0 1 2; do
      TORCHFT_LIGHTHOUSE=http://localhost:29510 .venv/bin/python examples/torchft_ddp.py --group $g &
    done

Each group trains a small CNN on its own shard of scikit-learn's digits and prints the accuracy on the held-out
split; all groups hold the same parameters after every committed step. See docs/elastic.md.
"""
import argparse
import os
from datetime import timedelta

import torch
import torch.nn.functional as F
from torchft import Manager
from torchft.ddp import DistributedDataParallel as TorchftDDP
from torchft.optim import OptimizerWrapper

import gradex.torchft as gxft
from torch_ddp_digits import accuracy, load_digits, make_model


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--group", type=int, default=int(os.environ.get("REPLICA_GROUP_ID", 0)))
    parser.add_argument("--groups", type=int, default=3, help="replica groups the data is sharded over")
    parser.add_argument("--mode", choices=["dgc", "pg"], default="dgc")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--min-replicas", type=int, default=2)
    args = parser.parse_args()

    train_x, train_y, test_x, test_y = load_digits()
    shard = slice(args.group, None, args.groups)
    train_x, train_y = train_x[shard], train_y[shard]
    model = make_model()
    inner = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    def state_dict():
        return {"model": model.state_dict(), "optim": inner.state_dict()}

    def load_state_dict(state):
        model.load_state_dict(state["model"])
        inner.load_state_dict(state["optim"])

    # The replica group's own store (torchrun's MASTER_ADDR/MASTER_PORT when launched by it).
    store = None
    if "MASTER_PORT" not in os.environ:
        store = torch.distributed.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    pg = gxft.ProcessGroupGradex(timeout=timedelta(seconds=10))  # gradex: instead of ProcessGroupGloo
    manager = Manager(pg=pg, min_replica_size=args.min_replicas, load_state_dict=load_state_dict,
                      state_dict=state_dict, replica_id=f"digits{args.group}",
                      store_addr="127.0.0.1" if store else None, store_port=store.port if store else None,
                      rank=0 if store else None, world_size=1 if store else None,
                      timeout=timedelta(seconds=10))
    if args.mode == "dgc":
        # gradex: DGC between replica groups; torchft decides who takes part and what commits.
        state = gxft.State(manager, pg, model, optimizer=inner,
                           config={"GRADEX_SPARSITY": "0.99", "GRADEX_DENSE_THRESHOLD": "8192"})
        ddp = gxft.DistributedDataParallel(manager, model, state)
    else:
        ddp = TorchftDDP(manager, model)
    optimizer = OptimizerWrapper(manager, inner)

    g = torch.Generator().manual_seed(args.group)
    while manager.current_step() < args.steps:
        batch = torch.randint(0, len(train_y), (32,), generator=g)
        optimizer.zero_grad()
        F.cross_entropy(ddp(train_x[batch]), train_y[batch]).backward()
        optimizer.step()  # steps only when the quorum commits
        if manager.current_step() % 50 == 0:
            print(f"group {args.group} step {manager.current_step()} participants {manager.num_participants()} "
                  f"test accuracy {accuracy(model, test_x, test_y):.1f}%", flush=True)
    manager.shutdown(wait=False)
    pg.shutdown()


if __name__ == "__main__":
    main()
