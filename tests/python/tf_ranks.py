"""Runs a function on N processes, one per rank, for the TensorFlow plugin tests.

run("module:function", world, env=..., args=..., timeout=...) gives each rank its launcher's variables
(`launcher`: "torchrun" RANK/WORLD_SIZE/LOCAL_RANK, "slurm" SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID, "pmi"
PMI_RANK/PMI_SIZE/MPI_LOCALRANKID; `env` may be a function of the rank), MASTER_ADDR/MASTER_PORT and
TensorFlow on one intra-op thread; rank r returns function(rank, world, *args) (pickled). Past the deadline
every rank is killed and the test fails with each rank's stderr; a rank that fails shows its traceback and
stderr. `may_die`: ranks allowed to die without reporting (a killed peer).

Ranks are interpreters started with subprocess (never fork: TensorFlow's threads do not survive it). Importing
TensorFlow and Keras costs each one ~9 s of CPU, most of a TF test's cost on a 2-core CI machine, so an
interpreter whose job ended cleanly is kept and runs a later job of this test process: before each job it
takes the job's whole environment (os.environ is replaced, so gradex reads exactly the job's variables) and
its stdout/stderr file, and after it gradex is shut down, Keras's session and dtype policy are reset and the
plugin's say-once memory is cleared. An interpreter is not reused after a job that failed, ran past its
deadline or had a rank die, nor for jobs whose variables TensorFlow reads at import (TF_*, KERAS_*) or that
ask for `fresh=True` (a job whose subject is process-wide state that a first use fixes, such as which op
library is loaded).
"""
import os
import pickle
import select
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
# Read by TensorFlow or Keras when they are imported: a job that sets one gets interpreters of its own.
_IMPORT_TIME_PREFIXES = ("TF_", "KERAS_")
# The largest job is three ranks: more idle interpreters than that would only hold memory.
_MAX_IDLE = 3


class _Interpreter:
    """One rank interpreter serving jobs (see _serve); `reusable` after a job that ended cleanly."""

    def __init__(self, env, log_path):
        # The log holds what the interpreter says before its first job (an import that fails).
        with open(log_path, "wb") as log:
            self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--serve"], env=env,
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log)
        self.replied = None  # the job's last word: "done" (may run another) or "spent" (exits)

    def start(self, job_path):
        self.replied = None
        self.proc.stdin.write((job_path + "\n").encode())
        self.proc.stdin.flush()

    def check_reply(self):
        """True once the running job has replied (its result is written)."""
        if self.replied is None and select.select([self.proc.stdout], [], [], 0)[0]:
            self.replied = self.proc.stdout.readline().decode().strip() or "exited"
        return self.replied is not None

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)


_idle = []  # this test process's interpreters waiting for a job


def _interpreters(world, env, reuse, workdir):
    taken = []
    if reuse:
        while _idle and len(taken) < world:
            interpreter = _idle.pop()
            if interpreter.proc.poll() is None:
                taken.append(interpreter)
    return taken + [_Interpreter(env, os.path.join(workdir, f"start.{rank}")) for rank in range(len(taken), world)]


def _release(interpreters, reuse):
    for interpreter in interpreters:
        if reuse and interpreter.replied == "done" and interpreter.proc.poll() is None and len(_idle) < _MAX_IDLE:
            _idle.append(interpreter)
        else:
            interpreter.kill()


