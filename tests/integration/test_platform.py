# SPDX-License-Identifier: MIT
"""The platform's run-bound capabilities, end to end: one sbx-control and two sbx-nodes (A, B)
as separate processes with separate state directories on loopback.

The seed's scenario: sandbox S runs as generation g on A and moves to B as g+1. Capabilities
for the wrong incarnation are refused before anything is forwarded (409 RefreshRoute), the edge
proxy repairs its stale route with exactly one retry, and streams bound to g are cut. Forged,
expired, not yet valid, wrong-purpose, wrong-port, wrong-protocol and other-sandbox
capabilities are denied (403 + reason); a replaced bridge is refused (502) without a byte
reaching it. Every refusal is paired with a positive control: the right capability, sent the
same way, works and has its side effect."""
import os
import secrets
import socket
import threading
import time

import pytest

from conftest import wait_until
from sbxplatform import AGENT_PORT, Platform, parse_ndjson

# Prints a line every 0.2 s for 60 s.
TICK = "i=0; while [ $i -lt 300 ]; do echo tick $i; i=$((i+1)); sleep 0.2; done"


@pytest.fixture(scope="module")
def plat():
    p = Platform(nodes=("nodeA", "nodeB"))
    yield p
    p.stop()


def refused(r, status, verdict, reason):
    """A node refusal: status, X-Sbx-Verdict and the machine-readable body."""
    assert r.status == status, r
    assert r.headers.get("x-sbx-verdict") == verdict, r
    j = r.json()
    assert j.get("verdict") == verdict and j.get("reason") == reason, j
    assert j.get("error"), j


def pid_alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


# ---- the seed's scenario ----------------------------------------------------------------------

def test_seed_scenario_move_from_a_to_b(plat):
    A, B = plat.node("nodeA"), plat.node("nodeB")
    job = plat.create_on("nodeA")
    run_g = job.run()
    g = run_g["generation"]
    assert run_g["node"] == "nodeA"
    job.sh("echo before-move > /root/state.txt")
    with open(A.root_path(job.id, "/root/state.txt")) as f:
        assert f.read() == "before-move\n"

    # Positive control: a correctly minted exec capability sent straight to A works.
    cap_g = job.mint("exec", run_g)
    minted = time.monotonic()
    r, res = A.exec(job, "echo direct-ok; touch /root/direct-ok", cap_g)
    assert r.status == 200 and res.code == 0 and res.out == "direct-ok\n", (r, res)
    assert os.path.exists(A.root_path(job.id, "/root/direct-ok"))

    # A capability for the next incarnation (a route that already knows g+1) reaching A while g
    # runs there: refused before forwarding, the command never runs.
    ahead = job.mint("exec", run_g, generation=g + 1)
    r, _ = A.exec(job, "touch /root/ahead", ahead)
    refused(r, 409, "RefreshRoute", "stale_run")
    assert not os.path.exists(A.root_path(job.id, "/root/ahead"))

    # Warm the control's route cache for g, then open exec streams on g (edge and direct).
    assert job.sh("hostname").strip() == job.id
    edge_stream = job.open_stream(TICK)
    direct_stream = A.open_stream(job, TICK, cap_g)
    assert edge_stream.status == 200 and direct_stream.status == 200
    assert edge_stream.wait_events(4) and direct_stream.wait_events(4)
    assert not edge_stream.ended() and not direct_stream.ended()
    agent_pid_g = A.run_record(job.id)["pid"]
    assert pid_alive(agent_pid_g)

    # Move to B: generation g+1.
    t_move = time.monotonic()
    r = job.action("move", {"node": "nodeB"})
    assert r.status == 202, r
    try:
        assert wait_until(lambda: edge_stream.ended() and direct_stream.ended(), 10), \
            "streams on g still open after the move"
        for s in (edge_stream, direct_stream):
            assert s.ended_at - t_move < 5, s.ended_at - t_move
            assert not s.has_exit(), s.events[-3:]  # cut, not finished
            assert len(s.stdout_events()) >= 3  # it was live before the cut
    finally:
        edge_stream.close()
        direct_stream.close()
    job.wait_stage("RUNNING", generation=g + 1, node="nodeB")
    run_n = job.run()
    assert run_n["generation"] == g + 1 and run_n["node"] == "nodeB"
    assert run_n["activation"] != run_g["activation"]

    # The edge's cached route still names g on A: the first request after the move is refused
    # by A, the entry is repaired, and exactly one retry lands on g+1 (files survived the move;
    # what this request writes is in B's root).
    res = job.exec("cat /root/state.txt; echo landed > /root/landed.txt; echo ok")
    assert res.code == 0 and res.out == "before-move\nok\n", res
    with open(B.root_path(job.id, "/root/landed.txt")) as f:
        assert f.read() == "landed\n"
    line = (f"edge: t/{job.id}: node refused run generation {g} (RefreshRoute); "
            f"retrying on generation {g + 1} at nodeB")
    log = plat.control.log()
    assert log.count(line) == 1, log[-3000:]
    assert log.count(f"edge: t/{job.id}: node refused") == 1, log[-3000:]
    # The repaired entry serves the next request directly (no new refusal).
    assert job.sh("echo again") == "again\n"
    assert plat.control.log().count(f"edge: t/{job.id}: node refused") == 1

    # A run-g capability sent to B (which runs g+1): refused, never forwarded.
    r, _ = B.exec(job, "touch /root/stale-on-b", cap_g)
    refused(r, 409, "RefreshRoute", "stale_run")
    assert not os.path.exists(B.root_path(job.id, "/root/stale-on-b"))

    # A retires g: its run directory goes, its process tree is gone.
    assert wait_until(lambda: not os.path.exists(A.run_dir(job.id)), 10), A.log()[-2000:]
    # (the directory is renamed away before the line is logged: wait for the line too)
    assert wait_until(lambda: f"retired run {job.id} generation {g}" in A.log(), 5), A.log()
    assert wait_until(lambda: not pid_alive(agent_pid_g), 5)
    # ... and then refuses the run-g capability too, before it expires.
    r, _ = A.exec(job, "true", cap_g)
    refused(r, 409, "RefreshRoute", "no_run")
    assert time.monotonic() - minted < 100  # lifetime 120 s: still unexpired

    # A capability for g+1 sent to A: refused before forwarding; the touch never happens.
    cap_n = job.mint("exec", run_n)
    r, _ = A.exec(job, "touch /root/wrong-node", cap_n)
    refused(r, 409, "RefreshRoute", "no_run")
    assert not os.path.exists(B.root_path(job.id, "/root/wrong-node"))
    assert not os.path.exists(A.run_dir(job.id))
    # Positive control: the same capability sent to B runs, with its side effect.
    r, res = B.exec(job, "cat /root/state.txt; touch /root/right-node", cap_n)
    assert r.status == 200 and res.out == "before-move\n", (r, res)
    assert os.path.exists(B.root_path(job.id, "/root/right-node"))
    job.cancel()


