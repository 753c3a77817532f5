# SPDX-License-Identifier: MIT
"""Port proxy: /v1/proxy/{port}/{rest...} replays the request to 127.0.0.1:{port} and splices
both directions. Each test starts its own backend on a free loopback port and checks the bytes
the backend and the client actually see."""
import base64
import hashlib
import json
import os
import queue
import socket
import struct
import threading
import time

import pytest

from conftest import free_port, status_of

WS_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


# ---- a tiny backend ---------------------------------------------------------------------------

class Backend:
    """A loopback TCP server; each accepted connection runs handler(sock, backend) in a thread."""

    def __init__(self, handler, backlog=64):
        self.handler = handler
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(backlog)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self.seen = queue.Queue()  # whatever handlers want to report
        self.errors = []
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            threading.Thread(target=self._serve, args=(c,), daemon=True).start()

    def _serve(self, c):
        c.settimeout(10)
        try:
            self.handler(c, self)
        except Exception as e:  # reported by the test through backend.errors
            self.errors.append(e)
        finally:
            c.close()

    def close(self):
        try:
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept()
        except OSError:
            pass
        self.sock.close()
        self.thread.join(timeout=5)


@pytest.fixture
def backend():
    started = []

    def start(handler, **kw):
        b = Backend(handler, **kw)
        started.append(b)
        return b

    yield start
    for b in started:
        b.close()


