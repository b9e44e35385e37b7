"""Bytes a host transmits, read from the kernel's interface counters (the race's per-host byte figures)."""


class TxCounter:
    """Bytes this host transmitted on `iface` during the spans between start() and stop() (iface None or
    empty: counts nothing, for ranks on loopback)."""

    def __init__(self, iface):
        self.path = f"/sys/class/net/{iface}/statistics/tx_bytes" if iface else None
        self.total, self._at = 0, None

    def _read(self):
        assert self.path is not None  # only called when an interface is counted
        with open(self.path) as f:
            return int(f.read())

    def start(self):
        if self.path:
            self._at = self._read()

    def stop(self):
        if self.path:
            self.total += self._read() - self._at
