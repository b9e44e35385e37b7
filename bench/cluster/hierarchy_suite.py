#!/usr/bin/env python3
"""The hierarchical-exchange stage of bench/run: several ranks per emulated host (L ranks share one
network namespace, so host_identity() puts them on one host, and one shaped link), `gradex-bench
exchange` with the default policy and with a dense 16-bit exchange, once with the flat exchange
(GRADEX_HIERARCHICAL=0) and once with gradex's default (hierarchical where a host holds >= 2 ranks).
Per run: the step time and the bytes each host sent and received over its link, counted by the kernel
at the host's veth (network.py), beside gradex's own count. bench/report.py turns the pairs into the
target ratios (hierarchy_report.py).

A gradex build that does not declare GRADEX_HIERARCHICAL has only the flat exchange: the stage then runs
the flat exchange alone, says so, and reports no ratio; once the variable exists the same command
measures both.

Expects a cluster of at least max(H) hosts to be up (bench/run creates it) unless --own-cluster is
given (this script then brings one up under bench/cluster/cluster.sh and always removes it).

    hierarchy_suite.py --out hierarchy.json --configs 2x2@100mbit,2x2@1gbit,4x2@1gbit

Ranks are placed host by host (ranks 0..L-1 on host 0, ...), as torchrun places them. Inside a host the
ranks talk over shared memory (--intra-host shm, the default: GRADEX_SHM=1 with UCX's shared-memory
transports allowed; ranks of different namespaces stay on tcp over the shaped links, since gradex asks
UCX for peer-failure detection with them, which its shared-memory transports lack; checked: the hosts'
veth counters are the same as with tcp inside hosts), or tcp over the namespace's own loopback
(--intra-host tcp), which never crosses the shaped link either.
"""
import argparse
import os
import pathlib
import re
import signal
import subprocess
import sys
import time
from typing import Any, Dict

from bench.cluster import gradex_vars  # noqa: E402
from bench.harness import machine  # noqa: E402
from bench.cluster.exchange_suite import modes_of, rate_steps, save  # noqa: E402
from bench.harness.network import CLUSTER_SH, Cluster  # noqa: E402
from bench.harness.launcher import RankFailure, parse_result, print_progress_line, run_ranks  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]
MODE = "auto"  # gradex-bench's engine mode with nothing overridden: what the environment selects
# Run after MODE, results dropped: the counters of a mode close when the next one starts, so that what the
# program sends after its steps (results, shutdown) is not charged to MODE (exchange_suite.gradex_runs).
SENTINEL = "dgc999"
# The two exchanges the targets judge: (name, settings on top of the environment).
POLICIES = {
    "default": {},
    # Dense 16-bit through the engine: no tensor sparsified, fp16 on the wire (the engine's dense format).
    "dense16": {"GRADEX_SPARSITY": "0", "GRADEX_FP16": "1"},
    # gradex's shipped default policy (GRADEX_POLICY=fixed: DGC 99.9% from 16,384 elements, dense below),
    # through gradex-bench's "fixed" mode. Opt-in: --policies default,dense16,fixed,int4.
    "fixed": {},
    # Every tensor on the dense 4-bit route with error feedback, through gradex-bench's "int4" mode (the
    # auto policy's rung while its early-training ramp caps DGC). Opt-in, as "fixed".
    "int4": {},
}
# gradex-bench's mode per policy (MODE unless named here).
POLICY_MODE = {"fixed": "fixed", "int4": "int4"}


def parse_configs(text):
    """[(hosts, ranks_per_host, rate)] from "2x2@100mbit,4x2@1gbit"; ValueError on a bad entry."""
    out = []
    for item in filter(None, text.split(",")):
        match = re.fullmatch(r"(\d+)x(\d+)@(\d+[kmg]?bit)", item)
        if not match or int(match.group(1)) < 2 or int(match.group(2)) < 1:
            raise ValueError(f"bad --configs entry {item!r} (expected HOSTSxRANKS@RATE, e.g. 2x2@100mbit)")
        out.append((int(match.group(1)), int(match.group(2)), match.group(3)))
    return out


def variants(names):
    """[(exchange, env)]: the flat exchange, and gradex's default when the build has GRADEX_HIERARCHICAL."""
    if gradex_vars.HIERARCHICAL not in names:
        return [("flat", {})]
    return [("flat", {gradex_vars.HIERARCHICAL: "0"}), ("hierarchical", {})]


def intra_host_env(kind):
    if kind == "shm":
        return {"GRADEX_SHM": "1", "UCX_TLS": "tcp,self,sm"}
    return {}


