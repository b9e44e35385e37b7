"""gradex's DiLoCo as the outer loop of a torchft job against torchft's own DiLoCo over ProcessGroupGradex
(fp32 pseudo-gradients): bytes each replica sends per outer sync, and how long a killed replica needs to rejoin.
Loopback, replica groups of one rank each (tests/python/torchft_diloco_worker.py: a 16-H-4 MLP, AdamW inner
steps, sync every --sync-every steps), torchft's Lighthouse in this process.

    .venv/bin/python -m bench.elastic.diloco --hidden 16384 --syncs 6

Prints one RESULT line per measurement.
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

from torchft._torchft import LighthouseServer

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "..", "..", "tests", "python", "torchft_diloco_worker.py")


def progress(out, r):
    try:
        with open(os.path.join(out, f"replica{r}.step")) as f:
            return tuple(int(v) for v in f.read().split())  # step commits rollbacks heals inner_steps
    except (OSError, ValueError):
        return None


def field(out, r, i):
    p = progress(out, r)
    return p[i] if p else -1


def wait_for(condition, what, limit=400):
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if condition():
            return time.monotonic()
        time.sleep(0.02)
    raise SystemExit(f"bench: timed out waiting for {what}")


def start(r, lighthouse, out, args, extra):
    log = open(os.path.join(out, f"replica{r}.log"), "a")
    return subprocess.Popen([sys.executable, WORKER, "--replica", str(r), "--lighthouse", lighthouse, "--out", out,
                             "--hidden", str(args.hidden), "--sync-every", str(args.sync_every), "--step-sleep", "0",
                             *extra], stdout=log, stderr=subprocess.STDOUT)


def stop(out, procs):
    with open(os.path.join(out, "stop.tmp"), "w") as f:
        f.write(str(max(field(out, r, 0) for r in procs) + 1))
    os.replace(os.path.join(out, "stop.tmp"), os.path.join(out, "stop"))
    for p in procs.values():
        p.wait(timeout=300)


def lighthouse():
    return LighthouseServer(bind="[::]:0", min_replicas=2, join_timeout_ms=10000, heartbeat_timeout_ms=2000)


def bytes_per_sync(args, name, extra):
    out = tempfile.mkdtemp(prefix="gradex_diloco_bench_")
    lh = lighthouse()
    procs = {r: start(r, lh.address(), out, args, [*extra, "--replicas", "2"]) for r in range(2)}
    try:
        wait_for(lambda: all(field(out, r, 1) >= args.syncs for r in range(2)), f"{name}: {args.syncs} syncs")
        stop(out, procs)
        stats = json.load(open(os.path.join(out, "replica0.stats")))
        syncs = field(out, 0, 0)
        per_sync = stats["bytes_sent"] / syncs
        params = 21 * args.hidden + 4
        print(f"RESULT diloco_bytes mode={name} params={params} syncs={syncs} bytes_sent_per_sync={per_sync:.0f} "
              f"fp32_ring_per_sync={4 * params:.0f}", flush=True)
        return per_sync
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
        lh.shutdown()


def rejoin(args):
    out = tempfile.mkdtemp(prefix="gradex_diloco_rejoin_")
    lh = lighthouse()
    extra = ["--delay", "1", "--replicas", "3"]
    procs = {r: start(r, lh.address(), out, args, extra) for r in range(3)}
    try:
        wait_for(lambda: all(field(out, r, 1) >= 2 for r in range(3)), "2 syncs everywhere")
        killed_at = max(field(out, r, 0) for r in (0, 1))
        procs[2].send_signal(signal.SIGKILL)
        procs[2].wait()
        killed = time.monotonic()
        survived = wait_for(lambda: min(field(out, r, 0) for r in (0, 1)) > killed_at, "the survivors' next commit")
        wait_for(lambda: min(field(out, r, 0) for r in (0, 1)) >= killed_at + 2, "2 syncs of the survivors")
        for name in ("replica2.step", "replica2.started"):
            os.remove(os.path.join(out, name))
        restarted = time.monotonic()
        procs[2] = start(2, lh.address(), out, args, extra)
        joined = wait_for(lambda: field(out, 2, 1) >= 1, "the restarted replica's first commit")
        with open(os.path.join(out, "replica2.started")) as f:
            manager_up = float(f.read())
        since_manager = time.time() - manager_up - (time.monotonic() - joined)
        print(f"RESULT diloco_rejoin survivors_commit_s={survived - killed:.2f} "
              f"rejoin_first_commit_s={joined - restarted:.2f} after_manager_up_s={since_manager:.2f} "
              f"heals={field(out, 2, 3)}", flush=True)
        stop(out, procs)
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
        lh.shutdown()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--hidden", type=int, default=16384)
    parser.add_argument("--sync-every", type=int, default=8)
    parser.add_argument("--syncs", type=int, default=6)
    parser.add_argument("--skip-rejoin", action="store_true")
    args = parser.parse_args()
    fp32 = bytes_per_sync(args, "torchft_fp32", ["--outer", "torchft"])
    for bits in (8, 4):
        mine = bytes_per_sync(args, f"gradex_{bits}bit", ["--bits", str(bits)])
        print(f"RESULT diloco_bytes_ratio mode=gradex_{bits}bit torchft_fp32_over_gradex={fp32 / mine:.2f}",
              flush=True)
    if not args.skip_rejoin:
        rejoin(args)


if __name__ == "__main__":
    main()
