# SPDX-License-Identifier: MIT
"""E2B's control API on sbx-control (src/control/e2b.c): driven by E2B's own SDK (the npm
package `e2b`, unmodified, tests/e2b/control_api.mjs), and by hand for the error shapes, the
keys and namespaces, and the chunked request bodies the JS SDK sends."""
import hashlib
import json
import sqlite3
import secrets
import os
import shutil
import socket
import subprocess

import pytest

from conftest import wait_until
from sbxplatform import TLS_PORTS, Job, Platform

E2B_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "e2b")


@pytest.fixture(scope="module")
def plat():
    p = Platform(nodes=("e2b-n1",))
    yield p
    p.stop()


def e2b(plat, method, path, body=None, key=None, **kw):
    return plat.request(method, path, body, token=None,
                        headers={"X-API-KEY": key if key is not None else plat.admin}, **kw)


def create(plat, key=None, **body):
    body.setdefault("templateID", "base")
    r = e2b(plat, "POST", "/v2/sandboxes", body, key=key, timeout=150)
    assert r.status == 201, r
    return r.json()


def test_e2b_sdk_drives_the_control_api(plat):
    """The SDK creates (201 only once the sandbox runs), reads, lists by metadata, extends the
    timeout, connects, kills (and a second kill answers false), and gets SandboxNotFoundError
    for an unknown id."""
    if not os.path.exists(os.path.join(E2B_DIR, "node_modules", "e2b", "package.json")):
        pytest.skip("E2B's SDK is not installed (scripts/setup.sh installs it)")
    env = dict(os.environ, E2B_API_URL=f"https://127.0.0.1:{plat.control.port}",
               E2B_API_KEY=plat.admin,
               NODE_EXTRA_CA_CERTS=os.path.join(plat.control.state, "tls", "ca.crt"))
    r = subprocess.run([shutil.which("node") or "node", "control_api.mjs"], cwd=E2B_DIR, env=env,
                       capture_output=True, text=True, timeout=240)
    steps = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    assert r.returncode == 0, (r.stdout, r.stderr[-3000:], plat.logs_tail())
    assert [s["step"] for s in steps][-1] == "done", steps
    sid = steps[0]["id"]
    # what the SDK did is what the platform has: the job is canceled
    job = plat.request("GET", f"/v1/jobs/e2b/{sid}").json()
    assert job["stage"] in ("CANCELED",) or job.get("desired") == "canceled", job


def run_sdk(plat, program, timeout=400, **env):
    """Run tests/e2b/<program> through E2B's SDK against plat; its steps (JSON lines)."""
    if not os.path.exists(os.path.join(E2B_DIR, "node_modules", "e2b", "package.json")):
        pytest.skip("E2B's SDK is not installed (scripts/setup.sh installs it)")
    url = f"https://127.0.0.1:{plat.control.port}"
    e = dict(os.environ, E2B_API_URL=url, E2B_SANDBOX_URL=url, E2B_API_KEY=plat.admin,
             NODE_EXTRA_CA_CERTS=os.path.join(plat.control.state, "tls", "ca.crt"), **env)
    r = subprocess.run([shutil.which("node") or "node", program], cwd=E2B_DIR, env=e,
                       capture_output=True, text=True, timeout=timeout)
    steps = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:], plat.logs_tail())
    assert steps and steps[-1]["step"] == "done", steps
    return [s["step"] for s in steps]


SDK_STEPS = ["create", "run", "run-fails", "background", "pty", "files", "presigned",
             "watchDir", "getHost", "setTimeout"]


def test_e2b_sdk_drives_a_dedicated_sandbox(plat):
    """E2B's SDK, unmodified, through the platform (E2B_API_URL and E2B_SANDBOX_URL = the control
    plane): tests/e2b/sdk_flow.mjs checks each value: commands streamed and failing, background
    + connect + stdin + kill, a PTY resized, files (text, binary, several at once, list, exists,
    makeDir, rename, remove), presigned URLs, watchDir, getHost(port), setTimeout, list by
    metadata, pause + connect, kill."""
    steps = run_sdk(plat, "sdk_flow.mjs", SBX_E2B_TEMPLATE="base")
    assert steps == SDK_STEPS + ["pause-connect", "done"], steps


