"""One replica group (one rank) of a torchft job whose outer loop is gradex's DiLoCo, for
tests/python/test_torchft_diloco.py: a small MLP, AdamW inner steps on this replica's own data, torchft's Manager
over ProcessGroupGradex, gradex.torchft.DiLoCo (4/8-bit pseudo-gradients).

Progress: after every inner step it writes <out>/replica<r>.step ("<manager step> <commits> <rollbacks> <heals>
<inner steps>"). --die-when-told: once <out>/die exists, the replica kills itself (SIGKILL) as soon as a quorum
of all --replicas replicas has formed for a sync: its peers start that sync's exchange with a member that is
gone. --outer torchft runs torchft's own DiLoCo (fp32 pseudo-gradients through Manager.allreduce) over the same
ProcessGroupGradex instead, for bench/elastic/diloco.py. Stop: once <out>/stop holds a step S and a sync of all --replicas replicas has just committed with the
Manager's step >= S, it writes its parameters, global copies and shared outer state to <out>/replica<r>.pt, its
statistics to <out>/replica<r>.stats, and exits 0.
"""
import argparse
import json
import os
import signal
import sys
import time
from datetime import timedelta

import torch
from torch import nn
from torchft import Manager

import gradex.torchft as gxft


def write(path, text):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


class TorchftOuter:
    """torchft.local_sgd.DiLoCo with the attributes the loop below reads from gradex.torchft.DiLoCo."""

    def __init__(self, manager, pg, net, inner, args):
        from torchft.local_sgd import DiLoCo
        outer_optimizer = torch.optim.SGD(net.parameters(), lr=0.7, momentum=0.9, nesterov=True)
        self._diloco = DiLoCo(manager, [net], inner, outer_optimizer, sync_every=args.sync_every,
                              fragment_sync_delay=args.delay)
        self._manager, self._pg = manager, pg
        self.rollbacks = self.heals = 0
        self.in_flight = False

    @property
    def commits(self):
        return self._manager.current_step()

    def global_parameters(self):
        return {}

    def shared_state(self):
        return None

    def stats(self):
        return self._pg._generation.engine.stats()  # the group's engine carries the fp32 allreduces

    def __enter__(self):
        self._diloco.__enter__()
        return self

    def __exit__(self, *exc):
        return self._diloco.__exit__(*exc)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--replica", type=int, required=True)
    parser.add_argument("--lighthouse", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--bits", type=int, default=4)
    parser.add_argument("--sync-every", type=int, default=4)
    parser.add_argument("--fragments", type=int, default=1)
    parser.add_argument("--delay", type=int, default=0)
    parser.add_argument("--min-replicas", type=int, default=2)
    parser.add_argument("--die-when-told", action="store_true")
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--step-sleep", type=float, default=0.02)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--outer", choices=["gradex", "torchft"], default="gradex")
    args = parser.parse_args()

    store = torch.distributed.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    pg = gxft.ProcessGroupGradex(timeout=timedelta(seconds=5))
    torch.manual_seed(100 + args.replica)  # different initial values: torchft's init_sync makes them equal
    net = nn.Sequential(nn.Linear(16, args.hidden), nn.ReLU(), nn.Linear(args.hidden, 4))
    inner = torch.optim.AdamW(net.parameters(), lr=1e-2)

    def state_dict():
        return {"model": net.state_dict(), "inner": inner.state_dict()}

    def load_state_dict(state):
        net.load_state_dict(state["model"])
        inner.load_state_dict(state["inner"])

    manager = Manager(pg=pg, min_replica_size=args.min_replicas, use_async_quorum=False,
                      load_state_dict=load_state_dict, state_dict=state_dict, replica_id=f"replica{args.replica}",
                      store_addr="127.0.0.1", store_port=store.port, rank=0, world_size=1,
                      lighthouse_addr=args.lighthouse, port=0, timeout=timedelta(seconds=5),
                      quorum_timeout=timedelta(seconds=60))
    write(os.path.join(args.out, f"replica{args.replica}.started"), repr(time.time()))
    loss_fn = nn.CrossEntropyLoss()
    progress = os.path.join(args.out, f"replica{args.replica}.step")
    stop_path = os.path.join(args.out, "stop")
    inner_steps = 0
    if args.outer == "torchft":
        outer = TorchftOuter(manager, pg, net, inner, args)
    else:
        outer = gxft.DiLoCo(manager, net, inner, sync_every=args.sync_every, fragments=args.fragments,
                            fragment_sync_delay=args.delay, bits=args.bits)
    with outer as diloco:
        if args.die_when_told:
            start_quorum = manager.start_quorum
            told = os.path.join(args.out, "die")

            def start_quorum_then_die(*a, **kw):
                start_quorum(*a, **kw)
                if os.path.exists(told) and manager.num_participants() == args.replicas:
                    os.kill(os.getpid(), signal.SIGKILL)
            manager.start_quorum = start_quorum_then_die
        while True:
            g = torch.Generator().manual_seed(100000 * args.replica + inner_steps)
            x = torch.randn(32, 16, generator=g)
            y = (x[:, :4].argmax(1) + args.replica) % 4  # each replica its own data
            commits = diloco.commits
            inner.zero_grad()
            loss_fn(net(x), y).backward()
            inner.step()  # the DiLoCo hooks: quorum, exchange, commit
            inner_steps += 1
            write(progress, f"{manager.current_step()} {diloco.commits} {diloco.rollbacks} {diloco.heals} "
                            f"{inner_steps}")
            everyone = manager.num_participants() == args.replicas
            if diloco.commits > commits and everyone and os.path.exists(stop_path):
                with open(stop_path) as f:
                    stop_at = int(f.read().strip() or "0")
                if manager.current_step() >= stop_at:
                    torch.save({"params": {k: v.clone() for k, v in net.state_dict().items()},
                                "global": diloco.global_parameters(), "shared": diloco.shared_state(),
                                "step": manager.current_step()},
                               os.path.join(args.out, f"replica{args.replica}.pt"))
                    write(os.path.join(args.out, f"replica{args.replica}.stats"), json.dumps(diloco.stats()))
                    break
            time.sleep(args.step_sleep)
    manager.shutdown(wait=False)
    pg.shutdown()
    sys.stdout.flush()
    os._exit(0)  # the peers may still be closing their connections; nothing here needs an orderly exit


if __name__ == "__main__":
    main()
