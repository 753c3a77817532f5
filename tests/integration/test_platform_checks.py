# SPDX-License-Identifier: MIT
"""Each of the node's checks on its own, end to end (one sbx-control, real sbx-nodes, real
requests), so that removing any one of them fails a test here without the unit tests:

- capabilities: a forged proxy capability; a capability for another exposed port; an HTTP
  capability used for a WebSocket upgrade; a capability naming another node, generation,
  activation or instance of the sandbox's run;
- management: a manage capability for another node (must not install, which would stop the
  current run), for another sandbox, or for a run other than the installed one;
- the bridge: a listener with the right pid and start time running another executable (the
  run's process execs in place after the node identified it), and a listener in another
  process of the run (same executable, same socket, another pid).

Every refusal is paired with a positive control: the right request, sent the same way, works."""
import os
import secrets
import stat
import tempfile

import pytest

from conftest import wait_until
from sbxplatform import AGENT_PORT, Platform


@pytest.fixture(scope="module")
def plat():
    p = Platform(nodes=("ck-a", "ck-b"))
    yield p
    p.stop()


def refused(r, status, verdict, reason, what):
    assert r.status == status, f"{what}: expected {status} {verdict}/{reason}, got {r}"
    assert r.headers.get("x-sbx-verdict") == verdict, f"{what}: {r}"
    j = r.json()
    assert (j.get("verdict"), j.get("reason")) == (verdict, reason), f"{what}: {j}"


@pytest.fixture(scope="module")
def served(plat):
    """A job on ck-a exposing the agent, 8080 (a Python HTTP server) and 8081 (nothing)."""
    job = plat.create_on("ck-a", flavor="cpu-small-nonet",
                         expose=[{"port": AGENT_PORT, "protocol": "http"},
                                 {"port": 8080, "protocol": "http"},
                                 {"port": 8081, "protocol": "http"}])
    job.sh("mkdir -p /srv && echo hello-8080 > /srv/index.txt")
    job.start_process("exec python3 -m http.server 8080 --bind 127.0.0.1 --directory /srv "
                      ">/srv/log 2>&1")
    assert wait_until(lambda: job.proxy("GET", 8080, "/index.txt").status == 200, 15, 0.1)
    yield job
    job.cancel()


def server_log(job):
    return job.sh("cat /srv/log")


def get_8080(job, headers=None, **capkw):
    """GET /index.txt on the run's port 8080 through its node, with a proxy capability minted
    for exactly this request from capkw (its own port and protocol fields)."""
    q = secrets.token_hex(4)
    h = {"X-Sandbox-Token": job.token}
    h.update(headers or {})
    node = job.node()
    path = node.ports_path(job.id, 8080, f"/index.txt?{q}")
    cap = job.mint("proxy", method="GET", target=path, **capkw)
    return node.request("GET", path, cap, headers=h), q


def positive_8080(job):
    r, q = get_8080(job, port=8080, protocol="http")
    assert r.status == 200 and r.body == b"hello-8080\n", r
    assert wait_until(lambda: q in server_log(job), 5)


# ---- capabilities -----------------------------------------------------------------------------

def test_forged_proxy_capability_is_refused(served):
    r, q = get_8080(served, port=8080, protocol="http", forge=True)
    refused(r, 403, "Deny", "signature", "signature check of a forged proxy capability")
    positive_8080(served)
    assert q not in server_log(served), "a forged proxy capability reached the service"


def test_capability_for_another_exposed_port_is_refused(served):
    """8081 is exposed too: only the comparison of the capability's port with the request's
    port stops a capability for 8081 from reaching 8080."""
    r, q = get_8080(served, port=8081, protocol="http")
    refused(r, 403, "Deny", "port", "port check: a capability for port 8081 used on 8080")
    positive_8080(served)
    assert q not in server_log(served), "a capability for port 8081 reached port 8080"


def test_http_capability_cannot_upgrade_to_websocket(served):
    r, q = get_8080(served, port=8080, protocol="http",
                    headers={"Upgrade": "websocket", "Connection": "Upgrade",
                             "Sec-WebSocket-Version": "13",
                             "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="})
    refused(r, 403, "Deny", "protocol",
            "protocol check: an http capability used for a websocket upgrade")
    positive_8080(served)
    assert q not in server_log(served), "an http capability carried a websocket upgrade"