def test_e2b_sdk_drives_a_pooled_sandbox(plat):
    """The same through a template that names a pool (what differs is said, not pretended:
    setTimeout refused with the reason, no pause)."""
    r = plat.request("POST", "/v1/pools/e2b", {"name": "sdkpool", "per_host": 4})
    assert r.status in (201, 409), r
    steps = run_sdk(plat, "sdk_flow.mjs", SBX_E2B_TEMPLATE="sdkpool", SBX_E2B_POOLED="1")
    assert steps == SDK_STEPS + ["done"], steps


def test_sandbox_shapes_and_lifecycle(plat):
    s = create(plat, metadata={"owner": "ann"}, envVars={"GREETING": "hi"},
               allow_internet_access=False, timeout=200)
    sid = s["sandboxID"]
    assert "-" not in sid and "." not in sid
    assert s["envdVersion"] == "0.5.7" and s["templateID"] == "base" and s["envdAccessToken"]
    # a domain always (an SDK told none sends port traffic to E2B's cloud): --e2b-domain's
    assert s["domain"] == f"localhost:{plat.control.port}" and s["clientID"], s
    # the job behind it runs with what was asked (env, network, the token as SBX_TOKEN)
    job = plat.request("GET", f"/v1/jobs/e2b/{sid}").json()
    assert job["stage"] == "RUNNING" and job["network"] == "none", job
    assert job["env"] == {"GREETING": "hi"} and job["secret_names"] == ["SBX_TOKEN"], job
    d = e2b(plat, "GET", f"/sandboxes/{sid}").json()
    assert d["state"] == "running" and d["metadata"] == {"owner": "ann"}, d
    assert d["allowInternetAccess"] is False and d["endAt"] > d["startedAt"], d
    # pause: 204, a second pause 409; connect resumes (201) with the same token
    assert e2b(plat, "POST", f"/sandboxes/{sid}/pause", {}).status == 204
    r = e2b(plat, "POST", f"/sandboxes/{sid}/pause", {})
    assert r.status == 409 and r.json()["code"] == 409, r
    assert e2b(plat, "GET", f"/sandboxes/{sid}").json()["state"] == "paused"
    r = e2b(plat, "POST", f"/v2/sandboxes/{sid}/connect", {"timeout": 60}, timeout=150)
    assert r.status == 201 and r.json()["envdAccessToken"] == s["envdAccessToken"], r
    r = e2b(plat, "POST", f"/v2/sandboxes/{sid}/connect", {"timeout": 60}, timeout=150)
    assert r.status == 200, r  # running already
    job = plat.request("GET", f"/v1/jobs/e2b/{sid}").json()
    assert job["run"]["generation"] == 2, job  # resumed as a new generation
    # a connect's timeout extends the lifetime to that long from now (never shortens it), and
    # one that does not parse is 400 (it was ignored: a resume after the end answered 201 and
    # the sandbox ended two seconds later)
    import datetime

    def end_in_s():
        end = e2b(plat, "GET", f"/sandboxes/{sid}").json()["endAt"]
        at = datetime.datetime.fromisoformat(end.replace("Z", "+00:00"))
        return (at - datetime.datetime.now(datetime.timezone.utc)).total_seconds()
    assert end_in_s() < 250
    r = e2b(plat, "POST", f"/v2/sandboxes/{sid}/connect", {"timeout": 3600}, timeout=150)
    assert r.status == 200 and 3500 < end_in_s() <= 3601, (r, end_in_s())
    r = e2b(plat, "POST", f"/v2/sandboxes/{sid}/connect", {"timeout": 60}, timeout=150)
    assert r.status == 200 and end_in_s() > 3500, end_in_s()  # not shortened
    for bad in ({"timeout": "60"}, {"timeout": 1.5}, {"timeout": 0}, [1]):
        r = e2b(plat, "POST", f"/v2/sandboxes/{sid}/connect", bad, timeout=150)
        assert r.status == 400 and "connect" in r.json()["message"], (bad, r)
    # timeout: the job now ends about 5 s from now
    assert e2b(plat, "POST", f"/sandboxes/{sid}/timeout", {"timeout": 5}).status == 204
    # kill: 204, then 404 in E2B's shape (the SDK reads "code")
    assert e2b(plat, "DELETE", f"/sandboxes/{sid}").status == 204
    r = e2b(plat, "DELETE", f"/sandboxes/{sid}")
    assert r.status == 404 and r.json() == {"code": 404, "message": f"sandbox {sid} not found"}