def read_head(sock):
    """Read a request/response head; return (head bytes without the blank line, extra bytes)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise EOFError(f"EOF inside head: {data!r}")
        data += chunk
    head, rest = data.split(b"\r\n\r\n", 1)
    return head, rest


def parse_head(head):
    lines = head.decode("latin-1").split("\r\n")
    headers = []
    for l in lines[1:]:
        name, value = l.split(":", 1)
        headers.append((name, value.strip()))
    return lines[0], headers


def recv_exact(sock, n, rest=b""):
    data = rest
    while len(data) < n:
        chunk = sock.recv(min(1 << 20, n - len(data)))
        if not chunk:
            raise EOFError(f"EOF after {len(data)} of {n} bytes")
        data += chunk
    return data


def recv_until(sock, marker, data=b""):
    while marker not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise EOFError(f"EOF before {marker!r}: {data!r}")
        data += chunk
    return data


def echo_head_handler(c, b):
    """Answer with a JSON document of the request line and headers the backend received."""
    head, _ = read_head(c)
    line, headers = parse_head(head)
    b.seen.put((line, headers))
    body = json.dumps({"line": line, "headers": headers}).encode()
    c.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
              + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n" + body)


def echo_body_handler(c, b):
    """Echo the request body back, byte for byte."""
    head, rest = read_head(c)
    _, headers = parse_head(head)
    n = int(dict((k.lower(), v) for k, v in headers)["content-length"])
    body = recv_exact(c, n, rest)
    b.seen.put(len(body))
    c.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: "
              + str(n).encode() + b"\r\nConnection: close\r\n\r\n" + body)


def raw_connect(server, timeout=10):
    return socket.create_connection(("127.0.0.1", server.port), timeout=timeout)


def server_fds(server):
    return len(os.listdir(f"/proc/{server.proc.pid}/fd"))


def settled_fds(server, quiet=0.3, timeout=5.0):
    """The server's fd count once it has stopped changing for `quiet` seconds: a connection
    the fixture just used (its readiness probe) may still be closing when a test starts."""
    deadline = time.monotonic() + timeout
    last, since = server_fds(server), time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.02)
        now = server_fds(server)
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet:
            return now
    raise AssertionError("the server's fd count never settled")


def wait_for(pred, timeout=5.0, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


# ---- plain HTTP -------------------------------------------------------------------------------

def test_get_path_and_raw_query_forwarded_exactly(server, backend):
    b = backend(echo_head_handler)
    status, _, data = server.request("GET", f"/v1/proxy/{b.port}/a/b%20c/?x=1&y=%2F+z&e=")
    assert status == 200, data
    assert json.loads(data)["line"] == "GET /a/b%20c/?x=1&y=%2F+z&e= HTTP/1.1"
    # an empty rest becomes "/", the query still follows
    status, _, data = server.request("GET", f"/v1/proxy/{b.port}?q=%41")
    assert status == 200, data
    assert json.loads(data)["line"] == "GET /?q=%41 HTTP/1.1"
    status, _, data = server.request("DELETE", f"/v1/proxy/{b.port}/")
    assert status == 200, data
    assert json.loads(data)["line"] == "DELETE / HTTP/1.1"


def test_credentials_stripped_other_headers_forwarded(server, backend):
    b = backend(echo_head_handler)
    status, _, data = server.request(
        "GET", f"/v1/proxy/{b.port}/h",
        headers={"Authorization": "Bearer hf_secret", "X-Custom-Thing": "kept value",
                 "x-sandbox-token-extra": "also kept"})
    assert status == 200, data
    headers = json.loads(data)["headers"]
    names = [n.lower() for n, _ in headers]
    assert "authorization" not in names, headers
    assert "x-sandbox-token" not in names, headers
    assert server.token not in data.decode()
    assert "hf_secret" not in data.decode()
    # positive control: everything else arrives, with its value
    assert ["X-Custom-Thing", "kept value"] in headers, headers
    assert ["x-sandbox-token-extra", "also kept"] in headers, headers
    assert "host" in names


def test_lowercase_and_mixed_case_credentials_stripped(server, backend):
    b = backend(echo_head_handler)
    req = (f"GET /v1/proxy/{b.port}/x HTTP/1.1\r\nHost: h\r\nx-SANDBOX-token: {server.token}\r\n"
           "aUtHoRiZaTiOn: Basic Zm9vOmJhcg==\r\nX-Keep: 1\r\nConnection: close\r\n\r\n")
    resp = server.raw(req.encode())
    assert status_of(resp) == 200, resp
    line, headers = b.seen.get(timeout=5)
    assert line == "GET /x HTTP/1.1"
    assert headers == [("Host", "h"), ("X-Keep", "1"), ("Connection", "close")], headers


def test_post_body_forwarded_byte_exact(server, backend):
    b = backend(echo_body_handler)
    body = os.urandom(1 << 20)
    status, hdrs, data = server.request("POST", f"/v1/proxy/{b.port}/upload", body=body,
                                        headers={"Content-Type": "application/octet-stream"})
    assert status == 200
    assert hdrs["content-length"] == str(len(body))
    assert hashlib.sha256(data).hexdigest() == hashlib.sha256(body).hexdigest()
    assert b.seen.get(timeout=5) == len(body)


def test_body_sent_with_the_head_is_forwarded(server, backend):
    """Bytes the server read together with the head (one write) reach the backend first."""
    b = backend(echo_body_handler)
    body = os.urandom(200_000)
    req = (f"PUT /v1/proxy/{b.port}/p HTTP/1.1\r\nHost: x\r\nX-Sandbox-Token: {server.token}\r\n"
           f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode() + body
    s = raw_connect(server)
    s.sendall(req)
    head, rest = read_head(s)
    assert head.startswith(b"HTTP/1.1 200"), head
    assert recv_exact(s, len(body), rest) == body
    s.close()


def chunked_body_handler(c, b):
    """Decode a chunked request body and answer with its length and digest."""
    head, data = read_head(c)
    _, headers = parse_head(head)
    h = dict((k.lower(), v) for k, v in headers)
    b.seen.put(h.get("transfer-encoding"))
    body = b""
    while True:
        data = recv_until(c, b"\r\n", data)
        line, data = data.split(b"\r\n", 1)
        n = int(line.split(b";")[0], 16)
        if n == 0:
            break
        data = recv_exact(c, n + 2, data)
        body += data[:n]
        data = data[n + 2:]
    reply = json.dumps({"len": len(body), "sha256": hashlib.sha256(body).hexdigest()}).encode()
    c.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
              + str(len(reply)).encode() + b"\r\nConnection: close\r\n\r\n" + reply)


def test_chunked_request_body_passes_through_the_proxy(server, backend):
    """Request bodies need a length everywhere (411) except through the port proxy, which
    splices them as sent; the connection closes after that request."""
    b = backend(chunked_body_handler)
    body = os.urandom(300_000)
    chunks = b"".join(b"%x\r\n" % len(body[i:i + 70_000]) + body[i:i + 70_000] + b"\r\n"
                      for i in range(0, len(body), 70_000)) + b"0\r\n\r\n"
    req = (f"POST /v1/proxy/{b.port}/upload HTTP/1.1\r\nHost: x\r\n"
           f"X-Sandbox-Token: {server.token}\r\nTransfer-Encoding: chunked\r\n\r\n").encode()
    s = raw_connect(server)
    s.sendall(req + chunks)
    head, rest = read_head(s)
    assert head.startswith(b"HTTP/1.1 200"), head
    _, hdrs = parse_head(head)
    n = int(dict((k.lower(), v) for k, v in hdrs)["content-length"])
    got = json.loads(recv_exact(s, n, rest))
    assert got == {"len": len(body), "sha256": hashlib.sha256(body).hexdigest()}
    assert b.seen.get(timeout=5) == "chunked"
    s.close()
    # control: the same chunked body to a non-proxy route is still 411
    s = raw_connect(server)
    s.sendall(req.replace(f"/v1/proxy/{b.port}/upload".encode(), b"/v1/exec") + chunks)
    head, _ = read_head(s)
    assert head.startswith(b"HTTP/1.1 411"), head
    s.close()


def test_http10_client_version_is_kept(server, backend):
    b = backend(echo_head_handler)
    req = f"GET /v1/proxy/{b.port}/old HTTP/1.0\r\nX-Sandbox-Token: {server.token}\r\n\r\n"
    resp = server.raw(req.encode())
    assert status_of(resp) == 200, resp
    assert b.seen.get(timeout=5)[0] == "GET /old HTTP/1.0"


# ---- streaming --------------------------------------------------------------------------------

def test_sse_chunked_arrives_incrementally(server, backend):
    go_on = threading.Event()

    def sse(c, b):
        read_head(c)
        c.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                  b"Transfer-Encoding: chunked\r\n\r\n")
        ev = b"data: first\n\n"
        c.sendall(b"%x\r\n%s\r\n" % (len(ev), ev))
        b.seen.put("first sent")
        if not go_on.wait(10):
            raise AssertionError("the client never saw the first event")
        ev = b"data: second\n\n"
        c.sendall(b"%x\r\n%s\r\n0\r\n\r\n" % (len(ev), ev))

    b = backend(sse)
    s = raw_connect(server)
    s.sendall(f"GET /v1/proxy/{b.port}/events HTTP/1.1\r\nHost: x\r\n"
              f"X-Sandbox-Token: {server.token}\r\nAccept: text/event-stream\r\n\r\n".encode())
    # The backend holds the second event until we have the first: it must arrive on its own.
    data = recv_until(s, b"data: first\n\n")
    assert b"second" not in data
    assert data.startswith(b"HTTP/1.1 200 OK\r\n")
    assert b"Transfer-Encoding: chunked" in data
    go_on.set()
    data = recv_until(s, b"0\r\n\r\n", data)
    assert b"e\r\ndata: second\n\n\r\n0\r\n\r\n" in data
    s.close()
    assert not b.errors


def ws_frame(payload, opcode=1, mask=True):
    hdr = bytes([0x80 | opcode])
    n = len(payload)
    mbit = 0x80 if mask else 0
    if n < 126:
        hdr += bytes([mbit | n])
    elif n < 65536:
        hdr += bytes([mbit | 126]) + struct.pack("!H", n)
    else:
        hdr += bytes([mbit | 127]) + struct.pack("!Q", n)
    if not mask:
        return hdr + payload
    key = os.urandom(4)
    return hdr + key + bytes(p ^ key[i % 4] for i, p in enumerate(payload))


def ws_read_frame(sock, data=b""):
    """Return (opcode, payload, leftover)."""
    data = recv_exact(sock, 2, data)
    opcode, n = data[0] & 0x0F, data[1] & 0x7F
    masked = data[1] & 0x80
    pos = 2
    if n == 126:
        data = recv_exact(sock, 4, data)
        n, pos = struct.unpack("!H", data[2:4])[0], 4
    elif n == 127:
        data = recv_exact(sock, 10, data)
        n, pos = struct.unpack("!Q", data[2:10])[0], 10
    key = b""
    if masked:
        data = recv_exact(sock, pos + 4, data)
        key, pos = data[pos:pos + 4], pos + 4
    data = recv_exact(sock, pos + n, data)
    payload = data[pos:pos + n]
    if masked:
        payload = bytes(p ^ key[i % 4] for i, p in enumerate(payload))
    return opcode, payload, data[pos + n:]


def ws_echo_handler(c, b):
    head, rest = read_head(c)
    line, headers = parse_head(head)
    h = {k.lower(): v for k, v in headers}
    b.seen.put((line, h))
    accept = base64.b64encode(hashlib.sha1(h["sec-websocket-key"].encode() + WS_GUID).digest())
    c.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
              b"Connection: Upgrade\r\nSec-WebSocket-Accept: " + accept + b"\r\n\r\n")
    while True:
        op, payload, rest = ws_read_frame(c, rest)
        if op == 8:  # close
            c.sendall(ws_frame(payload, 8, mask=False))
            return
        c.sendall(ws_frame(b"echo:" + payload, op, mask=False))


def ws_open(server, port, path="/ws", extra=b""):
    key = base64.b64encode(os.urandom(16))
    s = raw_connect(server)
    s.sendall(f"GET /v1/proxy/{port}{path} HTTP/1.1\r\nHost: localhost\r\n"
              f"X-Sandbox-Token: {server.token}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
              f"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: ".encode() + key + b"\r\n\r\n"
              + extra)
    head, rest = read_head(s)
    assert head.startswith(b"HTTP/1.1 101"), head
    want = base64.b64encode(hashlib.sha1(key + WS_GUID).digest())
    assert b"Sec-WebSocket-Accept: " + want in head
    return s, rest


def test_websocket_upgrade_and_echo(server, backend):
    b = backend(ws_echo_handler)
    s, rest = ws_open(server, b.port)
    line, h = b.seen.get(timeout=5)
    assert line == "GET /ws HTTP/1.1"
    assert h["upgrade"] == "websocket" and "x-sandbox-token" not in h
    for msg in (b"hello", os.urandom(300), os.urandom(70000)):
        s.sendall(ws_frame(msg))
        op, payload, rest = ws_read_frame(s, rest)
        assert op == 1 and payload == b"echo:" + msg
    s.sendall(ws_frame(b"\x03\xe8", 8))
    op, payload, rest = ws_read_frame(s, rest)
    assert op == 8 and payload == b"\x03\xe8"
    assert s.recv(10) == b""  # the backend closed: the tunnel passes the EOF on
    s.close()
    assert not b.errors


def test_websocket_frame_sent_with_the_handshake(server, backend):
    b = backend(ws_echo_handler)
    s, rest = ws_open(server, b.port, extra=ws_frame(b"early"))
    op, payload, rest = ws_read_frame(s, rest)
    assert payload == b"echo:early"
    s.close()


def test_websocket_library_client(server, backend):
    """An independent client implementation (python3-websockets) through the proxy."""
    websockets = pytest.importorskip("websockets")
    import asyncio
    import inspect
    b = backend(ws_echo_handler)
    url = f"ws://127.0.0.1:{server.port}/v1/proxy/{b.port}/lib"
    params = inspect.signature(websockets.connect).parameters
    kw = "additional_headers" if "additional_headers" in params else "extra_headers"

    async def go():
        async with websockets.connect(url, **{kw: {"X-Sandbox-Token": server.token}}) as ws:
            await ws.send("hi")
            return await asyncio.wait_for(ws.recv(), 5)

    assert asyncio.run(go()) == "echo:hi"


# ---- refusals ---------------------------------------------------------------------------------

@pytest.mark.parametrize("port", ["0", "70000", "65536", "abc", "80x", "-1", "+80", ""])
def test_bad_port_is_404(server, backend, port):
    b = backend(echo_head_handler)
    status, body = server.json("GET", f"/v1/proxy/{port}/x")
    assert status == 404, body
    assert "error" in body
    # positive control: the same request with a valid port reaches the backend
    status, _, _ = server.request("GET", f"/v1/proxy/{b.port}/x")
    assert status == 200


def test_closed_port_is_502(server, backend):
    port = free_port()  # bound and released: nothing listens there
    status, body = server.json("GET", f"/v1/proxy/{port}/x")
    assert status == 502, body
    assert str(port) in body["error"]
    # the connection stays usable for the next request (keep-alive after a refusal)
    c = server.conn()
    c.request("GET", f"/v1/proxy/{port}/", headers=server.headers())
    r = c.getresponse()
    assert r.status == 502 and b"error" in r.read()
    c.request("GET", "/health", headers=server.headers())
    assert c.getresponse().status == 200
    c.close()


def test_missing_or_wrong_token_never_reaches_backend(server, backend):
    b = backend(echo_head_handler)
    status, _, _ = server.request("GET", f"/v1/proxy/{b.port}/x", token=False)
    assert status == 403
    status, _, _ = server.request("GET", f"/v1/proxy/{b.port}/x", token=False,
                                  headers={"X-Sandbox-Token": "0" * 64})
    assert status == 403
    status, _, _ = server.request("GET", f"/v1/proxy/{b.port}/x", token=False,
                                  headers={"Authorization": f"Bearer {server.token}"})
    assert status == 403
    time.sleep(0.1)
    assert b.accepted == 0 and b.seen.empty()
    # positive control: with the token the backend sees the request
    status, _, _ = server.request("GET", f"/v1/proxy/{b.port}/x")
    assert status == 200
    assert b.accepted == 1 and b.seen.get(timeout=5)[0] == "GET /x HTTP/1.1"


@pytest.fixture
def blackhole():
    """A port whose accept queue is full: the kernel drops SYNs, so a connect hangs."""
    lst = socket.socket()
    lst.bind(("127.0.0.1", 0))
    lst.listen(0)
    port = lst.getsockname()[1]
    fillers = []
    for _ in range(2):  # the queue holds backlog+1 connections that nobody accepts
        f = socket.socket()
        f.setblocking(False)
        f.connect_ex(("127.0.0.1", port))
        fillers.append(f)
    time.sleep(0.1)
    yield port
    for f in fillers:
        f.close()
    lst.close()


def test_connect_timeout_is_504_and_loop_stays_responsive(server, blackhole):
    """The connect deadline answers 504 (this test takes the full 10 s deadline)."""
    port = blackhole
    result = {}

    def slow():
        result["r"] = server.json("GET", f"/v1/proxy/{port}/x", timeout=30)

    t0 = time.monotonic()
    th = threading.Thread(target=slow)
    th.start()
    time.sleep(0.3)
    # meanwhile the server answers others
    assert server.request("GET", "/health")[0] == 200
    assert "r" not in result
    th.join(20)
    elapsed = time.monotonic() - t0
    status, body = result["r"]
    assert status == 504, body
    assert 9 <= elapsed < 15, elapsed


def test_client_leaving_during_connect_releases_it(server, blackhole):
    base = settled_fds(server)
    s = raw_connect(server)
    s.sendall(f"GET /v1/proxy/{blackhole}/x HTTP/1.1\r\nHost: x\r\n"
              f"X-Sandbox-Token: {server.token}\r\n\r\n".encode())
    wait_for(lambda: server_fds(server) == base + 2, what="the pending backend socket")
    s.close()
    wait_for(lambda: server_fds(server) == base, what="the pending connect to be dropped")
    assert server.request("GET", "/health")[0] == 200


def test_shutdown_during_connect_is_clean(make_server, blackhole):
    srv = make_server()
    base = settled_fds(srv)
    s = raw_connect(srv)
    s.sendall(f"GET /v1/proxy/{blackhole}/x HTTP/1.1\r\nHost: x\r\n"
              f"X-Sandbox-Token: {srv.token}\r\n\r\n".encode())
    wait_for(lambda: server_fds(srv) == base + 2, what="the pending backend socket")
    srv.stop()
    assert srv.proc.returncode == 0
    s.close()


# ---- lifetime ---------------------------------------------------------------------------------

def test_client_disconnect_releases_tunnel(server, backend):
    got_eof = threading.Event()
    send_failed = threading.Event()

    def stream(c, b):
        read_head(c)
        c.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\ndata: one\n\n")
        c.settimeout(5)
        if c.recv(100) == b"":
            got_eof.set()
        try:  # keep streaming: the server must have closed our side for good
            for _ in range(200):
                c.sendall(b"data: more\n\n")
                time.sleep(0.01)
        except OSError:
            send_failed.set()

    b = backend(stream)
    time.sleep(0.1)
    base = settled_fds(server)
    s = raw_connect(server)
    s.sendall(f"GET /v1/proxy/{b.port}/s HTTP/1.1\r\nHost: x\r\n"
              f"X-Sandbox-Token: {server.token}\r\n\r\n".encode())
    recv_until(s, b"data: one\n\n")
    assert server_fds(server) == base + 2  # client socket + backend socket
    s.close()
    assert got_eof.wait(5), "the backend never saw EOF"
    assert send_failed.wait(5), "the backend connection was never closed"
    wait_for(lambda: server_fds(server) == base, what="the tunnel's fds to be closed")
    # positive control: the server still proxies
    b2 = backend(echo_head_handler)
    assert server.request("GET", f"/v1/proxy/{b2.port}/")[0] == 200


def test_half_close_is_propagated(server, backend):
    """The client shuts its write side; the backend sees EOF and can still answer."""
    def upper(c, b):
        head, rest = read_head(c)
        data = rest
        while True:
            chunk = c.recv(65536)
            if not chunk:
                break
            data += chunk
        c.sendall(b"HTTP/1.0 200 OK\r\n\r\n" + data.upper())

    b = backend(upper)
    s = raw_connect(server)
    s.sendall(f"POST /v1/proxy/{b.port}/u HTTP/1.1\r\nHost: x\r\n"
              f"X-Sandbox-Token: {server.token}\r\n\r\nhello ".encode())
    time.sleep(0.05)
    s.sendall(b"world")
    s.shutdown(socket.SHUT_WR)
    data = b""
    while True:
        chunk = s.recv(65536)
        if not chunk:
            break
        data += chunk
    assert data == b"HTTP/1.0 200 OK\r\n\r\nHELLO WORLD"
    s.close()


def server_rss_kb(server):
    with open(f"/proc/{server.proc.pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_slow_client_backpressure_bounds_memory(server, backend):
    total = 32 << 20
    block = os.urandom(1 << 20)

    def firehose(c, b):
        read_head(c)
        c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % total)
        for _ in range(total // len(block)):
            c.sendall(block)

    b = backend(firehose)
    rss0 = server_rss_kb(server)
    s = raw_connect(server)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 10)
    s.sendall(f"GET /v1/proxy/{b.port}/big HTTP/1.1\r\nHost: x\r\n"
              f"X-Sandbox-Token: {server.token}\r\n\r\n".encode())
    time.sleep(1.0)  # not reading: the backend must be held back, not buffered in the server
    grown = server_rss_kb(server) - rss0
    assert grown < 4096, f"server RSS grew {grown} KiB while the client was not reading"
    head, rest = read_head(s)
    h = hashlib.sha256()
    got = len(rest)
    h.update(rest)
    while got < total:
        chunk = s.recv(1 << 20)
        assert chunk, f"EOF after {got} bytes"
        h.update(chunk)
        got += len(chunk)
    assert got == total
    assert h.hexdigest() == hashlib.sha256(block * (total // len(block))).hexdigest()
    s.close()


def test_a_silent_backend_cannot_keep_the_tunnels_of_clients_that_left(make_server, backend):
    """A backend that takes requests and never answers nor closes would keep every tunnel whose
    client has gone (each a connection slot) until the server answered 503 to everyone: once
    the client has finished, the backend has PROXY_HALF_CLOSED_MS (10 s) of silence, then both
    sides close. Positive control: right after the clients leave, the silent backend does hold
    every slot."""
    srv = make_server(env={"SBX_MAX_CONNECTIONS": "3"})
    release = threading.Event()

    def silent(c, b):
        read_head(c)
        release.wait(40)  # never answers, never closes (until the test ends)

    b = backend(silent)
    try:
        for i in range(3):
            s = raw_connect(srv)
            s.sendall(f"GET /v1/proxy/{b.port}/{i} HTTP/1.1\r\nHost: x\r\n"
                      f"X-Sandbox-Token: {srv.token}\r\n\r\n".encode())
            time.sleep(0.2)  # the tunnel is up
            s.close()
        left = time.monotonic()
        resp = srv.raw(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert status_of(resp) == 503, resp  # positive control: all slots held

        def health_ok():
            r = srv.raw(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            return status_of(r) == 200

        wait_for(health_ok, timeout=20, what="the tunnels of clients that left to close")
        assert time.monotonic() - left >= 9, "closed before the backend's time was up"
    finally:
        release.set()


def test_tunnels_count_against_max_connections(make_server, backend):
    srv = make_server(env={"SBX_MAX_CONNECTIONS": "2"})
    b = backend(ws_echo_handler)
    t1, _ = ws_open(srv, b.port)
    t2, _ = ws_open(srv, b.port)
    # both slots are taken by tunnels: a third connection is turned away
    resp = srv.raw(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert status_of(resp) == 503, resp
    t1.sendall(ws_frame(b"bye", 8))
    ws_read_frame(t1)
    t1.close()
    # positive control: once a tunnel is gone its slot is free again
    def health_ok():
        resp = srv.raw(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        return status_of(resp) == 200
    wait_for(health_ok, what="a free connection slot")
    t2.sendall(ws_frame(b"still"))
    assert ws_read_frame(t2)[1] == b"echo:still"
    # shutting the server down with a live tunnel is clean
    srv.stop()
    assert srv.proc.returncode == 0
    assert t2.recv(10) == b""
    t2.close()
