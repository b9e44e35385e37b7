"""Kill/restart soak of a torchft job on gradex: 3 replica groups (tests/python/torchft_worker.py) on loopback;
each cycle SIGKILLs replica 1 or 2 (alternately), waits for the others to commit steps, restarts it and waits
until it has committed steps again. Replica 0 survives every cycle: its resident memory and open descriptors are
sampled after each cycle. At the end every replica stops at the same step; the report says whether their
parameters are bit-identical and whether every replica's step equals its commits plus the steps it took over
while healing (no step lost).

    .venv/bin/python -m bench.elastic.soak --cycles 20 --mode pg
"""
import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time

import torch
from torchft._torchft import LighthouseServer

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "..", "..", "tests", "python", "torchft_worker.py")


def progress(out, r):
    try:
        with open(os.path.join(out, f"replica{r}.step")) as f:
            return tuple(int(v) for v in f.read().split())
    except (OSError, ValueError):
        return None


def wait_for(condition, what, limit=300):
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.05)
    raise SystemExit(f"soak: timed out waiting for {what}")


def usage(pid):
    with open(f"/proc/{pid}/status") as f:
        rss = next(int(line.split()[1]) for line in f if line.startswith("VmRSS"))
    return rss, len(os.listdir(f"/proc/{pid}/fd"))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--cycles", type=int, default=20)
    parser.add_argument("--mode", choices=["pg", "hook"], default="pg")
    args = parser.parse_args()
    out = tempfile.mkdtemp(prefix="gradex-soak-")
    lighthouse = LighthouseServer(bind="[::]:0", min_replicas=2, join_timeout_ms=1000, heartbeat_timeout_ms=2000)

    def start(r):
        log = open(os.path.join(out, f"replica{r}.log"), "a")
        return subprocess.Popen([sys.executable, WORKER, "--replica", str(r), "--lighthouse", lighthouse.address(),
                                 "--out", out, "--mode", args.mode], stdout=log, stderr=subprocess.STDOUT)

    def step(r):
        p = progress(out, r)
        return p[0] if p else -1

    procs = {r: start(r) for r in range(3)}
    samples, survivor_s, rejoin_s = [], [], []
    try:
        wait_for(lambda: all(step(r) >= 3 for r in range(3)), "the first steps")
        for cycle in range(args.cycles):
            victim = 1 + cycle % 2
            other = 3 - victim
            procs[victim].send_signal(signal.SIGKILL)
            procs[victim].wait()
            at, t0 = max(step(0), step(other)), time.monotonic()
            wait_for(lambda: min(step(0), step(other)) > at, "survivors' commit")
            survivor_s.append(time.monotonic() - t0)
            wait_for(lambda: min(step(0), step(other)) >= at + 3, "survivors' steps")
            os.remove(os.path.join(out, f"replica{victim}.step"))
            procs[victim] = start(victim)
            wait_for(lambda: (progress(out, victim) or (0, 0))[1] >= 2, "the restarted replica's commits")
            with open(os.path.join(out, f"replica{victim}.started")) as f:
                rejoin_s.append(time.time() - float(f.read()))
            samples.append(usage(procs[0].pid))
            print(f"cycle {cycle + 1}: survivors committed after {survivor_s[-1]:.1f} s, replica {victim} back "
                  f"{rejoin_s[-1]:.1f} s after its Manager was up; replica 0 RSS {samples[-1][0]} kB, "
                  f"{samples[-1][1]} fds", flush=True)
        stop_at = max(step(r) for r in range(3)) + 3
        with open(os.path.join(out, "stop.tmp"), "w") as f:
            f.write(str(stop_at))
        os.replace(os.path.join(out, "stop.tmp"), os.path.join(out, "stop"))
        for r in range(3):
            procs[r].wait(timeout=120)
        params = [torch.load(os.path.join(out, f"replica{r}.pt")) for r in range(3)]
        identical = all(torch.equal(params[r][k], v) for r in (1, 2) for k, v in params[0].items())
        accounted = all((lambda p: p[0] == p[1] + p[3])(progress(out, r)) for r in range(3))
        print(f"cycles {args.cycles} ({args.mode}): survivors' next commit median "
              f"{sorted(survivor_s)[len(survivor_s) // 2]:.1f} s (max {max(survivor_s):.1f}); rejoin median "
              f"{sorted(rejoin_s)[len(rejoin_s) // 2]:.1f} s (max {max(rejoin_s):.1f}); replica 0 RSS "
              f"{samples[0][0]} -> {samples[-1][0]} kB, fds {samples[0][1]} -> {samples[-1][1]}; parameters "
              f"bit-identical: {identical}; every step committed or healed: {accounted}")
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
        lighthouse.shutdown()


if __name__ == "__main__":
    main()