def test_list_filters_and_pages(plat):
    ids = [create(plat, metadata={"batch": "b1", "n": str(i)})["sandboxID"] for i in range(3)]
    other = create(plat, metadata={"batch": "b2"})["sandboxID"]
    r = e2b(plat, "GET", "/v2/sandboxes?metadata=batch%3Db1&limit=2")
    assert r.status == 200 and len(r.json()) == 2, r
    nxt = r.headers.get("x-next-token")
    assert nxt, r.headers
    r2 = e2b(plat, "GET", f"/v2/sandboxes?metadata=batch%3Db1&limit=2&nextToken={nxt}")
    got = [s["sandboxID"] for s in r.json() + r2.json()]
    assert sorted(got) == sorted(ids) and not r2.headers.get("x-next-token"), (got, ids)
    r = e2b(plat, "GET", "/v2/sandboxes?metadata=batch%3Db1%26n%3D1")
    assert [s["sandboxID"] for s in r.json()] == [ids[1]], r
    assert e2b(plat, "POST", f"/sandboxes/{ids[0]}/pause", {}).status == 204
    r = e2b(plat, "GET", "/v2/sandboxes?metadata=batch%3Db1&state=paused")
    assert [s["sandboxID"] for s in r.json()] == [ids[0]], r
    r = e2b(plat, "GET", "/sandboxes")  # v1: running only
    listed = {s["sandboxID"] for s in r.json()}
    assert other in listed and ids[0] not in listed, r
    for sid in ids + [other]:
        assert e2b(plat, "DELETE", f"/sandboxes/{sid}").status == 204


def test_keys_roles_and_namespaces(plat):
    r = plat.request("GET", "/v2/sandboxes", token=None)
    assert r.status == 401 and r.json()["code"] == 401, r
    assert e2b(plat, "GET", "/v2/sandboxes", key="sbx_" + "0" * 40).status == 401
    a_write = plat.token("e2b-a", "team-a", "write")
    a_read = plat.token("e2b-a-read", "team-a", "read")
    b_write = plat.token("e2b-b", "team-b", "write")
    s = create(plat, key=a_write)
    sid = s["sandboxID"]
    assert plat.request("GET", f"/v1/jobs/team-a/{sid}").status == 200, \
        "ATTACK: the sandbox is not in its key's namespace"
    # read: sees it, cannot create, kill or pause it
    assert e2b(plat, "GET", f"/sandboxes/{sid}", key=a_read).status == 200
    for method, path, body in [("POST", "/v2/sandboxes", {"templateID": "base"}),
                               ("DELETE", f"/sandboxes/{sid}", None),
                               ("POST", f"/sandboxes/{sid}/pause", {})]:
        r = e2b(plat, method, path, body, key=a_read)
        assert r.status == 403 and r.json()["code"] == 403, ("ATTACK: a read key did", path, r)
    # another namespace's key: the sandbox does not exist for it
    for method, path in [("GET", f"/sandboxes/{sid}"), ("DELETE", f"/sandboxes/{sid}"),
                         ("POST", f"/sandboxes/{sid}/pause")]:
        r = e2b(plat, method, path, {} if method == "POST" else None, key=b_write)
        assert r.status == 404, ("ATTACK: another namespace's key reached it", path, r)
    assert sid not in {x["sandboxID"] for x in e2b(plat, "GET", "/v2/sandboxes", key=b_write).json()}
    assert e2b(plat, "GET", f"/sandboxes/{sid}", key=a_write).json()["state"] == "running"
    assert e2b(plat, "DELETE", f"/sandboxes/{sid}", key=a_write).status == 204


