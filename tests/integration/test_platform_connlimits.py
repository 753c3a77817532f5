# SPDX-License-Identifier: MIT
"""Fair connection limits of sbx-control and sbx-node, attacked with connection floods
(issue 9, item 5; the policy: src/http/connlimit.h, docs/platform.md).

- Per source: one address (IPv6: one /64) holds at most --max-conns-per-source connections;
  those beyond are refused alone (503 "too many connections from this source", Retry-After)
  while a client from another address keeps creating jobs and running commands. The node
  exempts its control plane's address: the control holds more connections to it than the cap.
- Unauthenticated connections: a short head deadline (an authenticated keep-alive connection
  lives on), a share of the table, and the oldest waiting one is closed to make room (never an
  authenticated one).
- Per principal: tenant A's connections beyond --max-conns-per-principal get 429 and close;
  tenant B, and A's connections within its share, are unaffected.

Positive controls: the same flood against a control plane and a node with the limits turned off
fills their tables, and a client from another address (the control plane's own, for the node)
is refused. Failure messages of the checks start "ATTACK" (tests/mutants/mutants.toml).

Sources are loopback addresses other than the servers' 127.0.0.1 (127.0.0.2 floods, 127.0.0.3
is the well-behaved client): Linux routes all of 127.0.0.0/8 to lo. The floods run against a
platform in plain HTTP (--insecure-plain-http): the limits act at accept, below the transport,
and a connection that never completes a TLS handshake is closed after the 10 s head timeout
anyway, which would end the floods mid-test. The head deadline, the per-principal share and
the tunnels are tested over TLS."""
import json
import os
import resource
import socket
import time
from collections import Counter

import pytest

from conftest import assert_no_sanitizer_report, free_port, output_of, wait_until
from sbxplatform import (AGENT_PORT, CONTROL_BIN, Platform, Proc, Stream, connection,
                         http_request, open_socket)

FLOOD = 2000
CONTROL_ARGS = ["--max-connections", "200", "--max-conns-per-source", "40",
                "--unauth-head-timeout-ms", "30000"]
NODE_ARGS = ["--max-connections", "200", "--max-conns-per-source", "4",
             "--unauth-head-timeout-ms", "30000"]
LIMITS_OFF = ["--max-connections", "200", "--max-conns-per-source", "0",
              "--max-unauth-conns", "0", "--unauth-head-timeout-ms", "0"]


@pytest.fixture(scope="module", autouse=True)
def nofile():
    """A flood holds FLOOD sockets in this process (the daemons raise their own limit)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 16384 if hard == resource.RLIM_INFINITY else min(hard, 16384)
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] > FLOOD + 500
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@pytest.fixture(scope="module")
def plat():
    p = Platform(nodes=("cl-node",), control_args=CONTROL_ARGS, node_args=NODE_ARGS, tls=False)
    yield p
    p.stop()


@pytest.fixture(scope="module")
def ctl():
    """A control plane with a short head deadline and a small per-principal share (TLS)."""
    p = Platform(nodes=("cl-p",), control_args=["--unauth-head-timeout-ms", "1000",
                                         "--max-conns-per-principal", "6"])
    yield p
    p.stop()


class Flood:
    """n TCP connections from src to 127.0.0.1:port that never send a byte, in order."""

    def __init__(self, src, port, n):
        self.socks = []
        try:
            for _ in range(n):
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                self.socks.append(s)
                s.bind((src, 0))
                s.connect(("127.0.0.1", port))  # loopback: the kernel completes it
                s.setblocking(False)
        except BaseException:
            self.close()
            raise
        self.state = ["open"] * n
        self.data = [b""] * n

    @staticmethod
    def _kind(data):
        if b"too many connections from this source" in data:
            return "source"
        if b"too many connections" in data:
            return "full"
        return "closed" if not data else "other"

    def poll(self):
        """Read what arrived; a socket at EOF is sorted by what it got: "source" (the per-source
        refusal), "full" (the table's), "closed" (nothing: closed by the server)."""
        for i, s in enumerate(self.socks):
            while self.state[i] == "open":
                try:
                    b = s.recv(65536)
                except BlockingIOError:
                    break
                except OSError:
                    self.state[i] = "reset"
                    break
                if not b:
                    self.state[i] = self._kind(self.data[i])
                else:
                    self.data[i] += b
        return Counter(self.state)

    def settle(self, n_open, timeout=10):
        """Poll until at most n_open stay open (or timeout), then a little longer: the counts."""
        deadline = time.monotonic() + timeout
        while self.poll()["open"] > n_open and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)
        return self.poll()

    def sample(self, kind):
        return next(d for d, s in zip(self.data, self.state) if s == kind)

    def close(self):
        for s in self.socks:
            s.close()


