"""One replica group (one rank) of a torchft job on gradex, for tests/python/test_torchft_kill_restart.py and
the failure benchmark: trains a small MLP with torchft's Manager over ProcessGroupGradex, either with torchft's
fault-tolerant DDP (--mode pg: gradients through ProcessGroupGradex's exact average) or with gradex's hook
(--mode hook: gradex.torchft.DistributedDataParallel, DGC/16-bit as configured).

Progress: after every step it writes <out>/<replica>.step ("<step> <commits> <discarded> <healed>": the
Manager's step, steps this replica committed, steps it discarded, steps it took over from a peer while healing,
so that step == commits + healed when no step was lost). Stop:
once <out>/stop holds a step S and this replica has committed S steps, it writes its parameters to
<out>/<replica>.pt and exits 0 (all replicas stop at the same step, so their parameters must be identical).
"""
import argparse
import os
import sys
import time
from datetime import timedelta

import torch
from torch import nn
from torchft import Manager
from torchft.ddp import DistributedDataParallel as TorchftDDP
from torchft.optim import OptimizerWrapper

import gradex.torchft as gxft


def model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 256), nn.ReLU(), nn.Linear(256, 10))


def write(path, text):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--replica", type=int, required=True)
    parser.add_argument("--lighthouse", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--mode", choices=["pg", "hook"], default="pg")
    parser.add_argument("--min-replicas", type=int, default=2)
    parser.add_argument("--step-sleep", type=float, default=0.05)
    args = parser.parse_args()

    store = torch.distributed.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    pg = gxft.ProcessGroupGradex(timeout=timedelta(seconds=5))
    net = model()
    inner = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)

    def state_dict():
        return {"model": net.state_dict(), "optim": inner.state_dict()}

    def load_state_dict(state):
        net.load_state_dict(state["model"])
        inner.load_state_dict(state["optim"])

    manager = Manager(pg=pg, min_replica_size=args.min_replicas, load_state_dict=load_state_dict,
                      state_dict=state_dict, replica_id=f"replica{args.replica}", store_addr="127.0.0.1",
                      store_port=store.port, rank=0, world_size=1, lighthouse_addr=args.lighthouse, port=0,
                      timeout=timedelta(seconds=10), quorum_timeout=timedelta(seconds=60))
    write(os.path.join(args.out, f"replica{args.replica}.started"), repr(time.time()))  # after imports
    if args.mode == "hook":
        state = gxft.State(manager, pg, net, optimizer=inner,
                           config={"GRADEX_DENSE_THRESHOLD": "1000", "GRADEX_SPARSITY": "0.9"})
        ddp = gxft.DistributedDataParallel(manager, net, state)
    else:
        ddp = TorchftDDP(manager, net)
    optimizer = OptimizerWrapper(manager, inner)
    loss_fn = nn.CrossEntropyLoss()
    commits = discarded = healed = 0
    stop_path = os.path.join(args.out, "stop")
    progress = os.path.join(args.out, f"replica{args.replica}.step")
    while True:
        step = manager.current_step()
        g = torch.Generator().manual_seed(1000 * args.replica + step)
        x = torch.randn(16, 32, generator=g)
        y = torch.randint(0, 10, (16,), generator=g)
        optimizer.zero_grad()
        loss_fn(ddp(x), y).backward()
        optimizer.step()  # steps the inner optimizer only if the quorum commits
        now = manager.current_step()
        if now == step:
            discarded += 1
        else:
            commits += 1
            healed += now - step - 1  # steps taken over from a peer's checkpoint while healing
        write(progress, f"{now} {commits} {discarded} {healed}")
        if os.path.exists(stop_path):
            with open(stop_path) as f:
                stop_at = int(f.read().strip() or "0")
            if manager.current_step() >= stop_at:
                torch.save({k: v.clone() for k, v in net.state_dict().items()},
                           os.path.join(args.out, f"replica{args.replica}.pt"))
                break
        time.sleep(args.step_sleep)
    manager.shutdown(wait=False)
    pg.shutdown()
    sys.stdout.flush()
    os._exit(0)  # the peers' engines may still be closing theirs; nothing here needs an orderly exit


if __name__ == "__main__":
    main()
