#!/usr/bin/env python3
"""An emulated wide-area network for the benchmarks: hosts as network namespaces joined by a
userspace delay line (gradex-delayline, bench/cluster/delayline/), for kernels without sch_netem.

Topology: host i is namespace <name>-h<i> (default gxw-h<i>) with one TUN device, wan0, holding
<subnet>.<i+1>/24 (default 198.19.0.0/24, inside the benchmarking range 198.18.0.0/15); the
subnet's route goes through wan0, so every packet between hosts passes through the delay line, which
applies per-host NIC rates, per-region delays and rates, drop-tail queues and random loss
(delayline/link.h). Nothing is attached to the root namespace: the traffic never leaves the
namespaces. Everything else (the rendezvous of ranks on one host, logs) stays on loopback.

    Wan(WanSpec(hosts=4, rate="1gbit", delay="25ms"))                       4 hosts, one region
    Wan(WanSpec(hosts=4, rate="10gbit", delay="0.25ms", regions=[0, 0, 1, 1],
                inter_rate="1gbit", inter_delay="25ms"))                     2 regions x 2 hosts

A Wan is a network of bench/harness/network.py (command, local_rank, host_bytes, ...), so launcher.py
and exchange_suite.py run ranks over it; it is also a context manager that builds the WAN on entry
and always removes it on exit. The relay lives as long as its owner's control pipe: if the owner
dies, the relay sees end of input and exits (its TUN devices vanish with it), and a detached watchdog
removes the namespaces and whatever still runs in them.

    wan.py run --hosts 2 --rate 100mbit --delay 10ms -- CMD...   build, run CMD in the root namespace
                                                                 (it reaches hosts with ip netns exec),
                                                                 tear down
    wan.py check --hosts 2 --rate 1gbit --delay 25ms             build, print RTT, one flow's
                                                                 throughput and the kernel limits
    wan.py down [--name gxw]                                     remove a WAN left behind
    wan.py limits --rate 1gbit --rtt-ms 50                       the kernel-limits line of this machine
                                                                 for such a path (read-only; exit 1 when
                                                                 one flow is window-limited)
"""
import argparse
import dataclasses
import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional, Tuple

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]
LINKCHECK = ROOT / "bench" / "cluster" / "linkcheck.py"
DEV = "wan0"


def default_delayline() -> str:
    return os.environ.get("GRADEX_DELAYLINE_EXE", str(ROOT / "build" / "bin" / "gradex-delayline"))


def _rate_bits(rate: str) -> float:
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([kmg]?)bit", rate)
    if not match:
        raise ValueError(f"bad rate {rate!r} (expected e.g. 1gbit, 100mbit)")
    return float(match.group(1)) * {"k": 1e3, "m": 1e6, "g": 1e9, "": 1}[match.group(2)]


def _time_s(text: str) -> float:
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(us|ms|s)", text)
    if not match:
        raise ValueError(f"bad time {text!r} (expected e.g. 25ms, 0.25ms)")
    return float(match.group(1)) * {"us": 1e-6, "ms": 1e-3, "s": 1.0}[match.group(2)]


def default_name() -> str:
    """The WAN's namespace prefix: GX_WAN_NAME, else GX_CLUSTER_NAME + "w" (so that engineers who set their
    cluster's name get WANs of their own), else gxw."""
    cluster = os.environ.get("GX_CLUSTER_NAME", "")
    return os.environ.get("GX_WAN_NAME") or (f"{cluster}w" if cluster and cluster != "gx" else "gxw")


def default_subnet() -> str:
    """The WAN's /24: GX_WAN_SUBNET, else GX_CLUSTER_SUBNET moved from 198.18.x to 198.19.x (a WAN never
    shares cluster.sh's addresses), else 198.19.0."""
    cluster = os.environ.get("GX_CLUSTER_SUBNET", "")
    if os.environ.get("GX_WAN_SUBNET"):
        return os.environ["GX_WAN_SUBNET"]
    return "198.19." + cluster.split(".")[2] if re.fullmatch(r"198\.18\.\d{1,3}", cluster) else "198.19.0"


