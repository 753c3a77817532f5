# SPDX-License-Identifier: MIT
"""Shared fixtures: start the real sbx-server binary on loopback and talk HTTP to it.

SBX_BUILD selects the build directory (default: build/), so the same suite runs against the
ASan+UBSan build in CI.
"""
import http.client
import json
import os
import re
import secrets
import socket
import subprocess
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.environ.get("SBX_BUILD", os.path.join(ROOT, "build"))
SERVER_BIN = os.path.join(BUILD, "sbx-server")


# A sanitizer report in the server's stderr fails the test that stopped it (the ASan+UBSan
# build runs with abort_on_error/halt_on_error, but a report must never pass unnoticed).
SANITIZER_REPORT = re.compile(
    r"ERROR: AddressSanitizer|ERROR: LeakSanitizer|SUMMARY: UndefinedBehaviorSanitizer"
    r"|:\d+:\d+: runtime error: ")


def assert_no_sanitizer_report(stderr_text):
    m = SANITIZER_REPORT.search(stderr_text)
    assert m is None, "sanitizer report in sbx-server stderr:\n" + stderr_text[-8000:]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A running sbx-server process plus small HTTP helpers."""

    def __init__(self, env=None, args=(), token=None, unix_path=None, binary=SERVER_BIN):
        self.token = token if token is not None else secrets.token_hex(32)
        self.port = free_port()
        self.unix_path = unix_path
        e = {k: v for k, v in os.environ.items() if not k.startswith("SBX_")}
        e["SBX_PORT"] = str(self.port)
        if self.token:
            e["SBX_TOKEN"] = self.token
        if unix_path:
            e["SBX_LISTEN"] = "unix:" + unix_path
        e.update(env or {})
        self.proc = subprocess.Popen([binary, *args], env=e, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE)
        self._wait_ready()

    def _wait_ready(self):
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                out, err = self.proc.communicate()
                raise RuntimeError(f"sbx-server exited {self.proc.returncode}: {err.decode()}")
            try:
                if self.unix_path:
                    s = socket.socket(socket.AF_UNIX)
                    s.connect(self.unix_path)
                else:
                    s = socket.create_connection(("127.0.0.1", self.port), timeout=1)
                s.close()
                return
            except OSError:
                time.sleep(0.02)
        raise RuntimeError("sbx-server did not start listening")

    def stop(self):
        """Stop the server (once) and return its stderr; fails on a sanitizer report."""
        if getattr(self, "_stderr", None) is not None:
            return self._stderr
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        out, err = self.proc.communicate()
        self._stderr = err.decode(errors="replace")
        assert_no_sanitizer_report(self._stderr)
        return self._stderr

    # -- HTTP helpers -------------------------------------------------------------------------
    def conn(self, timeout=30):
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)

    def headers(self, extra=None, token=True):
        h = {}
        if token and self.token:
            h["X-Sandbox-Token"] = self.token
        h.update(extra or {})
        return h

    def request(self, method, path, body=None, headers=None, token=True, timeout=30):
        """Return (status, headers dict (lowercase keys), body bytes)."""
        c = self.conn(timeout)
        if isinstance(body, (dict, list)):
            body = json.dumps(body).encode()
        c.request(method, path, body=body, headers=self.headers(headers, token))
        r = c.getresponse()
        data = r.read()
        hdrs = {k.lower(): v for k, v in r.getheaders()}
        c.close()
        return r.status, hdrs, data

    def json(self, method, path, body=None, **kw):
        status, _, data = self.request(method, path, body, **kw)
        return status, json.loads(data) if data else None

    def exec(self, body, **kw):
        """POST /v1/exec; return (status, list of events) for a stream, or (status, json)."""
        status, hdrs, data = self.request("POST", "/v1/exec", body, **kw)
        if status != 200 or "ndjson" not in hdrs.get("content-type", ""):
            return status, json.loads(data) if data else None
        return status, [json.loads(l) for l in data.split(b"\n") if l]

    def raw(self, payload, timeout=5, read_all=True):
        """Send raw bytes on a fresh TCP connection and return what comes back."""
        s = socket.create_connection(("127.0.0.1", self.port), timeout=timeout)
        s.sendall(payload)
        chunks = []
        try:
            while True:
                b = s.recv(65536)
                if not b:
                    break
                chunks.append(b)
                if not read_all:
                    break
        except socket.timeout:
            pass
        s.close()
        return b"".join(chunks)


def status_of(raw_response):
    """Status code of a raw HTTP response (first line)."""
    line = raw_response.split(b"\r\n", 1)[0]
    parts = line.split(b" ")
    return int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else None


def output_of(events, stream="stdout"):
    """Concatenate the exact bytes of stdout/stderr events (base64 or data_b64 aware)."""
    import base64
    out = []  # joined once: += on bytes is quadratic (minutes for a 50 MB stream)
    for e in events:
        if e.get("event") != stream:
            continue
        if "data_b64" in e:
            out.append(base64.b64decode(e["data_b64"]))
        elif e.get("_b64"):
            out.append(base64.b64decode(e["data"]))
        else:
            out.append(e["data"].encode())
    return b"".join(out)


@pytest.fixture
def server():
    s = Server()
    yield s
    s.stop()


@pytest.fixture
def make_server():
    started = []

    def start(**kw):
        s = Server(**kw)
        started.append(s)
        return s

    yield start
    for s in started:
        s.stop()
