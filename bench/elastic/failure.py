"""Failure benchmark under torchft: the MLP race task (bench/train/task.py, MLP 64-2048-2048-10, 16 examples per
replica and step, SGD momentum 0.9 with the race's cosine schedule) on 4 emulated hosts at 1 Gbit/s
(bench/cluster/cluster.sh: one network namespace per host), one replica group (one rank) per host, torchft's
Lighthouse on host 0. In the failure runs host 3's replica is SIGKILLed when replica 0 reaches 30% of the steps
and started again at 60%; it heals from a peer and takes part again.

    failure.py run --mode uninterrupted|gradex|gloo [--steps 250]    one run, merged into --out
    failure.py plot                                                  accuracy against time, RESULT lines

Modes: uninterrupted (gradex hook, no failure), gradex (gradex.torchft.State + its DDP hook: DGC on the
torchft quorum's exchange), gloo (torchft's DistributedDataParallel over its stock ProcessGroupGloo).
Replica 0 (never killed) evaluates the test set every --eval-every steps; its clock leaves the evaluations out.
Needs root (network namespaces); the namespaces are torn down at the end of every run.
"""
import argparse
import json
import math
import os
import pathlib
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent.parent
CLUSTER_SH = ROOT / "bench" / "cluster" / "cluster.sh"
HOSTS, VICTIM, LIGHTHOUSE_PORT = 4, 3, 29510
TARGET = 0.72  # the MLP race's target (bench/train/train_suite.py)
MODES = ("uninterrupted", "gradex", "gloo")
LABELS = {"uninterrupted": "torchft + gradex, no failure", "gradex": "torchft + gradex (hook, DGC 0.99)",
          "gloo": "torchft + gloo (stock ProcessGroupGloo)"}


def cluster_env(args):
    return dict(os.environ, GX_CLUSTER_NAME=args.cluster_name, GX_CLUSTER_SUBNET=args.subnet)


def host_ip(args, host):
    return f"{args.subnet}.{host + 1}"


# --- one replica (runs inside its host's namespace) --------------------------------------------------------


def worker(args):
    import socket
    ip = host_ip(args, args.replica)
    # The namespaces share one host name; torchft's HTTP checkpoint transport (a newcomer heals through it)
    # advertises socket.gethostname(), as do its handles and Manager defaults: this host's address instead.
    socket.gethostname = lambda: ip
    import torch
    from datetime import timedelta
    from torchft import Manager
    from torchft.ddp import DistributedDataParallel as TorchftDDP
    from torchft.optim import OptimizerWrapper
    from torchft.process_group import ProcessGroupGloo

    from bench.train import task
    import gradex.torchft as gxft
    from gradex.torchft import advertised_reconfigure_handle

    torch.set_num_threads(1)
    x_train, y_train, x_test, y_test = task.load("mlp")
    x_shard, y_shard = x_train[args.replica::HOSTS], y_train[args.replica::HOSTS]
    net = task.make_model("mlp", seed=0)
    inner = torch.optim.SGD(net.parameters(), lr=args.lr, momentum=0.9)
    timeout = timedelta(seconds=5)
    if args.mode == "gloo":
        pg = ProcessGroupGloo(timeout=timeout)
        # torchft's handle names the store at socket.gethostname(), unreachable from another namespace
        pg.get_reconfigure_handle = lambda: advertised_reconfigure_handle(pg, ip)
    else:
        pg = gxft.ProcessGroupGradex(timeout=timeout, host=ip)
    store = torch.distributed.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)

    def state_dict():
        return {"model": net.state_dict(), "optim": inner.state_dict()}

    def load_state_dict(state):
        net.load_state_dict(state["model"])
        inner.load_state_dict(state["optim"])

    manager = Manager(pg=pg, min_replica_size=HOSTS - 1, load_state_dict=load_state_dict, state_dict=state_dict,
                      replica_id=f"replica{args.replica}", store_addr="127.0.0.1", store_port=store.port, rank=0,
                      world_size=1, lighthouse_addr=f"http://{host_ip(args, 0)}:{LIGHTHOUSE_PORT}", port=0,
                      hostname=ip, timeout=timedelta(seconds=10), quorum_timeout=timedelta(seconds=60))
    if args.mode == "gloo":
        ddp = TorchftDDP(manager, net)
    else:
        state = gxft.State(manager, pg, net, optimizer=inner, config={"GRADEX_SPARSITY": "0.99"})
        ddp = gxft.DistributedDataParallel(manager, net, state)
    optimizer = OptimizerWrapper(manager, inner)
    loss_fn = torch.nn.CrossEntropyLoss()
    log = open(os.path.join(args.out, f"replica{args.replica}.jsonl"), "a", buffering=1)
    timed_phases(manager, pg, log)
    log.write(json.dumps({"event": "up", "wall": time.time()}) + "\n")
    go = os.path.join(args.out, "go")
    while not os.path.exists(go):
        time.sleep(0.02)
    evaluating = args.replica == 0

    def accuracy():
        return task.correct(net, x_test, y_test) / len(x_test)

    if evaluating:
        log.write(json.dumps({"event": "eval", "wall": time.time(), "eval_s": 0.0, "step": 0,
                              "accuracy": accuracy()}) + "\n")
    eval_s = 0.0
    last_eval = 0
    while True:
        step = manager.current_step()
        if step >= args.steps:
            break
        lr = args.lr * 0.5 * (1 + math.cos(math.pi * step / args.steps))
        for group in inner.param_groups:
            group["lr"] = lr
        g = torch.Generator().manual_seed(100_000 * args.replica + step)
        idx = torch.randint(0, len(x_shard), (16,), generator=g)
        t_start = time.time()
        optimizer.zero_grad()
        loss_fn(ddp(x_shard[idx]), y_shard[idx]).backward()
        t_backward = time.time()
        optimizer.step()  # steps only if the quorum commits
        now = manager.current_step()
        log.write(json.dumps({"event": "step", "wall": time.time(), "step": now, "committed": now != step,
                              "participants": manager.num_participants(), "start": t_start,
                              "backward_done": t_backward}) + "\n")
        if evaluating and (now - last_eval >= args.eval_every or now >= args.steps):
            last_eval = now
            t0 = time.time()
            acc = accuracy()
            eval_s += time.time() - t0
            log.write(json.dumps({"event": "eval", "wall": time.time(), "eval_s": eval_s, "step": now,
                                  "accuracy": acc}) + "\n")
    log.write(json.dumps({"event": "done", "wall": time.time()}) + "\n")
    log.close()
    manager.shutdown(wait=False)
    pg.shutdown()
    os._exit(0)  # peers may still be closing; nothing here needs an orderly exit


