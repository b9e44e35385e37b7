"""Starts N local ranks of a script (horovodrun -np N for one machine):

    python -m gradex.tensorflow.run -np 4 train.py --epochs 5

Each rank is a fresh interpreter (subprocess: TensorFlow must never be forked) with RANK, WORLD_SIZE,
LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR=127.0.0.1 and a free MASTER_PORT set. Output lines are prefixed "[rank] ". When a
rank fails, the others are stopped; the exit status is the first failure's. For several machines use
torchrun or mpirun (docs/tensorflow.md).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time
from typing import IO, Mapping, Optional, Sequence

from gradex._ports import free_port


def _pump(rank: int, stream: IO[bytes]) -> None:
    for line in iter(stream.readline, b""):
        sys.stdout.write(f"[{rank}] {line.decode('utf-8', 'replace')}")
        sys.stdout.flush()


def launch(nproc: int, argv: Sequence[str], env: Optional[Mapping[str, str]] = None) -> int:
    """Runs `argv` (a script and its arguments) on `nproc` local ranks; returns the exit status."""
    port = free_port()
    procs, pumps = [], []
    for rank in range(nproc):
        child_env = dict(os.environ if env is None else env)
        child_env.update(RANK=str(rank), WORLD_SIZE=str(nproc), LOCAL_RANK=str(rank),
                         LOCAL_WORLD_SIZE=str(nproc), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        p = subprocess.Popen([sys.executable] + list(argv), env=child_env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT)
        t = threading.Thread(target=_pump, args=(rank, p.stdout), daemon=True)
        t.start()
        procs.append(p)
        pumps.append(t)
    status = 0
    try:
        while any(p.poll() is None for p in procs):
            failed = [p.returncode for p in procs if p.poll() not in (None, 0)]
            if failed:
                status = failed[0]
                break
            time.sleep(0.2)
    finally:
        if status:
            for p in procs:
                if p.poll() is None:
                    p.terminate()
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        for t in pumps:
            t.join(timeout=5)
    return status or next((p.returncode for p in procs if p.returncode), 0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-np", "--nproc", type=int, required=True, help="number of local ranks")
    parser.add_argument("script", help="the training script")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="its arguments")
    a = parser.parse_args()
    if a.nproc < 1:
        parser.error("-np must be >= 1")
    sys.exit(launch(a.nproc, [a.script] + a.args))


if __name__ == "__main__":
    main()
