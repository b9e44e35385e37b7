"""What a delayed exchange's rule costs a task's accuracy with nothing else in the way: P data-parallel ranks
simulated in one process, their gradients averaged exactly in fp32 (no codec, no network, no timing), so that
the only difference from synchronous SGD momentum is the rule that GRADEX_DELAY applies.

Every rank has its own model copy, its own shard and batches (bench/train/task.py's Shard, the race's data
order) and, as the race's DDP does by default, rank 0's buffers before each forward. The optimizer is SGD with
momentum m (PyTorch's form, no dampening), the race's cosine learning rate; gradex owns the momentum under
delay as it does for SGD (docs/tuning.md, "Delayed exchange"): each rank keeps u_t = m u_{t-1} + g_t of its
own gradients and the exchange carries u. Cases, as RULE:D[:m]:

  sync          DDP: the average of step t's gradients, then momentum (D is ignored)
  correct:D     gradex's GRADEX_DELAY_RULE=correct (Delayed Gradient Averaging): step t applies
                u_t + avg(u_{t-D}) - u_{t-D}; u_t alone for the first D steps
  stale:D       GRADEX_DELAY_RULE=stale: avg(u_{t-D}) alone (nothing for the first D steps)
  carried:D     the averaged momentum of step t-D carried forward with this rank's own gradients of the last
                D steps, written so that the updates telescope (the ranks differ by those D gradients only,
                not by D local momenta): step t applies avg(u_{t-D}) + L_t - L_{t-1}, where L_t is the sum of
                the estimates of the last D synchronous updates m^j avg(u_{t-D}) + sum_{k<j} m^k g_{t-D+j-k}

At the end the ranks' parameters are averaged (gx.synchronize) and the model is tested with rank 0's buffers.
With the same batches on every rank, correct, carried and sync train the same model (tests/python/
test_bench_delay_rules.py checks that, and correct's telescoping, on small models).

    .venv/bin/python -m bench.experiments.delay_rules --tasks cnn,tfm,mlp --seeds 0,1,2,3 \\
        --cases sync,correct:1,correct:2,correct:3,correct:4,carried:2,stale:2 --jobs 2 \\
        --out docs/benchmarks/delay_rules_exact.json
"""
from __future__ import annotations

import argparse
import copy
import math
import multiprocessing
import statistics
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch

from bench.harness import results
from bench.train import task
from bench.train.train_suite import TASK_SETTINGS

RULES = ("sync", "correct", "stale", "carried")
Tensors = List[torch.Tensor]


@dataclass(frozen=True)
class Case:
    rule: str
    delay: int = 0
    momentum: float = 0.9

    @staticmethod
    def parse(text: str) -> "Case":
        parts = text.split(":")
        if parts[0] not in RULES or len(parts) > 3:
            raise ValueError(f"case {text!r}: expected RULE[:D[:MOMENTUM]] with RULE one of {', '.join(RULES)}")
        try:
            delay = int(parts[1]) if len(parts) > 1 else 0
            momentum = float(parts[2]) if len(parts) > 2 else 0.9
        except ValueError as e:
            raise ValueError(f"case {text!r}: D is an integer and MOMENTUM a number ({e})") from None
        if delay < 0 or (parts[0] != "sync" and delay == 0 and parts[0] != "correct"):
            raise ValueError(f"case {text!r}: D must be >= 1 for {parts[0]} (0 is sync)")
        if not 0 <= momentum < 1:
            raise ValueError(f"case {text!r}: MOMENTUM must be in [0, 1)")
        return Case(parts[0], delay, momentum)

    def label(self) -> str:
        if self.momentum != 0.9:
            return f"{self.rule}:{self.delay}:{self.momentum:g}"
        return self.rule if self.rule == "sync" else f"{self.rule}:{self.delay}"


@dataclass
class Run:
    """One simulated training run's end: every rank's parameters, and under correct the momenta of the last D
    steps per rank (oldest first), which the telescoping check needs."""
    params: List[Tensors]
    recent_u: List[List[Tensors]]
    accuracy: Optional[float]
    models: List[torch.nn.Module]  # every rank's model as it ended (its own parameters and buffers)
    # The synchronized model with its BatchNorm statistics measured again for its own parameters (None
    # without BatchNorm): rank 0's running statistics follow rank 0's parameters, not the ranks' average.
    accuracy_own_statistics: Optional[float] = None


def _average(parts: Sequence[Tensors]) -> Tensors:
    return [torch.stack([p[i] for p in parts]).mean(dim=0) for i in range(len(parts[0]))]