@pytest.mark.parametrize("field", ["node", "generation", "activation", "instance"])
def test_capability_for_another_incarnation_is_refused(plat, served, field):
    run = served.run()
    other = {"node": "ck-b", "generation": run["generation"] + 1,
             "activation": "a-other" + secrets.token_hex(3),
             "instance": "i-other" + secrets.token_hex(3)}[field]
    cap = plat.mint(dict(run, **{field: other}), "exec")
    node = served.node()
    marker = f"/root/other-{field}"
    r, _ = node.exec(served, f"touch {marker}", cap)
    refused(r, 409, "RefreshRoute", "stale_run",
            f"run identity check: a capability naming another {field}")
    assert not os.path.exists(node.root_path(served.id, marker))
    r, res = node.exec(served, "echo right-run", plat.mint(run, "exec"))  # positive control
    assert r.status == 200 and res.out == "right-run\n", (r, res)


# ---- management -------------------------------------------------------------------------------

def test_manage_capability_checks(plat):
    job = plat.create_on("ck-a")
    other = plat.create()
    node = plat.node("ck-a")
    run = job.run()
    nxt = dict(run, generation=run["generation"] + 1, activation="a-mg" + secrets.token_hex(3),
               instance="i-mg" + secrets.token_hex(3))
    body = {"secrets": {"SBX_TOKEN": job.token}}
    pause = f"/v1/runs/{job.id}/pause"

    def manage(r):  # a management capability for this pause request, naming run r
        return plat.mint(r, "manage", method="POST", target=pause, body="")
    try:
        # a manage capability for node ck-b must not install on ck-a (stopping the current run)
        put = f"/v1/runs/{job.id}"
        r = node.request("PUT", put, plat.mint(dict(nxt, node="ck-b"), "manage", method="PUT",
                                               target=put, body=body), body)
        refused(r, 409, "RefreshRoute", "stale_run",
                "manage node check: a capability for another node installed here")
        # ... nor pause it
        r = node.request("POST", pause, manage(dict(run, node="ck-b")))
        refused(r, 409, "RefreshRoute", "stale_run",
                "manage node check: a capability for another node paused the run here")
        # another sandbox's manage capability, on this sandbox's route
        r = node.request("POST", pause, manage(other.run()))
        refused(r, 403, "Deny", "sandbox",
                "manage sandbox check: another sandbox's capability paused this run")
        # a manage capability for a run that is not the installed one
        r = node.request("POST", pause, manage(nxt))
        refused(r, 409, "RefreshRoute", "stale_run",
                "manage target check: a capability for another run paused the installed one")
        assert job.sh("echo still-running") == "still-running\n", \
            "a refused management request stopped the run"
        assert job.run()["generation"] == run["generation"]
        # positive control: the right capability pauses the run
        r = node.request("POST", pause, manage(run))
        assert r.status == 200, r
        assert r.json()["run"]["state"] != "running", r.json()
    finally:
        job.cancel()
        other.cancel()


def test_dot_names_are_not_runs(plat):
    """A run's sandbox names a directory under the node's state: ".", ".." or a dot file are
    refused as routes (404) even with a valid management capability naming them."""
    job = plat.create_on("ck-a")
    node = plat.node("ck-a")
    run = job.run()
    try:
        for name in ("..", ".", ".hidden"):
            body = {"secrets": {"SBX_TOKEN": "x" * 32}}
            cap = plat.mint(dict(run, sandbox=name), "manage", method="PUT",
                            target=f"/v1/runs/{name}", body=body)
            r = node.request("PUT", f"/v1/runs/{name}", cap, body)
            assert r.status == 404, f"dot name check: PUT /v1/runs/{name} -> {r}"
        assert job.sh("echo intact") == "intact\n"
        # positive control: the same request for the job's own name is routed (installing the
        # installed run again answers with it)
        body = {"secrets": {"SBX_TOKEN": job.token}}
        r = node.request("PUT", f"/v1/runs/{job.id}",
                         plat.mint(run, "manage", method="PUT", target=f"/v1/runs/{job.id}",
                                   body=body), body)
        assert r.status == 200 and r.json()["run"]["run"]["sandbox"] == job.id, r
    finally:
        job.cancel()


# ---- the bridge -------------------------------------------------------------------------------

# The agents below stand in for sbx-server as the node's --agent. Each listens on the bridge
# socket it inherits (fd 3) in a way the node must refuse; the node's refusal message shows
# how far its checks got (the socket, then pid, then start time, then the executable).
LISTEN = ("import socket, time\n"
          "s = socket.socket(fileno=3)\n"
          "s.listen(16)\n"
          "while True:\n"
          "    c, _ = s.accept()\n"
          "    c.close()\n")

