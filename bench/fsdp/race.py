#!/usr/bin/env python3
"""The sharded race: a small word-level transformer (bench/lm/model.py) under FSDP2 HSDP on 2 replica groups x 2
shards (4 gloo CPU ranks), trained with AdamW by three methods for the same number of steps or the same
training-clock budget:

  native   torch's HSDP: fully_shard on the 2-D mesh (gloo reduce-scatter in a shard group, gloo all-reduce
           across replica groups)
  gradex   fully_shard on mesh["shard"], gx.HSDP across mesh["replicate"] (the GRADEX_* policy; AdamW: the
           Adam codec where the policy compresses)
  diloco   fully_shard on mesh["shard"], gx.DiLoCo(mesh=mesh): 4-bit streamed pseudo-gradients across replica
           groups every --period steps (2 fragments, delay 1, outer momentum 0.5)

    .venv/bin/python -m bench.fsdp.race --steps 200                       # loopback, equal steps
    sudo .venv/bin/python -m bench.fsdp.race --cluster 100mbit --budget 150 --steps 100000 \
        --out docs/benchmarks/fsdp_race_100m.json                         # 2 emulated hosts
    sudo .venv/bin/python -m bench.fsdp.race --wan 1gbit,0.1ms,100mbit,20ms --budget 180 --steps 100000 \
        --out docs/benchmarks/fsdp_race_regions.json                      # 2 emulated regions

Held-out loss is measured every --eval-every steps (its time is not counted). The target is native HSDP's
final held-out loss; each method's time to target is the training clock at its first evaluation at or below
it (nan: never); --target-loss sets another (to compare runs under other GRADEX_* settings). A run stops at
--steps or when its training clock reaches --budget seconds (ranks agree on it every step), whichever is first.

Without --cluster the ranks' links are loopback: nothing is shaped, so the replicate dimension is as fast as the
shard dimension; the race then measures each method's cost and its loss at equal steps, not a slow link.
With --cluster RATE (root) the race brings up 2 emulated hosts (bench/cluster/cluster.sh; GX_CLUSTER_NAME /
GX_CLUSTER_SUBNET name them) joined at RATE, and takes them down always: a shard group (the mesh's row, ranks
2h and 2h+1) lives on host h and talks over that host's loopback; the replicate dimension crosses the shaped
link. Bytes across hosts are the kernel's counters of the hosts' links over each method's whole run.
With --wan INSIDE_RATE,INSIDE_DELAY,ACROSS_RATE,ACROSS_DELAY (root) the ranks are 4 emulated hosts in 2 regions
(bench/harness/wan.py: TCP cubic, the MTU by the fastest pipe): shard group g on the hosts of region g, its
reduce-scatter over the regions' inside links, the replicate dimension across the pipe between the regions; the
bytes across regions are the delay line's count of what that pipe carried.
Prints a Markdown table and a RESULT line.
"""
import argparse
import json
import math
import os
import pathlib
import subprocess
import sys
import time
from typing import Any

import torch

HERE = pathlib.Path(__file__).resolve().parent
from bench.lm import corpus  # noqa: E402
from bench.lm import model as lm_model  # noqa: E402
from bench.harness import network  # noqa: E402
from bench.harness import results as result_files  # noqa: E402
from gradex._ports import free_port  # noqa: E402
from bench.harness.launcher import run_ranks  # noqa: E402
from bench.harness.wan import Wan, WanSpec  # noqa: E402

METHODS = ("native", "gradex", "diloco")
SHAPE = {"vocab": 4096, "d": 128, "layers": 2, "heads": 4, "context": 32}
REPLICAS, SHARDS = 2, 2  # the mesh: (replicate, shard), row-major over ranks
WORLD = REPLICAS * SHARDS


def shard_groups():
    """The ranks of each shard group: init_device_mesh lays ranks out row-major over (replicate, shard)."""
    return [list(range(g * SHARDS, (g + 1) * SHARDS)) for g in range(REPLICAS)]


def make_cluster(rate):
    """REPLICAS emulated hosts at `rate`, SHARDS ranks per host: shard group g on host g."""
    net = network.Cluster(REPLICAS, rate, ranks_per_host=SHARDS)
    for g, ranks in enumerate(shard_groups()):
        assert {net.host_of(r) for r in ranks} == {g}, "a shard group must live on one host"
    return net