@dataclasses.dataclass
class WanSpec:
    hosts: int
    rate: str                             # each host's NIC (and the intra-region links), tc spelling
    delay: str                            # one-way delay between hosts of one region, e.g. 25ms
    regions: Optional[List[int]] = None   # region of each host (default: one region)
    inter_rate: str = ""                  # the pipe between two regions, shared by its hosts
    inter_delay: str = ""                 # one-way delay between hosts of different regions
    inter_pairs: str = ""                 # region pairs that differ: "0-2:1gbit,75ms;1-2:1gbit,150ms"
    loss: float = 0.0                     # random loss per packet, each direction
    mtu: int = 0                          # TUN MTU; 0: by the fastest pipe's rate (link_mtu)
    queue_ms: float = 10.0                # each pipe's drop-tail queue in ms at its rate
    seed: int = 1
    tcp_buffer_mib: int = 0               # > 0: tcp_rmem/tcp_wmem max inside the hosts' namespaces
    sysctls: List[str] = dataclasses.field(default_factory=list)  # "key=value" inside the hosts' namespaces
    # The hosts' TCP congestion control: cubic, most clouds' default ("" keeps the machine's, which on
    # this machine is bbr: a WAN result then says little about what a user's hosts would see).
    cc: str = "cubic"
    name: str = dataclasses.field(default_factory=default_name)      # namespaces <name>-h<i>
    subnet: str = dataclasses.field(default_factory=default_subnet)  # host i at <subnet>.<i+1>

    def validate(self) -> None:
        if not 2 <= self.hosts <= 64:
            raise ValueError("hosts must be in [2, 64]")
        if not re.fullmatch(r"[a-z][a-z0-9]{0,11}", self.name) or self.name in ("gx",):
            raise ValueError(f"bad WAN name {self.name!r} (a-z0-9, a letter first; not cluster.sh's gx)")
        if not re.fullmatch(r"198\.1[89]\.\d{1,3}", self.subnet):
            raise ValueError(f"bad subnet {self.subnet!r} (198.18.x or 198.19.x)")
        _rate_bits(self.rate), _time_s(self.delay)
        if self.multi_region:
            if len(self.regions or []) != self.hosts:
                raise ValueError("regions must give one region per host")
            _rate_bits(self.inter_rate), _time_s(self.inter_delay)
            self.pair_links()
        self.host_sysctls()
        if not 0 <= self.loss <= 1:
            raise ValueError("loss must be in [0, 1]")
        if self.cc and not re.fullmatch(r"[a-z0-9_]{1,16}", self.cc):
            raise ValueError(f"bad congestion control {self.cc!r} (e.g. cubic, bbr, reno; '' keeps the machine's)")
        if self.mtu and not 576 <= self.mtu <= 65000:
            raise ValueError(f"mtu {self.mtu} is not in [576, 65000] (0: by the rate)")

    @property
    def multi_region(self) -> bool:
        return len(set(self.regions or [])) > 1

    def host_sysctls(self) -> List[str]:
        size = self.tcp_buffer_mib << 20
        buffers = ([f"net.ipv4.tcp_rmem=4096 131072 {size}", f"net.ipv4.tcp_wmem=4096 16384 {size}"]
                   if self.tcp_buffer_mib > 0 else [])
        for setting in self.sysctls:
            if not re.fullmatch(r"net\.ipv4\.[a-z0-9_.]+=[0-9 ]+", setting):
                raise ValueError(f"bad host sysctl {setting!r} (net.ipv4.KEY=NUMBERS: per-namespace only)")
        cc = [f"net.ipv4.tcp_congestion_control={self.cc}"] if self.cc else []
        return cc + buffers + list(self.sysctls)

    def pair_links(self) -> List[Tuple[str, str]]:
        """(rate, delay) of every region pair given in inter_pairs; ValueError on a bad entry."""
        links = []
        for item in filter(None, self.inter_pairs.split(";")):
            match = re.fullmatch(r"(\d+)-(\d+):([^,]+),(.+)", item)
            if not match:
                raise ValueError(f"bad region pair {item!r} (expected e.g. 0-2:1gbit,75ms)")
            _rate_bits(match.group(3)), _time_s(match.group(4))
            links.append((match.group(3), match.group(4)))
        return links

    def rates_bits(self) -> List[float]:
        """Every pipe's rate: the hosts' NICs and, across regions, the inter-region pipes."""
        rates = [self.rate] + ([self.inter_rate] + [r for r, _ in self.pair_links()] if self.multi_region else [])
        return [_rate_bits(r) for r in rates]

    def bottleneck_bits(self) -> float:
        """The slowest rate on the slowest path: the line rate a host's exchange traffic can reach."""
        return min(self.rates_bits())

    def link_mtu(self) -> int:
        """The TUN MTU the hosts use: `mtu` when given, else by the fastest pipe's rate, as on a real
        path: below 1 Gbit/s 1500, at and above it 9000 (jumbo frames; at 1500 the relay, sharing a
        core with the ranks, tops out near 830 Mbit/s). Packets far larger than a real path's distort
        what several flows do in one queue: at 1 Gbit/s, 25 ms a 10 ms queue holds 19 packets of
        64 KiB, and a four-connection exchange measured 503 ms a step against 275 ms at 9000 bytes.
        Above 1 Gbit/s the relay carries less than line rate at 9000 (10 Gbit/s needs mtu=65000)."""
        if self.mtu:
            return self.mtu
        return 1500 if max(self.rates_bits()) < 1e9 else 9000

    def max_one_way_s(self) -> float:
        delays = [self.delay] + ([self.inter_delay] + [d for _, d in self.pair_links()] if self.multi_region else [])
        return max(_time_s(d) for d in delays)

    def label(self) -> str:
        if self.multi_region:
            return (f"wan{len(set(self.regions or []))}r-{self.rate}-{self.delay}-{self.inter_rate}-"
                    f"{self.inter_delay}" + ("-pairs" if self.inter_pairs else "") + (f"-tcp{self.tcp_buffer_mib}m" if self.tcp_buffer_mib else ""))
        return (f"wan-{self.rate}-{self.delay}" + (f"-loss{self.loss:g}" if self.loss else "") +
                (f"-tcp{self.tcp_buffer_mib}m" if self.tcp_buffer_mib else "") +
                (f"-queue{self.queue_ms:g}ms" if self.queue_ms != 10.0 else "") +
                ("-" + "-".join(x.split("=")[0].rsplit(".", 1)[1] for x in self.sysctls) if self.sysctls else ""))


