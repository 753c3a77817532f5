# SPDX-License-Identifier: MIT
"""The trust chain around capabilities, attacked with real binaries and real requests.

- Nodes pin the control plane's identity key at join: a control plane with another identity
  (even one holding the join token, the node records and the signing keys) cannot hand a node a
  key set; an older signed key set replayed later is refused; the last good set survives a
  restart of the node.
- Capabilities name their request: a manage capability works once and only with its body; a
  data-path capability only for its method, target (and body, when it names one).
- Roles per purpose at the edge: read tokens read files and list, exec needs write.

Every refusal comes with a positive control that shows the effect would have been seen.

The identity tests run the platform with --insecure-plain-http: a signed key set must hold even
where the transport does not (an attacker on the control plane's address speaks plain HTTP
here). test_platform_tls.py attacks the transport itself."""
import http.server
import json
import os
import secrets
import shutil
import stat
import subprocess
import threading
import time

import pytest

from conftest import free_port, wait_until
from sbxplatform import (AGENT_PORT, CONTROL_BIN, NODE_BIN, Control, Node, Platform, Proc,
                         http_request)


@pytest.fixture
def plat():
    p = Platform(nodes=("tr-a",), tls=False)
    yield p
    p.stop()


def join_parts(path):
    """(token, identity key) of a join file: sbxjoin1.<token>.<base64url key>."""
    with open(path) as f:
        text = f.read().strip()
    magic, token, key = text.split(".")
    assert magic == "sbxjoin1", text
    return token, key


def mode(path):
    return stat.S_IMODE(os.stat(path).st_mode)


class OwnControl:
    """A real sbx-control on a state directory of its own (so its own identity key), stopped
    with the platform."""

    def __init__(self, plat, name, state=None, port=None):
        self.name = name
        self.state = state or os.path.join(plat.dir, name)
        self.port = port or free_port()
        self.token_file = os.path.join(plat.dir, f"{name}.admin")
        self.proc = Proc(name, [CONTROL_BIN, "--state", self.state, "--listen",
                                f"127.0.0.1:{self.port}", "--admin-token-file", self.token_file,
                                "--insecure-plain-http"],
                         os.path.join(plat.dir, f"{name}.log"))
        plat._retired.append(self)  # stopped (and its log checked) at teardown
        ok = wait_until(lambda: self._healthy() or not self.proc.alive(), 10)
        assert ok and self.proc.alive(), self.proc.log()
        self.join_file = os.path.join(self.state, "node-join.token")

    def _healthy(self):
        try:
            return http_request(self.port, "GET", "/v1/health", timeout=2).status == 200
        except OSError:
            return False

    def request(self, method, path, token, body=None):
        return http_request(self.port, method, path, body, {"Authorization": f"Bearer {token}"})