def wan_spec(text):
    """The WanSpec of --wan's INSIDE_RATE,INSIDE_DELAY,ACROSS_RATE,ACROSS_DELAY: REPLICAS regions of SHARDS hosts,
    one rank per host, shard group g in region g. ValueError naming what is wrong."""
    parts = text.split(",")
    if len(parts) != 4:
        raise ValueError(f"{len(parts)} fields, not 4")
    regions = [g for g in range(REPLICAS) for _ in range(SHARDS)]
    for g, ranks in enumerate(shard_groups()):
        assert {regions[r] for r in ranks} == {g}, "a shard group must live in one region"
    spec = WanSpec(hosts=WORLD, rate=parts[0], delay=parts[1], regions=regions, inter_rate=parts[2],
                   inter_delay=parts[3])
    spec.validate()
    return spec


def make_wan(text, log_dir):
    return Wan(wan_spec(text), log_dir=log_dir)


def _shard(model, mesh):
    from torch.distributed.fsdp import fully_shard
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)


def _rank(rank, world, init_method, method, args, data_path, sink):
    """One rank's run; rank 0 hands (curve, rank 0's gradex bytes sent) to sink (a queue, or a JSON path).
    curve: [(step, training clock s, held-out loss)]."""
    os.environ.update({"GRADEX_TIMEOUT_S": "120"})
    torch.set_num_threads(1)
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    import gradex.torch as gx
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world)
    mesh = init_device_mesh("cpu", (REPLICAS, world // REPLICAS), mesh_dim_names=("replicate", "shard"))
    data = corpus.load(data_path)
    model = lm_model.make(seed=0, **SHAPE)
    _shard(model, mesh if method == "native" else mesh["shard"])
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    helper: Any = None
    if method == "gradex":
        helper = gx.HSDP(model, mesh, optimizer=opt)
    elif method == "diloco":
        helper = gx.DiLoCo(model, opt, mesh=mesh, period=args.period, bits=4, fragments=2, delay=1,
                           outer_momentum=0.5)
    sampler = corpus.Sampler(data["train"], SHAPE["context"], args.batch, seed=100 + rank)
    held_out = corpus.eval_batches(data["held_out"], SHAPE["context"], args.eval_batches, args.batch)

    def evaluate():
        # DiLoCo between syncs: each replica's own model; the loss averaged over the ranks.
        loss = torch.tensor([lm_model.held_out_loss(model, held_out)])
        dist.all_reduce(loss)
        return float(loss) / world

    curve, clock, step = [], 0.0, 0
    while True:
        # Every rank's verdict, agreed: also the barrier that starts each step together.
        stop = torch.tensor([float(step >= args.steps or clock >= args.budget)])
        dist.all_reduce(stop, op=dist.ReduceOp.MAX)
        if stop.item() > 0:
            break
        step += 1
        start = time.perf_counter()
        x, y = sampler.next()
        lm_model.loss_of(model, x, y).backward()
        opt.step()
        opt.zero_grad()
        if method == "diloco":
            helper.step()
        clock += time.perf_counter() - start
        if step % args.eval_every == 0:
            curve.append((step, clock, evaluate()))
    if method == "diloco":
        start = time.perf_counter()
        helper.synchronize()
        clock += time.perf_counter() - start
    if method == "diloco" or not curve or curve[-1][0] != step:
        if curve and curve[-1][0] == step:
            curve.pop()
        curve.append((step, clock, evaluate()))
    sent = gx.stats(helper)["bytes_sent"] if helper is not None else float("nan")
    if method == "gradex" and rank == 0:
        print(f"gradex HSDP on rank 0, each shard's codec:\n{gx.explain(helper)}", file=sys.stderr)
    if helper is not None:
        helper.close()
    if rank == 0:
        if isinstance(sink, str):
            with open(sink + ".tmp", "w") as f:
                json.dump({"curve": curve, "sent": None if math.isnan(sent) else sent}, f)
            os.replace(sink + ".tmp", sink)
        else:
            sink.put((curve, sent))
    dist.barrier()
    dist.destroy_process_group()


def run_loopback(method, args, data_path):
    import torch.multiprocessing as mp
    ctx = mp.get_context("spawn")
    out, port = ctx.Queue(), free_port()
    procs = [ctx.Process(target=_rank, args=(r, WORLD, f"tcp://127.0.0.1:{port}", method, args, data_path, out))
             for r in range(WORLD)]
    for p in procs:
        p.start()
    curve, sent = out.get(timeout=3600)
    for p in procs:
        p.join()
    return curve, sent, None, None


def run_cluster(net, method, args, data_path, argv):
    """The 4 ranks as processes in the cluster's namespaces (this script with --worker); returns (curve,
    rank 0's gradex bytes, [(tx, rx)] bytes of each host's link over the whole run, bytes that crossed between
    regions or None on a network of one region)."""
    curve_out = os.path.join(args.log_dir, f"fsdp.{net.label}.{method}.json")
    if os.path.exists(curve_out):
        os.remove(curve_out)
    rank_argv = [sys.executable, "-m", "bench.fsdp.race", *argv,
                 "--worker", method, "--curve-out", curve_out, "--data", data_path]
    before, regions_before = net.host_bytes(), _regions_bytes(net)
    # The launcher bounds the run (budget plus slack), kills every rank on a failure and raises RankFailure
    # (a RuntimeError) with the failed ranks' log tails.
    run_ranks(net, WORLD, rank_argv, warmup=0, steps=1, timeout_s=args.budget + args.method_slack,
              log_dir=args.log_dir, label=f"fsdp.{net.label}.{method}")
    after, regions_after = net.host_bytes(), _regions_bytes(net)
    with open(curve_out) as f:
        run = json.load(f)
    hosts = [(tx - tx0, rx - rx0) for (tx, rx), (tx0, rx0) in zip(after, before)]
    regions = None if regions_before is None or regions_after is None else regions_after - regions_before
    return [tuple(c) for c in run["curve"]], (math.nan if run["sent"] is None else run["sent"]), hosts, regions


def _regions_bytes(net):
    """What crossed between regions so far (a multi-region Wan), else None."""
    wan_bytes = getattr(net, "wan_bytes", None)
    return wan_bytes() if wan_bytes is not None else None


def worker(args):
    """A rank launched by run_cluster: the launcher's variables name it (network.common_env)."""
    _rank(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), "env://", args.worker, args, args.data,
          args.curve_out)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200, help="steps per method (the cap, with --budget)")
    parser.add_argument("--budget", type=float, default=math.inf, help="seconds of training clock per method")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--period", type=int, default=8)
    parser.add_argument("--eval-every", type=int, default=25)
    parser.add_argument("--eval-batches", type=int, default=4)
    parser.add_argument("--corpus-bytes", type=int, default=2 << 20)
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--target-loss", type=float, default=None,
                        help="the loss to race to (default: native HSDP's final held-out loss in this run)")
    parser.add_argument("--cluster", metavar="RATE", default=None,
                        help="run on 2 emulated hosts joined at this tc rate (e.g. 100mbit; needs root)")
    parser.add_argument("--wan", metavar="IN_RATE,IN_DELAY,ACROSS_RATE,ACROSS_DELAY", default=None,
                        help="run on 2 emulated regions of 2 hosts (e.g. 1gbit,0.1ms,100mbit,20ms; needs root)")
    parser.add_argument("--method-slack", type=float, default=300,
                        help="seconds a method may run past its budget (--cluster)")
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    parser.add_argument("--log-dir", default="/tmp/gradex-fsdp-race")
    parser.add_argument("--worker", choices=METHODS, help=argparse.SUPPRESS)
    parser.add_argument("--curve-out", help=argparse.SUPPRESS)
    parser.add_argument("--data", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.methods = args.methods.split(",")
    bad = [m for m in args.methods if m not in METHODS]
    if bad:
        parser.error(f"unknown method(s) {bad}; choose from {','.join(METHODS)}")
    if args.budget <= 0 or args.steps <= 0:
        parser.error("--budget and --steps must be positive")
    if (args.cluster is not None or args.wan is not None) and math.isinf(args.budget):
        parser.error("--cluster and --wan need a --budget (seconds of training clock per method)")
    if args.cluster is not None and args.wan is not None:
        parser.error("--cluster and --wan are two networks: choose one")
    if args.wan is not None:
        try:
            wan_spec(args.wan)
        except ValueError as e:
            parser.error(f"--wan takes IN_RATE,IN_DELAY,ACROSS_RATE,ACROSS_DELAY such as 1gbit,0.1ms,100mbit,20ms, "
                         f"got {args.wan!r} ({e})")
    if args.cluster is not None and not (args.cluster.endswith("bit") and args.cluster[:-3].rstrip("kmg").isdigit()):
        parser.error(f"--cluster takes a tc rate such as 100mbit or 1gbit, got {args.cluster!r}")
    if args.target_loss is None and "native" not in args.methods and args.worker is None:
        parser.error("--target-loss is needed without the native method")
    return args


def _rank_argv(argv):
    """The options a worker shares with the driver: the driver's own, less the driver-only ones."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        if a.split("=", 1)[0] in ("--cluster", "--wan", "--out", "--methods", "--target-loss"):
            skip = "=" not in a
            continue
        out.append(a)
    return out


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.worker:
        return worker(args)
    os.makedirs(args.log_dir, exist_ok=True)
    data_path = os.path.join(args.log_dir, f"corpus.{SHAPE['vocab']}.{args.corpus_bytes}.pt")
    if not os.path.exists(data_path):
        corpus.save(corpus.build(SHAPE["vocab"], args.corpus_bytes), data_path)
    net, results = None, {}
    wan = make_wan(args.wan, args.log_dir) if args.wan else None
    if wan is not None:
        wan.up()  # removed below, whatever happens
        net = wan
    if args.cluster:
        subprocess.run([str(network.CLUSTER_SH), "up", "--hosts", str(REPLICAS), "--rate", args.cluster,
                        "--owner", str(os.getpid()),
                        "--max-s", str(int((args.budget + args.method_slack + 120) * len(args.methods)))],
                       check=True, timeout=120)
    try:
        if args.cluster:
            net = make_cluster(args.cluster)
            net.shape()
        for method in args.methods:
            started = time.time()
            if net is None:
                results[method] = run_loopback(method, args, data_path)
            else:
                results[method] = run_cluster(net, method, args, data_path, _rank_argv(argv))
            curve, sent, hosts, _ = results[method]
            across = "" if hosts is None else f", {sum(tx for tx, _ in hosts) / 1e6:.1f} MB across hosts"
            print(f"{method}: final held-out loss {curve[-1][2]:.4f} after {curve[-1][0]} steps, training clock "
                  f"{curve[-1][1]:.1f} s, rank 0 sent {sent:.0f} bytes{across} ({time.time() - started:.0f} s)",
                  file=sys.stderr, flush=True)
    finally:
        if args.cluster:
            subprocess.run([str(network.CLUSTER_SH), "down"], timeout=120)
        if wan is not None:
            wan.down()
    report(args, results)


def _link_label(args):
    if args.wan:
        spec = wan_spec(args.wan)
        return (f"{REPLICAS} regions x {SHARDS} hosts: {spec.rate}, {spec.delay} one way inside; {spec.inter_rate}, "
                f"{spec.inter_delay} one way across")
    return f"2 hosts at {args.cluster}" if args.cluster else "loopback"


def report(args, results):
    target = args.target_loss if args.target_loss is not None else results["native"][0][-1][2]
    link = _link_label(args)
    budget = f"{args.budget:g} s budget" if not math.isinf(args.budget) else f"{args.steps} steps"
    print(f"| method ({budget}, 2 x 2 ranks, {link}) | time to target {target:.4f} (s) | steps | final held-out "
          f"loss | training clock (s) | s/step | MB across hosts | rank 0 gradex bytes |\n|---|---|---|---|---|---|---|---|")
    fields, table = [], {}
    for method, (curve, sent, hosts, regions) in results.items():
        reached = next((t for _, t, loss in curve if loss <= target), math.nan)
        step, clock, loss = curve[-1]
        across = math.nan if hosts is None else sum(tx for tx, _ in hosts)
        print(f"| {method} | {'not reached' if math.isnan(reached) else f'{reached:.1f}'} | {step} | {loss:.4f} | "
              f"{clock:.1f} | {clock / step:.3f} | {across / 1e6:.1f} | {sent:.0f} |")
        fields += [f"final_loss_{method}={loss:.4f}", f"ttt_{method}={reached:.2f}", f"clock_{method}={clock:.2f}",
                   f"steps_{method}={step}", f"bytes_across_{method}={across:.0f}"]
        table[method] = {"time_to_target_s": None if math.isnan(reached) else reached, "steps": step,
                         "bytes_across_regions": regions,
                         "final_loss": loss, "clock_s": clock, "bytes_across_hosts": None if hosts is None else across,
                         "host_bytes_tx_rx": hosts, "rank0_gradex_bytes_sent": None if math.isnan(sent) else sent,
                         "curve": curve}
    print("RESULT " + " ".join(fields))
    if args.out:
        result_files.write(args.out, {"link": _link_label(args),
                                 "budget_s": None if math.isinf(args.budget) else args.budget,
                                 "max_steps": args.steps, "target_loss": target, "shape": SHAPE,
                                 "mesh": [REPLICAS, SHARDS],
                                 "gradex_env": {k: v for k, v in os.environ.items() if k.startswith("GRADEX_")},
                                 "methods": table}, link=_link_label(args))


if __name__ == "__main__":
    main()
