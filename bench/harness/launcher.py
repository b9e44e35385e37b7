"""Runs one multi-rank benchmark command (gradex-bench exchange, the PyTorch baselines) as P processes
placed by a network (network.py), bounded in time, and counts the bytes on the wire of each mode's
measured steps.

Contract with the rank programs: rank 0 writes progress "[<tool>] <mode> step <k>/<n>" to stderr
when stderr is a terminal (k counts from 1, warm-up first). Rank 0's stderr is therefore a pseudo-
terminal here; each progress line is seen when that step starts (before its gradients are generated
and its barrier), so the kernel's counters read when step warmup+1 of a mode starts, and when the
next mode starts (or the program ends), enclose exactly that mode's measured steps.

Every rank runs in its own session: on a failure, a timeout or Ctrl-C all of them are killed by
process group, and the error carries the tail of each failed rank's log.
"""
import os
import pty
import re
import signal
import subprocess
import sys
import threading
import time
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Tuple

from bench.harness.network import Network, RootLoopback, environment, pick_port

PROGRESS = re.compile(r"\[(\w+)\] (\w+) step (\d+)/(\d+)")


class RankFailure(RuntimeError):
    pass


class WireMeter:
    """Kernel byte counters sampled at the progress boundaries of rank 0: per mode, bytes per step and
    rank (per_step) and, on networks that count each host's link, [(tx, rx)] bytes per step of every
    host (per_host).

    On networks that count what crosses between regions (wan_bytes() not None: the WAN's delay line),
    per_wan holds each mode's WAN bytes per step, all hosts together, counted between the progress
    lines of its first and last measured steps (each printed as that step starts, before its
    gradients and barrier), so that only whole steps are counted: not the results' gathering, the
    engine's shutdown nor the next mode's start-up (connections, probes), which the per_step window
    includes. Needs two measured steps or more; with one, the per_step window is used."""

    def __init__(self, network: Any, warmup: int, steps: int, ranks: int):
        self.network, self.warmup, self.steps, self.ranks = network, warmup, steps, ranks
        self.current: Optional[str] = None
        self.start: Optional[int] = None
        self.start_hosts: Optional[List[Tuple[int, int]]] = None
        self.per_step: Dict[str, float] = {}
        self.per_host: Dict[str, List[Tuple[float, float]]] = {}
        self.by_host = hasattr(network, "host_bytes")
        self.by_wan = getattr(network, "wan_bytes", lambda: None)() is not None
        self.wan_samples: List[int] = []
        self.per_wan: Dict[str, float] = {}

    def on_progress(self, mode: str, step: int) -> None:
        if mode != self.current:
            self._close()
            self.current, self.start, self.start_hosts, self.wan_samples = mode, None, None, []
        if step > self.warmup and self.by_wan:
            self.wan_samples.append(self.network.wan_bytes())
        if step == self.warmup + 1 and self.network.counted:
            if self.by_host:
                self.start_hosts = self.network.host_bytes()
                self.start = sum(tx for tx, _ in self.start_hosts)
            else:
                self.start = self.network.bytes_sent()

    def _close(self) -> None:
        if self.current is not None and self.by_wan and self.wan_samples:
            if len(self.wan_samples) >= 2:
                self.per_wan[self.current] = ((self.wan_samples[-1] - self.wan_samples[0]) /
                                              (len(self.wan_samples) - 1))
            else:
                self.per_wan[self.current] = (self.network.wan_bytes() - self.wan_samples[0]) / self.steps
        if self.current is not None and self.start is not None:
            if self.by_host:
                now = self.network.host_bytes()
                self.per_host[self.current] = [((tx - tx0) / self.steps, (rx - rx0) / self.steps)
                                               for (tx, rx), (tx0, rx0) in zip(now, self.start_hosts or [])]
                delta = sum(tx for tx, _ in now) - self.start
            else:
                delta = self.network.bytes_sent() - self.start
            self.per_step[self.current] = delta / self.steps / self.ranks  # per step and rank
        self.start = None
        self.wan_samples = []

    def finish(self) -> None:
        self._close()
        self.current = None


def _kill_all(procs: Iterable["subprocess.Popen[bytes]"]) -> None:
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + 5
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()


def _read_progress(master_fd: int, meter: WireMeter, display: "Display", log_path: str) -> None:
    """Reads rank 0's terminal until it closes: keeps all of it in log_path (errors land there too)
    and feeds every new progress state to the meter and the display."""
    seen: Optional[Tuple[str, int]] = None
    buffer = b""
    log = open(log_path, "wb")
    while True:
        try:
            chunk = os.read(master_fd, 4096)
        except OSError:  # EIO: every writer closed the terminal
            break
        if not chunk:
            break
        log.write(chunk)
        log.flush()
        buffer = (buffer + chunk)[-4096:]
        for match in PROGRESS.finditer(buffer.decode(errors="replace")):
            state = (match.group(2), int(match.group(3)))
            if state != seen:
                seen = state
                meter.on_progress(*state)
                display(match.group(2), int(match.group(3)), int(match.group(4)))
        cut = max(buffer.rfind(b"\r"), buffer.rfind(b"\n"))
        buffer = buffer[cut + 1:] if cut >= 0 else buffer
    log.close()


Display = Callable[[str, int, int], None]  # (mode, step, total) of rank 0's progress


class _PortTaken(RankFailure):
    """The rendezvous port picked free on loopback was bound by another process before rank 0 listened."""


