"""Ports for the tests' own stores and process groups (MASTER_PORT, a gloo TCP store): gradex/_ports.py's,
drawn below the kernel's ephemeral range (pytest-xdist runs three tests at once), never torchft's fixed ones."""
from gradex._ports import free_ports as _free_ports

# torchft's own integration tests (torchft_suite.py) bind their Managers' servers at 19530 + a replica's id.
TORCHFT_FIXED_PORTS = range(19530, 19540)


def free_ports(count: int = 1) -> int:
    """A port p with p .. p + count - 1 free a moment ago, below the ephemeral range."""
    return _free_ports(count, avoid=TORCHFT_FIXED_PORTS)


def free_port() -> int:
    return free_ports(1)