def test_the_namespace_of_keys_of_every_namespace_is_reserved(plat):
    """A key of every namespace ("*") makes its E2B sandboxes in namespace e2b: no token may be
    made for that namespace, or its holder would list them, connect to them for their envd
    tokens, and put a pool named as a template there to take the next create's secrets.
    Positive control: a token for a namespace of another name is made."""
    r = plat.request("POST", "/v1/tokens", {"principal": "squatter", "namespace": "e2b",
                                           "role": "admin"})
    assert r.status == 400 and "reserved" in r.json()["error"], \
        ("ATTACK: a token was made for the E2B namespace of keys of every namespace", r)
    assert plat.token("squatter", "e2b-not", "admin")
    s = create(plat)  # the admin's key: every namespace
    sid = s["sandboxID"]
    try:
        assert plat.request("GET", f"/v1/jobs/e2b/{sid}").status == 200  # it is there
        assert e2b(plat, "GET", f"/sandboxes/{sid}").status == 200
        # a token for that namespace made before it was reserved (written into the store as
        # the control plane writes tokens) reaches nothing there
        old = "sbx_" + secrets.token_hex(20)
        db = sqlite3.connect(os.path.join(plat.ctl_state, "store.db"), timeout=10)
        try:
            with db:
                db.execute("BEGIN IMMEDIATE")
                rev = db.execute("SELECT rev FROM meta").fetchone()[0] + 1
                db.execute("UPDATE meta SET rev = ?", (rev,))
                db.execute("INSERT INTO kv (key, value, rev) VALUES (?, ?, ?)",
                           ("tokens/" + hashlib.sha256(old.encode()).hexdigest(),
                            json.dumps({"principal": "old", "namespace": "e2b", "role": "admin",
                                        "created_ms": 1}).encode(), rev))
        finally:
            db.close()
        for r in (plat.request("GET", f"/v1/jobs/e2b/{sid}", token=old),
                  e2b(plat, "GET", f"/sandboxes/{sid}", key=old),
                  e2b(plat, "GET", "/v2/sandboxes", key=old)):
            assert r.status == 403, ("ATTACK: an old token of the reserved namespace reached it", r)
    finally:
        assert e2b(plat, "DELETE", f"/sandboxes/{sid}").status == 204


@pytest.mark.parametrize("body,words", [
    ({"templateID": "no-such-image"}, "no such image"),
    ({"templateID": "Bad/Name"}, "image"),
    ({"templateID": "base", "timeout": 0}, "timeout"),
    ({"templateID": "base", "metadata": {"k": 1}}, "metadata"),
    ({"templateID": "base", "envVars": {"1X": "y"}}, "env"),
    ({"templateID": "base", "allow_internet_access": "yes"}, "allow_internet_access"),
    # a field of the wrong type is refused, never dropped with those after it (a float timeout
    # once dropped allow_internet_access: false, metadata and envVars, and made the sandbox)
    ({"templateID": "base", "timeout": 300.5, "allow_internet_access": False}, "timeout"),
    ({"templateID": "base", "timeout": "300", "allow_internet_access": False}, "timeout"),
    ({"templateID": 7, "allow_internet_access": False}, "templateID"),
])
def test_bad_create_requests_say_why(plat, body, words):
    r = e2b(plat, "POST", "/v2/sandboxes", body)
    assert r.status == 400 and r.json()["code"] == 400 and words in r.json()["message"], \
        f"NOT REFUSED: {r}"


# ---- chunked request bodies (the HTTP core: conn_collect_body) ---------------------------------

def raw_exchange(plat, head, body_wire, read_two=False):
    port = plat.control.port
    s = TLS_PORTS[port].wrap_socket(socket.create_connection(("127.0.0.1", port), timeout=60),
                                    server_hostname="127.0.0.1")
    s.sendall(head.encode() + body_wire)
    data = b""
    answers = []
    while len(answers) < (2 if read_two else 1):
        while b"\r\n\r\n" not in data:
            got = s.recv(65536)
            if not got:
                s.close()
                return answers, True
            data += got
        h, data = data.split(b"\r\n\r\n", 1)
        n = int(next((l.split(b":")[1] for l in h.split(b"\r\n")
                      if l.lower().startswith(b"content-length")), b"0"))
        while len(data) < n:
            data += s.recv(65536)
        answers.append((int(h.split(b" ")[1]), data[:n]))
        data = data[n:]
    s.close()
    return answers, False


