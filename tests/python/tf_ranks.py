"""Runs a function on N fresh processes, one per rank, for the TensorFlow plugin tests.

run("module:function", world, env=..., args=..., timeout=...) starts `world` interpreters with subprocess
(never fork: TensorFlow's threads do not survive it), each with its launcher's variables (`launcher`:
"torchrun" RANK/WORLD_SIZE/LOCAL_RANK, "slurm" SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID, "pmi"
PMI_RANK/PMI_SIZE/MPI_LOCALRANKID; `env` may be a function of the rank), MASTER_ADDR/MASTER_PORT,
TensorFlow on one intra-op thread, and rank r returning function(rank, world, *args)
(pickled). Past the deadline every rank is killed and the test fails with each rank's stderr; a rank that
fails shows its traceback and stderr. `may_die`: ranks allowed to die without reporting (a killed peer).
"""
import os
import pickle
import subprocess
import sys
import tempfile
import time

from free_ports import free_port  # noqa: F401  (the tests call ranks.free_port())

_HERE = os.path.dirname(os.path.abspath(__file__))


def _tail(path, limit=6000):
    try:
        with open(path, "rb") as f:
            data = f.read()
        return data[-limit:].decode("utf-8", "replace")
    except OSError:
        return ""


LAUNCHERS = {"torchrun": ("RANK", "WORLD_SIZE", "LOCAL_RANK"),
             "slurm": ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"),
             "pmi": ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID")}
# Variables of every launcher: removed from the ranks' environment so only the chosen launcher's are seen.
_LAUNCH_VARIABLES = [name for names in LAUNCHERS.values() for name in names] + [
    "LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_SIZE", "PMI_LOCAL_RANK", "MPI_LOCALNRANKS", "PMI_LOCAL_SIZE", "SLURM_NTASKS_PER_NODE",
    "SLURM_TASKS_PER_NODE", "SLURM_NODEID", "SLURM_JOB_ID", "SLURM_JOB_NODELIST", "SLURM_NODELIST",
    "TORCHELASTIC_RUN_ID"]


def run(target, world, env=None, args=(), timeout=240, may_die=(), launcher="torchrun"):
    """[result of rank 0, ..., rank world-1] (None for a rank in may_die that died); AssertionError on any
    failure, with the ranks' stderr."""
    port = free_port()
    workdir = tempfile.mkdtemp(prefix="gradex-tf-ranks-")
    with open(os.path.join(workdir, "args.pkl"), "wb") as f:
        pickle.dump(args, f)
    procs = []
    for rank in range(world):
        child_env = {k: v for k, v in os.environ.items() if k not in _LAUNCH_VARIABLES}
        rank_var, size_var, local_var = LAUNCHERS[launcher]
        child_env.update({rank_var: str(rank), size_var: str(world), local_var: str(rank)})
        child_env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), TF_CPP_MIN_LOG_LEVEL="2",
                         TF_NUM_INTRAOP_THREADS="1", OMP_NUM_THREADS="1",
                         PYTHONPATH=_HERE + os.pathsep + child_env.get("PYTHONPATH", ""))
        extra = env(rank) if callable(env) else (env or {})
        for k, v in extra.items():
            if v is None:
                child_env.pop(k, None)
            else:
                child_env[k] = str(v)
        err = open(os.path.join(workdir, f"stderr.{rank}"), "wb")
        procs.append(subprocess.Popen([sys.executable, os.path.abspath(__file__), target, str(rank), str(world),
                                       workdir], env=child_env, stdout=err, stderr=subprocess.STDOUT))
        err.close()
    deadline = time.monotonic() + timeout
    try:
        while any(p.poll() is None for p in procs):
            if time.monotonic() > deadline:
                raise AssertionError(f"ranks timed out after {timeout} s\n" + _report(procs, workdir))
            failed = [r for r, p in enumerate(procs) if p.poll() not in (None, 0) and r not in may_die]
            if failed:  # the others may be blocked on the failed rank: a short grace, then report
                grace = time.monotonic() + 20
                while any(p.poll() is None for p in procs) and time.monotonic() < min(grace, deadline):
                    time.sleep(0.2)
                raise AssertionError(f"ranks {failed} failed\n" + _report(procs, workdir))
            time.sleep(0.2)
        results = []
        for rank, p in enumerate(procs):
            path = os.path.join(workdir, f"result.{rank}")
            if p.returncode != 0 or not os.path.exists(path):
                if rank in may_die:
                    results.append(None)
                    continue
                raise AssertionError(f"rank {rank} exited with {p.returncode}\n" + _report(procs, workdir))
            with open(path, "rb") as f:
                results.append(pickle.load(f))
        return results
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)


def _report(procs, workdir):
    return "\n".join(f"--- rank {r} (exit {p.poll()}):\n{_tail(os.path.join(workdir, f'stderr.{r}'))}"
                     for r, p in enumerate(procs))


def _child(target, rank, world, workdir):
    import importlib

    import tensorflow as tf
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(2)
    module, function = target.split(":")
    with open(os.path.join(workdir, "args.pkl"), "rb") as f:
        args = pickle.load(f)
    result = getattr(importlib.import_module(module), function)(rank, world, *args)
    tmp = os.path.join(workdir, f"result.{rank}.tmp")
    with open(tmp, "wb") as f:
        pickle.dump(result, f)
    os.replace(tmp, os.path.join(workdir, f"result.{rank}"))


if __name__ == "__main__":
    _child(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