def simulate(name: str, seed: int, case: Case, steps: int, lr: float, world: int = 4, batch: int = 16,
             hidden: int = 2048, same_data: bool = False, constant_lr: bool = False,
             data: Optional[Tuple[torch.Tensor, ...]] = None, test: bool = True) -> Run:
    """Trains `world` ranks on task `name` for `steps` steps under `case`. same_data: every rank gets rank 0's
    batches (the ranks' gradients then differ only through their parameters); constant_lr: `lr` at every step
    instead of the cosine schedule."""
    x_train, y_train, x_test, y_test = data if data is not None else task.load(name)
    base = task.make_model(name, seed, hidden)
    models = [copy.deepcopy(base) for _ in range(world)]
    shards = [task.Shard(x_train, y_train, 0 if same_data else r, world, batch, seed) for r in range(world)]
    params = [list(m.parameters()) for m in models]
    zeros = [torch.zeros_like(p) for p in params[0]]
    u = [[z.clone() for z in zeros] for _ in range(world)]  # each rank's momentum of its own gradients
    velocity = [z.clone() for z in zeros]  # sync's momentum of the averaged gradients
    sent: List[List[Tensors]] = []  # per step, every rank's u (what the exchange carries); D + 1 kept
    grads: List[List[Tensors]] = []  # per step, every rank's gradient (carried); D + 1 kept
    carried = [[z.clone() for z in zeros] for _ in range(world)]  # carried's L_{t-1}
    loss_fn = torch.nn.CrossEntropyLoss()
    m, d = case.momentum, case.delay
    for t in range(steps):
        rate = lr if constant_lr else lr * 0.5 * (1 + math.cos(math.pi * t / steps))
        g: List[Tensors] = []
        for r, model in enumerate(models):
            if r > 0:  # DDP's broadcast_buffers: rank 0's buffers before every forward
                for b, b0 in zip(model.buffers(), models[0].buffers()):
                    b.copy_(b0)
            x, y = shards[r].next()
            for p in model.parameters():
                p.grad = None
            loss_fn(model(x), y).backward()
            g.append([p.grad.detach().clone() for p in model.parameters()])
        with torch.no_grad():
            if case.rule == "sync":
                for v, a in zip(velocity, _average(g)):
                    v.mul_(m).add_(a)
                for r in range(world):
                    for p, v in zip(params[r], velocity):
                        p.sub_(rate * v)
                continue
            for r in range(world):
                for ui, gi in zip(u[r], g[r]):
                    ui.mul_(m).add_(gi)
            sent.append([[ui.clone() for ui in u[r]] for r in range(world)])
            grads.append(g)
            if len(sent) > d + 1:
                sent.pop(0)
                grads.pop(0)
            past = _average(sent[0]) if t >= d else None  # avg(u_{t-D})
            for r in range(world):
                if case.rule == "correct":
                    update = sent[-1][r] if past is None else [
                        now + avg - then for now, avg, then in zip(sent[-1][r], past, sent[0][r])]
                elif case.rule == "stale":
                    update = past if past is not None else zeros
                else:  # carried
                    start = past if past is not None else zeros
                    estimate = []
                    for i, a in enumerate(start):
                        total = torch.zeros_like(a)
                        for j in range(1, d + 1):
                            total.add_(a, alpha=m ** j)
                            for k in range(j):
                                s = t - d + j - k  # the step whose gradient enters with weight m^k
                                if s >= 0:
                                    total.add_(grads[len(grads) - 1 - (t - s)][r][i], alpha=m ** k)
                        estimate.append(total)
                    update = [a + now - before for a, now, before in zip(start, estimate, carried[r])]
                    carried[r] = estimate
                for p, step in zip(params[r], update):
                    p.sub_(rate * step)
    recent = [[s[r] for s in sent[1:]] for r in range(world)] if case.rule == "correct" else []
    final = [[p.detach().clone() for p in ps] for ps in params]
    accuracy = None
    if test:  # gx.synchronize: the ranks' average, rank 0's buffers
        synchronized = copy.deepcopy(models[0])
        with torch.no_grad():
            for p, a in zip(synchronized.parameters(), _average(final)):
                p.copy_(a)
        accuracy = task.correct(synchronized, x_test, y_test) / len(x_test)
        own_statistics = _with_own_statistics(synchronized, x_train)
        if own_statistics is not None:
            return Run(final, recent, accuracy, models,
                       task.correct(own_statistics, x_test, y_test) / len(x_test))
    return Run(final, recent, accuracy, models)


