"""What machine a benchmark ran on, recorded with its results so the report describes the run and
not whatever machine renders the report later."""
import datetime
import os
import platform
import subprocess
from typing import Any, Dict, Optional


def _first(path: str, prefix: str) -> str:
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(prefix):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def _run(*argv: str) -> str:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return ""


def _read(path: str) -> Optional[str]:
    try:
        with open(path) as f:
            return f.read().strip() or None
    except OSError:
        return None


def tcp_congestion_control() -> Dict[str, Optional[str]]:
    """The emulated cluster's hosts' TCP congestion control (bench/cluster/cluster.sh --cc, from its state
    directory; None when no cluster is up) and the machine's own: the hosts' decides how multi-flow
    exchanges fare on the shaped links (docs/benchmarks.md, "the hosts' TCP")."""
    name = os.environ.get("GX_CLUSTER_NAME", "gx")
    state = "/run/gradex-cluster" if name == "gx" else f"/run/gradex-cluster-{name}"
    return {"cluster": _read(os.path.join(state, "cc")),
            "machine": _read("/proc/sys/net/ipv4/tcp_congestion_control")}


def describe() -> Dict[str, Any]:
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    ucx = _run("ucx_info", "-v").splitlines()
    try:
        import torch
        torch_version = str(torch.__version__)
    except ImportError:
        torch_version = "not installed"
    memory_kb = _first("/proc/meminfo", "MemTotal").split()[0]
    return {
        "cpu": _first("/proc/cpuinfo", "model name"),
        "cores": os.cpu_count(),
        "memory_gib": round(int(memory_kb) / 2**20, 1) if memory_kb.isdigit() else None,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "torch": torch_version,
        "ucx": ucx[0].lstrip("# ").strip() if ucx else "unknown",
        "commit": _run("git", "-C", root, "rev-parse", "--short", "HEAD") or "unknown",
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "load_average_at_start": os.getloadavg()[0],
        "tcp_congestion_control": tcp_congestion_control(),
    }


def cpu_times() -> Dict[str, float]:
    """The machine's CPU seconds so far, summed over its cores (/proc/stat's first line): "busy" (user,
    nice, system, irq, softirq, steal), "softirq" (mostly the network stack's receive work, which no
    process is charged for) and "idle" (idle, iowait). Two readings' difference says how much of the
    machine a run used: on a machine its ranks share, a method's CPU bounds its steps/s as its link does."""
    with open("/proc/stat") as f:
        fields = [int(v) for v in f.readline().split()[1:]]
    user, nice, system, idle, iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
    tick = float(os.sysconf("SC_CLK_TCK"))
    return {"busy": (user + nice + system + irq + softirq + steal) / tick, "softirq": softirq / tick,
            "idle": (idle + iowait) / tick}
