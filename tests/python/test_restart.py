"""Restart after a crash: `torchrun --max-restarts=1` with a rank SIGKILLed mid-run resumes from the last
checkpoint (model, optimizer and gx.State.state_dict()), and the resumed steps are bit-identical to an
uninterrupted run from the same checkpoint.

This file is also the training script torchrun runs (`python test_restart.py WORKER ...`)."""
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

from free_ports import free_ports

TOTAL_STEPS = 12
CHECKPOINT_EVERY = 4
KILL_AFTER = 6  # rank 1 dies after this step on the first attempt: the last checkpoint is step 4
CONFIG = {"GRADEX_DENSE_THRESHOLD": "2000", "GRADEX_SPARSITY": "0.99", "GRADEX_MOMENTUM": "0.9",
          "GRADEX_TIMEOUT_S": "30"}


def _digest(model):
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().contiguous().numpy().tobytes())
    return h.hexdigest()


def _save_atomic(obj, path):
    import torch
    tmp = path.with_suffix(".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def worker(ckpt_dir, log_dir, start_from, kill):
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import gradex.torch as gx

    rank = int(os.environ["RANK"])
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    torch.set_num_threads(1)
    # torchrun's agent store outlives a failed attempt, and keys of the dead workers (torch's own
    # gloo addresses among them) would be read by their successors: each attempt rendezvouses
    # through a fresh store that rank 0 serves on a port of its own.
    port = int(os.environ["GRADEX_TEST_BASE_PORT"]) + attempt
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=int(os.environ["WORLD_SIZE"]))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))
    ddp = DDP(model)
    state = gx.State(config=CONFIG)
    ddp.register_comm_hook(state, gx.hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)  # momentum 0: gradex's DGC owns momentum

    ckpt_dir = Path(ckpt_dir)
    latest = Path(start_from) / f"rank{rank}.pt" if start_from else ckpt_dir / f"latest-rank{rank}.pt"
    step = 0
    if latest.exists():
        ck = torch.load(latest, weights_only=False)
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["optimizer"])
        state.load_state_dict(ck["gradex"])
        step = ck["step"]
    # Every rank must resume from the same step.
    steps = torch.tensor([step, -step])
    dist.all_reduce(steps, op=dist.ReduceOp.MAX)
    assert steps[0] == step and -steps[1] == step, f"ranks resumed from different steps: {steps}"

    log = open(Path(log_dir) / f"rank{rank}-attempt{attempt}.jsonl", "a")
    while step < TOTAL_STEPS:
        step += 1
        x = torch.randn(32, 64, generator=torch.Generator().manual_seed(1000 * rank + step))
        opt.zero_grad()
        loss = ddp(x).square().mean()
        loss.backward()
        opt.step()
        log.write(json.dumps({"step": step, "digest": _digest(model), "loss": loss.item()}) + "\n")
        log.flush()
        if step % CHECKPOINT_EVERY == 0:
            ck = {"model": model.state_dict(), "optimizer": opt.state_dict(), "gradex": state.state_dict(),
                  "step": step}
            _save_atomic(ck, ckpt_dir / f"latest-rank{rank}.pt")
            (ckpt_dir / f"step{step}").mkdir(exist_ok=True)
            _save_atomic(ck, ckpt_dir / f"step{step}" / f"rank{rank}.pt")
        if kill and attempt == 0 and rank == 1 and step == KILL_AFTER:
            os.kill(os.getpid(), signal.SIGKILL)  # a crash: no cleanup, no goodbye
    log.close()
    state.close()
    dist.barrier()
    dist.destroy_process_group()


def _torchrun(tmp, name, start_from, kill):
    ckpt, logs = tmp / name / "ckpt", tmp / name / "logs"
    ckpt.mkdir(parents=True)
    logs.mkdir(parents=True)
    runner = Path(sys.executable).with_name("torchrun")
    cmd = [str(runner)] if runner.exists() else [sys.executable, "-m", "torch.distributed.run"]
    cmd += ["--standalone", "--nproc-per-node", "2", "--max-restarts", "1", "--monitor-interval", "0.5",
            __file__, "WORKER", str(ckpt), str(logs), str(start_from or ""), "1" if kill else "0"]
    env = dict(os.environ, OMP_NUM_THREADS="1", GRADEX_TEST_BASE_PORT=str(free_ports(2)))
    env.pop("RANK", None)
    env.pop("WORLD_SIZE", None)
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, f"torchrun failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-6000:]}"
    return ckpt, logs, proc


def _read(logs, rank, attempt):
    path = logs / f"rank{rank}-attempt{attempt}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_killed_rank_resumes_bit_identically(tmp_path):
    ckpt, logs, proc = _torchrun(tmp_path, "crashed", None, kill=True)
    # The first attempt died after KILL_AFTER steps on rank 1, and a second attempt finished the run.
    first = _read(logs, 1, 0)
    assert [e["step"] for e in first] == list(range(1, KILL_AFTER + 1)), proc.stderr[-6000:]
    resumed = {r: _read(logs, r, 1) for r in (0, 1)}
    for r in (0, 1):
        assert [e["step"] for e in resumed[r]] == list(range(CHECKPOINT_EVERY + 1, TOTAL_STEPS + 1)), \
            f"rank {r} did not resume from the step-{CHECKPOINT_EVERY} checkpoint: {resumed[r]}"
    # The replicas stay identical (gradex's average is bit-identical on every rank).
    assert [e["digest"] for e in resumed[0]] == [e["digest"] for e in resumed[1]]

    # An uninterrupted run from the same checkpoint (kept as it was written, before the crash).
    start = tmp_path / "start"
    shutil.copytree(ckpt / f"step{CHECKPOINT_EVERY}", start)
    _, ref_logs, _ = _torchrun(tmp_path, "reference", start, kill=False)
    for r in (0, 1):
        reference = _read(ref_logs, r, 0)
        assert [e["step"] for e in reference] == [e["step"] for e in resumed[r]]
        assert [e["digest"] for e in resumed[r]] == [e["digest"] for e in reference], \
            f"rank {r}: the resumed steps differ from the uninterrupted run"
        assert [e["loss"] for e in resumed[r]] == [e["loss"] for e in reference]
    # Training did something: the parameters changed at every step.
    digests = [e["digest"] for e in resumed[0]]
    assert len(set(digests)) == len(digests)


if __name__ == "__main__" and len(sys.argv) == 6 and sys.argv[1] == "WORKER":
    worker(sys.argv[2], sys.argv[3], sys.argv[4] or None, sys.argv[5] == "1")