def timed_phases(manager, pg, log):
    """Writes a "phase" event (name, start, end: wall clock) for each of a quorum's set-up phases on this
    replica: the process group's reconfiguration (for gradex: its engine, then the comm hook's engine, told
    through a membership listener) and the newcomer's checkpoint transfer. The step's own phases are in its
    "step" event (start, backward done, end)."""
    def record(name, start):
        log.write(json.dumps({"event": "phase", "name": name, "start": start, "end": time.time()}) + "\n")

    def timed(owner, method, name):
        inner = getattr(owner, method)

        def call(*a, **k):
            start = time.time()
            try:
                return inner(*a, **k)
            finally:
                record(name, start)
        setattr(owner, method, call)

    timed(pg, "reconfigure", "pg_reconfigure")
    timed(manager._checkpoint_transport, "recv_checkpoint", "recv_checkpoint")
    listeners = getattr(pg, "_listeners", None)
    if listeners:  # gradex: the group's own engine is up when the first listener runs, the hook's at the last
        marks: Dict[str, float] = {}
        listeners.insert(0, lambda *a: marks.__setitem__("engine", time.time()))
        listeners.append(lambda *a: log.write(json.dumps(
            {"event": "phase", "name": "hook_engine", "start": marks.pop("engine", time.time()),
             "end": time.time()}) + "\n"))
    client = manager._client
    quorum = client._quorum

    def timed_quorum(*a, **k):
        start = time.time()
        try:
            return quorum(*a, **k)
        finally:
            record("quorum", start)
    try:
        client._quorum = timed_quorum
    except AttributeError:  # a native client whose methods cannot be replaced: the phase stays unmeasured
        pass


# --- the driver (root namespace) ---------------------------------------------------------------------------


def read_log(out, replica):
    try:
        with open(os.path.join(out, f"replica{replica}.jsonl")) as f:
            return [json.loads(line) for line in f if line.endswith("\n")]
    except OSError:
        return []


def last_step(out, replica):
    steps = [e["step"] for e in read_log(out, replica) if e["event"] == "step"]
    return steps[-1] if steps else 0


def wait_for(condition, what, limit):
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.05)
    raise SystemExit(f"failure: timed out waiting for {what}")