def test_installing_next_run_refuses_old_capabilities_and_cuts_streams(plat):
    """Once run N+1 is installed on a node, run-N capabilities are refused at once, even
    unexpired, and an open stream on N is cut. N+1 is installed directly with a management
    capability for a new generation on the same node."""
    job = plat.create()
    node = job.node()
    old = job.run()
    cap_old = job.mint("exec", old)
    minted = time.monotonic()
    r, res = node.exec(job, "echo old-run", cap_old)
    assert r.status == 200 and res.out == "old-run\n", (r, res)
    stream = node.open_stream(job, TICK, cap_old)
    assert stream.status == 200 and stream.wait_events(4) and not stream.ended()

    tag = secrets.token_hex(4)
    new = dict(old, generation=old["generation"] + 1, activation=f"a-test{tag}",
               instance=f"i-test{tag}")
    body = {"secrets": {"SBX_TOKEN": job.token}}
    manage = plat.mint(new, "manage", method="PUT", target=f"/v1/runs/{job.id}", body=body)
    try:
        r = node.request("PUT", f"/v1/runs/{job.id}", manage, body)
        installed = time.monotonic()
        assert r.status == 201, r
        assert r.json()["run"]["run"]["generation"] == new["generation"]
        assert wait_until(stream.ended, 5), "stream on run N still open"
        assert stream.ended_at - installed < 3
        assert not stream.has_exit() and len(stream.stdout_events()) >= 3, stream.events[-3:]

        r, _ = node.exec(job, "touch /root/old-cap", cap_old)
        refused(r, 409, "RefreshRoute", "stale_run")
        assert time.monotonic() - minted < 100  # unexpired
        assert not os.path.exists(node.root_path(job.id, "/root/old-cap"))
        # Positive control: run N+1's own capability works.
        cap_new = plat.mint(new, "exec")
        r, res = node.exec(job, "echo new-run; touch /root/new-cap", cap_new)
        assert r.status == 200 and res.out == "new-run\n", (r, res)
        assert os.path.exists(node.root_path(job.id, "/root/new-cap"))
    finally:
        stream.close()
        node.request("DELETE", f"/v1/runs/{job.id}",
                     plat.mint(new, "manage", method="DELETE", target=f"/v1/runs/{job.id}",
                               body=""))
    job.cancel()