ALLOWED_CC = pathlib.Path("/proc/sys/net/ipv4/tcp_allowed_congestion_control")


def allow_congestion_control(cc: str) -> None:
    """A namespace may only choose a congestion control the machine allows (the kernel refuses the others with
    EPERM even to root): `cc` is added to the machine's allowed list when it is available but not listed. The
    machine's own default is left alone."""
    if not cc:
        return
    allowed = ALLOWED_CC.read_text().split()
    if cc in allowed:
        return
    available = pathlib.Path("/proc/sys/net/ipv4/tcp_available_congestion_control").read_text().split()
    if cc not in available:
        _run(["modprobe", f"tcp_{cc}"], check=False)
    _run(["sysctl", "-qw", f"net.ipv4.tcp_allowed_congestion_control={' '.join(allowed + [cc])}"])


def _proc_net_counters(text: str) -> Dict[str, int]:
    """/proc/net/snmp and /proc/net/netstat as nstat names them ("Tcp" + "RetransSegs", "TcpExt" + ...):
    each table is a line of names followed by a line of values, both led by the table's name."""
    out: Dict[str, int] = {}
    lines = text.splitlines()
    for names, values in zip(lines, lines[1:]):
        head, _, rest = names.partition(":")
        vhead, _, vrest = values.partition(":")
        if head != vhead or not rest.strip() or not rest.split()[0].isalpha():
            continue
        for name, value in zip(rest.split(), vrest.split()):
            if value.lstrip("-").isdigit():
                out[head + name] = int(value)
    return out


def _run(argv: List[str], timeout: float = 30, check: bool = True) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.strip()}")
    return done.stdout


