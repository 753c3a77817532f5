# SPDX-License-Identifier: MIT
"""Streams through the whole path (client -> sbx-control edge -> sbx-node -> agent -> a service in
the run): a WebSocket to a service inside a `-nonet` run, the WebSocket as a lease on the run
(pause cuts it, a resumed generation serves a new one), and chunked/streamed HTTP through the
edge (the agent's NDJSON exec stream arriving incrementally, request bodies that are not
replayable going straight through).

The service inside the run is Python stdlib only (SERVICE below): a WebSocket echo server on
127.0.0.1:8081 written on raw sockets, and a small HTTP server on 127.0.0.1:8082 that reports
what request body it received. The test's WebSocket client is raw sockets too, so every byte of
the handshake and of the frames is the test's own. Every refusal has a positive control."""
import base64
import hashlib
import json
import os
import socket
import ssl
import struct
import time
import urllib.parse

import pytest

from conftest import wait_until
from sbxplatform import AGENT_PORT, Platform, open_socket

WS_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
WS_PORT = 8081  # exposed as websocket only
HTTP_PORT = 8082  # exposed as http only

SERVICE = r'''
import base64, hashlib, json, socket, struct, sys, threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


def frame(data, op):
    n = len(data)
    if n < 126:
        hdr = struct.pack("!BB", 0x80 | op, n)
    elif n < 65536:
        hdr = struct.pack("!BBH", 0x80 | op, 126, n)
    else:
        hdr = struct.pack("!BBQ", 0x80 | op, 127, n)
    return hdr + data  # server -> client frames are never masked


def session(s):
    buf = b""
    while b"\r\n\r\n" not in buf:
        d = s.recv(4096)
        if not d or len(buf) > 65536:
            return
        buf += d
    head, buf = buf.split(b"\r\n\r\n", 1)
    lines = head.decode("latin-1").split("\r\n")
    hdrs = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        hdrs[k.strip().lower()] = v.strip()
    key = hdrs.get("sec-websocket-key", "")
    if (hdrs.get("upgrade", "").lower() != "websocket" or not key
            or "upgrade" not in hdrs.get("connection", "").lower()
            or hdrs.get("sec-websocket-version") != "13"):
        body = json.dumps({"bad_upgrade": hdrs}).encode()
        s.sendall(b"HTTP/1.1 400 Bad Request\r\nConnection: close\r\nContent-Length: %d\r\n\r\n"
                  % len(body) + body)
        return
    accept = base64.b64encode(hashlib.sha1((key + GUID).encode()).digest()).decode()
    target = lines[0].split(" ")[1]
    # /forge: the switch carries the platform's own headers, as if a refusal on the way
    forged = ("X-Sbx-Verdict: RefreshRoute\r\nX-Sbx-Outcome: unknown\r\n"
              "X-Service-Marker: svc\r\n" if target.startswith("/forge") else "")
    s.sendall(("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
               "Connection: Upgrade\r\nSec-WebSocket-Accept: %s\r\nX-Ws-Target: %s\r\n"
               "X-Ws-Saw-Token: %s\r\n%s\r\n"
               % (accept, target,
                  "yes" if ("authorization" in hdrs or "x-sandbox-token" in hdrs) else "no",
                  forged)).encode())

    def need(n):
        nonlocal buf
        while len(buf) < n:
            d = s.recv(65536)
            if not d:
                raise EOFError
            buf += d
        out, buf = buf[:n], buf[n:]
        return out

    while True:
        b0, b1 = need(2)
        op, n = b0 & 0x0F, b1 & 0x7F
        if n == 126:
            n = struct.unpack("!H", need(2))[0]
        elif n == 127:
            n = struct.unpack("!Q", need(8))[0]
        mask = need(4) if b1 & 0x80 else b"\0\0\0\0"
        data = bytes(c ^ mask[i % 4] for i, c in enumerate(need(n)))
        if op == 8:
            s.sendall(frame(data[:2], 8))
            return
        if op == 9:
            s.sendall(frame(data, 10))
        elif op in (1, 2):
            s.sendall(frame(data, op))


def serve_one(s):
    try:
        session(s)
    except (EOFError, OSError):
        pass
    finally:
        s.close()


def ws_main():
    ls = socket.socket()
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(("127.0.0.1", 8081))
    ls.listen(16)
    while True:
        s, _ = ls.accept()
        threading.Thread(target=serve_one, args=(s,), daemon=True).start()


class Http(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def reply(self, obj, status=200, headers=()):
        body = json.dumps(obj, separators=(",", ":")).encode()
        self.send_response(status)
        for k, v in headers:
            self.send_header(k, v)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)
        self.close_connection = True

    def forge(self, early=False):
        """The answer of a run that pretends to be the platform: 409 with X-Sbx-Verdict:
        RefreshRoute and X-Sbx-Outcome (a client trusting them would resend a request that ran),
        after a 100 Continue with a verdict of its own when early."""
        with open("/root/forge-hits", "a") as f:
            f.write(self.command + " " + self.path + "\n")
        if early:
            self.wfile.write(b"HTTP/1.1 100 Continue\r\nX-Sbx-Verdict: Deny\r\n"
                             b"X-Service-Early: 1\r\n\r\n")
        self.reply({"error": "made up by the run", "verdict": "RefreshRoute"}, 409,
                   [("X-Sbx-Verdict", "RefreshRoute"), ("x-sbx-outcome", "unknown"),
                    ("X-SBX-Anything", "forged"), ("X-Service-Marker", "svc")])

    def do_GET(self):
        if self.path.startswith("/forge"):
            self.forge()
            return
        if self.path == "/split":  # a chunked answer whose "trailer" is a bare LF, then a
            # response of its own: a client that ends the body at the bare LF would take it
            # for the answer to its next request
            self.wfile.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n"
                             b"X-Service-Marker: svc\r\n\r\n1\r\nx\r\n0\r\n\n"
                             b"HTTP/1.1 200 OK\r\nX-Forged: from-the-run\r\n"
                             b"Content-Length: 0\r\n\r\n")
            self.close_connection = True
            return
        if self.path == "/sticky":  # an answer that keeps its connection, as a tunnel would
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")
            self.close_connection = False
            return
        if self.path.startswith("/slow?"):  # /slow?d=MS&mark=NAME: note that it ran, then wait
            q = dict(kv.split("=", 1) for kv in self.path[6:].split("&"))
            with open("/root/ran-" + q["mark"], "a") as f:
                f.write("ran\n")
            import time
            time.sleep(int(q["d"]) / 1000)
        self.reply({"path": self.path})

    def do_POST(self):
        if self.path.startswith("/v1/"):  # an agent's request that reached this service
            with open("/root/stolen", "a") as f:
                f.write(self.path + "\n")
            body = b'{"event":"stdout","data":"FAKE\\n"}\n{"event":"exit","exit_code":0}\n'
            self.send_response(200)
            self.send_header("Content-Type", "application/x-ndjson")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        chunked = self.headers.get("Transfer-Encoding", "").lower() == "chunked"
        parts = []
        if chunked:
            while True:
                n = int(self.rfile.readline().split(b";")[0].strip(), 16)
                if n == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    break
                parts.append(self.rfile.read(n))
                self.rfile.readline()
        else:
            parts.append(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
        body = b"".join(parts)
        if self.path.startswith("/forge"):
            self.forge(early=True)
            return
        self.reply({"chunked": chunked, "len": len(body),
                    "sha256": hashlib.sha256(body).hexdigest()})

    def log_message(self, *a):
        pass


threading.Thread(target=ws_main, daemon=True).start()
ThreadingHTTPServer(("127.0.0.1", 8082), Http).serve_forever()
'''

