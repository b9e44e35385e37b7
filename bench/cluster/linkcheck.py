#!/usr/bin/env python3
"""A minimal iperf and ping: TCP goodput and UDP round trips from one emulated host to another, to
check that a link is up and shaped at the rate and delay it claims. Standard library only.

    linkcheck.py serve PORT SECONDS          receive until the sender closes (or SECONDS pass); print
                                              "received <bytes> <seconds>" measured from the first byte
    linkcheck.py send ADDR PORT SECONDS      send zeros for SECONDS, then close
    linkcheck.py echo PORT SECONDS           answer UDP datagrams on PORT for SECONDS
    linkcheck.py ping ADDR PORT COUNT INTERVAL [TIMEOUT]
                                             COUNT UDP round trips INTERVAL seconds apart, each lost
                                             after TIMEOUT seconds (default 1) without answer; print
                                             "ping sent=N received=M min_ms=.. median_ms=.. max_ms=.."

Run the two sides in two namespaces (ip netns exec gx-h1 ... serve, ip netns exec gx-h0 ... send).
Every socket operation has a timeout, so a broken link fails instead of hanging.
"""
import socket
import sys
import time

CHUNK = 1 << 20


def serve(port, seconds):
    with socket.create_server(("0.0.0.0", port)) as server:
        server.settimeout(seconds + 10)
        conn, _ = server.accept()
        with conn:
            conn.settimeout(10)
            total, first = 0, None
            buffer = bytearray(CHUNK)
            while True:
                n = conn.recv_into(buffer)
                if n == 0:
                    break
                if first is None:
                    first = time.monotonic()
                total += n
            elapsed = time.monotonic() - first if first is not None else 0.0
    print(f"received {total} {elapsed:.6f}")


def send(address, port, seconds):
    deadline = time.monotonic() + 10
    while True:  # the server may still be starting in its namespace
        try:
            sock = socket.create_connection((address, port), timeout=10)
            break
        except ConnectionRefusedError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    with sock:
        payload = bytes(CHUNK)
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            sock.sendall(payload)


def echo(port, seconds):
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("0.0.0.0", port))
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            sock.settimeout(max(0.01, end - time.monotonic()))
            try:
                data, peer = sock.recvfrom(2048)
            except socket.timeout:
                break
            sock.sendto(data, peer)


def ping(address, port, count, interval, timeout=1.0):
    """A probe is lost when no answer comes within `timeout` s; a late answer to an earlier probe is
    ignored (each carries its sequence number)."""
    rtts = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.connect((address, port))
        # Until the echo side answers once (it may still be starting in its namespace), for at most
        # 3 s: past that the probes run anyway and count what a cut-off or lossy path loses.
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            try:
                sock.send(b"hello")
                sock.settimeout(0.2)
                sock.recv(64)
                break
            except ConnectionRefusedError:
                time.sleep(0.05)
            except socket.timeout:
                pass
        for seq in range(count):
            sent = time.monotonic()
            sock.send(seq.to_bytes(4, "big"))
            while True:
                left = sent + timeout - time.monotonic()
                if left <= 0:
                    break
                sock.settimeout(left)
                try:
                    data = sock.recv(64)
                except (socket.timeout, ConnectionRefusedError):
                    break
                if data[:4] == seq.to_bytes(4, "big"):
                    rtts.append((time.monotonic() - sent) * 1e3)
                    break
            time.sleep(max(0.0, sent + interval - time.monotonic()))
    rtts.sort()
    stats = (rtts[0], rtts[len(rtts) // 2], rtts[-1]) if rtts else (0.0, 0.0, 0.0)
    print("ping sent={} received={} min_ms={:.3f} median_ms={:.3f} max_ms={:.3f}".format(
        count, len(rtts), *stats))


def main(argv):
    if len(argv) == 4 and argv[1] == "serve":
        serve(int(argv[2]), float(argv[3]))
    elif len(argv) == 5 and argv[1] == "send":
        send(argv[2], int(argv[3]), float(argv[4]))
    elif len(argv) == 4 and argv[1] == "echo":
        echo(int(argv[2]), float(argv[3]))
    elif len(argv) in (6, 7) and argv[1] == "ping":
        ping(argv[2], int(argv[3]), int(argv[4]), float(argv[5]), *map(float, argv[6:]))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv)