def run(args):
    env = cluster_env(args)
    if not os.path.exists(pathlib.Path(sys.executable).parent / "torchft_lighthouse"):
        raise SystemExit("failure: torchft_lighthouse not found beside the interpreter")
    out = tempfile.mkdtemp(prefix="gradex-failure-")
    subprocess.run([str(CLUSTER_SH), "up", "--hosts", str(HOSTS), "--rate", args.rate, "--owner", str(os.getpid()),
                    "--max-s", "900"], check=True, env=env, stdout=subprocess.DEVNULL, timeout=120)
    procs: Dict[int, Any] = {}
    events: Dict[str, Any] = {}
    ns = [f"{args.cluster_name}-h{h}" for h in range(HOSTS)]
    lighthouse = subprocess.Popen(
        ["ip", "netns", "exec", ns[0], str(pathlib.Path(sys.executable).parent / "torchft_lighthouse"),
         "--bind", f"[::]:{LIGHTHOUSE_PORT}", "--min_replicas", str(HOSTS - 1), "--quorum_tick_ms", "100",
         "--join_timeout_ms", "10000", "--heartbeat_timeout_ms", "2000"],
        stdout=open(os.path.join(out, "lighthouse.log"), "w"), stderr=subprocess.STDOUT)

    def start(h):
        worker_env = dict(env, PYTHONPATH=str(ROOT), UCX_TLS="tcp,self", GRADEX_SHM="0", GRADEX_IFACE="eth0", GLOO_SOCKET_IFNAME="eth0",
                          OMP_NUM_THREADS="1")
        events.setdefault(f"start{h}", []).append(time.time())
        return subprocess.Popen(["ip", "netns", "exec", ns[h], sys.executable, "-m", "bench.elastic.failure", "worker", "--replica",
                                 str(h), "--mode", args.mode, "--steps", str(args.steps), "--out", out,
                                 "--lr", str(args.lr), "--eval-every", str(args.eval_every), "--subnet",
                                 args.subnet, "--cluster-name", args.cluster_name],
                                env=worker_env, stdout=open(os.path.join(out, f"replica{h}.out"), "a"),
                                stderr=subprocess.STDOUT)

    try:
        for h in range(HOSTS):
            procs[h] = start(h)
        wait_for(lambda: all(any(e["event"] == "up" for e in read_log(out, h)) for h in range(HOSTS)),
                 "the replicas' managers", 240)
        go = time.time()
        pathlib.Path(out, "go").touch()
        if args.mode != "uninterrupted":
            wait_for(lambda: last_step(out, 0) >= 0.3 * args.steps, "30% of the steps", 400)
            procs[VICTIM].send_signal(signal.SIGKILL)
            procs[VICTIM].wait()
            events["kill"] = time.time()
            events["kill_step"] = last_step(out, 0)
            wait_for(lambda: last_step(out, 0) >= 0.6 * args.steps, "60% of the steps", 400)
            procs[VICTIM] = start(VICTIM)
        for h in range(HOSTS):
            wait_for(lambda: procs[h].poll() is not None, f"replica {h} to finish", 500)
    finally:
        for p in [*procs.values(), lighthouse]:
            if p.poll() is None:
                p.kill()
                p.wait()
        subprocess.run([str(CLUSTER_SH), "down"], env=env, stdout=subprocess.DEVNULL, timeout=120)
    logs = {h: read_log(out, h) for h in range(HOSTS)}
    result = summarize(args, go, events, logs)
    path = pathlib.Path(args.out)
    from bench.harness import results as result_files
    merged = json.loads(path.read_text()) if path.exists() else {}
    merged.pop("provenance", None)
    # One file holds every mode's run: each run keeps its own command line, the file the latest's provenance.
    merged[args.mode] = dict(result, command=result_files.command_line())
    result_files.write(path, merged, link=args.rate)
    print(json.dumps({k: v for k, v in result.items() if k != "curve"}))
    print(f"logs in {out}")