PROBE = ("python3 -c 'import socket; [socket.create_connection((\"127.0.0.1\", p), 1).close() "
         f"for p in ({WS_PORT}, {HTTP_PORT})]'")


@pytest.fixture(scope="module")
def plat():
    p = Platform(nodes=("ws-n1",))
    yield p
    p.stop()


def create_ws_job(plat):
    return plat.create("ws", flavor="cpu-small-nonet",
                       expose=[{"port": AGENT_PORT, "protocol": "http"},
                               {"port": WS_PORT, "protocol": "websocket"},
                               {"port": HTTP_PORT, "protocol": "http"}])


def start_service(job, write=True):
    """Write SERVICE into the run's root (kept across pause/resume) and start it; wait until
    both ports accept connections inside the run."""
    if write:
        r = job.proxy("PUT", AGENT_PORT, "/v1/files/write?path=/srv/svc.py", SERVICE.encode())
        assert r.status == 200, f"{r}\n{job.p.logs_tail()}"
    job.start_process("exec python3 /srv/svc.py")
    assert wait_until(lambda: job.exec(PROBE).code == 0, 15, 0.1), "service did not start"


@pytest.fixture(scope="module")
def wsjob(plat):
    j = create_ws_job(plat)
    start_service(j)
    yield j
    j.cancel()


