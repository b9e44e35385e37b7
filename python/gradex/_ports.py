"""Ports for rendezvous stores that ranks on this machine bind (MASTER_PORT: `python -m gradex.tensorflow.run`,
the benchmark harness, the tests): a port found free here is bound later by another process, so it is drawn at
random below the kernel's ephemeral range. A port taken as
port 0 comes from that range, where any process's outgoing connection (UCX's, gloo's, another test's) may take
it before the rank meant to bind it does: a race's rank 0 then failed with "MASTER_PORT ... is already in use"
in CI, three test workers beside it."""
import random
import socket
from typing import Container

_rng = random.Random()


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_ports(count: int = 1, avoid: Container[int] = ()) -> int:
    """A port p with p .. p + count - 1 free a moment ago, below the ephemeral range and outside `avoid`."""
    high = max(10000 + count + 1, _ephemeral_low() - count)
    for _ in range(200):
        p = _rng.randrange(10000, high)
        if any(q in avoid for q in range(p, p + count)):
            continue
        sockets = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
        try:
            for i, s in enumerate(sockets):
                s.bind(("127.0.0.1", p + i))
            return p
        except OSError:
            continue
        finally:
            for s in sockets:
                s.close()
    raise RuntimeError(f"no {count} consecutive free ports below {high}")


def free_port() -> int:
    return free_ports(1)
