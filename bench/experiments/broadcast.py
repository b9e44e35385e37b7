"""gx.broadcast_parameters against gloo's torch.distributed.broadcast on the emulated cluster, side by side.

On bench/harness: one rank per host of a running cluster (bench/cluster/cluster.sh up --hosts P --rate R, with
the same GX_CLUSTER_NAME / GX_CLUSTER_SUBNET; harness.network.Cluster places and configures the ranks), every
method in turn, round after round, so that the machine's load touches them alike; the result file carries the
harness's provenance (command, commit, machine, link). Methods (each a fresh set of P processes):
  gloo            torch.distributed.broadcast of every tensor of the state dict (gloo process group)
  gradex:<label>  gx.broadcast_parameters(state_dict, root_rank=0) with the gradex importable by the given
                  Python interpreter (--gradex LABEL=PYTHON, repeatable: e.g. the main branch's and this one's)
Each broadcast is timed from a common barrier to the last rank's return; the first call of a process (cold:
gradex creates its connections then) is reported apart from the warm ones. The root's bytes on the wire are
its host's eth0 transmit counter across the call. Every rank checks that it holds the root's bits.

    GX_CLUSTER_NAME=gxp GX_CLUSTER_SUBNET=198.18.10 bench/cluster/cluster.sh up --hosts 4 --rate 1gbit
    GX_CLUSTER_NAME=gxp GX_CLUSTER_SUBNET=198.18.10 .venv/bin/python -m bench.experiments.broadcast \\
        --hosts 4 --rate 1gbit --gradex before=/work/main/.venv/bin/python --gradex after=.venv/bin/python \\
        --out docs/benchmarks/broadcast_parameters_1gbit.json
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional, Tuple

from bench.harness import results
from bench.harness.network import Cluster, environment, pick_port

# A 25.2M-parameter model's state: 6 square layers of 2048 with biases (float32: 100.7 MB).
LAYERS, WIDTH = 6, 2048


def _state(seed: int) -> Dict[str, Any]:
    import torch
    g = torch.Generator().manual_seed(seed)
    state: Dict[str, Any] = {}
    for i in range(LAYERS):
        state[f"layer{i}.weight"] = torch.randn(WIDTH, WIDTH, generator=g)
        state[f"layer{i}.bias"] = torch.randn(WIDTH, generator=g)
    return state


def _tx_bytes(iface: str) -> int:
    with open("/proc/net/dev") as f:
        for line in f:
            name, _, rest = line.partition(":")
            if name.strip() == iface:
                return int(rest.split()[8])
    raise RuntimeError(f"no interface {iface} in /proc/net/dev")


def _digest(state: Dict[str, Any]) -> str:
    import torch
    h = hashlib.sha256()
    for name in sorted(state):
        t = state[name]
        assert isinstance(t, torch.Tensor)
        h.update(t.contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def worker(method: str, calls: int) -> None:
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", rank=rank, world_size=world)
    iface = os.environ["GLOO_SOCKET_IFNAME"]
    if method == "gradex":
        import gradex.torch as gx
    records = []
    for call in range(calls):
        state = _state(1000 + call) if rank == 0 else {k: torch.zeros_like(v) for k, v in _state(0).items()}
        dist.barrier()
        tx0, start = _tx_bytes(iface), time.perf_counter()
        if method == "gloo":
            for t in state.values():
                dist.broadcast(t, src=0)
        else:
            gx.broadcast_parameters(state, root_rank=0)
        seconds = time.perf_counter() - start
        longest = torch.tensor([seconds], dtype=torch.float64)
        dist.all_reduce(longest, op=dist.ReduceOp.MAX)
        # Read once every rank has returned: a root's sends complete when the kernel holds the bytes, before
        # they have all left its link (the window adds the 8-byte all_reduce's packets).
        tx1 = _tx_bytes(iface)
        same = torch.tensor([int(_digest(state) == _digest(_state(1000 + call)))])
        dist.all_reduce(same, op=dist.ReduceOp.MIN)
        records.append({"call": call, "seconds": longest.item(), "root_tx_bytes": tx1 - tx0,
                        "bit_exact": bool(same.item())})
    dist.barrier()
    if rank == 0:
        model_bytes = sum(t.numel() * t.element_size() for t in _state(0).values())
        print("RESULT " + json.dumps({"model_bytes": model_bytes, "calls": records}), flush=True)
    dist.destroy_process_group()


def _launch(network: Cluster, python: str, method: str, calls: int, timeout: float) -> Dict[str, Any]:
    """One process per host running `method` with interpreter `python`; rank 0's RESULT record."""
    port = pick_port(network)
    procs: List[Tuple[int, "subprocess.Popen[str]"]] = []
    for rank in range(network.hosts):
        env = environment(network, rank, network.hosts, port)
        argv = network.command(rank, [python, "-m", "bench.experiments.broadcast", "--worker", method,
                                      "--calls", str(calls)])
        procs.append((rank, subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                             text=True)))
    result: Optional[Dict[str, Any]] = None
    deadline = time.monotonic() + timeout
    failures = []
    for rank, p in procs:
        try:
            out, err = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for _, q in procs:
                q.kill()
            raise RuntimeError(f"{method} with {python}: rank {rank} ran past {timeout} s")
        if p.returncode != 0:
            failures.append(f"rank {rank} exited {p.returncode}: {err[-2000:]}")
        for line in out.splitlines():
            if line.startswith("RESULT "):
                result = json.loads(line[len("RESULT "):])
    if failures or result is None:
        raise RuntimeError(f"{method} with {python} failed: " + " | ".join(failures))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--calls", type=int, default=4, help="broadcasts per process (the first is cold)")
    parser.add_argument("--hosts", type=int, default=4)
    parser.add_argument("--rate", default="1gbit", help="the cluster's link rate, as it was built (recorded)")
    parser.add_argument("--rounds", type=int, default=2, help="every method once per round")
    parser.add_argument("--gradex", action="append", default=[], metavar="LABEL=PYTHON")
    parser.add_argument("--gloo-python", default=sys.executable)
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--out", required=False)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.calls)
        return
    methods = [("gloo", args.gloo_python, "gloo")] + \
        [(f"gradex:{label}", python, "gradex") for label, python in (g.split("=", 1) for g in args.gradex)]
    runs: Dict[str, List[Dict[str, Any]]] = {label: [] for label, _, _ in methods}
    network = Cluster(args.hosts, args.rate)
    for round_ in range(args.rounds):
        for label, python, method in methods:
            result = _launch(network, python, method, args.calls, args.timeout)
            runs[label].append(result)
            print(f"round {round_} {label}: " + ", ".join(
                f"{c['seconds']:.3f}s/{c['root_tx_bytes'] / 1e6:.1f}MB" for c in result["calls"]), flush=True)
    summary: Dict[str, Dict[str, Any]] = {}
    model_bytes = 0
    for label, made in runs.items():
        cold = [c for r in made for c in r["calls"] if c["call"] == 0]
        warm = [c for r in made for c in r["calls"] if c["call"] > 0]
        model_bytes = int(made[0]["model_bytes"])
        summary[label] = {
            "cold_seconds_median": statistics.median(c["seconds"] for c in cold),
            "warm_seconds_median": statistics.median(c["seconds"] for c in warm) if warm else None,
            "root_tx_over_model_bytes_warm": statistics.median(c["root_tx_bytes"] for c in warm) / model_bytes
            if warm else None,
            "root_tx_over_model_bytes_cold": statistics.median(c["root_tx_bytes"] for c in cold) / model_bytes,
            "bit_exact": all(c["bit_exact"] for r in made for c in r["calls"]),
        }
    gloo = summary["gloo"]
    for label, s in summary.items():
        if label != "gloo":
            s["warm_time_over_gloo"] = (s["warm_seconds_median"] / gloo["warm_seconds_median"]
                                        if s["warm_seconds_median"] and gloo["warm_seconds_median"] else None)
            s["cold_time_over_gloo_warm"] = s["cold_seconds_median"] / gloo["warm_seconds_median"]
    record = {
        "experiment": "broadcast_parameters",
        "interpreters": {label: python for label, python, _ in methods},
        "model": {"parameters": model_bytes // 4, "bytes": model_bytes, "tensors": 2 * LAYERS},
        "calls_per_process": args.calls, "rounds": args.rounds,
        "note": "shared 2-core VM: other engineers' builds and tests ran at the same time",
        "summary": summary, "runs": runs,
    }
    if args.out:
        results.write(args.out, record, {"hosts": args.hosts, "rate": args.rate,
                                         "cluster": os.environ.get("GX_CLUSTER_NAME", "gx")})
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