def chunked(payload, size=7):
    return b"".join(b"%x\r\n%s\r\n" % (len(payload[i:i + size]), payload[i:i + size])
                    for i in range(0, len(payload), size)) + b"0\r\n\r\n"


def test_chunked_request_bodies_are_read_and_the_connection_goes_on(plat):
    body = json.dumps({"labels": {"via": "chunked"}, "secrets": {"SBX_TOKEN": "t" * 32}}).encode()
    head = (f"POST /v1/jobs/chunky HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {plat.admin}\r\n"
            f"Transfer-Encoding: chunked\r\nContent-Type: application/json\r\n\r\n")
    nxt = f"GET /v1/jobs/chunky HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {plat.admin}\r\n\r\n"
    answers, _ = raw_exchange(plat, head, chunked(body) + nxt.encode(), read_two=True)
    (st1, b1), (st2, b2) = answers
    assert st1 == 201 and json.loads(b1)["labels"] == {"via": "chunked"}, (st1, b1)
    assert st2 == 200 and json.loads(b2)[0]["id"] == json.loads(b1)["id"], (st2, b2)
    assert plat.request("POST", f"/v1/jobs/chunky/{json.loads(b1)['id']}/cancel").status == 202


@pytest.mark.parametrize("te,wire,status", [
    ("chunked", b"zz\r\nhello\r\n0\r\n\r\n", 400),
    ("chunked", b"5\r\nhelloXX0\r\n\r\n", 400),
    ("gzip", b"", 501),
])
def test_bad_chunked_bodies_are_refused(plat, te, wire, status):
    head = (f"POST /v1/jobs/chunky HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {plat.admin}\r\n"
            f"Transfer-Encoding: {te}\r\n\r\n")
    answers, closed = raw_exchange(plat, head, wire)
    assert answers and answers[0][0] == status, answers


def test_a_chunked_body_over_the_cap_is_413(plat):
    head = (f"POST /v2/sandboxes HTTP/1.1\r\nHost: x\r\nX-API-KEY: {plat.admin}\r\n"
            f"Transfer-Encoding: chunked\r\n\r\n")
    big = b'{"templateID":"base","metadata":{"k":"' + b"x" * (300 * 1024) + b'"}}'
    answers, _ = raw_exchange(plat, head, chunked(big, 64 * 1024))
    assert answers and answers[0][0] == 413, answers


