"""One rank of a torchft job whose replica groups are FSDP2-sharded, for tests/python/test_fsdp_diloco.py: a
replica group is --shards ranks with their own gloo process group (FSDP2 over it, fully_shard on a 1-D mesh),
each rank has a torchft Manager (rank = its shard index in the group) over a ProcessGroupGradex, which spans
the ranks of the same shard index in every replica group, and gradex.torchft.DiLoCo runs the outer step on the
rank's own shards. After --steps inner steps (a multiple of --sync-every: the last step's sync includes
every replica) it writes its shards, commit count and held-out loss to <out>/replica<r>.shard<s>.pt.
"""
import argparse
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torchft import Manager

import gradex.torchft as gxft

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fsdp_ranks as fr  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--replica", type=int, required=True)
    parser.add_argument("--shard", type=int, required=True)
    parser.add_argument("--shards", type=int, default=2)
    parser.add_argument("--store-port", type=int, required=True)
    parser.add_argument("--lighthouse", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--sync-every", type=int, default=4)
    parser.add_argument("--bits", type=int, default=4)
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.store_port}", rank=args.shard,
                            world_size=args.shards)
    mesh = init_device_mesh("cpu", (args.shards,), mesh_dim_names=("shard",))
    teacher = fr.task()
    model = fr.shard(fr.make_model(), mesh)
    initial = fr.held_out_loss(model, teacher)
    inner = torch.optim.AdamW(model.parameters(), lr=3e-3)

    def state_dict():
        return {"model": model.state_dict(), "inner": inner.state_dict()}

    def load_state_dict(state):
        model.load_state_dict(state["model"])
        inner.load_state_dict(state["inner"])

    pg = gxft.ProcessGroupGradex(timeout=timedelta(seconds=20))
    manager = Manager(pg=pg, min_replica_size=2, use_async_quorum=False, load_state_dict=load_state_dict,
                      state_dict=state_dict, replica_id=f"replica{args.replica}", store_addr="127.0.0.1",
                      store_port=args.store_port, rank=args.shard, world_size=args.shards,
                      lighthouse_addr=args.lighthouse, port=0, timeout=timedelta(seconds=20),
                      quorum_timeout=timedelta(seconds=60))
    rank = args.replica * args.shards + args.shard  # this rank's data, as on a 2-D mesh
    with gxft.DiLoCo(manager, model, inner, sync_every=args.sync_every, bits=args.bits,
                     outer_momentum=0.5) as diloco:
        for step in range(args.steps):
            x = fr.batch(rank, step)
            torch.nn.functional.mse_loss(model(x), teacher(x)).backward()
            inner.step()  # the DiLoCo hooks: quorum, exchange, commit
            inner.zero_grad()
        result = {"shards": fr.local_shards(model), "commits": diloco.commits, "rollbacks": diloco.rollbacks,
                  "stats": diloco.stats(), "initial": initial}
    result["loss"] = fr.held_out_loss(model, teacher)
    torch.save(result, os.path.join(args.out, f"replica{args.replica}.shard{args.shard}.pt"))
    dist.barrier()
    manager.shutdown(wait=False)
    pg.shutdown()
    sys.stdout.flush()
    os._exit(0)  # the peers may still be closing their connections; nothing here needs an orderly exit


if __name__ == "__main__":
    main()