def test_handoff_that_keeps_the_run_keeps_streams_and_capabilities(plat):
    """An install of the very run that is installed (a control plane retrying, or another
    replica taking over) changes nothing: 200, the same process, open streams go on and the
    run's capabilities keep working. Restarting the control plane is such a hand-off too for
    what goes straight to the node."""
    job = plat.create()
    node = job.node()
    run = job.run()
    cap = job.mint("exec", run)
    pid = node.run_record(job.id)["pid"]
    stream = node.open_stream(job, TICK, cap)
    try:
        assert stream.status == 200 and stream.wait_events(3)
        body = {"secrets": {"SBX_TOKEN": job.token}}
        r = node.request("PUT", f"/v1/runs/{job.id}",
                         plat.mint(run, "manage", method="PUT", target=f"/v1/runs/{job.id}",
                                   body=body), body)
        assert r.status == 200, r  # already installed: nothing to do
        assert node.run_record(job.id)["pid"] == pid
        seen = len(stream.events)
        assert wait_until(lambda: len(stream.events) >= seen + 3, 5), "stream stopped"
        assert not stream.ended()
        plat.restart_control(0, same_port=True)
        seen = len(stream.events)
        assert wait_until(lambda: len(stream.events) >= seen + 3, 5), "stream stopped"
        assert not stream.ended()
        r, res = node.exec(job, "echo same-run", cap)
        assert r.status == 200 and res.out == "same-run\n", (r, res)
        assert job.sh("echo through-the-new-control") == "through-the-new-control\n"
    finally:
        stream.close()
    job.cancel()


# ---- denials ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def target(plat):
    """A job exposing the agent and port 8080 (a Python HTTP server on 127.0.0.1 inside its own
    network namespace: no clash with the host's ports), and another job whose capabilities
    must not work on it."""
    job = plat.create(flavor="cpu-small-nonet",
                      expose=[{"port": AGENT_PORT, "protocol": "http"},
                              {"port": 8080, "protocol": "http"}])
    job.sh("mkdir -p /srv && echo hello-8080 > /srv/index.txt")
    proc = job.start_process("exec python3 -m http.server 8080 --bind 127.0.0.1 --directory /srv")
    ok = wait_until(lambda: job.proxy("GET", 8080, "/index.txt").status == 200, 15, 0.1)
    assert ok, job.proxy("GET", 8080, "/index.txt")
    job.http_proc = proc["id"]
    other = plat.create()
    yield job, other
    job.cancel()
    other.cancel()


def http_server_log(job):
    """What the Python server inside the job printed (one line per request it received)."""
    r = job.proxy("GET", AGENT_PORT, f"/v1/processes/{job.http_proc}/output?follow=false")
    assert r.status == 200, r
    out = []
    for e in parse_ndjson(r.body):
        if e.get("event") in ("stdout", "stderr"):
            out.append(e.get("data", ""))
    return "".join(out)


EXEC_DENIALS = {
    "signature": dict(forge=True),
    "unknown_key": dict(forge=True, kid="k-neverissued"),
    "expired": dict(iat_offset=-300, lifetime=60),
    "not_yet": dict(iat_offset=120),
    "purpose": dict(access="files_read"),
}


@pytest.mark.parametrize("reason", list(EXEC_DENIALS))
def test_exec_capability_denied(plat, target, reason):
    job, _ = target
    node = job.node()
    kw = dict(EXEC_DENIALS[reason])
    access = kw.pop("access", "exec")
    bad = job.mint(access, **kw)
    marker = f"/root/denied-{reason}"
    r, _ = node.exec(job, f"touch {marker}", bad)
    refused(r, 403, "Deny", reason)
    # Positive control: the correct capability, same request, same node.
    good = job.mint("exec")
    ok_marker = f"/root/allowed-{reason}"
    r, res = node.exec(job, f"touch {ok_marker}; echo allowed", good)
    assert r.status == 200 and res.out == "allowed\n", (r, res)
    assert os.path.exists(node.root_path(job.id, ok_marker))
    assert not os.path.exists(node.root_path(job.id, marker))


def test_other_sandbox_capability_denied(plat, target):
    job, other = target
    node = job.node()
    foreign = other.mint("exec")  # valid, unexpired, for the other sandbox's current run
    path = node.ports_path(job.id, AGENT_PORT, "/v1/exec")
    r = node.request("POST", path, foreign, {"cmd": "touch /root/foreign"},
                     {"X-Sandbox-Token": job.token})
    refused(r, 403, "Deny", "sandbox")
    assert not os.path.exists(node.root_path(job.id, "/root/foreign"))
    # Positive control: that capability works for its own sandbox.
    r, res = other.node().exec(other, "echo mine", foreign)
    assert r.status == 200 and res.out == "mine\n", (r, res)


