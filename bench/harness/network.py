"""Where the ranks of one benchmark run live, how they reach each other, and how many bytes they put
on the wire, counted by the kernel (independently of gradex's and torch's own counters).

Four networks:
  Cluster(H, L)     L ranks per host (default 1): rank r in namespace gx-h<r // L>
                    (bench/cluster/cluster.sh up), on eth0 at 198.18.0.<r // L + 1>; counters of
                    each host's veth, read on the switch side
  NamespaceLoopback every rank inside gx-h0, on its own loopback: unshaped, yet with counters that
                    only this benchmark's traffic touches
  RootLoopback      every rank in the root namespace on 127.0.0.1 (when namespaces are unavailable):
                    no byte counters, since other programs share that loopback
  wan.Wan           (bench/harness/wan.py) one rank per host in namespace gxw-h<r> on a TUN device,
                    wan0, at 198.19.0.<r + 1>, joined by a userspace delay line (per-region rates,
                    delays, loss); counters of each host's wan0

Namespace names and subnet follow cluster.sh: GX_CLUSTER_NAME (default gx: gx-h<i>, gx-sw) and
GX_CLUSTER_SUBNET (default 198.18.0), read from the environment when a network is created.
"""
import json
import os
import pathlib
import subprocess
from typing import Any, Dict, List, Mapping, Optional, Protocol, Tuple

ROOT = pathlib.Path(__file__).resolve().parents[2]
CLUSTER_SH = ROOT / "bench" / "cluster" / "cluster.sh"


def cluster_name() -> str:
    return os.environ.get("GX_CLUSTER_NAME", "gx")


def cluster_subnet() -> str:
    return os.environ.get("GX_CLUSTER_SUBNET", "198.18.0")


def _ip_json(*args: str) -> Any:
    out = subprocess.run(["ip", "-j", *args], check=True, capture_output=True, text=True, timeout=10)
    return json.loads(out.stdout)


def _link_stats(namespace: str) -> Dict[str, Tuple[int, int]]:
    """{ifname: (tx_bytes, rx_bytes)} of every interface in `namespace`."""
    return {link["ifname"]: (link["stats64"]["tx"]["bytes"], link["stats64"]["rx"]["bytes"])
            for link in _ip_json("-n", namespace, "-s", "link", "show")}


class Network(Protocol):
    """What a launcher needs of a network (Cluster, NamespaceLoopback, RootLoopback, wan.Wan): where rank r
    runs (command), its place on its host, the rendezvous address, the interface to pin, whether the kernel
    counts its bytes, and its label in results."""
    iface: str
    counted: bool
    label: str
    master_addr: str

    def command(self, rank: int, argv: List[str]) -> List[str]: ...

    def local_rank(self, rank: int) -> int: ...

    def local_world(self, world: int) -> int: ...

    def shape(self) -> None: ...


def common_env(network: Network, rank: int, world: int, port: int) -> Dict[str, str]:
    """Launcher variables for one rank: what torchrun would set, plus the interface pins.
    UCX_TLS=tcp,self: the namespaces share one kernel and /dev/shm, so UCX would otherwise pick
    shared memory between "hosts" and bypass the shaped links. GRADEX_SHM=0: ranks that share a
    namespace (loopback, or the L ranks of one emulated host) also talk tcp, over that namespace's
    own loopback, which never crosses a host's shaped link."""
    return {
        "RANK": str(rank), "WORLD_SIZE": str(world),
        "LOCAL_RANK": str(network.local_rank(rank)), "LOCAL_WORLD_SIZE": str(network.local_world(world)),
        "MASTER_ADDR": network.master_addr, "MASTER_PORT": str(port),
        "GRADEX_IFACE": network.iface, "GLOO_SOCKET_IFNAME": network.iface,
        "UCX_TLS": "tcp,self", "GRADEX_SHM": "0", "OMP_NUM_THREADS": "1",
    }


class Cluster:
    iface = "eth0"
    counted = True

    def __init__(self, hosts: int, rate: str, delay: str = "", ranks_per_host: int = 1):
        self.hosts, self.rate, self.delay, self.ranks_per_host = hosts, rate, delay, ranks_per_host
        self.label = rate
        self.name_prefix = f"{cluster_name()}-h"
        self.switch = f"{cluster_name()}-sw"
        self.master_addr = f"{cluster_subnet()}.1"

    def host_of(self, rank: int) -> int:
        return rank // self.ranks_per_host

    def command(self, rank: int, argv: List[str]) -> List[str]:
        return ["ip", "netns", "exec", f"{self.name_prefix}{self.host_of(rank)}", *argv]

    def local_rank(self, rank: int) -> int:
        return rank % self.ranks_per_host

    def local_world(self, world: int) -> int:
        return self.ranks_per_host

    def shape(self) -> None:
        delay = ["--delay", self.delay] if self.delay else []
        subprocess.run([str(CLUSTER_SH), "shape", "--rate", self.rate, *delay], check=True,
                       timeout=60, stdout=subprocess.DEVNULL)

    def host_bytes(self) -> List[Tuple[int, int]]:
        """[(tx, rx)] bytes of each host's eth0 so far, in host order (data, headers and ACKs;
        after shaping), read on the switch side of each host's veth pair: port p<i> receives
        exactly what host i's eth0 transmits, and transmits what it receives."""
        stats = _link_stats(self.switch)
        return [(stats[f"p{i}"][1], stats[f"p{i}"][0]) for i in range(self.hosts)]

    def bytes_sent(self) -> Optional[int]:
        """Total bytes all hosts transmitted so far."""
        return sum(tx for tx, _ in self.host_bytes())


class NamespaceLoopback:
    master_addr = "127.0.0.1"
    iface = "lo"
    counted = True
    label = "loopback"

    def __init__(self) -> None:
        self.namespace: Optional[str] = f"{cluster_name()}-h0"

    def command(self, rank: int, argv: List[str]) -> List[str]:
        return ["ip", "netns", "exec", str(self.namespace), *argv]

    def local_rank(self, rank: int) -> int:
        return rank

    def local_world(self, world: int) -> int:
        return world

    def shape(self) -> None:
        pass

    def bytes_sent(self) -> Optional[int]:
        return _link_stats(str(self.namespace))["lo"][0]  # every packet on lo is sent once


class RootLoopback(NamespaceLoopback):
    counted = False

    def __init__(self) -> None:
        self.namespace = None

    def command(self, rank: int, argv: List[str]) -> List[str]:
        return list(argv)

    def bytes_sent(self) -> Optional[int]:
        return None


_ports = [0]  # runs so far in this process: each takes the next port


def pick_port(network: Network) -> int:
    """A TCP port for the rendezvous. Inside our namespaces nothing else listens, so a fixed one is
    safe; in the root namespace one free below the ephemeral range (bench/harness/ports.py)."""
    if isinstance(network, RootLoopback):
        from gradex._ports import free_port
        return free_port()
    _ports[0] += 1  # fresh port per run: no TIME_WAIT clash
    return 29400 + _ports[0] % 500


def environment(network: Network, rank: int, world: int, port: int,
                extra: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
    env = dict(os.environ)
    # Rank programs run as modules of the bench package (python -m bench.train.train_rank): the
    # repository root is their import path wherever the launcher was started.
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")]))
    env.update(common_env(network, rank, world, port))
    env.update(extra or {})
    return env