def _namespaces() -> List[str]:
    out = _run(["ip", "netns", "list"], check=False)
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _proc_start(pid: int) -> str:
    """Start time of a process (to tell a live owner from a reused pid); 'gone' when it is not."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return "gone"


def state_dir(name: str) -> pathlib.Path:
    return pathlib.Path(f"/run/gradex-wan-{name}")


def owner_alive(name: str) -> bool:
    try:
        pid, start = (state_dir(name) / "owner").read_text().split()
    except (OSError, ValueError):
        return False
    return _proc_start(int(pid)) == start


def remove(name: str) -> None:
    """Kills every process inside <name>-h* namespaces (all started by a benchmark), deletes them and
    the state. Idempotent."""
    pattern = re.compile(rf"^{re.escape(name)}-h\d+$")
    for ns in (n for n in _namespaces() if pattern.match(n)):
        for sig, rounds in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
            pids = [int(p) for p in _run(["ip", "netns", "pids", ns], check=False).split()]
            for pid in pids:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            for _ in range(rounds if pids else 0):
                if not _run(["ip", "netns", "pids", ns], check=False).split():
                    break
                time.sleep(0.2)
        _run(["ip", "netns", "del", ns], check=False)
    try:
        for f in state_dir(name).iterdir():
            f.unlink()
        state_dir(name).rmdir()
    except FileNotFoundError:
        pass


class Wan:
    """The network of one WAN (network.py's interface) and its lifecycle; see the module's doc."""

    iface = DEV
    counted = True

    def __init__(self, spec: WanSpec, delayline: Optional[str] = None, log_dir: Optional[str] = None):
        spec.validate()
        self.spec = spec
        self.hosts = spec.hosts
        self.label = spec.label()
        self.rate = spec.rate
        self.delayline = delayline or default_delayline()
        self.log_dir = pathlib.Path(log_dir or ROOT / "build" / "bench-run" / "logs")
        self.master_addr = self.address(0)
        self.relay: Optional[subprocess.Popen] = None
        self._watchdog: Optional[subprocess.Popen] = None

    # -- network.py's interface ------------------------------------------------------------------
    def namespace(self, host: int) -> str:
        return f"{self.spec.name}-h{host}"

    def address(self, host: int) -> str:
        return f"{self.spec.subnet}.{host + 1}"

    def command(self, rank: int, argv: List[str]) -> List[str]:
        return ["ip", "netns", "exec", self.namespace(rank), *argv]

    def local_rank(self, rank: int) -> int:
        return 0

    def local_world(self, world: int) -> int:
        return 1

    def shape(self) -> None:
        """The WAN is shaped when built (network.py's Cluster re-shapes per rate; one Wan, one shape)."""

    def host_bytes(self) -> List[Tuple[int, int]]:
        """[(tx, rx)] IP bytes of each host's wan0 so far (a TUN device counts what the relay read
        from it as tx, what it wrote as rx; tx includes packets the WAN then dropped)."""
        out = []
        for h in range(self.hosts):
            stats = _run(["ip", "-n", self.namespace(h), "-s", "-j", "link", "show", DEV])
            link = json.loads(stats)[0]["stats64"]
            out.append((link["tx"]["bytes"], link["rx"]["bytes"]))
        return out

    def bytes_sent(self) -> int:
        return sum(tx for tx, _ in self.host_bytes())

    def wan_bytes(self) -> Optional[int]:
        """IP bytes that crossed between regions so far (the delay line's count of what its
        inter-region pipes accepted, both directions); None on a WAN of one region."""
        if not self.spec.multi_region or self.relay is None:
            return None
        return self.stats().get("wan_bytes")

    # TCP's loss-recovery counters (nstat's names) that say how a run's flows met the WAN's drops: segments
    # sent again, retransmission timeouts (a stall of at least 200 ms, doubling), tail loss probes, and
    # fast retransmits.
    TCP_LOSS_COUNTERS = ("TcpRetransSegs", "TcpExtTCPTimeouts", "TcpExtTCPLossProbes", "TcpExtTCPFastRetrans")

    def loss_counters(self) -> Dict[str, int]:
        """The delay line's queue and loss drops, and TCP_LOSS_COUNTERS summed over the hosts, so far: a
        run's figures are the difference of two reads."""
        out = {"queue_drops": 0, "loss_drops": 0}
        if self.relay is not None:
            relay = self.stats()
            out = {k: relay.get(k, 0) for k in out}
        for name in self.TCP_LOSS_COUNTERS:
            out[name] = 0
        for h in range(self.hosts):
            text = _run(["ip", "netns", "exec", self.namespace(h), "cat", "/proc/net/snmp", "/proc/net/netstat"])
            for name, value in _proc_net_counters(text).items():
                if name in out:
                    out[name] += value
        return out

    # -- lifecycle -------------------------------------------------------------------------------
    def __enter__(self) -> "Wan":
        self.up()
        return self

    def __exit__(self, *exc: object) -> None:
        self.down()

    def up(self) -> None:
        """Builds the WAN (first removing a stale one whose owner is gone). RuntimeError when another
        live owner holds this name, or when any step fails (after removing what was built)."""
        name = self.spec.name
        if not os.path.exists(self.delayline):
            raise RuntimeError(f"{self.delayline} is missing: build it (cmake --build build --target "
                               "gradex-delayline) or set GRADEX_DELAYLINE_EXE")
        if any(n.startswith(f"{name}-h") for n in _namespaces()) or state_dir(name).exists():
            if owner_alive(name):
                raise RuntimeError(f"another benchmark owns the WAN '{name}' ({state_dir(name)}/owner)")
            remove(name)
        try:
            self._build()
        except BaseException:
            self.down()
            raise

    def _build(self) -> None:
        spec = self.spec
        state = state_dir(spec.name)
        state.mkdir(parents=True)
        (state / "owner").write_text(f"{os.getpid()} {_proc_start(os.getpid())}\n")
        for h in range(self.hosts):
            ns = self.namespace(h)
            _run(["ip", "netns", "add", ns])
            _run(["ip", "-n", ns, "link", "set", "lo", "up"])
        self.log_dir.mkdir(parents=True, exist_ok=True)
        mtu = spec.link_mtu()
        argv = [self.delayline, "--netns", ",".join(self.namespace(h) for h in range(self.hosts)),
                "--subnet", spec.subnet, "--dev", DEV, "--intra", f"{spec.rate},{spec.delay}",
                "--mtu", str(mtu), "--queue-ms", str(spec.queue_ms), "--loss", str(spec.loss),
                "--seed", str(spec.seed)]
        if spec.multi_region:
            argv += ["--regions", ",".join(map(str, spec.regions or [])),
                     "--inter", f"{spec.inter_rate},{spec.inter_delay}"]
            if spec.inter_pairs:
                argv += ["--inter-pairs", spec.inter_pairs]
        log = open(self.log_dir / f"{spec.name}.delayline.log", "wb")
        self.relay = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                                      text=True, bufsize=1)
        log.close()
        assert self.relay.stdout is not None  # stdout=PIPE
        ready = self.relay.stdout.readline().strip()
        if not ready.startswith("ready"):
            self.relay.wait(timeout=10)
            raise RuntimeError(f"gradex-delayline did not start ({self.relay.returncode}): "
                               f"{(self.log_dir / f'{spec.name}.delayline.log').read_text().strip()}")
        allow_congestion_control(spec.cc)
        for h in range(self.hosts):
            ns = self.namespace(h)
            # IPv4 only: no IPv6 autoconfiguration chatter through the relay.
            _run(["ip", "netns", "exec", ns, "sysctl", "-qw", f"net.ipv6.conf.{DEV}.disable_ipv6=1"],
                 check=False)
            _run(["ip", "-n", ns, "link", "set", DEV, "mtu", str(mtu), "up"])
            _run(["ip", "-n", ns, "addr", "add", f"{self.address(h)}/24", "dev", DEV])
            for setting in spec.host_sysctls():
                # Per-namespace sysctls (net.ipv4.*): the emulated host's, never the machine's.
                _run(["ip", "netns", "exec", ns, "sysctl", "-qw", setting])
        # Detached (own session) so that it outlives an owner killed outright.
        self._watchdog = subprocess.Popen(
            [sys.executable, str(HERE / "wan.py"), "_watchdog", spec.name,
             (state / "owner").read_text().strip()],
            start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL)

    def down(self) -> None:
        """Removes everything: the ranks still running inside, the relay (its TUN devices with it),
        the namespaces. Idempotent."""
        if self.relay is not None:
            assert self.relay.stdin is not None and self.relay.stdout is not None  # both PIPE
            try:
                self.relay.stdin.close()  # end of input: the relay quits
                self.relay.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired):
                self.relay.kill()
                self.relay.wait()
            self.relay.stdout.close()
            self.relay = None
        remove(self.spec.name)
        if self._watchdog is not None:
            self._watchdog.wait(timeout=10)  # it exits once the owner file is gone
            self._watchdog = None

    # -- control ---------------------------------------------------------------------------------
    def control(self, line: str) -> str:
        """Sends one command to the relay (relay.h) and returns its one-line answer."""
        if self.relay is None or self.relay.poll() is not None:
            raise RuntimeError("the delay line is not running")
        assert self.relay.stdin is not None and self.relay.stdout is not None  # both PIPE
        self.relay.stdin.write(line + "\n")
        self.relay.stdin.flush()
        answer = self.relay.stdout.readline().strip()
        if not answer or answer.startswith("error"):
            raise RuntimeError(f"delay line: {line!r}: {answer or 'no answer'}")
        return answer

    def stats(self) -> Dict[str, int]:
        return {k: int(v) for k, v in (item.split("=") for item in self.control("stats").split()[1:])}

    def relay_cpu_s(self) -> float:
        """CPU seconds (user + system) the delay line has used so far."""
        if self.relay is None:
            raise RuntimeError("the delay line is not running")
        with open(f"/proc/{self.relay.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def set_loss(self, probability: float) -> None:
        self.control(f"loss {probability}")

    def blackhole(self, host: int) -> None:
        """Drops every packet from or to `host` until restore(host): a host cut off the network."""
        self.control(f"blackhole {host}")

    def restore(self, host: int) -> None:
        self.control(f"restore {host}")

    # -- measurements ----------------------------------------------------------------------------
    def ping(self, src: int, dst: int, count: int = 20, interval_s: float = 0.02,
             timeout_s: float = 1.0, port: int = 5300) -> Dict[str, float]:
        """UDP round trips from src to dst (linkcheck.py echo/ping), each lost after timeout_s:
        {'sent', 'received', 'min_ms', 'median_ms', 'max_ms'}."""
        lifetime = count * (interval_s + timeout_s) + 20
        server = subprocess.Popen(self.command(dst, [sys.executable, str(LINKCHECK), "echo", str(port),
                                                     str(lifetime)]),
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            out = _run(self.command(src, [sys.executable, str(LINKCHECK), "ping", self.address(dst),
                                          str(port), str(count), str(interval_s), str(timeout_s)]),
                       timeout=lifetime + 10)
        finally:
            server.terminate()
            server.wait(timeout=10)
        return {k: float(v) for k, v in (item.split("=") for item in out.split()[1:])}

    def throughput(self, src: int, dst: int, seconds: float = 3.0, port: int = 5201) -> float:
        """Goodput in bit/s of one TCP flow from src to dst for `seconds` (linkcheck.py send/serve)."""
        server = subprocess.Popen(self.command(dst, [sys.executable, str(LINKCHECK), "serve", str(port),
                                                     str(seconds)]),
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            _run(self.command(src, [sys.executable, str(LINKCHECK), "send", self.address(dst), str(port),
                                    str(seconds)]), timeout=seconds + 60)
            out, err = server.communicate(timeout=seconds + 30)
        finally:
            if server.poll() is None:
                server.kill()
                server.wait()
        words = out.split()
        if len(words) != 3 or words[0] != "received":
            raise RuntimeError(f"linkcheck serve: unexpected output {out!r} {err!r}")
        return int(words[1]) * 8 / float(words[2]) if float(words[2]) > 0 else 0.0


def kernel_limits(bdp_bytes: float, namespace: Optional[str] = None) -> Tuple[bool, str]:
    """Whether one TCP flow can fill a path of `bdp_bytes` (rate x RTT) as this kernel is set up,
    read-only, inside `namespace` (the sysctls of an emulated host; net.core.* are the machine's):
    (ok, one line naming the limits and, when one falls short, the commands that fix it). Needs
    the 'cat' and 'ip' commands only; changes nothing."""
    def read(key: str) -> str:
        path = "/proc/sys/" + key.replace(".", "/")
        argv = ["cat", path] if namespace is None else ["ip", "netns", "exec", namespace, "cat", path]
        return _run(argv, check=False).strip()

    rmem_max, wmem_max = int(read("net.core.rmem_max") or 0), int(read("net.core.wmem_max") or 0)
    tcp_rmem = [int(x) for x in read("net.ipv4.tcp_rmem").split()] or [0, 0, 0]
    tcp_wmem = [int(x) for x in read("net.ipv4.tcp_wmem").split()] or [0, 0, 0]
    cc = read("net.ipv4.tcp_congestion_control")
    idle_restart = read("net.ipv4.tcp_slow_start_after_idle")
    # Autotuning grows a flow's buffers up to tcp_[rw]mem[2], and only part of a buffer carries data
    # (the rest is skb overhead; tcp_adv_win_scale halves the receive window): a full window needs
    # about twice the BDP on both sides. net.core.[rw]mem_max cap only what a program sets itself
    # (SO_SNDBUF/SO_RCVBUF), so they are reported, and fixed only for such programs.
    need = -(-int(2 * bdp_bytes) // (1 << 20)) * (1 << 20)  # rounded up to a MiB
    mib = 1 << 20
    line = (f"kernel: tcp_rmem max {tcp_rmem[2] / mib:.0f} MiB, tcp_wmem max {tcp_wmem[2] / mib:.0f} MiB, "
            f"rmem_max {rmem_max / mib:.0f} MiB, wmem_max {wmem_max / mib:.0f} MiB, cc {cc or '?'}, "
            f"slow start after idle {'on' if idle_restart == '1' else 'off'}; "
            f"path BDP {bdp_bytes / mib:.1f} MiB")
    fixes = []
    if tcp_rmem[2] < need:
        fixes.append(f"sysctl -w net.ipv4.tcp_rmem='{tcp_rmem[0]} {tcp_rmem[1]} {need}'")
    if tcp_wmem[2] < need:
        fixes.append(f"sysctl -w net.ipv4.tcp_wmem='{tcp_wmem[0]} {tcp_wmem[1]} {need}'")
    explicit = ""
    if min(rmem_max, wmem_max) < need:
        explicit = (f" (programs that set SO_SNDBUF/SO_RCVBUF themselves also need "
                    f"net.core.rmem_max/wmem_max >= {need})")
    if not fixes:
        return True, line + ": one autotuned flow can fill it" + explicit
    return False, line + ": one flow is window-limited; fix: " + "; ".join(fixes) + explicit


def check(wan: Wan, seconds: float = 3.0) -> Dict[str, Any]:
    """The WAN's measured round trips (every host pair), one flow's throughput along the farthest
    pair, and the kernel limits line for that path, as a dict for a results file."""
    rtts = {f"{a}-{b}": wan.ping(a, b, count=10)
            for a in range(wan.hosts) for b in range(a + 1, wan.hosts)}
    far = max(rtts, key=lambda pair: rtts[pair]["median_ms"])
    src, dst = (int(h) for h in far.split("-"))
    bits = wan.throughput(src, dst, seconds)
    rtt_s = rtts[far]["median_ms"] / 1e3
    ok, limits = kernel_limits(wan.spec.bottleneck_bits() / 8 * rtt_s, wan.namespace(src))
    return {"rtt_ms": rtts, "rtt_ms_max": rtts[far]["median_ms"], "farthest": far,
            "configured_rtt_ms": 2e3 * wan.spec.max_one_way_s(), "flow_bits": bits, "flow": far,
            "line_bits": wan.spec.bottleneck_bits(), "kernel_ok": ok, "kernel_limits": limits}


def _watchdog(name: str, owner_pid: str, owner_start: str) -> None:
    token = f"{owner_pid} {owner_start}"
    while True:
        time.sleep(1)
        try:
            if (state_dir(name) / "owner").read_text().strip() != token:
                return  # torn down (or rebuilt by someone else)
        except OSError:
            return
        if _proc_start(int(owner_pid)) != owner_start:
            remove(name)
            return


def spec_from_args(args: argparse.Namespace) -> WanSpec:
    regions = [int(r) for r in args.regions.split(",")] if args.regions else None
    return WanSpec(hosts=args.hosts, rate=args.rate, delay=args.delay, regions=regions,
                   inter_rate=args.inter_rate, inter_delay=args.inter_delay, inter_pairs=args.inter_pairs,
                   loss=args.loss,
                   mtu=args.mtu, queue_ms=args.queue_ms, tcp_buffer_mib=args.tcp_buffer_mib, cc=args.cc, name=args.name,
                   subnet=args.subnet)


def add_spec_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--hosts", type=int, default=4)
    p.add_argument("--rate", default="1gbit", help="each host's NIC / intra-region rate")
    p.add_argument("--delay", default="25ms", help="one-way delay inside a region")
    p.add_argument("--regions", default="", help="region of each host, e.g. 0,0,1,1")
    p.add_argument("--inter-rate", default="1gbit")
    p.add_argument("--inter-delay", default="25ms")
    p.add_argument("--inter-pairs", default="", help="region pairs that differ, e.g. '0-2:1gbit,75ms;1-2:1gbit,150ms'")
    p.add_argument("--loss", type=float, default=0.0)
    p.add_argument("--mtu", type=int, default=0, help="TUN MTU (0: by the rate, WanSpec.link_mtu)")
    p.add_argument("--queue-ms", type=float, default=10.0)
    p.add_argument("--tcp-buffer-mib", type=int, default=0,
                   help="tcp_rmem/tcp_wmem max inside the hosts' namespaces (0: the machine's)")
    p.add_argument("--cc", default="cubic", help="the hosts' TCP congestion control ('' keeps the machine's)")
    p.add_argument("--name", default=default_name())
    p.add_argument("--subnet", default=default_subnet())


def main(argv: List[str]) -> int:
    if argv[:1] == ["_watchdog"]:
        _watchdog(*argv[1:4])
        return 0
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="what", required=True)
    for what in ("run", "check"):
        add_spec_args(sub.add_parser(what))
    sub.choices["run"].add_argument("cmd", nargs=argparse.REMAINDER)
    down = sub.add_parser("down")
    down.add_argument("--name", default=os.environ.get("GX_WAN_NAME", "gxw"))
    limits = sub.add_parser("limits")
    limits.add_argument("--rate", default="1gbit")
    limits.add_argument("--rtt-ms", type=float, default=50.0)
    args = p.parse_args(argv)
    if args.what == "down":
        remove(args.name)
        return 0
    if args.what == "limits":
        ok, line = kernel_limits(_rate_bits(args.rate) / 8 * args.rtt_ms / 1e3)
        print(line)
        return 0 if ok else 1
    with Wan(spec_from_args(args)) as wan:
        if args.what == "check":
            result = check(wan)
            for pair, r in result["rtt_ms"].items():
                print(f"rtt h{pair.replace('-', '-h')}: median {r['median_ms']:.2f} ms (min {r['min_ms']:.2f}, "
                      f"{int(r['received'])}/{int(r['sent'])} answered)")
            print(f"one flow h{result['flow'].replace('-', '->h')}: {result['flow_bits'] / 1e6:.0f} Mbit/s "
                  f"({result['flow_bits'] / result['line_bits']:.2f} of line rate)")
            print(result["kernel_limits"])
            return 0
        cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
        return subprocess.run(cmd).returncode if cmd else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