def test_missing_or_malformed_capability(plat, target):
    job, _ = target
    node = job.node()
    path = node.ports_path(job.id, AGENT_PORT, "/v1/exec")
    for cap in (None, "v1.garbage.garbage", "not-a-capability"):
        r = node.request("POST", path, cap, {"cmd": "touch /root/nocap"},
                         {"X-Sandbox-Token": job.token})
        refused(r, 401, "Deny", "malformed")
    assert not os.path.exists(node.root_path(job.id, "/root/nocap"))


PORT_DENIALS = {
    # capability for another port than the request's
    "port": dict(cap=dict(port=8081, protocol="http"), req_port=8080),
    # websocket capability for a plain HTTP request
    "protocol": dict(cap=dict(port=8080, protocol="websocket"), req_port=8080),
    # a port the job does not expose (capability and request agree on it)
    "port-not-exposed": dict(cap=dict(port=9090, protocol="http"), req_port=9090),
}


@pytest.mark.parametrize("case", list(PORT_DENIALS))
def test_port_capability_denied(plat, target, case):
    job, _ = target
    node = job.node()
    spec = PORT_DENIALS[case]
    q = f"denied-{case}-{secrets.token_hex(3)}"
    path = node.ports_path(job.id, spec["req_port"], f"/index.txt?{q}")
    bad = job.mint("proxy", method="GET", target=path, **spec["cap"])
    tok = {"X-Sandbox-Token": job.token}
    r = node.request("GET", path, bad, headers=tok)
    refused(r, 403, "Deny", case.split("-")[0])
    # Positive control: the right capability reaches the server (which logs the request).
    okq = f"allowed-{case}-{secrets.token_hex(3)}"
    path = node.ports_path(job.id, 8080, f"/index.txt?{okq}")
    good = job.mint("proxy", port=8080, protocol="http", method="GET", target=path)
    r = node.request("GET", path, good, headers=tok)
    assert r.status == 200 and r.body == b"hello-8080\n", r
    assert wait_until(lambda: okq in http_server_log(job), 5)
    assert q not in http_server_log(job)


def test_edge_denies_unexposed_port(plat, target):
    """Through the edge the capability names the port asked for; the node refuses a port the
    job does not expose, and the Deny is final (passed on, no retry)."""
    job, _ = target
    r = job.proxy("GET", 9090, "/index.txt")
    assert r.status == 403 and r.headers.get("x-sbx-verdict") == "Deny", r
    assert r.json()["reason"] == "port"
    r = job.proxy("GET", 8080, "/index.txt")  # positive control
    assert r.status == 200 and r.body == b"hello-8080\n", r


# ---- the bridge -------------------------------------------------------------------------------

class FakeBridge:
    """A unix listener that records every connection and byte it receives."""

    def __init__(self, path):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(path)
        self.sock.listen(16)
        self.sock.settimeout(0.1)
        self.accepted = 0
        self.received = b""
        self._stop = False
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        while not self._stop:
            try:
                c, _ = self.sock.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            self.accepted += 1
            c.settimeout(1)
            try:
                while True:
                    b = c.recv(65536)
                    if not b:
                        break
                    self.received += b
            except OSError:
                pass
            c.close()

    def close(self):
        self._stop = True
        self.thread.join(5)
        self.sock.close()


def test_replaced_bridge_is_refused(plat):
    job = plat.create()
    node = job.node()
    cap = job.mint("exec")
    r, res = node.exec(job, "echo via-bridge", cap)  # positive control
    assert r.status == 200 and res.out == "via-bridge\n", (r, res)

    sock_path = os.path.join(node.run_dir(job.id), "br", "a.sock")
    assert os.path.exists(sock_path)
    os.unlink(sock_path)
    fake = FakeBridge(sock_path)  # same path, another process (this one)
    try:
        r, _ = node.exec(job, "touch /root/through-fake", cap)
        assert r.status == 502, r
        assert r.json()["error"].startswith("bridge:"), r
        r = job.exec_raw("touch /root/through-fake-edge")  # through the edge: the same
        assert r.status == 502 and r.json()["error"].startswith("bridge:"), r
        time.sleep(0.3)
        assert fake.accepted == 0 and fake.received == b"", \
            f"bridge inode check: the node connected to a replaced socket " \
            f"({fake.accepted} connections, {fake.received[:200]!r})"
        assert "bridge refused" in node.log()
        # refused by the check meant for it (the socket's inode), not a later one by chance
        assert "bridge socket is not the one this node created" in node.log(), \
            "bridge inode check: the replaced socket was not refused as another socket"
    finally:
        fake.close()
    assert not os.path.exists(node.root_path(job.id, "/root/through-fake"))
    job.cancel()
