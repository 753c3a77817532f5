# SPDX-License-Identifier: MIT
"""A tiny HTTP/1.1 client over a raw socket, for tests that need exact bytes on the wire:
keep-alive reuse, pipelining, half-read streams, connections the server must close."""
import json
import select
import socket
import time


def request_bytes(method, path, token=None, body=b"", headers=None, version="HTTP/1.1",
                  content_length=True):
    """Build one request. headers: list of (name, value) pairs, sent in order."""
    if isinstance(body, (dict, list)):
        body = json.dumps(body).encode()
    lines = [f"{method} {path} {version}", "Host: 127.0.0.1"]
    if token:
        lines.append(f"X-Sandbox-Token: {token}")
    for k, v in headers or []:
        lines.append(f"{k}: {v}")
    if content_length and (body or method in ("POST", "PUT")):
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


class RawConn:
    def __init__(self, server=None, timeout=10, unix_path=None, rcvbuf=None):
        if unix_path:
            self.s = socket.socket(socket.AF_UNIX)
        else:
            self.s = socket.socket(socket.AF_INET)
        if rcvbuf:
            self.s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.s.settimeout(timeout)
        self.s.connect(unix_path or ("127.0.0.1", server.port))
        self.buf = b""

    def close(self):
        self.s.close()

    def __enter__(self):
        return self

    def __exit__(self, *a):
        self.close()

    def send(self, data):
        self.s.sendall(data)

    def _fill(self):
        b = self.s.recv(1 << 20)
        if not b:
            raise EOFError("connection closed by the server")
        self.buf += b

    def read_until(self, sep):
        start = 0
        while True:
            i = self.buf.find(sep, start)
            if i >= 0:
                out, self.buf = self.buf[:i + len(sep)], self.buf[i + len(sep):]
                return out
            start = max(0, len(self.buf) - len(sep))
            self._fill()

    def read_n(self, n):
        while len(self.buf) < n:
            self._fill()
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def read_head(self):
        head = self.read_until(b"\r\n\r\n").decode("latin-1")
        lines = head.split("\r\n")
        status = int(lines[0].split(" ")[1])
        hdrs = {}
        for line in lines[1:]:
            if line:
                k, v = line.split(":", 1)
                hdrs[k.strip().lower()] = v.strip()
        return status, hdrs

    def read_chunk(self):
        """One chunk of a chunked body; b"" at the end (the terminator is consumed)."""
        size = int(self.read_until(b"\r\n")[:-2], 16)
        data = self.read_n(size + 2)[:-2]
        return data

    def response(self):
        """(status, headers, body) of the next response."""
        status, hdrs = self.read_head()
        if hdrs.get("transfer-encoding") == "chunked":
            body = []
            while True:
                d = self.read_chunk()
                if not d:
                    break
                body.append(d)
            return status, hdrs, b"".join(body)
        if "content-length" in hdrs:
            return status, hdrs, self.read_n(int(hdrs["content-length"]))
        rest = self.buf
        self.buf = b""
        try:
            while True:
                b = self.s.recv(1 << 20)
                if not b:
                    break
                rest += b
        except OSError:
            pass
        return status, hdrs, rest

    def events(self):
        """Iterate the NDJSON events of a chunked stream (after read_head)."""
        pending = b""
        while True:
            d = self.read_chunk()
            if not d:
                break
            pending += d
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                if line:
                    yield json.loads(line)

    def closed_by_peer(self, timeout=3.0):
        """True if the server closes the connection (EOF or reset) within timeout, with no
        further bytes sent."""
        deadline = time.monotonic() + timeout
        if self.buf:
            return False
        while time.monotonic() < deadline:
            r, _, _ = select.select([self.s], [], [], max(0.0, deadline - time.monotonic()))
            if not r:
                continue
            try:
                b = self.s.recv(65536)
            except ConnectionResetError:
                return True
            if not b:
                return True
            self.buf += b
            return False
        return False