def run_ranks(network: Network, world: int, argv: List[str], *, warmup: int, steps: int, timeout_s: float,
              log_dir: str, label: str, extra_env: Optional[Mapping[str, str]] = None,
              display: Optional[Display] = None, host_wire: Optional[Dict[str, Any]] = None,
              wan_wire: Optional[Dict[str, float]] = None) -> Tuple[str, Dict[str, float]]:
    """Runs argv as `world` ranks on `network` (see _run_ranks_once). On the root namespace's loopback
    a free port can be taken by another process between the pick and rank 0's listen (tests run side
    by side): that run alone is repeated on a fresh port, up to three times."""
    for attempt in range(3):
        try:
            return _run_ranks_once(network, world, argv, warmup=warmup, steps=steps, timeout_s=timeout_s,
                                   log_dir=log_dir, label=label, extra_env=extra_env, display=display,
                                   host_wire=host_wire, wan_wire=wan_wire)
        except _PortTaken:
            if attempt == 2:
                raise
    raise AssertionError("unreachable")


def _run_ranks_once(network: Network, world: int, argv: List[str], *, warmup: int, steps: int,
                    timeout_s: float, log_dir: str, label: str, extra_env: Optional[Mapping[str, str]] = None,
                    display: Optional[Display] = None, host_wire: Optional[Dict[str, Any]] = None,
                    wan_wire: Optional[Dict[str, float]] = None) -> Tuple[str, Dict[str, float]]:
    """Runs argv as `world` ranks on `network`. Returns (rank 0's stdout, {mode: wire bytes per step
    and rank} — empty when the network has no counters); fills host_wire (a dict, when given) with
    {mode: [(tx, rx) bytes per step of each host]} on networks that count each host's link, and
    wan_wire (a dict, when given) with {mode: bytes per step that crossed between regions} on
    networks that count them (WireMeter).
    RankFailure when a rank fails or the run exceeds timeout_s; every rank is gone when this returns
    or raises."""
    os.makedirs(log_dir, exist_ok=True)
    port = pick_port(network)
    meter = WireMeter(network, warmup, steps, world)
    display = display or (lambda mode, step, total: None)
    procs: List["subprocess.Popen[bytes]"] = []
    logs: List[str] = []
    master_fd, pty_fd = pty.openpty()
    slave_fd: Optional[int] = pty_fd
    try:
        for rank in range(world):
            out_path = os.path.join(log_dir, f"{label}.rank{rank}.log")
            logs.append(out_path)
            out = open(out_path, "wb")
            stderr = pty_fd if rank == 0 else subprocess.STDOUT
            procs.append(subprocess.Popen(
                network.command(rank, argv), env=environment(network, rank, world, port, extra_env),
                stdin=subprocess.DEVNULL, stdout=out, stderr=stderr, start_new_session=True))
            out.close()
        os.close(pty_fd)
        slave_fd = None
        stderr_log = os.path.join(log_dir, f"{label}.rank0.stderr.log")
        logs.append(stderr_log)
        reader = threading.Thread(target=_read_progress,
                                  args=(master_fd, meter, display, stderr_log), daemon=True)
        reader.start()
        deadline = time.monotonic() + timeout_s
        failed = []
        while True:
            codes = [p.poll() for p in procs]
            failed = [r for r, c in enumerate(codes) if c not in (None, 0)]
            if failed or all(c == 0 for c in codes):
                break
            if time.monotonic() > deadline:
                _kill_all(procs)
                raise RankFailure(f"{label}: timed out after {timeout_s:.0f} s" + _tails(logs, range(world + 1)))
            time.sleep(0.05)
        reader.join(timeout=5)
        meter.finish()
        if host_wire is not None:
            host_wire.update(meter.per_host)
        if wan_wire is not None:
            wan_wire.update(meter.per_wan)
        if failed:
            time.sleep(0.5)  # let a peer's own message land in its log before it is killed
            _kill_all(procs)
            shown = failed + ([world] if 0 in failed else [])  # rank 0's stderr log is logs[world]
            tails = _tails(logs, shown)
            if isinstance(network, RootLoopback) and "EADDRINUSE" in tails:
                raise _PortTaken(f"{label}: rank(s) {failed} failed" + tails)
            raise RankFailure(f"{label}: rank(s) {failed} failed" + tails)
        with open(logs[0], errors="replace") as f:
            return f.read(), meter.per_step
    finally:
        _kill_all(procs)
        if slave_fd is not None:
            os.close(slave_fd)
        os.close(master_fd)


def _tails(logs: List[str], ranks: Iterable[int], lines: int = 15) -> str:
    text = ""
    for r in ranks:
        try:
            with open(logs[r], errors="replace") as f:
                tail = f.read().splitlines()[-lines:]
        except OSError:
            tail = []
        text += f"\n--- {logs[r]}:\n" + "\n".join(tail)
    return text


def parse_result(stdout: str) -> Dict[str, str]:
    """The last 'RESULT k=v ...' line of a program's output as a dict of strings."""
    lines = [line for line in stdout.splitlines() if line.startswith("RESULT")]
    if not lines:
        raise RankFailure("no RESULT line in output:\n" + stdout[-2000:])
    return dict(tuple(item.split("=", 1)) for item in lines[-1].split()[1:])  # type: ignore[misc]


def print_progress_line(text: str) -> None:
    if sys.stderr.isatty():
        sys.stderr.write("\r\033[K" + text)
        sys.stderr.flush()
