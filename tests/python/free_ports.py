"""Ports for the tests' own stores and process groups (MASTER_PORT, a gloo TCP store): a port found free
here is bound later by another process, so it is drawn at random below the kernel's ephemeral range.
Ports that the tests' processes bind as port 0 come from that range, and a port freed there can be handed
to one of them (pytest-xdist runs three tests at once) before the process meant to bind it does."""
import random
import socket

_rng = random.Random()
# torchft's own integration tests (torchft_suite.py) bind their Managers' servers at 19530 + a replica's id.
TORCHFT_FIXED_PORTS = range(19530, 19540)


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_ports(count: int = 1) -> int:
    """A port p with p .. p + count - 1 free a moment ago, below the ephemeral range."""
    high = max(10000 + count + 1, _ephemeral_low() - count)
    for _ in range(200):
        p = _rng.randrange(10000, high)
        if any(q in TORCHFT_FIXED_PORTS for q in range(p, p + count)):
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