# The run's process is /bin/sh when the node identifies it, then execs python3 in place: same
# pid, same start time, same socket, another executable.
EXEC_IN_PLACE = "#!/bin/sh\nsleep 2\nexec /usr/bin/python3 -c '%s'\n" % LISTEN

# The run's process (python3) forks; the child (same executable) listens: another pid.
OTHER_PID = ("#!/usr/bin/python3\n"
             "import os, time\n"
             "time.sleep(1)\n"
             "if os.fork() == 0:\n"
             + "".join("    " + line + "\n" for line in LISTEN.splitlines()) +
             "os.wait()\n")


def impostor_platform(script, name):
    d = tempfile.mkdtemp(prefix="sbx-agent-")
    os.chmod(d, 0o755)
    path = os.path.join(d, "sbx-server")
    with open(path, "w") as f:
        f.write(script)
    os.chmod(path, stat.S_IRWXU | stat.S_IRGRP | stat.S_IXGRP | stat.S_IROTH | stat.S_IXOTH)
    return Platform(nodes=(name,), agent=path), d


@pytest.mark.parametrize("case,script,message", [
    ("exe", EXEC_IN_PLACE, "bridge peer runs another executable"),
    ("pid", OTHER_PID, "bridge peer is not the process started for this activation"),
], ids=["exe", "pid"])
def test_bridge_refuses_an_impostor_listener(case, script, message):
    p, d = impostor_platform(script, f"im-{case}")
    try:
        job = p.create(wait=False)
        node = p.node(f"im-{case}")
        seen = wait_until(lambda: message in node.log(), 25, 0.2)
        assert seen, (f"bridge {case} check: the node never refused the impostor listener "
                      f"with {message!r}; its log:\n" + node.log()[-3000:])
        j = job.inspect()
        assert not ((j.get("run") or {}).get("state") == "running" and
                    j.get("stage") == "RUNNING"), f"bridge {case} check: the run is served: {j}"
    finally:
        p.stop(check=False)
        with os.scandir(d) as it:
            for e in it:
                os.unlink(e.path)
        os.rmdir(d)


def test_bridge_positive_control(plat):
    """The same node code with the real agent passes every bridge check."""
    job = plat.create_on("ck-b")
    try:
        assert job.sh("echo bridged") == "bridged\n"
    finally:
        job.cancel()


# A job whose command is not the agent but listens on the bridge itself (the socket it inherits
# as fd 3) and answers HTTP: a foreign agent. The node's bridge pins the agent binary it mounted
# into the run (device and inode), so this run is never accepted, whatever it executed at spawn.
FOREIGN_AGENT = ("import socket\n"
                 "s = socket.socket(fileno=3)\n"
                 "s.listen(16)\n"
                 "body = b'FOREIGN'\n"
                 "while True:\n"
                 "    c, _ = s.accept()\n"
                 "    c.recv(65536)\n"
                 "    c.sendall(b'HTTP/1.1 200 OK\\r\\nContent-Type: application/x-ndjson\\r\\n'\n"
                 "              b'Content-Length: 7\\r\\nConnection: close\\r\\n\\r\\n' + body)\n"
                 "    c.close()\n")


def test_bridge_refuses_a_foreign_agent_command(plat):
    job = plat.create(wait=False, command=["/usr/bin/python3", "-c", FOREIGN_AGENT])
    try:
        def settled():
            j = job.inspect()
            return j if j["stage"] in ("RUNNING", "ERROR") else None
        j = wait_until(settled, 30, 0.1)
        assert j, f"the job did not settle: {job.inspect()}"
        r = job.exec_raw("echo hi")
        assert b"FOREIGN" not in r.body, f"ATTACK: foreign agent accepted and served: {r}"
        assert j["stage"] == "ERROR", f"ATTACK: foreign agent accepted: {j}"
        assert "bridge peer runs another executable than the node's agent" in j["message"], j
    finally:
        job.action("cancel")


def test_bridge_accepts_the_agent_behind_a_wrapper_command(plat):
    """Positive control: a command that ends by executing the mounted agent is accepted (the
    check is the agent binary, at every connection, not what ran at spawn)."""
    job = plat.create(command=["/bin/sh", "-c", "exec /.sbx/bin/sbx-server"])
    try:
        assert job.sh("echo wrapped") == "wrapped\n"
    finally:
        job.cancel()