def test_sandbox_traffic_by_header_and_by_host(plat):
    """E2B's SDKs reach a sandbox through the control plane by E2b-Sandbox-Id (+ -Port) headers
    (E2B_SANDBOX_URL) or by the host <port>-<id>.<domain> (getHost); the credential is the
    sandbox's own access token, checked before anything goes on."""
    s = create(plat, allow_internet_access=False)
    sid, tok, traffic = s["sandboxID"], s["envdAccessToken"], s["trafficAccessToken"]
    assert len(traffic) == 64 and traffic != tok, s
    job = Job(plat, "e2b", plat.request("GET", f"/v1/jobs/e2b/{sid}").json(), tok)
    job.sh("mkdir -p /srv && echo hello-e2b > /srv/index.txt")
    job.start_process("exec python3 -m http.server 8000 --bind 127.0.0.1 --directory /srv")

    def by_host(token, port=8000, to=sid):
        h = {"Host": f"{port}-{to}.localhost:{plat.control.port}"}
        if token is not None:
            h["e2b-traffic-access-token"] = token
        return plat.request("GET", "/index.txt", token=None, headers=h)

    def by_header(token, port="8000", to=sid, path="/index.txt", method="GET", body=None):
        h = {"E2b-Sandbox-Id": to, "E2b-Sandbox-Port": port}
        if token is not None:
            h["X-Access-Token"] = token
        return plat.request(method, path, body, token=None, headers=h)

    # a port: by host with the traffic token (e2b-traffic-access-token), by headers with the
    # access token (X-Access-Token)
    assert wait_until(lambda: by_host(traffic).status == 200, 15, 0.2), by_host(traffic)
    r = by_host(traffic)
    assert (r.status, r.body) == (200, b"hello-e2b\n"), r
    r = by_header(tok)
    assert (r.status, r.body) == (200, b"hello-e2b\n"), r
    # refused, and the server inside never sees them: no token, a wrong one, another
    # sandbox's token; an unknown sandbox is 502 (what the SDKs read as "not running")
    other = create(plat, allow_internet_access=False)
    for t in (None, "0" * 64, other["envdAccessToken"], other["trafficAccessToken"]):
        r = by_host(t)
        assert r.status == 401 and b"hello-e2b" not in r.body, ("ATTACK: served", t, r)
        r = by_header(t)
        assert r.status == 401 and b"hello-e2b" not in r.body, ("ATTACK: served", t, r)
    assert by_host(traffic, to="f" * 24).status == 502
    # a port the sandbox does not expose is not reached (with its own token)
    r = by_host(traffic, port=9999)
    assert r.status == 403 and b"hello-e2b" not in r.body, r
    # envd's port: errors in Connect's shape (a string code); the traffic token does not
    # reach it (it is for ports), the access token does (positive control: the agent answers
    # rather than the edge refusing)
    r = by_header("nope", port="49983", path="/v1/files/read?path=/srv/index.txt")
    assert r.status == 401 and r.json()["code"] == "unauthenticated", r
    h = {"E2b-Sandbox-Id": sid, "e2b-traffic-access-token": traffic}
    r = plat.request("GET", "/v1/files/read?path=/srv/index.txt", token=None, headers=h)
    assert r.status == 401 and b"hello-e2b" not in r.body, ("ATTACK: traffic token on envd", r)
    r = by_header(tok, port="49983", path="/v1/files/read?path=/srv/index.txt")
    assert (r.status, r.body) == (200, b"hello-e2b\n"), r
    # a presigned-looking /files URL goes on without a token and without the edge's: the
    # agent checks its signature (a forged one is refused; the SDK's own: sdk_flow.mjs)
    r = plat.request("GET", "/files?path=/srv/index.txt&signature=v1_forged", token=None,
                     headers={"Host": f"49983-{sid}.localhost:{plat.control.port}"})
    assert r.status == 401 and b"hello-e2b" not in r.body, ("ATTACK: a forged signature", r)
    # a job made through the Jobs API is not E2B's: its token alone does not reach it (the Jobs
    # API's edge wants an API token too); positive control: it serves through that edge
    plain = plat.create(ns="e2b")
    plain.sh("mkdir -p /srv && echo hello-plain > /srv/index.txt")
    r = by_header(plain.token, port="49983", to=plain.id, path="/v1/files/read?path=/srv/index.txt")
    assert r.status == 502 and b"hello-plain" not in r.body, ("ATTACK: a Jobs API job", r)
    assert plain.read_file("/srv/index.txt").body == b"hello-plain\n"
    plain.cancel()
    # killed: 502 from then on
    assert e2b(plat, "DELETE", f"/sandboxes/{other['sandboxID']}").status == 204
    assert wait_until(lambda: by_host(other["trafficAccessToken"], to=other["sandboxID"]).status
                      == 502, 15, 0.2)
    assert e2b(plat, "DELETE", f"/sandboxes/{sid}").status == 204


# An HTTP server of the files under ./www on the unix socket $SBX_PROXY_DIR/<port>.sock.
UNIX_HTTP_SERVER = """
import http.server, os, socketserver, sys
os.chdir("www")
class H(http.server.SimpleHTTPRequestHandler):
    def address_string(self):
        return "unix"
class S(socketserver.UnixStreamServer):
    def get_request(self):
        return self.socket.accept()[0], ("unix", 0)
S(os.path.join(os.environ["SBX_PROXY_DIR"], sys.argv[1] + ".sock"), H).serve_forever()
"""