def one_run(args, network, world, steps, warmup, env, label, mode=MODE):
    argv = [args.bench, "exchange", "--modes", f"{mode},{SENTINEL}", "--model", args.model, "--steps", str(steps),
            "--warmup", str(warmup), "--idle-s", "0"]
    host_wire: Dict[str, Any] = {}

    def display(mode, step, total):
        print_progress_line(f"[{label}] step {step}/{total}")

    stdout, wire = run_ranks(network, world, argv, warmup=warmup, steps=steps, timeout_s=args.run_timeout_s,
                             log_dir=args.log_dir, label=label, extra_env=env, display=display,
                             host_wire=host_wire)
    print_progress_line("")
    metrics = modes_of(parse_result(stdout)).get(mode, {})
    per_host = host_wire.get(mode)
    return {"step_ms": metrics.get("step_ms"), "mean_ms": metrics.get("mean_ms"), "cpu_ms": metrics.get("cpu_ms"),
            "steps_per_s": 1e3 / metrics["step_ms"] if metrics.get("step_ms") else None,
            "self_wire_bytes": metrics.get("wire_bytes"),
            "host_tx_bytes": [tx for tx, _ in per_host] if per_host else None,
            "host_rx_bytes": [rx for _, rx in per_host] if per_host else None}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--configs", default="2x2@100mbit,2x2@1gbit,4x2@1gbit",
                   help="HOSTSxRANKS_PER_HOST@RATE, comma-separated")
    p.add_argument("--policies", default="default,dense16", help=f"of {', '.join(POLICIES)}")
    p.add_argument("--model", default="resnet50")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--rate-steps", default="100mbit=3/1", help="steps/warm-up per rate, e.g. 100mbit=3/1")
    p.add_argument("--intra-host", choices=("tcp", "shm"), default="shm")
    p.add_argument("--own-cluster", action="store_true", help="bring a cluster up (and down) here")
    p.add_argument("--bench", default=str(ROOT / "build" / "bin" / "gradex-bench"))
    p.add_argument("--run-timeout-s", type=float, default=300)
    p.add_argument("--log-dir", default=str(ROOT / "build" / "bench-run" / "logs"))
    args = p.parse_args()
    configs = parse_configs(args.configs)
    per_rate = rate_steps(args.rate_steps)
    policies = [x for x in args.policies.split(",") if x]
    for x in policies:
        if x not in POLICIES:
            p.error(f"unknown policy {x!r} (expected one of {', '.join(POLICIES)})")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    names = gradex_vars.declared(args.bench)
    kinds = variants(names)
    note = ("GRADEX_HIERARCHICAL=0 (flat) against gradex's default (hierarchical where a host holds >= 2 ranks)"
            if len(kinds) == 2 else
            "this gradex build has no GRADEX_HIERARCHICAL: only the flat exchange was measured, so no "
            "hierarchical ratio is reported (the same command measures both once the variable exists)")
    print(f"hierarchy_suite: {note}", flush=True)
    data = {"machine": machine.describe(), "model": args.model, "variable": len(kinds) == 2, "note": note,
            "intra_host": args.intra_host, "policy_variable": gradex_vars.POLICY in names, "runs": [],
            "failures": []}
    hosts_needed = max(h for h, _, _ in configs)
    if args.own_cluster:
        subprocess.run([str(CLUSTER_SH), "up", "--hosts", str(hosts_needed), "--rate", configs[0][2],
                        "--owner", str(os.getpid()), "--max-s", "3600"], check=True, timeout=120)
    try:
        for hosts, local, rate in configs:
            network = Cluster(hosts, rate, ranks_per_host=local)
            network.shape()
            steps, warmup = per_rate.get(rate, (args.steps, args.warmup))
            for policy in policies:
                for exchange, hier_env in kinds:
                    env = {**intra_host_env(args.intra_host), **POLICIES[policy], **hier_env}
                    if policy == "dense16":  # the fixed policy: nothing may re-pick the codec
                        env.update(gradex_vars.policy_env(names, "fixed"))
                    label = f"hier.{hosts}x{local}.{rate}.{policy}.{exchange}"
                    started = time.monotonic()
                    try:
                        result = one_run(args, network, hosts * local, steps, warmup, env, label,
                                         POLICY_MODE.get(policy, MODE))
                    except (RankFailure, OSError) as e:
                        print(f"  FAILED: {label}: {e}", file=sys.stderr, flush=True)
                        data["failures"].append(f"{label}: {str(e).splitlines()[0]}")
                        continue
                    result.update({"hosts": hosts, "ranks_per_host": local, "rate": rate, "policy": policy,
                                   "exchange": exchange, "env": env, "steps": steps, "warmup": warmup})
                    data["runs"].append(result)
                    tx = result["host_tx_bytes"] or []
                    print(f"  {hosts}x{local} {rate} {policy} {exchange}: {result['step_ms']:.1f} ms/step, "
                          f"host tx MB/step {' '.join(f'{b / 1e6:.2f}' for b in tx)} "
                          f"({time.monotonic() - started:.0f} s)", flush=True)
                    save(args.out, data)
    finally:
        if args.own_cluster:
            subprocess.run([str(CLUSTER_SH), "down"], timeout=120)
    save(args.out, data)
    return 1 if data["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