def raw(port, src="127.0.0.3", send=b""):
    """A connection from src (TLS where the daemon speaks it) that sent `send`."""
    s = open_socket(port, source=src)
    if send:
        s.sendall(send)
    return s


def tcp(port, src):
    """A TCP connection from src that sends nothing (not even a TLS hello)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind((src, 0))
    s.connect(("127.0.0.1", port))
    return s


def read_to_eof(s, timeout):
    """(bytes, seconds until EOF or None if still open after timeout)."""
    t0 = time.monotonic()
    s.settimeout(0.1)
    data = b""
    while time.monotonic() - t0 < timeout:
        try:
            b = s.recv(65536)
        except socket.timeout:
            continue
        except OSError:  # reset, or a TLS stream cut without close_notify
            return data, time.monotonic() - t0
        if not b:
            return data, time.monotonic() - t0
        data += b
    return data, None


def is_open(s):
    s.setblocking(False)
    try:
        return s.recv(1, socket.MSG_PEEK) != b""
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        s.setblocking(True)


class KeepAlive:
    """One keep-alive HTTP connection from src."""

    def __init__(self, port, src="127.0.0.3"):
        self.c = connection(port, 10, source=src)

    def get(self, path, token=None):
        h = {"Authorization": f"Bearer {token}"} if token else {}
        self.c.request("GET", path, headers=h)
        r = self.c.getresponse()
        body = r.read()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, body

    def close(self):
        self.c.close()


class BareControl:
    """An sbx-control of its own (own state, own admin token), no nodes."""

    def __init__(self, plat, name, args):
        self.port = free_port()
        self.token_file = os.path.join(plat.dir, f"{name}.admin")
        self.proc = Proc(name, [CONTROL_BIN, "--state", os.path.join(plat.dir, name),
                                "--listen", f"127.0.0.1:{self.port}", "--admin-token-file",
                                self.token_file, "--default-image", "host",
                                "--insecure-plain-http"] + args,
                         os.path.join(plat.dir, f"{name}.log"))

        def up():
            try:
                return http_request(self.port, "GET", "/v1/health", timeout=2).status == 200
            except OSError:
                return False
        assert wait_until(lambda: up() or not self.proc.alive(), 10) and self.proc.alive(), \
            self.proc.log()
        with open(self.token_file) as f:
            self.admin = f.read().strip()


# ---- per source ------------------------------------------------------------------------------

def test_control_source_flood_leaves_other_clients_working(plat):
    flood = Flood("127.0.0.2", plat.control.port, FLOOD)
    try:
        st = flood.settle(40)
        assert st["open"] == 40 and st["source"] == FLOOD - 40, \
            f"ATTACK per-source cap (control): {FLOOD} idle connections from 127.0.0.2 against " \
            f"--max-conns-per-source 40 (table 200): {dict(st)}"
        refusal = flood.sample("source")
        assert refusal.startswith(b"HTTP/1.1 503 ") and b"\r\nRetry-After: 1\r\n" in refusal, \
            refusal
        # another source creates jobs, inspects them and runs a command through the edge
        plat.source = "127.0.0.3"
        try:
            jobs = [plat.create("cl") for _ in range(2)]
            for j in jobs:
                assert j.inspect()["stage"] == "RUNNING"
            assert jobs[0].sh("echo from-127.0.0.3") == "from-127.0.0.3\n"
            r = plat.request("GET", "/v1/jobs/cl")
            assert r.status == 200 and len(r.json()) >= 2, r
        finally:
            plat.source = None
        # the flood held its connections all along
        assert flood.poll()["open"] == 40, dict(flood.poll())
    finally:
        flood.close()


def test_node_source_flood_leaves_the_control_plane_working(plat):
    node = plat.nodes[0]
    flood = Flood("127.0.0.2", node.port, FLOOD)
    try:
        st = flood.settle(4)
        assert st["open"] == 4 and st["source"] == FLOOD - 4, \
            f"ATTACK per-source cap (node): {FLOOD} idle connections from 127.0.0.2 against " \
            f"--max-conns-per-source 4 (table 200): {dict(st)}"
        # the control plane installs a run on the node and runs commands through the edge,
        # 6 streams at once: more connections from the control's address than the cap of 4
        job = plat.create("cl")
        assert job.node() is node
        streams = [job.open_stream("sleep 1; echo streamed") for _ in range(6)]
        try:
            for s in streams:
                wait_until(lambda: s.has_exit() or s.ended(), 15)
                assert s.status == 200 and s.has_exit() and \
                    output_of(s.events) == b"streamed\n", \
                    f"ATTACK node exempts its control plane: stream through the edge: " \
                    f"{s.status} {s.events} {s.error}"
        finally:
            for s in streams:
                s.close()
        assert flood.poll()["open"] == 4, dict(flood.poll())
    finally:
        flood.close()


# ---- the unauthenticated share -----------------------------------------------------------------

def test_unauthenticated_flood_sheds_its_oldest_never_authenticated_connections(plat):
    """Ten sources at their per-source cap (400 idle connections) against a table of 200 with
    an unauthenticated share of 100: the oldest idle ones are closed to make room; the
    authenticated keep-alive connections and a new client are served."""
    port = plat.control.port
    authed = [KeepAlive(port) for _ in range(10)]
    floods = []
    try:
        for a in authed:
            assert a.get("/v1/jobs/cl", plat.admin)[0] == 200
        for k in range(10):
            floods.append(Flood(f"127.0.1.{k + 1}", port, 40))
        deadline = time.monotonic() + 10
        while sum(f.poll()["open"] for f in floods) > 100 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)
        for f in floods:
            f.poll()
        states = [s for f in floods for s in f.state]
        st = Counter(states)
        assert st["open"] <= 100 and st["closed"] >= 300 and st["full"] == 0 and \
            st["source"] == 0, f"ATTACK unauthenticated share: 400 idle connections, share 100: " \
            f"{dict(st)}"
        # the oldest were closed, the newest stay
        assert set(states[:290]) == {"closed"} and set(states[-90:]) == {"open"}, \
            f"ATTACK unauthenticated share: not the oldest closed: {states[:290].count('open')} " \
            f"of the oldest 290 open, {states[-90:].count('closed')} of the newest 90 closed"
        for a in authed:  # never shed
            assert a.get("/v1/jobs/cl", plat.admin)[0] == 200, \
                "ATTACK unauthenticated share: an authenticated connection was closed"
        r = http_request(port, "GET", "/v1/jobs/cl",
                         headers={"Authorization": f"Bearer {plat.admin}"}, source="127.0.0.3")
        assert r.status == 200, f"ATTACK unauthenticated share: a new client: {r}"
    finally:
        for f in floods:
            f.close()
        for a in authed:
            a.close()


def test_unauthenticated_connection_has_a_short_head_deadline(ctl):
    port = ctl.control.port
    idle = tcp(port, "127.0.0.4")
    partial = raw(port, "127.0.0.4", b"GET /v1/jobs/t HTTP/1.1\r\nHost: x\r\n")
    unauth = raw(port, "127.0.0.4", b"GET /v1/health HTTP/1.1\r\nHost: x\r\n\r\n")
    authed = KeepAlive(port)
    t0 = time.monotonic()
    try:
        assert authed.get("/v1/jobs/t", ctl.admin)[0] == 200
        time.sleep(0.3)
        assert is_open(idle), "positive control: the idle connection is open at first"
        data, took = read_to_eof(idle, 5)
        assert took is not None and 0.5 < time.monotonic() - t0 < 4, \
            f"ATTACK head deadline: an idle unauthenticated connection, deadline 1000 ms, is " \
            f"open {time.monotonic() - t0:.1f} s after accept"
        data, took = read_to_eof(partial, 5)
        assert took is not None and data.startswith(b"HTTP/1.1 408 "), \
            f"ATTACK head deadline: a partial head: {data!r} (eof after {took})"
        data, took = read_to_eof(unauth, 5)
        assert data.startswith(b"HTTP/1.1 200 ") and took is not None, \
            f"ATTACK head deadline: keep-alive after an unauthenticated request: {data!r} {took}"
        time.sleep(max(0.0, 2.5 - (time.monotonic() - t0)))
        # 2.5 s idle: the authenticated keep-alive connection lives on (keep-alive 75 s)
        st, h, _ = authed.get("/v1/jobs/t", ctl.admin)
        assert st == 200, st
    finally:
        for s in (idle, partial, unauth):
            s.close()
        authed.close()


# ---- per principal -----------------------------------------------------------------------------

def test_principal_over_its_share_gets_429_others_unaffected(ctl):
    port = ctl.control.port
    ta = ctl.token("tenant-a", "ns-a", "write")
    tb = ctl.token("tenant-b", "ns-b", "write")
    a = [KeepAlive(port) for _ in range(6)]
    b = [KeepAlive(port) for _ in range(6)]
    try:
        for c in a:
            assert c.get("/v1/jobs/ns-a", ta)[0] == 200
        # the 7th connection of tenant A
        s = raw(port, send=(f"GET /v1/jobs/ns-a HTTP/1.1\r\nHost: x\r\n"
                            f"Authorization: Bearer {ta}\r\n\r\n").encode())
        data, took = read_to_eof(s, 5)
        s.close()
        head = data.split(b"\r\n\r\n")[0].decode(errors="replace")
        assert data.startswith(b"HTTP/1.1 429 "), \
            f"ATTACK per-principal: tenant A's 7th connection (share 6): {data[:200]!r}"
        assert "\r\nRetry-After: 1" in head and "Connection: close" in head and took is not None, \
            f"ATTACK per-principal: 429 without Retry-After or not closed: {head!r} eof {took}"
        assert json.loads(data.split(b"\r\n\r\n", 1)[1]) == {
            "error": "too many connections for this principal"}
        # tenant B is unaffected: its own six connections
        for c in b:
            assert c.get("/v1/jobs/ns-b", tb)[0] == 200, "per-principal: tenant B refused"
        # A's connections within its share keep working
        for c in a:
            assert c.get("/v1/jobs/ns-a", ta)[0] == 200, "per-principal: A's own refused"
        # the share counts open connections: one of A's closed, one of B's presents A's token
        # and moves to A, which is then at its share again
        a.pop().close()

        def fresh():
            return http_request(port, "GET", "/v1/jobs/ns-a",
                                headers={"Authorization": f"Bearer {ta}"}).status
        time.sleep(0.3)  # the close reaches the control plane
        moved = b.pop(0)
        assert moved.get("/v1/jobs/ns-a", ta)[0] == 200, "positive control: A's released one"
        assert fresh() == 429, \
            "ATTACK per-principal: a connection that moved to A by its token does not count"
        moved.close()
        assert wait_until(lambda: fresh() == 200, 5, 0.1), "positive control: released again"
    finally:
        for c in a + b:
            c.close()


def test_principal_share_counts_its_streams_through_the_edge(ctl):
    """Requests in flight through the edge keep counting against their principal until they
    end: exec streams (relayed on the client's connection) and uploads whose body is too large
    to replay (the client's socket becomes a tunnel to the node)."""
    port = ctl.control.port
    ta = ctl.token("tenant-s", "ns-s", "write")
    job = ctl.create("ns-s", token=ta)
    time.sleep(0.3)  # the creating connections' close reaches the control plane
    streams = []
    try:
        for _ in range(6):
            streams.append(Stream(port, "POST", job.path(f"/proxy/{AGENT_PORT}/v1/exec"),
                                  {"cmd": "sleep 3; echo done"},
                                  {"Authorization": f"Bearer {ta}",
                                   "X-Sandbox-Token": job.token}))
        assert all(s.status == 200 for s in streams), [s.status for s in streams]
        r = http_request(port, "GET", "/v1/jobs/ns-s", headers={"Authorization": f"Bearer {ta}"})
        assert r.status == 429, \
            f"ATTACK per-principal (edge streams): six streams open, share 6, a 7th request: {r}"
        for s in streams:
            assert wait_until(s.ended, 15) and s.has_exit(), (s.events, s.error)
    finally:
        for s in streams:
            s.close()  # (a kept connection counts until the client closes it)

    def fresh():
        return http_request(port, "GET", "/v1/jobs/ns-s",
                            headers={"Authorization": f"Bearer {ta}"}).status == 200
    assert wait_until(fresh, 5, 0.1), "positive control: streams closed, share released"
    # six uploads of 2 MiB, 64 KiB sent: tunnels from the edge to the node, held open
    uploads = []
    try:
        for i in range(6):
            u = raw(port, send=(f"PUT {job.path(f'/proxy/{AGENT_PORT}/v1/files/write')}"
                                f"?path=/tmp/up{i} HTTP/1.1\r\nHost: x\r\n"
                                f"Authorization: Bearer {ta}\r\nX-Sandbox-Token: {job.token}\r\n"
                                f"Content-Length: {2 << 20}\r\n\r\n").encode() + b"x" * 65536)
            uploads.append(u)
        time.sleep(0.5)  # the edge has handed each to a tunnel
        r = http_request(port, "GET", "/v1/jobs/ns-s", headers={"Authorization": f"Bearer {ta}"})
        assert r.status == 429, \
            f"ATTACK per-principal through tunnels: six uploads in flight, share 6: {r}"
    finally:
        for u in uploads:
            u.close()
    assert wait_until(fresh, 5, 0.1), "positive control: uploads cut, share released"


# ---- positive controls: the same floods without the limits -------------------------------------

def test_control_flood_without_limits_refuses_other_clients(plat):
    off = BareControl(plat, "cl-off", LIMITS_OFF)
    flood = None
    try:
        flood = Flood("127.0.0.2", off.port, FLOOD)
        st = flood.settle(200)
        assert st["open"] == 200 and st["full"] == FLOOD - 200, dict(st)
        r = http_request(off.port, "GET", "/v1/jobs/cl",
                         headers={"Authorization": f"Bearer {off.admin}"}, source="127.0.0.3")
        assert r.status == 503 and r.json() == {"error": "too many connections"}, \
            f"positive control: limits off, a client from 127.0.0.3 under the flood: {r}"
    finally:
        if flood:
            flood.close()
        off.proc.stop()
        assert_no_sanitizer_report(off.proc.log())


def test_node_flood_without_limits_refuses_the_control_plane(plat):
    """Last in this module: the flooded node is registered with the platform's control."""
    off = plat.add_node("cl-off", args=LIMITS_OFF)
    flood = Flood("127.0.0.2", off.port, FLOOD)
    try:
        st = flood.settle(200)
        assert 195 <= st["open"] <= 200 and st["full"] >= FLOOD - 200, dict(st)
        r = http_request(off.port, "GET", "/v1/health")  # from 127.0.0.1: the control's address
        assert r.status == 503 and r.json() == {"error": "too many connections"}, \
            f"positive control: limits off, the control plane's address under the flood: {r}"
    finally:
        flood.close()