def run(target, world, env=None, args=(), timeout=240, may_die=(), launcher="torchrun", fresh=False):
    """[result of rank 0, ..., rank world-1] (None for a rank in may_die that died); AssertionError on any
    failure, with the ranks' stderr. fresh=True: interpreters that ran no earlier job and run no later one."""
    port = free_port()
    workdir = tempfile.mkdtemp(prefix="gradex-tf-ranks-")
    with open(os.path.join(workdir, "args.pkl"), "wb") as f:
        pickle.dump(args, f)
    envs = []
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
        envs.append(child_env)
    import_time = {k for e in envs for k in e if k.startswith(_IMPORT_TIME_PREFIXES)}
    reuse = not fresh and not may_die and all(
        e.get(k) == envs[0].get(k) == os.environ.get(k) for e in envs for k in import_time
        if k not in ("TF_CPP_MIN_LOG_LEVEL", "TF_NUM_INTRAOP_THREADS"))
    interpreters = _interpreters(world, envs[0], reuse, workdir)
    for rank, interpreter in enumerate(interpreters):
        job = os.path.join(workdir, f"job.{rank}")
        with open(job, "wb") as f:
            pickle.dump({"target": target, "rank": rank, "world": world, "workdir": workdir, "env": envs[rank],
                         "output": os.path.join(workdir, f"stderr.{rank}")}, f)
        interpreter.start(job)
    procs = [i.proc for i in interpreters]
    deadline = time.monotonic() + timeout
    try:
        while not all(i.check_reply() or i.proc.poll() is not None for i in interpreters):
            if time.monotonic() > deadline:
                raise AssertionError(f"ranks timed out after {timeout} s\n" + _report(procs, workdir))
            failed = [r for r, p in enumerate(procs) if p.poll() not in (None, 0) and r not in may_die]
            if failed:  # the others may be blocked on the failed rank: a short grace, then report
                grace = time.monotonic() + 20
                while (not all(i.check_reply() or i.proc.poll() is not None for i in interpreters)
                       and time.monotonic() < min(grace, deadline)):
                    time.sleep(0.2)
                raise AssertionError(f"ranks {failed} failed\n" + _report(procs, workdir))
            time.sleep(0.1)
        results = []
        for rank, interpreter in enumerate(interpreters):
            path = os.path.join(workdir, f"result.{rank}")
            if interpreter.replied not in ("done", "spent") or not os.path.exists(path):
                if rank in may_die:
                    results.append(None)
                    continue
                raise AssertionError(f"rank {rank} exited with {interpreter.proc.poll()}\n" + _report(procs, workdir))
            with open(path, "rb") as f:
                results.append(pickle.load(f))
        _release(interpreters, reuse)
        interpreters = []
        return results
    finally:
        _release(interpreters, False)


def _report(procs, workdir):
    return "\n".join(f"--- rank {r} (exit {p.poll()}):\n{_tail(os.path.join(workdir, f'start.{r}'))}"
                     f"{_tail(os.path.join(workdir, f'stderr.{r}'))}" for r, p in enumerate(procs))


def _reset_after_job():
    """What a job may leave behind in the interpreter and a later job must not see."""
    if "gradex.tensorflow" in sys.modules:
        import gradex.tensorflow as gxt
        from gradex import _log
        from gradex.tensorflow import _runtime
        if gxt.is_initialized():
            gxt.shutdown()
        _runtime._said_once.clear()  # noqa: SLF001 - a later job's warnings must show as in a fresh process
        _log._said.clear()  # noqa: SLF001
    if "keras" in sys.modules:
        import keras
        keras.mixed_precision.set_global_policy("float32")
        keras.backend.clear_session()


def _serve():
    """Imports TensorFlow, then runs the jobs whose file paths arrive on stdin, one at a time, each with its own
    environment and output file; replies "done" (ready for another) or "spent" (about to exit) on stdout."""
    import importlib

    import tensorflow as tf
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(2)
    reply = os.fdopen(os.dup(1), "w")
    quiet = os.open(os.devnull, os.O_WRONLY)
    os.dup2(quiet, 1)
    for line in sys.stdin:
        with open(line.strip(), "rb") as f:
            job = pickle.load(f)
        output = os.open(job["output"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(output, 1)
        os.dup2(output, 2)
        os.close(output)
        os.environ.clear()
        os.environ.update(job["env"])
        module, function = job["target"].split(":")
        with open(os.path.join(job["workdir"], "args.pkl"), "rb") as f:
            args = pickle.load(f)
        # An exception ends the interpreter with its traceback in the job's output (exit status 1).
        result = getattr(importlib.import_module(module), function)(job["rank"], job["world"], *args)
        tmp = os.path.join(job["workdir"], f"result.{job['rank']}.tmp")
        with open(tmp, "wb") as f:
            pickle.dump(result, f)
        os.replace(tmp, os.path.join(job["workdir"], f"result.{job['rank']}"))
        reusable = True
        try:
            _reset_after_job()
        except Exception:  # noqa: BLE001 - the result stands; this interpreter just is not reused
            import traceback
            traceback.print_exc()
            reusable = False
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(quiet, 1)
        os.dup2(quiet, 2)
        reply.write("done\n" if reusable else "spent\n")
        reply.flush()
        if not reusable:
            return


if __name__ == "__main__":
    _serve()