STATISTICS_BATCHES, STATISTICS_BATCH = 40, 256


def _with_own_statistics(model: torch.nn.Module, x_train: torch.Tensor) -> Optional[torch.nn.Module]:
    """A copy of `model` whose BatchNorm running statistics are measured again over the first
    STATISTICS_BATCHES training batches (PyTorch's update_bn, as a user would); None when it has no BatchNorm."""
    if not any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in model.modules()):
        return None
    fresh = copy.deepcopy(model)
    batches = [x_train[i * STATISTICS_BATCH:(i + 1) * STATISTICS_BATCH] for i in range(STATISTICS_BATCHES)]
    torch.optim.swa_utils.update_bn(batches, fresh)
    return fresh


def _one(job: Tuple[str, int, Case, int, float]) -> Dict[str, Any]:
    name, seed, case, steps, lr = job
    torch.set_num_threads(1)
    started = time.perf_counter()
    run = simulate(name, seed, case, steps, lr)
    return {"task": name, "seed": seed, "case": case.label(), "accuracy": run.accuracy,
            "accuracy_own_statistics": run.accuracy_own_statistics,
            "seconds": round(time.perf_counter() - started, 1)}


def summarize(rows: Sequence[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Per task and case: the mean accuracy over seeds and its difference from sync's, in points, seed by seed
    (the same seeds' sync runs); for BatchNorm models also with every model's statistics measured again."""
    sync = {(r["task"], r["seed"]): r["accuracy"] for r in rows if r["case"] == "sync"}
    sync_own = {(r["task"], r["seed"]): r.get("accuracy_own_statistics") for r in rows if r["case"] == "sync"}
    out = []
    for name in dict.fromkeys(r["task"] for r in rows):
        for case in dict.fromkeys(r["case"] for r in rows if r["task"] == name):
            mine = [r for r in rows if r["task"] == name and r["case"] == case]
            diffs = [100 * (r["accuracy"] - sync[(name, r["seed"])]) for r in mine if (name, r["seed"]) in sync]
            own = [100 * (r["accuracy_own_statistics"] - sync_own[(name, r["seed"])]) for r in mine
                   if r.get("accuracy_own_statistics") is not None and sync_own.get((name, r["seed"])) is not None]
            out.append({"task": name, "case": case, "seeds": len(mine),
                        "mean_accuracy": round(statistics.mean(r["accuracy"] for r in mine), 4),
                        "points_vs_sync": round(statistics.mean(diffs), 2) if diffs else None,
                        "worst_points_vs_sync": round(min(diffs), 2) if diffs else None,
                        "points_vs_sync_own_statistics": round(statistics.mean(own), 2) if own else None})
    return out


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tasks", default="cnn", help="comma-separated race tasks (bench/train/task.py)")
    p.add_argument("--seeds", default="0,1,2,3")
    p.add_argument("--cases", default="sync,correct:1,correct:2", help="RULE[:D[:MOMENTUM]], comma-separated")
    p.add_argument("--jobs", type=int, default=1, help="runs at once (one process each, one thread each)")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    cases = [Case.parse(c) for c in args.cases.split(",")]
    tasks = args.tasks.split(",")
    for name in tasks:
        if name not in TASK_SETTINGS:
            raise SystemExit(f"--tasks: unknown task {name!r} (expected one of {', '.join(TASK_SETTINGS)})")
    jobs = [(name, int(s), c, TASK_SETTINGS[name]["steps"], TASK_SETTINGS[name]["lr"])
            for name in tasks for c in cases for s in args.seeds.split(",")]
    rows: List[Dict[str, Any]] = []
    with multiprocessing.get_context("spawn").Pool(max(1, args.jobs)) as pool:
        for row in pool.imap_unordered(_one, jobs):
            rows.append(row)
            print(f"{row['task']} {row['case']} seed {row['seed']}: {row['accuracy']:.4f} ({row['seconds']} s)",
                  flush=True)
            results.write(args.out, {"runs": rows, "summary": summarize(rows)}, link="none (one process)")
    for line in summarize(rows):
        print(f"{line['task']:5} {line['case']:14} {line['mean_accuracy']:.4f} over {line['seeds']} seeds; "
              f"{line['points_vs_sync']} points against sync (worst seed {line['worst_points_vs_sync']})"
              + (f"; {line['points_vs_sync_own_statistics']} with BatchNorm statistics of its own"
                 if line["points_vs_sync_own_statistics"] is not None else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
