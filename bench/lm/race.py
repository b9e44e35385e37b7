#!/usr/bin/env python3
"""The LM race: DDP, gradex DGC, LocalSGD and DiLoCo (8-bit, streaming) train the same small byte-level
transformer (bench/lm/model.py) on the standard library's .py files for the same number of steps, on P
emulated hosts (a private namespace cluster, bench/lm/netns.py) at each link rate. Held-out loss is
plotted against training time and against bytes on the wire; the RESULT line gives, per rate and
method, the time and bytes each needed to reach DDP's final held-out loss (within --tolerance), and the
ratios DDP / DiLoCo.

    sudo .venv/bin/python bench/lm/race.py --rates 1gbit,100mbit --out docs/benchmarks/lm_race.json

Needs root (network namespaces, tc). Every namespace it creates is removed on exit.
"""
import argparse
import json
import os
import pathlib
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from netns import PrivateCluster  # noqa: E402

METHODS = ("ddp", "dgc", "localsgd", "diloco")


def run_method(cluster, method, args, port, log_dir):
    curve_out = os.path.join(log_dir, f"lm.{cluster.rate}.{method}.json")
    argv = [args.python, str(HERE / "lm_rank.py"), "--method", method, "--steps", str(args.steps),
            "--eval-every", str(args.eval_every), "--switch", cluster.switch, "--curve-out", curve_out,
            *args.rank_args.split()]
    procs, logs = [], []
    for r in range(args.hosts):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(args.hosts), LOCAL_RANK="0",
                   MASTER_ADDR=cluster.master_addr, MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="eth0",
                   GRADEX_IFACE="eth0", UCX_TLS="tcp,self", GRADEX_SHM="0", OMP_NUM_THREADS="1")
        log = open(os.path.join(log_dir, f"lm.{cluster.rate}.{method}.rank{r}.log"), "w")
        logs.append(log)
        procs.append(subprocess.Popen(cluster.command(r, argv), env=env, stdout=log, stderr=subprocess.STDOUT,
                                      start_new_session=True))
    deadline = time.monotonic() + args.method_timeout
    try:
        while any(p.poll() is None for p in procs):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{method} at {cluster.rate}: timed out after {args.method_timeout} s")
            if any(p.poll() not in (None, 0) for p in procs):
                time.sleep(2)
                bad = [r for r, p in enumerate(procs) if p.poll() not in (None, 0)]
                raise RuntimeError(f"{method} at {cluster.rate}: ranks {bad} failed (logs in {log_dir})")
            time.sleep(0.5)
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, 9)
                p.wait()
        for log in logs:
            log.close()
    with open(curve_out) as f:
        return json.load(f)["curve"]


def first_reaching(curve, target):
    """(time, bytes) of the first evaluation at or below target, else (None, None)."""
    for clock, _step, loss, b in curve:
        if loss <= target:
            return clock, b
    return None, None


def plot(results, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rates = list(results)
    fig, axes = plt.subplots(len(rates), 2, figsize=(11, 4 * len(rates)), squeeze=False)
    for row, rate in enumerate(rates):
        for method, curve in results[rate]["curves"].items():
            t = [c[0] for c in curve]
            loss = [c[2] for c in curve]
            b = [c[3] / 1e6 for c in curve]
            axes[row][0].plot(t, loss, marker=".", label=method)
            axes[row][1].plot(b[1:], loss[1:], marker=".", label=method)  # step 0 has sent nothing
        axes[row][0].set(title=f"{rate}: held-out loss vs training time", xlabel="s (rank 0)",
                         ylabel="loss (nats/byte)")
        axes[row][1].set(title=f"{rate}: held-out loss vs bytes on the wire", xlabel="MB (all hosts)",
                         xscale="log")
        for ax in axes[row]:
            ax.set_ylim(top=4.5)  # the first evaluations (loss ~8.6 at step 0) would flatten the rest
            if results[rate]["target"] is not None:
                ax.axhline(results[rate]["target"], color="grey", linestyle=":", linewidth=1)
            ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def replot(json_path, png_path):
    """Redraws the plot of a finished race from its JSON."""
    with open(json_path) as f:
        plot(json.load(f)["results"], png_path)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rates", default="1gbit,100mbit")
    p.add_argument("--hosts", type=int, default=4)
    p.add_argument("--methods", default=",".join(METHODS))
    p.add_argument("--steps", type=int, default=128)
    p.add_argument("--eval-every", type=int, default=16)
    p.add_argument("--tolerance", type=float, default=0.02, help="reaching DDP's final loss within this")
    p.add_argument("--rank-args", default="", help="extra lm_rank.py options, e.g. '--period 8 --bits 4'")
    p.add_argument("--python", default=sys.executable)
    p.add_argument("--method-timeout", type=float, default=900)
    p.add_argument("--out", default="docs/benchmarks/lm_race.json")
    p.add_argument("--plot", default="docs/benchmarks/lm_race.png")
    p.add_argument("--log-dir", default=str(HERE.parents[1] / "build" / "bench-lm"))
    args = p.parse_args()
    os.makedirs(args.log_dir, exist_ok=True)
    methods = args.methods.split(",")
    rates = args.rates.split(",")
    cluster = PrivateCluster(args.hosts, rates[0])
    results, port = {}, 29000 + os.getpid() % 500
    try:
        for rate in rates:
            cluster.shape(rate)
            curves = {}
            for method in methods:
                port += 1
                started = time.monotonic()
                curves[method] = run_method(cluster, method, args, port, args.log_dir)
                print(f"[lm] {rate} {method}: final loss {curves[method][-1][2]:.4f} after "
                      f"{curves[method][-1][0]:.1f} s, {curves[method][-1][3] / 1e6:.2f} MB "
                      f"(run {time.monotonic() - started:.0f} s)", file=sys.stderr, flush=True)
            target = curves["ddp"][-1][2] * (1 + args.tolerance) if "ddp" in curves else None
            reach = {m: first_reaching(c, target) for m, c in curves.items()} if target else {}
            results[rate] = {"curves": curves, "target": target, "reach": reach}
    finally:
        cluster.close()
    with open(args.out, "w") as f:
        json.dump({"hosts": args.hosts, "steps": args.steps, "results": results}, f, indent=1)
    plot(results, args.plot)
    items = []
    for rate, r in results.items():
        tag = rate.replace("gbit", "g").replace("mbit", "m")
        for m, (t, b) in r["reach"].items():
            items.append(f"{m}_time_to_ddp_loss_{tag}={'none' if t is None else f'{t:.4g}'}")
            items.append(f"{m}_bytes_to_ddp_loss_{tag}={'none' if b is None else b}")
        d_t, d_b = r["reach"].get("ddp", (None, None))
        x_t, x_b = r["reach"].get("diloco", (None, None))
        if d_t and x_t:
            items.append(f"ddp_over_diloco_time_{tag}={d_t / x_t:.3g}")
        if d_b and x_b:
            items.append(f"ddp_over_diloco_bytes_{tag}={d_b / max(x_b, 1):.3g}")
        for m, c in r["curves"].items():
            items.append(f"{m}_final_loss_{tag}={c[-1][2]:.4f}")
    print("RESULT " + " ".join(items))


if __name__ == "__main__":
    main()