def summarize(args, go, events, logs):
    evals = [e for e in logs[0] if e["event"] == "eval"]
    curve = [(e["wall"] - go - e["eval_s"], e["step"], e["accuracy"]) for e in evals]
    reached = next((c for c in curve if c[2] >= TARGET), None)
    result = {"mode": args.mode, "rate": args.rate, "steps": args.steps, "target": TARGET, "curve": curve,
              "time_to_target_s": reached[0] if reached else None,
              "steps_to_target": reached[1] if reached else None, "final_accuracy": curve[-1][2],
              "train_s": curve[-1][0]}
    if "kill" in events:
        kill = events["kill"]
        commits = [e for e in logs[0] if e["event"] == "step" and e["committed"] and e["wall"] > kill]
        result["kill_at_s"] = kill - go - max((e["eval_s"] for e in evals if e["wall"] < kill), default=0.0)
        result["survivors_next_commit_s"] = commits[0]["wall"] - kill if commits else None
        restart = events[f"start{VICTIM}"][-1]
        result["restart_at_s"] = restart - go - max((e["eval_s"] for e in evals if e["wall"] < restart), default=0.0)
        up = [e for e in logs[VICTIM] if e["event"] == "up" and e["wall"] > restart]
        rejoined = [e for e in logs[VICTIM] if e["event"] == "step" and e["committed"] and e["wall"] > restart]
        result["rejoin_after_start_s"] = rejoined[0]["wall"] - restart if rejoined else None
        result["rejoin_after_manager_up_s"] = rejoined[0]["wall"] - up[0]["wall"] if rejoined and up else None
        result["discarded_steps_replica0"] = sum(1 for e in logs[0] if e["event"] == "step" and not e["committed"])
        if rejoined and up:
            result["rejoin_phases_s"] = phases_between(logs[VICTIM], up[0]["wall"], rejoined[0])
        survivor_commit = commits[0] if commits else None
        if survivor_commit is not None:
            result["survivor_phases_s"] = phases_between(logs[0], kill, survivor_commit)
    return result


def phases_between(log, since, step):
    """Where a replica's seconds went from `since` (wall clock) to the end of the committed `step` event: every
    phase event that began in between (seconds, summed by name; a phase may begin more than once), the
    committed step's forward + backward from `since` on (the comm hook's exchanges run in it, after waiting
    for the quorum and the heal) and its optimizer step
    (the Manager's should_commit: waits for the quorum, the heal and the exchanges), and what is left
    (waiting between them, the steps that did not commit)."""
    out: Dict[str, float] = {}
    for e in log:
        if e["event"] == "phase" and since <= e["start"] <= step["wall"]:
            out[e["name"]] = out.get(e["name"], 0.0) + e["end"] - e["start"]
    if "start" in step:
        out["step_forward_backward"] = step["backward_done"] - max(step["start"], since)
        out["step_optimizer_commit"] = step["wall"] - step["backward_done"]
    out["total"] = step["wall"] - since
    return {k: round(v, 3) for k, v in out.items()}


def plot(args):
    from bench.harness import plot as figures

    results = json.loads(pathlib.Path(args.out).read_text())
    fig, ax = figures.figure()
    for mode in MODES:
        if mode not in results:
            continue
        r = results[mode]
        t = [c[0] for c in r["curve"]]
        line, = ax.plot(t, [100 * c[2] for c in r["curve"]], label=LABELS[mode], marker=".")
        for key, style in (("kill_at_s", ":"), ("restart_at_s", "--")):
            if r.get(key) is not None:
                ax.axvline(r[key], color=line.get_color(), linestyle=style, linewidth=1)
        print(f"RESULT mode={mode} rate={r['rate']} steps={r['steps']} "
              f"time_to_target_s={fmt(r['time_to_target_s'])} steps_to_target={r['steps_to_target']} "
              f"final_accuracy={r['final_accuracy']:.4f} train_s={r['train_s']:.1f}"
              + "".join(f" {k}={fmt(r.get(k))}" for k in ("survivors_next_commit_s", "rejoin_after_start_s",
                                                             "rejoin_after_manager_up_s", "discarded_steps_replica0")
                        if k in r))
    ax.axhline(100 * TARGET, color="grey", linewidth=0.8)
    ax.set_xlabel("seconds of training (replica 0's clock, evaluations left out)")
    ax.set_ylabel("test accuracy (%)")
    ax.set_title("MLP race, 4 hosts at 1 Gbit/s, host 3 killed at 30% and restarted at 60% (: kill, -- restart)",
                 fontsize=9)
    figures.finish(ax, legend="lower right")
    figures.save(fig, args.png, dpi=110)
    print(f"wrote {args.png}")


def fmt(v):
    return "none" if v is None else (f"{v:.2f}" if isinstance(v, float) else str(v))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("action", choices=["run", "plot", "worker"])
    p.add_argument("--mode", choices=MODES, default="gradex")
    p.add_argument("--steps", type=int, default=250)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--eval-every", type=int, default=10)
    p.add_argument("--rate", default="1gbit")
    p.add_argument("--cluster-name", default="elastic2")
    p.add_argument("--subnet", default="198.18.16")
    p.add_argument("--replica", type=int)
    p.add_argument("--out", default=str(ROOT / "docs" / "benchmarks" / "elastic_failure.json"))
    p.add_argument("--png", default=str(ROOT / "docs" / "benchmarks" / "elastic_failure.png"))
    args = p.parse_args()
    {"run": run, "plot": plot, "worker": worker}[args.action](args)


if __name__ == "__main__":
    main()
