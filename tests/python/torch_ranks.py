"""Runs a function on N real processes joined by torch.distributed (gloo over 127.0.0.1).

run(fn, world, env=..., timeout=...) starts `world` fresh processes, each setting `env`, one thread for torch,
and initialising a gloo process group (process_group=False: none; the ranks then have only the launcher's
variables, as under a launcher without torch.distributed); rank r returns fn(rank, world, *args). Nothing can
hang the test run: past the deadline every rank is killed and the test fails with what they reported.

The ranks are forked from a multiprocessing forkserver that has imported torch once (importing torch costs
each fresh interpreter ~2.5 s of CPU, most of a small test's cost on a 2-core CI machine). The forkserver
itself is a fresh interpreter (never a fork of the test process, which may hold engines and threads), and
each rank starts from the environment the test process has at run() time, as a spawned rank would.
"""
import os
import time
import traceback

import torch.multiprocessing as mp

from free_ports import free_port  # noqa: F401  (the tests call ranks.free_port())


EXIT = "torch_ranks.EXIT"  # returned by fn: the rank reports, then leaves at once (a peer dying mid-job)


def _context():
    """The forkserver context, its server importing torch (and torch.distributed) before its first fork."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "torch.distributed"])
    return ctx


def _entry(fn, rank, world, port, env, args, results, leave_together, process_group=True, parent_env=None):
    try:
        if parent_env is not None:  # the forkserver's environment is the one it started with: take the test's
            os.environ.clear()
            os.environ.update(parent_env)
        os.environ.update({k: str(v) for k, v in env.items()})
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                          WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
        import torch
        import torch.distributed as dist
        torch.set_num_threads(1)
        if process_group:
            dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
        result = fn(rank, world, *args)
        results.put((rank, "ok", result))
        if result == EXIT:
            results.close()
            results.join_thread()
            os._exit(0)
        if leave_together and process_group:  # a rank that exits while others still use the store would fail
            dist.barrier()
            dist.destroy_process_group()
    except BaseException:  # noqa: BLE001 - reported to the parent
        results.put((rank, "error", traceback.format_exc()))


def run(fn, world, env=None, args=(), timeout=180, leave_together=True, process_group=True):
    """Returns [fn's result on rank 0, ..., rank world-1]; raises AssertionError on any failure."""
    ctx = _context()
    results = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_entry, args=(fn, r, world, port, env or {}, args, results, leave_together,
                                              process_group, dict(os.environ)),
                         daemon=True) for r in range(world)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + timeout
    outcome = {}
    try:
        while len(outcome) < world:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"ranks timed out after {timeout} s; reported so far: {outcome}")
            try:
                rank, status, value = results.get(timeout=min(left, 1.0))
            except Exception:  # queue.Empty
                dead = [r for r, p in enumerate(procs) if p.exitcode not in (None, 0) and r not in outcome]
                if dead:
                    raise AssertionError(f"ranks {dead} died (exit codes "
                                         f"{[procs[r].exitcode for r in dead]}); reported: {outcome}")
                continue
            outcome[rank] = (status, value)
            if status != "ok":  # the others may be blocked on the failed rank: give them a short grace
                deadline = min(deadline, time.monotonic() + 20)
        errors = {r: v for r, (s, v) in outcome.items() if s != "ok"}
        if errors:
            raise AssertionError("ranks failed:\n" + "\n".join(f"--- rank {r}:\n{v}" for r, v in errors.items()))
        for p in procs:
            p.join(timeout=max(1.0, deadline - time.monotonic()))
        return [outcome[r][1] for r in range(world)]
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
