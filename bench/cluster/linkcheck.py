#!/usr/bin/env python3
"""A minimal iperf: TCP goodput from one emulated host to another, to check that a link is up and
shaped at the rate it claims. Standard library only.

    linkcheck.py serve PORT SECONDS          receive until the sender closes (or SECONDS pass); print
                                              "received <bytes> <seconds>" measured from the first byte
    linkcheck.py send ADDR PORT SECONDS      send zeros for SECONDS, then close

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


def main(argv):
    if len(argv) == 4 and argv[1] == "serve":
        serve(int(argv[2]), float(argv[3]))
    elif len(argv) == 5 and argv[1] == "send":
        send(argv[2], int(argv[3]), float(argv[4]))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv)
