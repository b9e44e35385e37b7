"""A small TCP key-value store for bootstrapping gradex engines without a framework store.

TensorFlow has no store to lend (torch.distributed has one), and every engine created from the environment
would start its own server on MASTER_PORT, so a process could hold only one. gradex.tensorflow instead runs
one store per job: rank 0 serves it on MASTER_ADDR:MASTER_PORT for the lifetime of gxt.init() ..
gxt.shutdown(), and every engine bootstraps through it under a key prefix of its own (gradex._capi's
StoreAdapter presents it to the C API).

Wire format, per request: op (1 byte: S set, G get, W wait, A add), key length (u32) + key, payload length
(u64) + payload (set: the value; wait: timeout in ms as i64; add: delta as i64). Reply: status (1 byte:
0 ok, 1 timed out, 2 no such key) + payload length (u64) + payload.
"""
import datetime
import socket
import socketserver
import struct
import threading
import time

from .. import _errors

_HEAD = struct.Struct("<cI")
_LEN = struct.Struct("<Q")
_I64 = struct.Struct("<q")


def _recv_exact(sock, n):
    chunks = []
    while n:
        chunk = sock.recv(min(n, 1 << 20))
        if not chunk:
            raise ConnectionError("store connection closed")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


class _Table:
    def __init__(self):
        self.values = {}
        self.cond = threading.Condition()

    def set(self, key, value):
        with self.cond:
            self.values[key] = value
            self.cond.notify_all()

    def wait(self, key, timeout_s):
        deadline = time.monotonic() + timeout_s
        with self.cond:
            while key not in self.values:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.cond.wait(left)
            return True

    def add(self, key, delta):
        with self.cond:
            value = int(self.values.get(key, b"0")) + delta
            self.values[key] = str(value).encode()
            self.cond.notify_all()
            return value


class _Handler(socketserver.BaseRequestHandler):
    def handle(self):
        table = self.server.table
        sock = self.request
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            while True:
                op, key_len = _HEAD.unpack(_recv_exact(sock, _HEAD.size))
                key = _recv_exact(sock, key_len).decode()
                (length,) = _LEN.unpack(_recv_exact(sock, _LEN.size))
                payload = _recv_exact(sock, length)
                status, reply = 0, b""
                if op == b"S":
                    table.set(key, payload)
                elif op == b"G":
                    with table.cond:
                        reply = table.values.get(key)
                    status, reply = (0, reply) if reply is not None else (2, b"")
                elif op == b"W":
                    status = 0 if table.wait(key, _I64.unpack(payload)[0] / 1000.0) else 1
                elif op == b"A":
                    reply = str(table.add(key, _I64.unpack(payload)[0])).encode()
                else:
                    return  # not our protocol: drop the connection
                sock.sendall(bytes([status]) + _LEN.pack(len(reply)) + reply)
        except (ConnectionError, OSError, struct.error):
            return


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


class TcpStore:
    """Client of the job's store; rank 0 (serve=True) also runs the server. Thread-safe."""

    def __init__(self, host, port, serve, timeout_s):
        self._server = None
        self._lock = threading.Lock()
        if serve:
            bind = host if host in ("127.0.0.1", "localhost", "::1") else ""
            try:
                self._server = _Server((bind, port), _Handler)
            except OSError as exc:
                raise _errors.ConfigError(
                    f"gradex: MASTER_PORT {port} is already in use on this host ({exc})") from None
            self._server.table = _Table()
            threading.Thread(target=self._server.serve_forever, name="gradex-store", daemon=True).start()
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                self._sock = socket.create_connection((host, port), timeout=max(1.0, timeout_s))
                break
            except OSError as exc:
                if time.monotonic() >= deadline:
                    raise _errors.TimeoutError(
                        f"gradex: cannot reach the store at MASTER_ADDR={host} MASTER_PORT={port} within "
                        f"{timeout_s:g} s (GRADEX_TIMEOUT_S): {exc}") from None
                time.sleep(0.1)
        self._sock.settimeout(None)
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def _request(self, op, key, payload=b""):
        k = key.encode()
        with self._lock:
            self._sock.sendall(_HEAD.pack(op, len(k)) + k + _LEN.pack(len(payload)) + payload)
            status = _recv_exact(self._sock, 1)[0]
            (length,) = _LEN.unpack(_recv_exact(self._sock, _LEN.size))
            return status, _recv_exact(self._sock, length)

    def set(self, key, value):
        self._request(b"S", key, bytes(value))

    def get(self, key):
        status, value = self._request(b"G", key)
        if status != 0:
            raise KeyError(key)
        return value

    def wait(self, keys, timeout):
        ms = int(timeout.total_seconds() * 1000) if isinstance(timeout, datetime.timedelta) else int(timeout)
        for key in keys:
            status, _ = self._request(b"W", key, _I64.pack(ms))
            if status != 0:
                raise TimeoutError(f"store key '{key}' did not appear within {ms} ms")

    def add(self, key, delta):
        return int(self._request(b"A", key, _I64.pack(int(delta)))[1])

    def close(self):
        try:
            self._sock.close()
        except OSError:
            pass
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


class LocalStore:
    """The store of a single-process job (world size 1): a dictionary."""

    def __init__(self):
        self._table = _Table()

    def set(self, key, value):
        self._table.set(key, bytes(value))

    def get(self, key):
        with self._table.cond:
            return self._table.values[key]

    def wait(self, keys, timeout):
        for key in keys:
            if not self._table.wait(key, timeout.total_seconds()):
                raise TimeoutError(f"store key '{key}' did not appear")

    def add(self, key, delta):
        return self._table.add(key, int(delta))

    def close(self):
        pass