class ReplayControl:
    """Something on the control plane's address that answers registration and heartbeats with
    a fixed (genuinely signed, but old) key set."""

    def __init__(self, port, keyset):
        self.calls = 0
        outer = self

        class H(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                n = int(self.headers.get("content-length") or 0)
                self.rfile.read(n)
                outer.calls += 1
                body = json.dumps({"keyset": keyset, "node_token": "sbxnode_replayed",
                                   "heartbeat_ms": 1000}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *a):
                pass

        self.srv = http.server.ThreadingHTTPServer(("127.0.0.1", port), H)
        self.thread = threading.Thread(target=self.srv.serve_forever, daemon=True)
        self.thread.start()

    def stop(self):
        self.srv.shutdown()
        self.srv.server_close()
        self.thread.join(5)


def rotate(request):
    """POST /v1/admin/keys/rotate through request(method, path, body); the new key's id."""
    r = request("POST", "/v1/admin/keys/rotate", {})
    assert r.status == 200, r
    return next(k["kid"] for k in r.json()["keys"] if k["retired"] == 0)


def stop_control(plat):
    c = plat.control
    c.proc.stop()
    plat._retired.append(c)
    return c.port


def restart_control(plat, port):
    c = Control(plat, f"control-back{len(plat._retired)}", plat.ctl_state, port=port)
    plat.controls[0] = plat.control = c
    return c


def exec_works(node, job, cap, word):
    r, res = node.exec(job, f"echo {word}", cap)
    return r.status == 200 and res is not None and res.out == f"{word}\n"


# ---- pinned control identity, signed key sets ---------------------------------------------

def test_join_material_pins_the_control_identity(plat):
    node = plat.node("tr-a")
    tok, key = join_parts(plat.join_token_file)
    assert tok.startswith("sbxjoin_") and len(key) == 43
    ident = os.path.join(plat.ctl_state, "identity.key")
    assert mode(ident) == 0o600 and mode(plat.join_token_file) == 0o600
    ks = os.path.join(node.state, "keyset")
    assert mode(ks) == 0o600 and node.health()["keyset_version"] >= 1
    # a bare join token (no identity to pin) is refused at start, and a wrong key is no key
    for argv in (["--join", tok], ["--join", f"sbxjoin1.{tok}.short"]):
        out = subprocess.run([NODE_BIN, "--state", os.path.join(plat.dir, "nope"), "--listen",
                              f"127.0.0.1:{free_port()}", "--control",
                              f"127.0.0.1:{plat.control.port}", "--name", "nope"] + argv,
                             capture_output=True, timeout=10)
        assert out.returncode == 2, out
    # positive control: the same token with --control-key starts and registers
    n = Node(plat, "tr-key", plat.control.port, join=tok)
    n.proc.proc.kill()  # replaced below: Node() has no --control-key argument
    n.proc.proc.wait()
    n.proc.stop()
    argv = n.proc.argv + ["--control-key", key]
    n.proc = Proc("tr-key", argv, os.path.join(plat.dir, "tr-key.log"))
    plat.nodes.append(n)
    assert wait_until(lambda: n.health().get("registered"), 10), n.log()


def test_old_join_file_is_upgraded_with_the_same_token_and_identity(plat):
    """A state directory from before the identity key: the bare join token in node-join.token
    stays valid, and the file becomes join material with the (kept) identity key."""
    tok, key = join_parts(plat.join_token_file)
    port = stop_control(plat)
    with open(plat.join_token_file, "w") as f:
        f.write(tok + "\n")
    restart_control(plat, port)
    assert join_parts(plat.join_token_file) == (tok, key)
    assert mode(plat.join_token_file) == 0o600
    plat.add_node("tr-late")  # registers with the upgraded material


def test_control_with_a_foreign_identity_is_refused(plat):
    """A real sbx-control with its own identity that accepts the node's join token answers the
    node's registration: the node pinned to the real control refuses its key set and never
    heartbeats it. Positive control: a node pinned to that control's identity registers."""
    fake = OwnControl(plat, "fake-ctl")
    ftok, fkey = join_parts(fake.join_file)
    _, real_key = join_parts(plat.join_token_file)
    assert fkey != real_key
    pinned = Node(plat, "tr-pinned", fake.port, join=f"sbxjoin1.{ftok}.{real_key}")
    plat.nodes.append(pinned)
    trusting = Node(plat, "tr-trusting", fake.port, join=f"sbxjoin1.{ftok}.{fkey}")
    plat.nodes.append(trusting)
    with open(fake.token_file) as f:
        fadmin = f.read().strip()

    def fake_live(name):
        r = fake.request("GET", "/v1/nodes", fadmin)
        return any(n["name"] == name and n["live"] for n in r.json())

    assert wait_until(lambda: trusting.health().get("registered") and fake_live("tr-trusting"),
                      10), trusting.log()
    assert wait_until(lambda: "not signed by the pinned control identity" in pinned.log(), 5)
    time.sleep(1.5)  # more registration attempts
    h = pinned.health()
    assert h["registered"] is False and h["keyset_version"] == 0, h
    assert not fake_live("tr-pinned")
    assert not os.path.exists(os.path.join(pinned.state, "keyset"))
    assert not os.path.exists(os.path.join(pinned.state, "node.token"))  # nothing taken from it
    assert os.path.exists(os.path.join(trusting.state, "keyset"))


def test_impostor_with_the_control_state_cannot_replace_keys(plat):
    """The control plane goes away and an impostor binds its address with a copy of its store
    (tokens, node records, signing keys) but not its identity key; it even rotates the signing
    key. The node keeps its set: the impostor's new key is unknown to it, the old one still
    works. Positive control: the real control comes back on the address, rotates, and the node
    takes the new key."""
    node = plat.node("tr-a")
    job = plat.create()
    v0 = node.health()["keyset_version"]
    port = stop_control(plat)
    imp_state = os.path.join(plat.dir, "imp-state")
    shutil.copytree(plat.ctl_state, imp_state)
    os.unlink(os.path.join(imp_state, "identity.key"))
    imp = OwnControl(plat, "impostor", state=imp_state, port=port)
    fake_kid = rotate(lambda m, p, b: imp.request(m, p, plat.admin, b))
    assert wait_until(lambda: "not signed by the pinned control identity" in node.log(), 5)
    time.sleep(2.5)  # heartbeats to the impostor
    assert node.health()["keyset_version"] == v0
    fake_cap = plat.mint(job.run(), "exec", kid=fake_kid,
                         store=os.path.join(imp_state, "store.db"))
    r, _ = node.exec(job, "touch /root/impostor", fake_cap)
    assert r.status == 403 and r.json()["reason"] == "unknown_key", r
    assert not os.path.exists(node.root_path(job.id, "/root/impostor"))
    assert exec_works(node, job, plat.mint(job.run(), "exec"), "old-key")  # its set is kept

    imp.proc.stop()
    restart_control(plat, port)
    real_kid = rotate(lambda m, p, b: plat.request(m, p, b))
    assert wait_until(lambda: node.health()["keyset_version"] > v0, 5), node.log()[-2000:]
    cap = plat.mint(job.run(), "exec", kid=real_kid)
    assert exec_works(node, job, cap, "new-key")


def test_replayed_older_key_set_is_refused_and_the_set_survives_restart(plat):
    node = plat.node("tr-a")
    job = plat.create()
    with open(os.path.join(node.state, "keyset")) as f:
        old_set = f.read()
    v_old = node.health()["keyset_version"]
    new_kid = rotate(lambda m, p, b: plat.request(m, p, b))
    assert wait_until(lambda: node.health()["keyset_version"] > v_old, 5)
    v_new = node.health()["keyset_version"]
    run = job.run()
    port = stop_control(plat)
    replay = ReplayControl(port, old_set)  # genuinely signed by the control, but older
    try:
        want = f"refused a key set of version {v_old}: this node holds version {v_new}"
        assert wait_until(lambda: want in node.log(), 5), node.log()[-2000:]
        assert node.health()["keyset_version"] == v_new
        assert exec_works(node, job, plat.mint(run, "exec", kid=new_kid), "kept")
        # positive control: a node holding no set yet takes that very set from the same server
        _, key = join_parts(plat.join_token_file)
        fresh = Node(plat, "tr-fresh", port, join=f"sbxjoin1.sbxjoin_x.{key}")
        plat.nodes.append(fresh)
        assert wait_until(lambda: fresh.health().get("keyset_version") == v_old, 10), \
            fresh.log()
    finally:
        replay.stop()
    # the node restarted with nothing on the control address: its kept set is loaded
    node.proc.stop()
    again = Node(plat, "tr-a", port, port=node.port)
    plat.nodes[plat.nodes.index(node)] = again
    assert wait_until(lambda: again.health().get("keyset_version") == v_new, 10), again.log()
    assert again.health()["registered"] is False
    # a kept set is not current (a rotation may have outdated it): a key it does not know is
    # "not ready yet" (503 + Retry-After), not a final refusal
    r = again.request("POST", f"/v1/runs/{job.id}/ports/{AGENT_PORT}/v1/exec",
                      plat.mint(run, forge=True, kid="k-neverissued"), {"cmd": "true"})
    assert r.status == 503 and r.headers.get("retry-after") == "1", \
        f"key set check: a node holding only its kept set refused an unknown key: {r}"


# ---- capabilities bind what they authorize -----------------------------------------------

def test_manage_capability_single_use_and_bound_to_its_body(plat):
    job = plat.create()
    node = job.node()
    old = job.run()
    tag = secrets.token_hex(4)
    new = dict(old, generation=old["generation"] + 1, activation=f"a-tr{tag}",
               instance=f"i-tr{tag}")
    path = f"/v1/runs/{job.id}"
    body = {"secrets": {"SBX_TOKEN": job.token}}
    evil = {"secrets": {"SBX_TOKEN": "attacker-chosen"}}

    def manage(method, b, run=new):
        return plat.mint(run, "manage", method=method, target=path, body=b)

    def installed_generation():
        return ((node.run_record(job.id) or {}).get("run") or {}).get("generation")

    install = manage("PUT", body)
    pid = node.run_record(job.id)["pid"]
    assert installed_generation() == old["generation"]
    # another body under the capability: refused, nothing installed
    r = node.request("PUT", path, install, evil)
    assert r.status == 403 and r.json()["reason"] == "body", r
    assert installed_generation() == old["generation"] and node.run_record(job.id)["pid"] == pid
    # positive control: its own body installs run N+1
    r = node.request("PUT", path, install, body)
    assert r.status == 201, r
    assert installed_generation() == new["generation"]
    # retire it, then replay the install: refused, no second install
    r = node.request("DELETE", path, manage("DELETE", ""))
    assert r.status == 200, r
    assert node.run_record(job.id) is None
    r = node.request("PUT", path, install, body)
    assert r.status == 403 and r.json()["reason"] == "replay", r
    time.sleep(0.5)
    assert node.run_record(job.id) is None
    # ... and the same with the body changed: still refused (the id is used)
    r = node.request("PUT", path, install, evil)
    assert r.status == 403, r
    assert node.run_record(job.id) is None
    # positive control: a fresh capability for the very same install works
    r = node.request("PUT", path, manage("PUT", body), body)
    assert r.status == 201, r
    assert installed_generation() == new["generation"]
    # another method or target under a manage capability: refused
    pause = manage("POST", "")
    r = node.request("DELETE", path, pause)
    assert r.status == 403 and r.json()["reason"] == "request", r
    assert installed_generation() == new["generation"]
    r = node.request("DELETE", path, manage("DELETE", ""))
    assert r.status == 200, r
    job.cancel()


def test_data_path_capability_bound_to_method_target_and_body(plat):
    job = plat.create()
    node = job.node()
    exec_path = node.ports_path(job.id, AGENT_PORT, "/v1/exec")
    cap = job.mint("exec,files_read,files_write,processes", method="POST", target=exec_path,
                   body={"cmd": "echo bound"})
    tok = {"X-Sandbox-Token": job.token}
    # positive control, twice (a data-path capability is not single-use)
    for _ in range(2):
        r, res = node.exec(job, "echo bound", cap)
        assert r.status == 200 and res.out == "bound\n", (r, res)
    # another body on its request
    r, _ = node.exec(job, "touch /root/other-body", cap)
    assert r.status == 403 and r.json()["reason"] == "body", r
    # another path (a write it would otherwise cover), another query, another method
    write = node.ports_path(job.id, AGENT_PORT, "/v1/files/write?path=/root/other-path")
    r = node.request("PUT", write, cap, b"x", tok)
    assert r.status == 403 and r.json()["reason"] == "request", r
    r = node.request("POST", exec_path + "?x=1", cap, {"cmd": "echo bound"}, tok)
    assert r.status == 403 and r.json()["reason"] == "request", r
    read = node.ports_path(job.id, AGENT_PORT, "/v1/files/read")
    r = node.request("GET", read + "?path=/etc/hostname", cap, headers=tok)
    assert r.status == 403 and r.json()["reason"] == "request", r
    r = node.request("PUT", exec_path, cap, {"cmd": "echo bound"}, tok)
    assert r.status == 403 and r.json()["reason"] == "request", r
    assert not os.path.exists(node.root_path(job.id, "/root/other-body"))
    assert not os.path.exists(node.root_path(job.id, "/root/other-path"))
    # positive control: the write with a capability for that request lands
    wcap = job.mint("files_write", method="PUT", target=write, body="x")
    r = node.request("PUT", write, wcap, b"x", tok)
    assert r.status in (200, 201, 204), r
    assert os.path.exists(node.root_path(job.id, "/root/other-path"))
    job.cancel()


# ---- roles per purpose ---------------------------------------------------------------------

def test_read_token_reads_but_cannot_exec_or_write(plat):
    reader = plat.token("tr-reader", "t", "read")
    writer = plat.token("tr-writer", "t", "write")
    job = plat.create()
    job.sh("mkdir -p /root/d && echo data > /root/d/f")
    # read may: read, stat and list files; list and inspect jobs
    r = job.proxy("GET", AGENT_PORT, "/v1/files/read?path=/root/d/f", token=reader)
    assert r.status == 200 and r.body == b"data\n", r
    assert job.proxy("GET", AGENT_PORT, "/v1/files/stat?path=/root/d/f",
                     token=reader).status == 200
    assert job.proxy("GET", AGENT_PORT, "/v1/files/list?path=/root/d", token=reader).status == 200
    assert plat.request("GET", "/v1/jobs/t", token=reader).status == 200
    assert plat.request("GET", job.path(), token=reader).status == 200
    # read may not: exec, processes, file writes, other ports
    refused = [
        job.exec_raw("touch /root/by-reader", token=reader),
        job.proxy("POST", AGENT_PORT, "/v1/processes", {"cmd": "touch /root/by-reader-proc"},
                  token=reader),
        job.proxy("GET", AGENT_PORT, "/v1/processes", token=reader),
        job.proxy("PUT", AGENT_PORT, "/v1/files/write?path=/root/by-reader-write", b"x",
                  token=reader),
        job.proxy("POST", AGENT_PORT, "/v1/files/mkdir?path=/root/by-reader-dir", token=reader),
        job.proxy("GET", 8080, "/", token=reader),
    ]
    for r in refused:
        assert r.status == 403 and "may not write" in r.json()["error"], r
    time.sleep(0.3)
    for f in ("by-reader", "by-reader-proc", "by-reader-write", "by-reader-dir"):
        assert not os.path.exists(job.node().root_path(job.id, "/root/" + f)), f
    # positive control: a write token does all of it (the port is refused by the node only
    # because the job does not expose it: past the role check)
    assert job.exec("touch /root/by-writer && echo w", token=writer).out == "w\n"
    r = job.proxy("PUT", AGENT_PORT, "/v1/files/write?path=/root/by-writer-write", b"x",
                  token=writer)
    assert r.status in (200, 201, 204), r
    r = job.proxy("GET", 8080, "/", token=writer)
    assert r.status == 403 and r.json().get("reason") == "port", r
    for f in ("by-writer", "by-writer-write"):
        assert os.path.exists(job.node().root_path(job.id, "/root/" + f)), f
    job.cancel()


# ---- revocable API tokens ------------------------------------------------------------------

@pytest.fixture
def plat2():
    p = Platform(nodes=("tr-r",), controls=2)
    yield p
    p.stop()


def test_revoked_token_refused_within_a_second_on_every_control(plat2):
    plat = plat2
    job = plat.create()
    r = plat.request("POST", "/v1/tokens", {"principal": "tr-rev", "namespace": "t",
                                            "role": "write"})
    assert r.status == 201, r
    victim, vid = r.json()["token"], r.json()["id"]
    keeper = plat.token("tr-keep", "t", "write")
    assert any(t["id"] == vid and "token" not in t and "token_hash" not in t
               for t in plat.request("GET", "/v1/tokens").json())
    # both controls have verified (and cached) the token, through the Jobs API and the edge
    for c in plat.controls:
        assert plat.request("GET", "/v1/jobs/t", token=victim, control=c).status == 200
        assert job.exec("echo pre", token=victim, control=c).out == "pre\n"
    r = plat.request("DELETE", f"/v1/tokens/{vid}", control=plat.controls[0])
    t0 = time.monotonic()
    assert r.status == 200, r
    # refused on the control that revoked it at once, on the other within a second
    assert plat.request("GET", "/v1/jobs/t", token=victim, control=plat.controls[0]).status == 401
    other = plat.controls[1]
    assert wait_until(lambda: plat.request("GET", "/v1/jobs/t", token=victim,
                                           control=other).status == 401, 1.0, 0.02)
    assert time.monotonic() - t0 <= 1.0
    r = job.exec_raw("touch /root/revoked", token=victim, control=other)
    assert r.status == 401, r
    assert not os.path.exists(job.node().root_path(job.id, "/root/revoked"))
    # positive control: another token keeps working on both; the id is gone
    for c in plat.controls:
        assert job.exec("echo kept", token=keeper, control=c).out == "kept\n"
    assert plat.request("DELETE", f"/v1/tokens/{vid}").status == 404
    assert plat.request("DELETE", "/v1/tokens/t-zz").status == 404
    # revoking needs admin
    kid = next(t["id"] for t in plat.request("GET", "/v1/tokens").json()
               if t["principal"] == "tr-keep")
    assert plat.request("DELETE", f"/v1/tokens/{kid}", token=keeper).status == 403
    job.cancel()
