"""A private emulated cluster for the LM race: P hosts as network namespaces behind a bridge, every link
shaped by tbf in both directions. Names and addresses are unique to this run (gxlm<id>-h<i>, gxlm<id>-sw,
198.19.<id>.0/24), so it never collides with bench/cluster's gx-* cluster or another helper's run. Always
removed by close() (also registered with atexit)."""
import atexit
import os
import subprocess


def _run(*args):
    subprocess.run(args, check=True, timeout=30, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


class PrivateCluster:
    def __init__(self, hosts, rate):
        taken = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        self.id = next(i for i in [os.getpid() % 200 + 20, *range(20, 220)] if f"gxlm{i}-" not in taken)
        self.hosts, self.rate = hosts, rate
        self.prefix = f"gxlm{self.id}"
        self.switch = f"{self.prefix}-sw"
        self.subnet = f"198.19.{self.id}"
        self.master_addr = f"{self.subnet}.1"
        self.iface = "eth0"
        self._made = []
        atexit.register(self.close)
        try:
            self._build()
        except BaseException:
            self.close()
            raise

    def host(self, i):
        return f"{self.prefix}-h{i}"

    def _build(self):
        _run("ip", "netns", "add", self.switch)
        self._made.append(self.switch)
        _run("ip", "-n", self.switch, "link", "set", "lo", "up")
        _run("ip", "-n", self.switch, "link", "add", "br0", "type", "bridge", "stp_state", "0")
        _run("ip", "-n", self.switch, "link", "set", "br0", "up")
        for i in range(self.hosts):
            ns = self.host(i)
            _run("ip", "netns", "add", ns)
            self._made.append(ns)
            _run("ip", "-n", ns, "link", "set", "lo", "up")
            _run("ip", "link", "add", "name", "eth0", "netns", ns, "type", "veth", "peer", "name", f"p{i}",
                 "netns", self.switch)
            _run("ip", "-n", self.switch, "link", "set", f"p{i}", "master", "br0", "up")
            _run("ip", "-n", ns, "addr", "add", f"{self.subnet}.{i + 1}/24", "dev", "eth0")
            _run("ip", "-n", ns, "link", "set", "eth0", "up")
        self.shape(self.rate)

    def shape(self, rate):
        """tbf at `rate` on each host's egress and on the switch port towards it (full duplex)."""
        self.rate = rate
        bps = int(rate[:-4]) * {"k": 10**3, "m": 10**6, "g": 10**9}[rate[-4]] if rate[-4] in "kmg" else int(rate[:-3])
        burst = max(32 * 1024, bps // 8 // 250)  # ~4 ms of traffic, at least 32 KiB
        for i in range(self.hosts):
            for ns, dev in ((self.host(i), "eth0"), (self.switch, f"p{i}")):
                subprocess.run(["ip", "netns", "exec", ns, "tc", "qdisc", "del", "dev", dev, "root"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=30)
                _run("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate", rate,
                     "burst", str(burst), "latency", "20ms")

    def command(self, rank, argv):
        return ["ip", "netns", "exec", self.host(rank), *argv]

    def bytes_sent(self):
        """Bytes all hosts transmitted (what the switch ports received), headers and ACKs included."""
        total = 0
        for i in range(self.hosts):
            out = subprocess.run(["ip", "netns", "exec", self.switch, "cat", f"/sys/class/net/p{i}/statistics/rx_bytes"],
                                 check=True, capture_output=True, text=True, timeout=30)
            total += int(out.stdout)
        return total

    def close(self):
        for ns in reversed(self._made):
            pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()
            for pid in pids:  # only processes inside our own namespaces
                try:
                    os.kill(int(pid), 9)
                except (ProcessLookupError, ValueError):
                    pass
            subprocess.run(["ip", "netns", "del", ns], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self._made = []
