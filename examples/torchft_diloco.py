"""DiLoCo across replica groups with torchft, gradex's 4-bit (or 8-bit) outer loop exchanging the
pseudo-gradients.

torchft (pip install 'gradex[torchft]') forms a quorum of replica groups at every outer sync through its
Lighthouse, discards syncs that do not commit and heals a replica that (re)joins from a healthy peer: the model
and inner optimizer through this script's state_dict functions, the outer state (global copies, outer momenta,
step count) through gradex.torchft.DiLoCo's own. Start a Lighthouse, then one process (or torchrun) per replica
group; kill one and start it again at will:

    torchft_lighthouse --min_replicas 2 --quorum_tick_ms 100 --join_timeout_ms 5000 &
    for g in 0 1 2; do
      TORCHFT_LIGHTHOUSE=http://localhost:29510 .venv/bin/python examples/torchft_diloco.py --group $g &
    done

Each group trains a small CNN with AdamW on its own shard of scikit-learn's digits, syncs every --sync-every
steps and prints the accuracy of the global model on the held-out split. See docs/elastic.md.
"""
import argparse
import os
from datetime import timedelta

import torch
import torch.nn.functional as F
from torchft import Manager

import gradex.torchft as gxft
from torch_ddp_digits import accuracy, load_digits, make_model


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--group", type=int, default=int(os.environ.get("REPLICA_GROUP_ID", 0)))
    parser.add_argument("--groups", type=int, default=3, help="replica groups the data is sharded over")
    parser.add_argument("--syncs", type=int, default=40, help="committed outer syncs to run")
    parser.add_argument("--sync-every", type=int, default=20)
    parser.add_argument("--bits", type=int, choices=[4, 8], default=4)
    parser.add_argument("--min-replicas", type=int, default=2)
    args = parser.parse_args()

    train_x, train_y, test_x, test_y = load_digits()
    shard = slice(args.group, None, args.groups)
    train_x, train_y = train_x[shard], train_y[shard]
    model = make_model()
    inner = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def state_dict():  # what a healing replica takes from a peer, with DiLoCo's outer state
        return {"model": model.state_dict(), "inner": inner.state_dict()}

    def load_state_dict(state):
        model.load_state_dict(state["model"])
        inner.load_state_dict(state["inner"])

    # The replica group's own store (torchrun's MASTER_ADDR/MASTER_PORT when launched by it).
    store = None
    if "MASTER_PORT" not in os.environ:
        store = torch.distributed.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    pg = gxft.ProcessGroupGradex(timeout=timedelta(seconds=10))
    manager = Manager(pg=pg, min_replica_size=args.min_replicas, use_async_quorum=False,  # as DiLoCo needs
                      load_state_dict=load_state_dict, state_dict=state_dict, replica_id=f"diloco{args.group}",
                      store_addr="127.0.0.1" if store else None, store_port=store.port if store else None,
                      rank=0 if store else None, world_size=1 if store else None,
                      timeout=timedelta(seconds=10), quorum_timeout=timedelta(seconds=120))

    g = torch.Generator().manual_seed(args.group)
    with gxft.DiLoCo(manager, model, inner, sync_every=args.sync_every, bits=args.bits) as diloco:
        while manager.current_step() < args.syncs:
            batch = torch.randint(0, len(train_y), (32,), generator=g)
            commits = diloco.commits
            inner.zero_grad()
            F.cross_entropy(model(train_x[batch]), train_y[batch]).backward()
            inner.step()  # every sync_every steps: quorum, 4-bit exchange, outer step, commit
            if diloco.commits > commits and manager.current_step() % 5 == 0:
                stats = diloco.stats()
                print(f"group {args.group} sync {manager.current_step()} participants {manager.num_participants()} "
                      f"test accuracy {accuracy(model, test_x, test_y):.1f}% "
                      f"({stats['bytes_sent'] / 1e3:.0f} kB sent, {stats['compression_ratio']:.1f}x less than fp32)",
                      flush=True)
    manager.shutdown(wait=False)
    pg.shutdown()
    os._exit(0)  # the outer optimizer's peers may have gone: no orderly goodbye needed


if __name__ == "__main__":
    main()