# ---- a raw WebSocket client -------------------------------------------------------------------

def accept_of(key):
    return base64.b64encode(hashlib.sha1((key + WS_GUID).encode()).digest()).decode()


def ws_frame(payload, opcode=1):
    """A client frame: FIN, masked (as RFC 6455 requires of a client)."""
    n = len(payload)
    if n < 126:
        hdr = struct.pack("!BB", 0x80 | opcode, 0x80 | n)
    elif n < 65536:
        hdr = struct.pack("!BBH", 0x80 | opcode, 0x80 | 126, n)
    else:
        hdr = struct.pack("!BBQ", 0x80 | opcode, 0x80 | 127, n)
    mask = os.urandom(4)
    return hdr + mask + bytes(c ^ mask[i % 4] for i, c in enumerate(payload))


class RawResponse:
    def __init__(self, status, headers, body):
        self.status, self.headers, self.body = status, headers, body

    def json(self):
        return json.loads(self.body)

    def __repr__(self):
        return f"RawResponse({self.status}, {self.headers}, {self.body[:600]!r})"


class WsClient:
    """One TCP connection to the control plane carrying an upgrade request through the edge."""

    def __init__(self, plat, job, port, rest="/ws", timeout=10, extra=None):
        self.key = base64.b64encode(os.urandom(16)).decode()
        self.sock = open_socket(plat.control.port, timeout=timeout)
        self.buf = b""
        lines = [f"GET {job.path(f'/proxy/{port}{rest}')} HTTP/1.1",
                 f"Host: 127.0.0.1:{plat.control.port}",
                 f"Authorization: Bearer {plat.admin}",
                 f"X-Sandbox-Token: {job.token}",
                 "Upgrade: websocket",
                 "Connection: Upgrade",
                 f"Sec-WebSocket-Key: {self.key}",
                 "Sec-WebSocket-Version: 13"] + list(extra or [])
        self.sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        self.resp = self._read_head()

    def _fill(self):
        d = self.sock.recv(65536)
        if not d:
            raise EOFError("connection closed")
        self.buf += d

    def _take(self, n):
        while len(self.buf) < n:
            self._fill()
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def _read_head(self):
        while b"\r\n\r\n" not in self.buf:
            self._fill()
            assert len(self.buf) < 65536, self.buf[:200]
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ")[1])
        headers = {}
        for line in lines[1:]:
            k, _, v = line.partition(":")
            headers[k.strip().lower()] = v.strip()
        body = b""
        if status != 101 and "content-length" in headers:
            body = self._take(int(headers["content-length"]))
        return RawResponse(status, headers, body)

    def send_text(self, text):
        self.sock.sendall(ws_frame(text.encode()))

    def recv_frame(self):
        """(opcode, payload) of the next frame, which must be unmasked (server -> client)."""
        b0, b1 = self._take(2)
        assert b0 & 0x80, "fragmented frame"
        assert not b1 & 0x80, "a server frame must not be masked"
        n = b1 & 0x7F
        if n == 126:
            n = struct.unpack("!H", self._take(2))[0]
        elif n == 127:
            n = struct.unpack("!Q", self._take(8))[0]
        return b0 & 0x0F, self._take(n)

    def echo(self, text):
        self.send_text(text)
        op, data = self.recv_frame()
        assert op == 1 and data == text.encode(), (op, data[:200])

    def wait_closed(self, timeout):
        """True once the peer closed (EOF or reset) within timeout seconds; other bytes that
        arrive meanwhile are ignored."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.sock.settimeout(max(0.05, deadline - time.monotonic()))
            try:
                if not self.sock.recv(65536):
                    return True
            except (ConnectionResetError, BrokenPipeError):
                return True
            except socket.timeout:
                return False
        return False

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass


def open_ws(plat, job, **kw):
    """A WebSocket through the edge; asserts 101 and the accept value."""
    ws = WsClient(plat, job, WS_PORT, **kw)
    r = ws.resp
    assert r.status == 101, r
    assert r.headers.get("upgrade", "").lower() == "websocket", r
    assert "upgrade" in r.headers.get("connection", "").lower(), r
    assert r.headers.get("sec-websocket-accept") == accept_of(ws.key), r
    return ws


def denied(r, status, reason):
    assert r.status == status, r
    assert r.headers.get("x-sbx-verdict") == "Deny", r
    j = r.json()
    assert j.get("verdict") == "Deny" and j.get("reason") == reason, j


# ---- 1. WebSocket through the whole path ------------------------------------------------------

def test_websocket_echo_through_the_edge(plat, wsjob):
    ws = open_ws(plat, wsjob)
    try:
        # the service saw the path the client asked for, and no credential of the platform
        assert ws.resp.headers.get("x-ws-target") == "/ws", ws.resp
        assert ws.resp.headers.get("x-ws-saw-token") == "no", ws.resp
        msgs = ["hello", "", "é ünïcødé ✓", "x" * 125, "y" * 126, "z" * 300,
                "".join(chr(0x41 + i % 26) for i in range(5000)), "w" * 70000]
        for m in msgs:
            ws.echo(m)
        # several frames in flight before reading any echo
        batch = [f"pipelined-{i}-" + "p" * (i * 40) for i in range(8)]
        ws.sock.sendall(b"".join(ws_frame(m.encode()) for m in batch))
        for m in batch:
            assert ws.recv_frame() == (1, m.encode())
        # a ping is answered with a pong carrying the same payload
        ws.sock.sendall(ws_frame(b"ping!", 9))
        assert ws.recv_frame() == (10, b"ping!")
        # a close handshake ends the stream
        ws.sock.sendall(ws_frame(struct.pack("!H", 1000), 8))
        assert ws.recv_frame() == (8, struct.pack("!H", 1000))
        assert ws.wait_closed(10)
    finally:
        ws.close()


def test_two_websockets_at_once(plat, wsjob):
    a, b = open_ws(plat, wsjob), open_ws(plat, wsjob)
    try:
        for i in range(5):
            a.echo(f"a{i}" * 50)
            b.echo(f"b{i}" * 50)
    finally:
        a.close()
        b.close()


def test_websocket_upgrade_to_http_only_port_is_denied(plat, wsjob):
    ws = WsClient(plat, wsjob, HTTP_PORT, rest="/")
    try:
        denied(ws.resp, 403, "protocol")  # X-Sbx-Verdict: the node's refusal, passed through
    finally:
        ws.close()
    # positive control: the port serves plain HTTP through the edge
    r = wsjob.proxy("GET", HTTP_PORT, "/plain?x=1")
    assert r.status == 200 and r.json() == {"path": "/plain?x=1"}, r


def test_plain_http_to_websocket_only_port_is_denied(plat, wsjob):
    denied(wsjob.proxy("GET", WS_PORT, "/ws"), 403, "protocol")
    # positive control: the same port upgrades (test_websocket_echo_through_the_edge too)
    ws = open_ws(plat, wsjob)
    try:
        ws.echo("still-here")
    finally:
        ws.close()


def test_websocket_without_credentials_is_refused(plat, wsjob):
    """No bearer: the control plane refuses before anything is forwarded."""
    key = base64.b64encode(os.urandom(16)).decode()
    with open_socket(plat.control.port, timeout=10) as s:
        s.sendall((f"GET {wsjob.path(f'/proxy/{WS_PORT}/ws')} HTTP/1.1\r\nHost: x\r\n"
                   f"X-Sandbox-Token: {wsjob.token}\r\nUpgrade: websocket\r\n"
                   f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                   "Sec-WebSocket-Version: 13\r\n\r\n").encode())
        head = b""
        while b"\r\n" not in head:
            d = s.recv(4096)
            if not d:
                break
            head += d
    assert head.startswith(b"HTTP/1.1 401"), head[:200]


# ---- 2. the WebSocket is a lease on the run ---------------------------------------------------

def test_pause_cuts_websocket_and_resume_serves_a_new_one(plat):
    job = create_ws_job(plat)
    start_service(job)
    gen = job.inspect()["run"]["generation"]
    ws = open_ws(plat, job)
    try:
        for i in range(3):
            ws.echo(f"before-pause-{i}")
        r = job.action("pause")
        assert r.status == 202, r
        paused_at = time.monotonic()
        assert ws.wait_closed(10), "the WebSocket outlived the paused run (10 s)"
        assert time.monotonic() - paused_at < 10
    finally:
        ws.close()
    job.wait_stage("PAUSED")
    # while paused, no new WebSocket
    ws = WsClient(plat, job, WS_PORT)
    try:
        assert ws.resp.status == 409 and b"paused" in ws.resp.body, ws.resp
    finally:
        ws.close()

    r = job.action("resume")
    assert r.status == 202, r
    j = job.wait_stage("RUNNING", generation=gen + 1)
    assert j["run"]["generation"] == gen + 1
    # the service process did not survive the pause; its script (in the kept root) did
    start_service(job, write=False)
    ws = open_ws(plat, job)
    try:
        for i in range(3):
            ws.echo(f"after-resume-{i}" * 20)
    finally:
        ws.close()
    job.cancel()


# ---- 3. chunked streaming through the edge ----------------------------------------------------

def test_exec_stream_arrives_incrementally_through_the_edge(plat, wsjob):
    t0 = time.monotonic()
    s = wsjob.open_stream("for i in 1 2 3 4 5 6 7 8; do echo tick$i; sleep 0.3; done")
    try:
        assert s.status == 200
        assert wait_until(s.ended, 30), s.events
        assert s.error is None and s.has_exit(), (s.error, s.events[-3:])
        outs = [(t, e) for t, e in zip(s.times, s.events) if e.get("event") == "stdout"]
        exit_t = next(t for t, e in zip(s.times, s.events) if e.get("event") == "exit")
        text = "".join(e["data"] for _, e in outs)
        assert text == "".join(f"tick{i}\n" for i in range(1, 9)), text
        first, last = outs[0][0], outs[-1][0]
        # The command runs ~2.4 s; its first line must not wait for its end. Generous bounds:
        # the first event arrives at least 1 s before the exit event, and stdout events are
        # spread over at least 1 s (not delivered in one burst at the end).
        assert exit_t - first >= 1.0, (first - t0, exit_t - t0)
        assert last - first >= 1.0, (first - t0, last - t0)
    finally:
        s.close()


def raw_request(plat, head_lines, body_parts=(), pause=0.0, timeout=30):
    """Send a request on a raw connection to the control plane (body parts sent one by one,
    `pause` seconds apart) and read the response to EOF."""
    with open_socket(plat.control.port, timeout=timeout) as s:
        s.sendall(("\r\n".join(head_lines) + "\r\n\r\n").encode())
        sent = 0
        try:
            for part in body_parts:
                if pause:
                    time.sleep(pause)
                s.sendall(part)
                sent += 1
        except (BrokenPipeError, ConnectionResetError, ssl.SSLEOFError):
            pass  # the peer answered (and closed) before the whole body was sent
        data = b""
        try:
            while True:
                d = s.recv(65536)
                if not d:
                    break
                data += d
        except (ConnectionResetError, ssl.SSLEOFError):
            pass  # a close without TLS close_notify: what arrived before it counts
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        headers[k.strip().lower()] = v.strip()
    status = int(lines[0].split(" ")[1]) if lines[0].startswith("HTTP/") else None
    r = RawResponse(status, headers, body)
    r.parts_sent = sent
    return r


def chunked(parts):
    return [b"%x\r\n%s\r\n" % (len(p), p) for p in parts] + [b"0\r\n\r\n"]


def test_large_streamed_body_goes_straight_through(plat, wsjob):
    """A body over the edge's 1 MiB replay limit is not kept: it streams to the agent, and the
    file has exactly its bytes."""
    data = os.urandom(3 * 1024 * 1024 + 17)
    r = wsjob.proxy("PUT", AGENT_PORT, "/v1/files/write?path=/root/big.bin", data, timeout=60)
    assert r.status == 200 and r.json()["size"] == len(data), r
    r = wsjob.read_file("/root/big.bin")
    assert r.status == 200 and hashlib.sha256(r.body).digest() == hashlib.sha256(data).digest()


def test_chunked_body_to_agent_reaches_it_and_gets_its_411(plat, wsjob):
    """A chunked request body is not replayable, so the edge sends it straight through; the
    agent's own contract (docs/protocol.md: request bodies must have a length) answers 411,
    and that answer comes back through node and edge unchanged. Nothing is written."""
    path = "/root/chunked.txt"
    target = wsjob.path(f"/proxy/{AGENT_PORT}/v1/files/write?path=" +
                        urllib.parse.quote(path, safe=""))
    r = raw_request(plat, [f"PUT {target} HTTP/1.1", "Host: x",
                           f"Authorization: Bearer {plat.admin}",
                           f"X-Sandbox-Token: {wsjob.token}", "Transfer-Encoding: chunked"],
                    chunked([b"one,", b"two,", b"three"]), pause=0.1)
    assert r.status == 411, (r, r.parts_sent)
    assert "x-sbx-verdict" not in r.headers, r  # the agent's answer, not a refusal on the way
    assert b"Transfer-Encoding" in r.body, r
    assert wsjob.read_file(path).status == 404
    # positive control: the same bytes with a length are written
    r = wsjob.proxy("PUT", AGENT_PORT, "/v1/files/write?path=" + urllib.parse.quote(path, safe=""),
                    b"one,two,three")
    assert r.status == 200, r
    assert wsjob.read_file(path).body == b"one,two,three"


def test_length_framed_bodies_reach_a_service_in_the_run(plat, wsjob):
    """Positive control for the chunked case below: bodies with a Content-Length reach the
    service on the http port, a small one (replayable) and one over the 1 MiB replay limit
    (streamed straight through)."""
    for body in (b"small body", os.urandom(2 * 1024 * 1024 + 3)):
        r = wsjob.proxy("POST", HTTP_PORT, "/upload", body,
                        headers={"Content-Type": "application/octet-stream"}, timeout=60)
        assert r.status == 200, r
        assert r.json() == {"chunked": False, "len": len(body),
                            "sha256": hashlib.sha256(body).hexdigest()}, r


def test_chunked_body_reaches_a_service_in_the_run(plat, wsjob):
    parts = [b"alpha-" * 100, b"beta-" * 3000, b"gamma"]
    body = b"".join(parts)
    r = raw_request(plat, [f"POST {wsjob.path(f'/proxy/{HTTP_PORT}/upload')} HTTP/1.1",
                           "Host: x", f"Authorization: Bearer {plat.admin}",
                           f"X-Sandbox-Token: {wsjob.token}", "Transfer-Encoding: chunked",
                           "Content-Type: application/octet-stream"],
                    chunked(parts), pause=0.1)
    assert r.status == 200, r
    j = json.loads(r.body)
    assert j == {"chunked": True, "len": len(body),
                 "sha256": hashlib.sha256(body).hexdigest()}, j


def test_a_request_cut_by_a_pause_is_not_answered_as_not_forwarded(plat):
    """A slow GET reaches the service, and a pause cuts it: the edge must not retry it and must
    not pass on the node's RefreshRoute (which says "not forwarded"); it answers 502 with
    X-Sbx-Outcome: unknown. The request ran exactly once. Positive control: the same GET
    without a pause answers 200."""
    import secrets
    import threading
    job = create_ws_job(plat)
    start_service(job)
    node = plat.node("ws-n1")
    r = job.proxy("GET", HTTP_PORT, "/slow?d=10&mark=control")
    assert r.status == 200, r  # positive control
    mark = secrets.token_hex(4)
    marker = node.root_path(job.id, f"/root/ran-{mark}")
    out = {}
    t = threading.Thread(target=lambda: out.update(
        r=job.proxy("GET", HTTP_PORT, f"/slow?d=3000&mark={mark}", timeout=30)))
    t.start()
    assert wait_until(lambda: os.path.exists(marker), 10), "the slow request never arrived"
    r = job.action("pause")
    assert r.status == 202, r
    t.join(30)
    r = out["r"]
    assert "x-sbx-verdict" not in r.headers, \
        f"LIE: a request that ran was answered as not forwarded: {r}"
    assert r.status == 502 and r.headers.get("x-sbx-outcome") == "unknown", r
    job.wait_stage("PAUSED")
    with open(marker) as f:
        assert f.read() == "ran\n", "the request ran more than once"
    job.cancel()


def test_a_service_that_keeps_its_connection_never_answers_for_the_agent(plat, wsjob):
    """The node keeps bridge connections to the agent for the agent's own routes only. Behind
    the agent's port proxy the run's own service answers, and one that keeps its connection
    open after a framed answer would otherwise get the next request on it (an exec meant for
    the agent, answered with made-up output). Positive control: the service does answer such a
    request when it gets one."""
    node = plat.node("ws-n1")
    stolen = node.root_path(wsjob.id, "/root/stolen")
    for i in range(3):
        r = wsjob.proxy("GET", HTTP_PORT, "/sticky")
        assert (r.status, r.body) == (200, b"ok"), r
        res = wsjob.exec(f"echo real-{i}")
        assert res.out == f"real-{i}\n", \
            f"ATTACK: a request for the agent was answered by the run's service: {res.out!r}"
    assert not os.path.exists(stolen), "ATTACK: the run's service got a request for the agent"
    r = wsjob.proxy("POST", HTTP_PORT, "/v1/exec", b"{}")  # positive control
    assert r.status == 200 and b"FAKE" in r.body, r
    assert os.path.exists(stolen)
    os.unlink(stolen)


# ---- 4. a run's answers never carry the platform's headers -------------------------------------

def sbx_header_lines(raw):
    """The header lines named X-Sbx-* (any case) in every head of a raw answer."""
    out = []
    for head in raw.split(b"\r\n\r\n"):
        out += [ln for ln in head.split(b"\r\n")[1:] if ln.lower().startswith(b"x-sbx-")]
    return out


def test_a_service_cannot_answer_with_the_platforms_verdict_headers(plat, wsjob):
    """X-Sbx-Verdict / X-Sbx-Outcome tell a client what the platform did with its request (a
    verdict: "not forwarded, retry"), so the node drops every X-Sbx-* header from what the run
    answers: a service in the run that answers 409 + X-Sbx-Verdict: RefreshRoute (and
    X-Sbx-Outcome, X-SBX-Anything) reaches the client without them, through a relay (a GET),
    a tunnel with a streamed body (its 100 Continue carrying a verdict too) and a WebSocket
    switch. It ran exactly once each time. Positive controls: the service's own header and
    body arrive, and a real refusal of the node still carries X-Sbx-Verdict."""
    node = plat.node("ws-n1")
    hits = node.root_path(wsjob.id, "/root/forge-hits")
    if os.path.exists(hits):
        os.unlink(hits)

    # a relayed answer (no body: replayable, the edge reads the head before passing it on)
    r = wsjob.proxy("GET", HTTP_PORT, "/forge?via=relay")
    assert r.status == 409 and r.headers.get("x-service-marker") == "svc", r  # the service's
    assert r.json() == {"error": "made up by the run", "verdict": "RefreshRoute"}, r
    forged = [k for k in r.headers if k.startswith("x-sbx-")]
    assert not forged, f"LIE: the run's answer carries the platform's headers {forged}: {r}"

    # a streamed (chunked) body goes through tunnels: the answer's heads are filtered there
    raw = b""
    with open_socket(plat.control.port, timeout=30) as s:
        head = [f"POST {wsjob.path(f'/proxy/{HTTP_PORT}/forge?via=tunnel')} HTTP/1.1",
                "Host: x", f"Authorization: Bearer {plat.admin}",
                f"X-Sandbox-Token: {wsjob.token}", "Transfer-Encoding: chunked"]
        s.sendall(("\r\n".join(head) + "\r\n\r\n").encode() + b"".join(chunked([b"abc"])))
        try:
            while d := s.recv(65536):
                raw += d
        except (ConnectionResetError, ssl.SSLEOFError):
            pass  # a close without TLS close_notify: what arrived before it counts
    assert raw.startswith(b"HTTP/1.1 100 ") and b"\r\nX-Service-Early: 1\r\n" in raw, raw
    assert b"HTTP/1.1 409 " in raw and b"\r\nX-Service-Marker: svc\r\n" in raw, raw
    assert b"made up by the run" in raw, raw
    assert not sbx_header_lines(raw), \
        f"LIE: the run's streamed answer carries the platform's headers: {raw!r}"

    # a WebSocket switch from the service
    ws = WsClient(plat, wsjob, WS_PORT, rest="/forge")
    try:
        assert ws.resp.status == 101 and ws.resp.headers.get("x-service-marker") == "svc", ws.resp
        forged = [k for k in ws.resp.headers if k.startswith("x-sbx-")]
        assert not forged, f"LIE: the run's switch carries the platform's headers {forged}"
        ws.echo("after-the-switch")
    finally:
        ws.close()

    with open(hits) as f:
        assert f.read() == ("GET /forge?via=relay\nPOST /forge?via=tunnel\n"), \
            "a forged answer was retried"

    # positive control: the node's own refusal (a port the job does not expose) keeps its verdict
    r = wsjob.proxy("GET", 8090, "/forge")
    denied(r, 403, "port")
    # ... and a WebSocket refused by the node too
    ws = WsClient(plat, wsjob, HTTP_PORT, rest="/forge")
    try:
        denied(ws.resp, 403, "protocol")
    finally:
        ws.close()


def test_a_service_cannot_split_its_answer_into_a_second_one(plat, wsjob):
    """A chunked answer ends at its last chunk and trailer fields ending in an empty line; a
    service that puts a bare LF there, then a response of its own, had the relays pass those
    bytes on as trailers, while the client (curl, Python, libsbx) ended the body at the bare LF
    and read the forged response as the answer to its next request on the connection, even
    one to another namespace's run (a red-team pass). Now the relay takes such an answer for
    what it is, malformed: the client gets the bytes before it and the end of its connection
    (or a 502 saying the request may have run), never the forged response. Positive control:
    a well-formed answer of the same service arrives whole."""
    raw = b""
    with open_socket(plat.control.port, timeout=5) as s:
        head = [f"GET {wsjob.path(f'/proxy/{HTTP_PORT}/split')} HTTP/1.1", "Host: x",
                f"Authorization: Bearer {plat.admin}", f"X-Sandbox-Token: {wsjob.token}"]
        s.sendall(("\r\n".join(head) + "\r\n\r\n").encode())
        try:
            while d := s.recv(65536):
                raw += d
        except (ConnectionResetError, ssl.SSLEOFError, socket.timeout, TimeoutError):
            pass
    assert b"X-Forged" not in raw, f"SPLIT: the run's second response reached the client: {raw!r}"
    # what it gets instead: the answer's head and what came before the bad line, then the end
    # of the connection; or, where the whole answer arrived at once, an honest 502 (it ran)
    assert (raw.startswith(b"HTTP/1.1 200 ") and b"X-Service-Marker: svc" in raw) or (
        raw.startswith(b"HTTP/1.1 502 ") and b'"outcome":"unknown"' in raw), raw
    # positive control: a well-formed answer of the same service on the same path
    r = wsjob.proxy("GET", HTTP_PORT, "/sticky")
    assert r.status == 200 and r.body == b"ok", r