def test_a_template_that_names_a_pool_makes_pooled_sandboxes(plat):
    """templateID = a pool of the key's namespace: a pooled sandbox (fast create), reached,
    listed, inspected, connected and killed through E2B's API; no lifetime to move, no pause."""
    r = plat.request("POST", "/v1/pools/e2b", {"name": "fast", "per_host": 4})
    assert r.status == 201, r
    s = create(plat, templateID="fast", metadata={"kind": "pooled"}, timeout=120)
    sid, tok, traffic = s["sandboxID"], s["envdAccessToken"], s["trafficAccessToken"]
    assert len(sid) == 16 and s["templateID"] == "fast" and tok and traffic != tok, s
    d = e2b(plat, "GET", f"/sandboxes/{sid}").json()
    assert d["state"] == "running" and d["metadata"] == {"kind": "pooled"}, d
    assert d["templateID"] == "fast" and d["domain"] == s["domain"], d
    listed = e2b(plat, "GET", "/v2/sandboxes?metadata=kind%3Dpooled").json()
    assert [x["sandboxID"] for x in listed] == [sid], listed
    # it is the pool's sandbox: a server started through the pools API is reached by host (a
    # pooled sandbox cannot bind TCP: its service listens on $SBX_PROXY_DIR/<port>.sock)
    pool_sb = f"/v1/pools/e2b/fast/sandboxes/{sid}"
    r = plat.request("PUT", pool_sb + "/files/write?path=srv.py", UNIX_HTTP_SERVER.encode())
    assert r.status == 200, r
    r = plat.request("POST", pool_sb + "/processes", {
        "cmd": "mkdir -p www && echo hello-pooled > www/index.txt && exec python3 srv.py 8000"})
    assert r.status == 200, r

    def by_host(token, port=8000):
        h = {"Host": f"{port}-{sid}.localhost:{plat.control.port}",
             "e2b-traffic-access-token": token}
        return plat.request("GET", "/index.txt", token=None, headers=h)

    assert wait_until(lambda: by_host(traffic).status == 200, 15, 0.2), by_host(traffic)
    assert by_host(traffic).body == b"hello-pooled\n"
    for t in ("0" * 64, tok[:-1] + ("0" if tok[-1] != "0" else "1")):
        r = by_host(t)
        assert r.status == 401 and b"hello-pooled" not in r.body, ("ATTACK: pooled served", r)
    assert by_host(traffic, port=9999).status == 403  # not an --e2b-ports port
    # envd's port: the host agent's routes for that sandbox, below /v1/sandboxes/{id} (positive
    # control: its files through our own route there)
    h = {"E2b-Sandbox-Id": sid, "X-Access-Token": tok}
    r = plat.request("GET", "/files/read?path=www/index.txt", token=None, headers=h)
    assert (r.status, r.body) == (200, b"hello-pooled\n"), r
    h = {"E2b-Sandbox-Id": sid, "e2b-traffic-access-token": traffic}
    r = plat.request("GET", "/files/read?path=www/index.txt", token=None, headers=h)
    assert r.status == 401, ("ATTACK: the traffic token reaches a pooled sandbox's agent", r)
    # no lifetime to move, no pause: said, not pretended
    for op in ("timeout", "pause"):
        r = e2b(plat, "POST", f"/sandboxes/{sid}/{op}", {"timeout": 30})
        assert r.status == 400 and "pooled" in r.json()["message"], r
    r = e2b(plat, "POST", f"/v2/sandboxes/{sid}/connect", {"timeout": 60})
    assert r.status == 200 and r.json()["envdAccessToken"] == tok, r
    # another namespace's key does not see it
    other = plat.request("POST", "/v1/tokens", {"principal": "e2b-other", "namespace": "elsewhere",
                                                "role": "write"}).json()["token"]
    r = e2b(plat, "GET", f"/sandboxes/{sid}", key=other)
    assert r.status == 404, ("ATTACK: another namespace's key sees it", r)
    r = e2b(plat, "DELETE", f"/sandboxes/{sid}", key=other)
    assert r.status == 404, ("ATTACK: another namespace's key kills it", r)
    assert by_host(traffic).status == 200  # (still there)
    # kill: 204, then gone everywhere
    assert e2b(plat, "DELETE", f"/sandboxes/{sid}").status == 204
    assert e2b(plat, "GET", f"/sandboxes/{sid}").status == 404
    r = e2b(plat, "DELETE", f"/sandboxes/{sid}")
    assert r.status == 404 and r.json()["code"] == 404, r
    assert by_host(traffic).status == 502
    assert plat.request("GET", pool_sb).status == 404
    # an unknown pool name is an image name: one no node has is refused
    r = e2b(plat, "POST", "/v2/sandboxes", {"templateID": "no-such-pool-or-image"})
    assert r.status in (400, 404) and r.json()["code"] == r.status, r


def test_one_namespaces_waiting_creates_hold_nothing_of_the_others():
    """A create answers once its sandbox runs, which on a full platform may be minutes. One
    namespace's creates used to hold the control plane's eight workers while they waited (a
    red-team pass: another tenant's pause took 118 s), and went on waiting after their clients
    left, starting later unseen. Now a waiting create holds no worker, one namespace has at
    most 32 requests in progress (429 beyond) and half the workers at once (a second
    namespace's pool allocations, which wait on their workers for a pool host that cannot
    start), and a create whose client left is cancelled. Positive control: B's connect,
    answered at once."""
    import threading
    import time
    p = Platform(nodes=("e2b-full",), node_args=["--capacity", "1"])
    try:
        a = p.token("e2b-fa", "team-fa", "write")
        a2 = p.token("e2b-fa2", "team-fa2", "write")
        b = p.token("e2b-fb", "team-fb", "write")
        sid = create(p, key=b)["sandboxID"]  # the node's one run: the platform is full
        statuses = []
        # a second namespace whose pool allocations wait for a pool host that cannot start:
        # those do sleep on their workers (at most half of them, whoever asks)
        r = p.request("POST", "/v1/pools/team-fa2", {"name": "p", "per_host": 64, "max_hosts": 1},
                      token=a2)
        assert r.status == 201, r

        def waiting_alloc():
            try:
                p.request("POST", "/v1/pools/team-fa2/p/sandboxes", {"count": 1}, token=a2,
                          timeout=6)
            except OSError:
                pass

        def waiting_create():
            try:
                r = e2b(p, "POST", "/v2/sandboxes", {"templateID": "base"}, key=a, timeout=6)
                statuses.append(r.status)
            except OSError:
                statuses.append("gave up")  # the client leaves before the sandbox runs
        threads = [threading.Thread(target=waiting_create) for _ in range(40)]
        threads += [threading.Thread(target=waiting_alloc) for _ in range(10)]
        for t in threads:
            t.start()
        time.sleep(1.5)
        t0 = time.monotonic()
        try:
            r = e2b(p, "POST", f"/sandboxes/{sid}/connect", {"timeout": 300}, key=b, timeout=15)
        except OSError as e:
            r = e
        took = time.monotonic() - t0
        assert not isinstance(r, OSError) and r.status in (200, 201) and took < 5, \
            f"STARVED: another namespace's waiting creates held B's connect {took:.1f} s ({r})"
        for t in threads:
            t.join()
        assert statuses.count(429) >= 8, f"OVER CAP: no 429 past 32 in progress: {statuses}"
        assert statuses.count("gave up") >= 1, statuses

        def a_jobs_cancelled():
            jobs = p.request("GET", "/v1/jobs/team-fa").json()
            return jobs and all(j.get("desired") == "canceled" for j in jobs)
        assert wait_until(a_jobs_cancelled, 10), \
            f"ORPHAN: creates whose clients left are not cancelled: " \
            f"{[(j['id'], j.get('desired'), j.get('stage')) for j in p.request('GET', '/v1/jobs/team-fa').json()]}"
    finally:
        p.stop()


def test_a_resume_after_the_sandboxs_end_gives_it_a_lifetime_again(plat):
    """A paused sandbox whose lifetime ran out while paused: a connect without a timeout (E2B's
    JS SDK sends none) resumes it for the default 300 s from now; it was resumed and ended two
    seconds later (a red-team pass). Positive control: it runs and answers after the resume."""
    import time
    s = create(plat, timeout=4)
    sid = s["sandboxID"]
    assert e2b(plat, "POST", f"/sandboxes/{sid}/pause", {}).status == 204
    time.sleep(5)  # past its end, paused
    r = e2b(plat, "POST", f"/v2/sandboxes/{sid}/connect", {}, timeout=150)
    assert r.status == 201, r
    time.sleep(3)
    d = e2b(plat, "GET", f"/sandboxes/{sid}")
    assert d.status == 200 and d.json()["state"] == "running", \
        f"ENDED: a resumed sandbox ended at its old end: {d}"
    assert e2b(plat, "DELETE", f"/sandboxes/{sid}").status == 204
