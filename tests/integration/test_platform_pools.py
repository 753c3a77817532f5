# SPDX-License-Identifier: MIT
"""Pools as a control-plane resource (/v1/pools/{ns}): sbx-control packs pooled sandboxes into
pool hosts (jobs of mode "pool") with compare-and-swap on slot counts, boots hosts only when every
host is full and never past max_hosts, keeps warm hosts, retires empty ones, and routes each
sandbox through the edge to exactly the run it was made in (410 once that run is gone)."""
import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
import urllib.parse

import pytest

from conftest import ExecResult, wait_until as _wait_until
from sbxplatform import Control, Platform, TLS_PORTS, parse_ndjson


@pytest.fixture(scope="module")
def plat():
    p = Platform(nodes=("pool-n1",))
    yield p
    p.stop()


def wait_until(pred, timeout=10, what="a condition"):
    assert _wait_until(pred, timeout, 0.1), f"timed out waiting for {what}"


_n = [0]


def new_pool(plat, ns="t", **spec):
    _n[0] += 1
    spec.setdefault("name", f"p{_n[0]}-{os.getpid() % 1000}")
    r = plat.request("POST", f"/v1/pools/{ns}", spec)
    assert r.status == 201, r
    return r.json()


def make(plat, pool, count=1, ns="t", **body):
    r = plat.request("POST", f"/v1/pools/{ns}/{pool['name']}/sandboxes", dict(body, count=count),
                     timeout=200)
    return r


def make_ok(plat, pool, count=1, **body):
    r = make(plat, pool, count, **body)
    assert r.status == 200, r
    return r.json()["sandboxes"]


def sb_path(pool, sb, rest="", ns="t"):
    return f"/v1/pools/{ns}/{pool['name']}/sandboxes/{sb['id']}{rest}"


def sb_exec(plat, pool, sb, cmd, **kw):
    r = plat.request("POST", sb_path(pool, sb, "/exec"), {"cmd": cmd}, **kw)
    assert r.status == 200 and "ndjson" in r.headers.get("content-type", ""), r
    return ExecResult(parse_ndjson(r.body))


def inspect(plat, pool, ns="t"):
    r = plat.request("GET", f"/v1/pools/{ns}/{pool['name']}")
    assert r.status == 200, r
    return r.json()


def drain(plat, pool, ns="t"):
    r = plat.request("DELETE", f"/v1/pools/{ns}/{pool['name']}")
    assert r.status == 202, r
    wait_until(lambda: plat.request("GET", f"/v1/pools/{ns}/{pool['name']}").status == 404,
               timeout=30, what="the pool to drain")


# ---- bad input: a 4xx with a reason ------------------------------------------------------------

@pytest.mark.parametrize("spec,status,words", [
    ({"name": "x", "bogus": 1}, 400, "unknown fields"),
    ({}, 400, "name required"),
    ({"name": "Bad Name"}, 400, "name:"),
    ({"name": "x", "per_host": 0}, 400, "per_host"),
    ({"name": "x", "per_host": 5000}, 400, "per_host"),
    ({"name": "x", "max_hosts": 0}, 400, "max_hosts"),
    ({"name": "x", "max_hosts": 65}, 400, "max_hosts"),
    ({"name": "x", "warm": 3, "max_hosts": 2}, 400, "warm"),
    ({"name": "x", "image": "Not/An/Image"}, 400, "image"),
    ({"name": "x", "image": "no-such-image"}, 400, "not available on any node"),
    ({"name": "x", "flavor": "gpu-huge"}, 400, "flavor"),
    ({"name": "x", "host_idle_s": -1}, 400, "host_idle_s"),
])
def test_a_bad_pool_is_refused_with_its_reason(plat, spec, status, words):
    r = plat.request("POST", "/v1/pools/t", spec)
    assert r.status == status, r
    assert words in r.json()["error"], r
    assert plat.request("GET", "/v1/pools/t/x").status == 404  # nothing was made


def test_bad_sandbox_requests_are_refused_with_their_reason(plat):
    pool = new_pool(plat, per_host=2, max_hosts=1)
    for body, words in [({"count": 0}, "count: 1..1000"), ({"count": 1001}, "count: 1..1000"),
                        ({"count": "3"}, "expected"), ({"count": 1, "zzz": 1}, "unknown fields"),
                        ({"count": 1, "env": {"1BAD": "x"}}, "env:"),
                        ({"count": 1, "env": {"A": 1}}, "env:"),
                        ({"count": 1, "env": ["A=1"]}, "env:"),
                        ({"count": 1, "max_procs": 0}, "max_procs"),
                        ({"count": 1, "idle_timeout_secs": -5}, "idle_timeout_secs")]:
        r = plat.request("POST", f"/v1/pools/t/{pool['name']}/sandboxes", body)
        assert r.status == 400 and words in r.json()["error"], (body, r)
    r = plat.request("POST", "/v1/pools/t/no-such-pool/sandboxes", {"count": 1})
    assert r.status == 404 and "no pool" in r.json()["error"], r
    r = plat.request("GET", f"/v1/pools/t/{pool['name']}/sandboxes/0123456789abcdef")
    assert r.status == 404, r
    r = plat.request("GET", f"/v1/pools/t/{pool['name']}/sandboxes/not-an-id")
    assert r.status == 404, r
    r = plat.request("POST", "/v1/pools/t", {"name": pool["name"]})
    assert r.status == 409 and "exists" in r.json()["error"], r
    # nothing above made a host; a good request still works (positive control)
    assert inspect(plat, pool)["hosts"] == []
    assert len(make_ok(plat, pool, 1)) == 1
    drain(plat, pool)


# ---- a pooled sandbox through the edge ---------------------------------------------------------

def test_pooled_sandbox_exec_files_processes_and_delete(plat):
    pool = new_pool(plat, per_host=8, max_hosts=1)
    sbs = make_ok(plat, pool, 2, env={"GREETING": "hello"})
    a, b = sbs
    assert a["token"] and a["path"] == sb_path(pool, a) and a["host"] == b["host"]
    res = sb_exec(plat, pool, a, "echo $GREETING from $(id -u) in $(pwd)")
    assert res.code == 0 and res.out == f"hello from {a['uid']} in {a['home']}\n", res
    # files: write, read, list, stat
    r = plat.request("PUT", sb_path(pool, a, "/files/write?path=/note.txt"), b"pooled bytes")
    assert r.status in (200, 201), r
    r = plat.request("GET", sb_path(pool, a, "/files/read?path=/note.txt"))
    assert r.status == 200 and r.body == b"pooled bytes", r
    r = plat.request("GET", sb_path(pool, a, "/files/list?path=/"))
    assert r.status == 200 and "note.txt" in r.text, r
    # a background process
    r = plat.request("POST", sb_path(pool, a, "/processes"), {"cmd": "echo bg; sleep 0.2"})
    assert r.status == 200, r
    # list and inspect through the control plane (no tokens there)
    r = plat.request("GET", f"/v1/pools/t/{pool['name']}/sandboxes")
    ids = {s["id"] for s in r.json()["sandboxes"]}
    assert ids == {a["id"], b["id"]} and "token" not in r.text, r
    r = plat.request("GET", sb_path(pool, a))
    assert r.status == 200 and r.json()["uid"] == a["uid"] and "token" not in r.json(), r
    assert inspect(plat, pool)["hosts"][0]["used"] == 2
    # delete: gone on the host, the record and its slot freed
    r = plat.request("DELETE", sb_path(pool, a), timeout=60)
    assert r.status == 200 and r.json()["deleted"] is True, r
    assert plat.request("GET", sb_path(pool, a)).status == 404
    assert plat.request("POST", sb_path(pool, a, "/exec"), {"cmd": "true"}).status == 404
    assert inspect(plat, pool)["hosts"][0]["used"] == 1
    assert sb_exec(plat, pool, b, "echo still here").out == "still here\n"
    drain(plat, pool)


def test_a_pool_hosts_janitor_survives_creates_and_deletes_in_its_run(plat):
    """The janitor recycles network namespaces and homes inside the run; there setns() back
    into the run's own namespace is refused, and a janitor that did so died at every delete
    (its trees left in the trash, every namespace made again)."""
    pool = new_pool(plat, per_host=8, max_hosts=1)
    host = None
    for _ in range(3):
        (a,) = make_ok(plat, pool, 1)
        host = a["host"]
        assert sb_exec(plat, pool, a, "true").code == 0
        r = plat.request("DELETE", sb_path(pool, a), timeout=60)
        assert r.status == 200, r
    logs = [os.path.join(n.run_dir(host), "log") for n in plat.nodes]
    logs = [p for p in logs if os.path.exists(p)]
    assert len(logs) == 1, logs
    text = open(logs[0], errors="replace").read()
    assert "listening" in text, text[-2000:]  # positive control: the pool host's own log
    assert "janitor" not in text, text[-2000:]
    drain(plat, pool)


def test_a_sandbox_route_reaches_only_that_sandbox(plat):
    """ATTACK: the client names sandbox A in the path and hands a sibling's token, or asks for a
    sibling's files by path: it gets A, confined to A's home, every time."""
    pool = new_pool(plat, per_host=4, max_hosts=1)
    a, b = make_ok(plat, pool, 2)
    assert a["uid"] != b["uid"]
    r = plat.request("PUT", sb_path(pool, b, "/files/write?path=/secret"), b"b's secret")
    assert r.status in (200, 201), r
    # B's token on A's route: the edge hands A's own token; the command runs as A
    r = plat.request("POST", sb_path(pool, a, "/exec"), {"cmd": "id -u"},
                     headers={"X-Sandbox-Token": b["token"]})
    assert r.status == 200 and ExecResult(parse_ndjson(r.body)).out == f"{a['uid']}\n", \
        ("ATTACK: the client's X-Sandbox-Token reached the agent instead of the sandbox's own", r)
    # A reading B's home: refused by the kernel (uid + Landlock), B reads it (positive control)
    res = sb_exec(plat, pool, a, f"cat {b['home']}/secret")
    assert res.code != 0 and "b's secret" not in res.out, "ATTACK: a sandbox read its sibling's home"
    assert sb_exec(plat, pool, b, "cat $HOME/secret").out == "b's secret"
    # the file API is rooted at A's home: B's path is a path inside A's
    r = plat.request("GET", sb_path(pool, a, "/files/read?path=" +
                                    urllib.parse.quote(b["home"] + "/secret", safe="")))
    assert r.status == 404 and b"b's secret" not in r.body, r
    drain(plat, pool)


def test_roles_and_namespaces_hold_for_pooled_sandboxes(plat):
    pool = new_pool(plat, per_host=2, max_hosts=1)
    (a,) = make_ok(plat, pool, 1)
    assert sb_exec(plat, pool, a, "echo x > $HOME/f").code == 0
    reader = plat.token("pool-reader", "t", "read")
    other = plat.token("pool-other", "u", "write")
    # read: reads files, lists; cannot exec, write files, make or delete sandboxes
    r = plat.request("GET", sb_path(pool, a, "/files/read?path=/f"), token=reader)
    assert r.status == 200 and r.body == b"x\n", r
    assert plat.request("GET", f"/v1/pools/t/{pool['name']}", token=reader).status == 200
    for method, path, body in [("POST", sb_path(pool, a, "/exec"), {"cmd": "true"}),
                               ("PUT", sb_path(pool, a, "/files/write?path=/g"), b"x"),
                               ("POST", f"/v1/pools/t/{pool['name']}/sandboxes", {"count": 1}),
                               ("DELETE", sb_path(pool, a), None),
                               ("POST", "/v1/pools/t", {"name": "by-reader"})]:
        r = plat.request(method, path, body, token=reader)
        assert r.status == 403, ("ATTACK: a read token did", method, path, r)
    # another namespace's token reaches nothing here
    for method, path in [("GET", sb_path(pool, a, "/files/read?path=/f")),
                         ("POST", sb_path(pool, a, "/exec")), ("GET", "/v1/pools/t")]:
        r = plat.request(method, path, {"cmd": "true"} if method == "POST" else None, token=other)
        assert r.status == 403, ("ATTACK: another namespace's token did", method, path, r)
    assert plat.request("GET", sb_path(pool, a)).status == 200  # still there
    drain(plat, pool)



# A sandbox's service: HTTP on its proxy socket (a pooled sandbox cannot bind TCP), answering
# with its tag, the path, and which credential headers reached it; each path is logged.
UNIX_HTTP = textwrap.dedent("""
    import http.server, os, socketserver, sys
    path, tag = sys.argv[1], sys.argv[2]
    log = os.path.join(os.environ["HOME"], "served-" + tag)
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            with open(log, "a") as f:
                f.write(self.path + "\\n")
            creds = ",".join(h for h in ("authorization", "x-sandbox-token") if h in self.headers)
            body = ("%s %s creds=[%s]" % (tag, self.path, creds)).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        def log_message(self, *a):
            pass
    socketserver.UnixStreamServer(path, H).serve_forever()
""")


def serve(plat, pool, sb, port, tag):
    """Start the service in sandbox sb on <home>/.sbx/proxy/<port>.sock; wait until it listens."""
    r = plat.request("PUT", sb_path(pool, sb, "/files/write?path=/svc.py"), UNIX_HTTP.encode())
    assert r.status in (200, 201), r
    r = plat.request("POST", sb_path(pool, sb, "/processes"),
                     {"cmd": f"exec python3 $HOME/svc.py $HOME/.sbx/proxy/{port}.sock {tag}"})
    assert r.status == 200, r
    wait_until(lambda: sb_exec(plat, pool, sb, f"test -S $HOME/.sbx/proxy/{port}.sock").code == 0,
               timeout=20, what=f"the service of {tag} to listen")


def served(plat, pool, sb, tag):
    """The paths sb's service `tag` has answered (read as the sandbox itself)."""
    r = plat.request("GET", sb_path(pool, sb, f"/files/read?path=/served-{tag}"))
    return r.body.decode().splitlines() if r.status == 200 else []


# A service that keeps every connection and answers whatever comes on it: /sticky with "ok",
# anything else with a made-up exec answer, logging what it got (that it got it is the attack).
STICKY = textwrap.dedent("""
    import os, socket, sys, threading, time
    home = os.environ["HOME"]
    s = socket.socket(socket.AF_UNIX)
    s.bind(sys.argv[1])
    s.listen(16)
    def serve(c):
        buf = b""
        while True:
            d = c.recv(65536)
            if not d:
                return
            buf += d
            while b"\\r\\n\\r\\n" in buf:
                head, rest = buf.split(b"\\r\\n\\r\\n", 1)
                n = 0
                for l in head.split(b"\\r\\n"):
                    if l.lower().startswith(b"content-length:"):
                        n = int(l.split(b":")[1])
                if len(rest) < n:
                    break
                buf = rest[n:]
                if head.startswith(b"GET /sticky"):
                    c.sendall(b"HTTP/1.1 200 OK\\r\\nContent-Length: 2\\r\\n\\r\\nok")
                    continue
                with open(home + "/stolen", "ab") as f:
                    f.write(head.split(b"\\r\\n")[0] + b"\\n")
                body = (b'{"event":"stdout","data":"FAKE\\\\n"}\\n'
                        b'{"event":"exit","exit_code":0,"signal":null,"timed_out":false,'
                        b'"duration_ms":1}\\n')
                c.sendall(b"HTTP/1.1 200 OK\\r\\nContent-Type: application/x-ndjson\\r\\n"
                          b"Content-Length: %d\\r\\n\\r\\n" % len(body) + body)
    threading.Timer(60, lambda: os._exit(0)).start()
    while True:
        threading.Thread(target=serve, args=(s.accept()[0],), daemon=True).start()
""")


def test_a_pooled_service_that_keeps_its_connection_never_answers_for_the_agent(plat):
    """The node keeps its connections to a pool host's agent for the agent's own routes only:
    behind a pooled sandbox's port proxy (/v1/sandboxes/{id}/proxy/...) that sandbox's service
    answers, and one that keeps the connection would get the next request on it (a sibling's
    exec and its token, the control plane's sync with the host's token). Positive control: the
    service answers such a request with made-up output when it does get one."""
    pool = new_pool(plat, per_host=4, max_hosts=1)
    a, b = make_ok(plat, pool, 2)
    assert a["host"] == b["host"]
    r = plat.request("PUT", sb_path(pool, a, "/files/write?path=/sticky.py"), STICKY.encode())
    assert r.status in (200, 201), r
    r = plat.request("POST", sb_path(pool, a, "/processes"),
                     {"cmd": "exec python3 $HOME/sticky.py $HOME/.sbx/proxy/8080.sock"})
    assert r.status == 200, r
    wait_until(lambda: sb_exec(plat, pool, a, "test -S $HOME/.sbx/proxy/8080.sock").code == 0,
               timeout=20, what="the sticky service to listen")
    for i in range(3):
        r = plat.request("GET", sb_path(pool, a, "/proxy/8080/sticky"))
        assert (r.status, r.body) == (200, b"ok"), r
        for sb, who in ((b, "the sibling"), (a, "the sandbox itself")):
            res = sb_exec(plat, pool, sb, f"echo real-{i}")
            assert res.out == f"real-{i}\n", \
                (f"ATTACK: an exec of {who} was answered by a pooled sandbox's service", res.out)
        r = plat.request("GET", f"/v1/pools/t/{pool['name']}")
        assert r.status == 200, r
    time.sleep(3.5)  # the control plane's sync of the host (every 3 s) has gone by
    r = plat.request("GET", sb_path(pool, a, "/files/read?path=/stolen"))
    assert r.status == 404, ("ATTACK: the service got requests meant for the agent", r.body)
    assert sb_exec(plat, pool, b, "echo alive").out == "alive\n"  # B still known, not gone
    r = plat.request("POST", sb_path(pool, a, "/proxy/8080/v1/exec"), b"{}")  # positive control
    assert r.status == 200 and b"FAKE" in r.body, r
    r = plat.request("GET", sb_path(pool, a, "/files/read?path=/stolen"))
    assert r.status == 200 and b"POST /v1/exec" in r.body, r
    drain(plat, pool)


def test_a_pooled_sandboxs_port_is_reached_through_its_own_route_only(plat):
    """/v1/pools/{ns}/{pool}/sandboxes/{id}/proxy/{port}/... reaches the service that sandbox
    runs on its proxy socket. ATTACK: a sibling's route (or the sibling's token on it) never
    reaches A's service; no API token, a read token or another namespace's token reach
    nothing; a port nothing listens on is 502 (docs/protocol.md, Port proxy)."""
    pool = new_pool(plat, per_host=4, max_hosts=1)
    a, b = make_ok(plat, pool, 2)
    assert a["host"] == b["host"]
    serve(plat, pool, a, 8080, "A")
    serve(plat, pool, b, 8081, "B")
    # positive: A's route reaches A's service, path and query as sent, no credential passed on
    r = plat.request("GET", sb_path(pool, a, "/proxy/8080/some/path?x=1"),
                     headers={"X-Sandbox-Token": b["token"]})
    assert r.status == 200 and r.body == b"A /some/path?x=1 creds=[]", \
        ("the pooled proxy route did not reach the sandbox's service as sent", r)
    r = plat.request("GET", sb_path(pool, b, "/proxy/8081/own"))
    assert r.status == 200 and r.body == b"B /own creds=[]", r
    # ATTACK: B's route to A's port, with A's token or none: B has no service there
    for hdrs in ({}, {"X-Sandbox-Token": a["token"]}):
        r = plat.request("GET", sb_path(pool, b, "/proxy/8080/steal"), headers=hdrs)
        assert r.status == 502 and not r.body.startswith(b"A "), \
            ("ATTACK: a sibling's route reached A's service", hdrs, r)
    r = plat.request("GET", sb_path(pool, a, "/proxy/8081/steal"))
    assert r.status == 502 and not r.body.startswith(b"B "), \
        ("ATTACK: A's route reached B's service", r)
    # credentials: none, another namespace's, a read token (the proxy needs write)
    r = plat.request("GET", sb_path(pool, a, "/proxy/8080/noauth"), token=None)
    assert r.status == 401, ("ATTACK: the proxy route answered without an API token", r)
    other = plat.token("pool-proxy-other", "u", "write")
    reader = plat.token("pool-proxy-reader", "t", "read")
    for tok in (other, reader, "sbx_not-a-token"):
        r = plat.request("GET", sb_path(pool, a, "/proxy/8080/foreign"), token=tok)
        assert r.status in (401, 403), ("ATTACK: the proxy route answered a foreign token", r)
    # nothing listens on that port: 502; not a port: 404
    r = plat.request("GET", sb_path(pool, a, "/proxy/8099/none"))
    assert r.status == 502, r
    for bad in ("0", "65536", "http"):
        r = plat.request("GET", sb_path(pool, a, f"/proxy/{bad}/x"))
        assert r.status == 404, (bad, r)
    # what each service was asked: only its own route's requests
    assert served(plat, pool, a, "A") == ["/some/path?x=1"], served(plat, pool, a, "A")
    assert served(plat, pool, b, "B") == ["/own"], served(plat, pool, b, "B")
    # a gone sandbox's route: 404 after its delete, never a sibling's service
    assert plat.request("DELETE", sb_path(pool, a), timeout=60).status == 200
    r = plat.request("GET", sb_path(pool, a, "/proxy/8080/after"))
    assert r.status == 404, r
    assert plat.request("GET", sb_path(pool, b, "/proxy/8081/still")).body == b"B /still creds=[]"
    drain(plat, pool)

# ---- packing: exact under concurrency ----------------------------------------------------------

CLIENT = textwrap.dedent("""
    import http.client, json, ssl, sys, time
    port, token, ca, path, count = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
    start_at = float(sys.argv[6])
    ctx = ssl.create_default_context(cafile=ca) if ca else None
    c = (http.client.HTTPSConnection if ctx else http.client.HTTPConnection)(
        "127.0.0.1", int(port), timeout=300, **({"context": ctx} if ctx else {}))
    c.connect()  # connected (and TLS done) before the common start
    time.sleep(max(0.0, start_at - time.time()))
    c.request("POST", path, json.dumps({"count": count}),
              {"Authorization": "Bearer " + token, "Content-Type": "application/json"})
    r = c.getresponse()
    print(json.dumps({"status": r.status, "body": json.loads(r.read() or b"null")}))
""")


@pytest.fixture
def racy(plat):
    """A control process that widens the window between reading a pool's hosts and writing a
    reservation or a new host (SBX_TEST_POOL_RACE_MS), so that concurrent requests surely
    overlap there; the normal one again afterwards."""
    swap_control(plat, {"SBX_TEST_POOL_RACE_MS": "40"})
    yield
    swap_control(plat)


def concurrent_creates(plat, pool, procs, each):
    ctx = TLS_PORTS.get(plat.control.port)
    ca = os.path.join(plat.control.state, "tls", "ca.crt") if ctx else ""
    path = f"/v1/pools/t/{pool['name']}/sandboxes"
    start_at = time.time() + 1.5  # every process sends at once
    ps = [subprocess.Popen([sys.executable, "-c", CLIENT, str(plat.control.port), plat.admin, ca,
                            path, str(each), str(start_at)], stdout=subprocess.PIPE, text=True)
          for _ in range(procs)]
    outs = []
    for p in ps:
        out, _ = p.communicate(timeout=300)
        outs.append(json.loads(out))
    return outs


def check_packing(plat, pool, outs, per_host):
    made = [s for o in outs if o["status"] == 200 for s in o["body"]["sandboxes"]]
    ids = [s["id"] for s in made]
    assert len(ids) == len(set(ids))
    info = inspect(plat, pool)
    hosts = info["hosts"]
    by_host = {}
    for s in made:
        by_host[s["host"]] = by_host.get(s["host"], 0) + 1
    for h in hosts:
        assert h["used"] <= h["capacity"] == per_host, ("ATTACK: a host was over-packed", h)
        assert by_host.get(h["job"], 0) == h["used"], \
            ("LIE: a host's slot count is not the sandboxes made on it", h, by_host)
    assert set(by_host) <= {h["job"] for h in hosts}, \
        ("LIE: sandboxes live on a host the pool does not count", by_host, hosts)
    assert info["sandboxes"] == len(made)
    assert sum(h["used"] for h in hosts) == info["sandboxes"], \
        ("LIE: the hosts' live counts are not the live sandbox records", hosts, info["sandboxes"])
    jobs = plat.request("GET", f"/v1/jobs/t?label=sbx-pool={pool['name']}").json()
    assert len(jobs) == len(hosts), \
        ("ATTACK: a host job was booted that no host record counts", len(jobs), hosts)
    return made, hosts


def test_eight_clients_at_once_fill_exactly_the_hosts_needed(plat, racy):
    """8 processes x 50 sandboxes, 100 per host, max_hosts 4: exactly 4 hosts, every slot used,
    nothing rejected."""
    pool = new_pool(plat, per_host=100, max_hosts=4)
    outs = concurrent_creates(plat, pool, 8, 50)
    assert all(o["status"] == 200 and o["body"]["rejected"] == 0 for o in outs), \
        ("ATTACK: a host was over-packed (its agent refused slots the pool handed out), or a "
         "request was refused though the pool had room",
         [(o["status"], o["body"].get("reason")) for o in outs])
    made, hosts = check_packing(plat, pool, outs, 100)
    assert len(made) == 400
    assert len(hosts) == 4, ("ATTACK: more hosts booted than needed", hosts)
    assert all(h["used"] == 100 for h in hosts), hosts
    # one of each host's sandboxes answers (positive control that they are real)
    seen = set()
    for s in made:
        if s["host"] not in seen:
            seen.add(s["host"])
            assert sb_exec(plat, pool, s, "id -u").out == f"{s['uid']}\n"
    drain(plat, pool)


def test_many_clients_that_each_need_a_new_host_at_once_boot_one_each(plat, racy):
    """16 processes x 5 sandboxes, 5 per host: each request finds every host full and makes a
    host at the lowest free slot; requests that collide on a slot pack into the winner's host or
    take the next slot. Exactly 16 hosts, each full, none over max_hosts."""
    pool = new_pool(plat, per_host=5, max_hosts=16)
    outs = concurrent_creates(plat, pool, 16, 5)
    assert all(o["status"] == 200 and o["body"]["rejected"] == 0 for o in outs), \
        ("ATTACK: a host was over-packed (its agent refused slots the pool handed out), or a "
         "request was refused though the pool had room",
         [(o["status"], o["body"].get("reason")) for o in outs])
    made, hosts = check_packing(plat, pool, outs, 5)
    assert len(made) == 80, ("LIE: not every free slot was used", [o["status"] for o in outs])
    assert len(hosts) == 16 and all(h["used"] == 5 for h in hosts), \
        ("ATTACK: more hosts booted than needed", hosts)
    drain(plat, pool)


def test_max_hosts_is_exact_and_what_does_not_fit_is_rejected_with_the_reason(plat, racy):
    """8 processes x 50 into 3 hosts of 100: 300 made, 100 rejected, never a 4th host."""
    pool = new_pool(plat, per_host=100, max_hosts=3)
    outs = concurrent_creates(plat, pool, 8, 50)
    made, hosts = check_packing(plat, pool, outs, 100)
    assert len(made) == 300, ("LIE: not every free slot was used", [o["status"] for o in outs])
    assert len(hosts) == 3, ("ATTACK: max_hosts exceeded", hosts)
    rejected = sum(o["body"]["rejected"] for o in outs)
    assert rejected == 100, outs
    for o in outs:
        if o["status"] == 429:
            assert "max_hosts" in o["body"]["error"] and o["body"]["rejected"] == 50, o
        elif o["body"]["rejected"]:
            assert "max_hosts" in o["body"]["reason"], o
    # a full pool answers 429 at once
    r = make(plat, pool, 1)
    assert r.status == 429 and r.json()["rejected"] == 1 and "max_hosts" in r.json()["reason"], r
    assert len(plat.request("GET", f"/v1/jobs/t?label=sbx-pool={pool['name']}").json()) == 3
    drain(plat, pool)


def host_records(plat, pool):
    """The pool's host records as the store holds them, by key."""
    db = sqlite3.connect(os.path.join(plat.ctl_state, "store.db"), timeout=10)
    try:
        rows = db.execute("SELECT key, value FROM kv WHERE key >= ? AND key < ?",
                          (f"poolhosts/t/{pool['name']}/", f"poolhosts/t/{pool['name']}0")).fetchall()
    finally:
        db.close()
    return {k: json.loads(v) for k, v in rows}


def live_listed(plat, pool):
    """Live sandboxes per host job, from the pool's list of sandbox records."""
    listed = plat.request("GET", f"/v1/pools/t/{pool['name']}/sandboxes").json()["sandboxes"]
    by_host = {}
    for s in listed:
        if not s.get("gone"):
            by_host[s["host"]] = by_host.get(s["host"], 0) + 1
    return by_host


def test_live_counts_stay_exact_through_concurrent_creates_and_deletes(plat, racy):
    """A create counts a host's free slots from its host record's live count, not by reading
    every sandbox record of the pool: the count moves in the transaction that writes or deletes
    a sandbox record. After 4 clients create and delete at once, each host's count is exactly
    its live records; a host record from before the count (its count removed in the store) is
    counted again by the reconciler."""
    pool = new_pool(plat, per_host=6, max_hosts=2)
    keep = make_ok(plat, pool, 4)
    errors = []

    def churn():
        for _ in range(6):
            r = make(plat, pool, 1)
            if r.status != 200:
                errors.append(("create", r.status, r.body[:200]))
                continue
            (sb,) = r.json()["sandboxes"]
            d = plat.request("DELETE", sb_path(pool, sb), timeout=60)
            if d.status != 200:
                errors.append(("delete", d.status, d.body[:200]))

    threads = [threading.Thread(target=churn) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not errors, errors
    listed = live_listed(plat, pool)
    assert sum(listed.values()) == len(keep) == 4, listed
    recs = host_records(plat, pool)
    counts = {h["job"]: h["live"] for h in recs.values()}
    for job, n in counts.items():
        assert n == listed.get(job, 0), ("LIE: a host's live count is not its live sandboxes",
                                         counts, listed)
    # a delete of a kept one moves its host's count down by one
    assert plat.request("DELETE", sb_path(pool, keep[0]), timeout=60).status == 200
    recs = host_records(plat, pool)
    assert {h["job"]: h["live"] for h in recs.values()}[keep[0]["host"]] == \
        counts[keep[0]["host"]] - 1, recs
    # a host record from before the count: the reconciler counts its live records again
    key, old = next((k, h) for k, h in recs.items() if h["live"] > 0)
    db = sqlite3.connect(os.path.join(plat.ctl_state, "store.db"), timeout=10)
    try:
        with db:
            db.execute("BEGIN IMMEDIATE")
            rev = db.execute("SELECT rev FROM meta").fetchone()[0] + 1
            stripped = {k: v for k, v in old.items() if k != "live"}
            db.execute("UPDATE meta SET rev = ?", (rev,))
            db.execute("UPDATE kv SET value = ?, rev = ? WHERE key = ?",
                       (json.dumps(stripped, sort_keys=True, separators=(",", ":")).encode(), rev,
                        key))
    finally:
        db.close()
    assert "live" not in host_records(plat, pool)[key]
    assert inspect(plat, pool)["sandboxes"] == 3  # counted by listing meanwhile
    wait_until(lambda: host_records(plat, pool)[key].get("live") == old["live"], timeout=20,
               what="the reconciler to count the host's live sandboxes")
    # positive control: the pool still fills exactly to its capacity, no further
    more = make_ok(plat, pool, 12 - 3)
    assert len(more) == 9
    assert make(plat, pool, 1).status == 429, "ATTACK: a full pool took one more sandbox"
    drain(plat, pool)


# ---- hosts that end, move, idle; warm hosts; sandbox idle ---------------------------------------

def test_a_host_that_ends_is_dropped_and_its_sandboxes_are_gone(plat):
    pool = new_pool(plat, per_host=4, max_hosts=2)
    a, b = make_ok(plat, pool, 2)
    assert sb_exec(plat, pool, a, "echo up").out == "up\n"
    host = a["host"]
    r = plat.request("POST", f"/v1/jobs/t/{host}/cancel")
    assert r.status == 202, r
    wait_until(lambda: plat.request("GET", sb_path(pool, a)).status == 410, timeout=30,
               what="the sandbox to be reported gone")
    r = plat.request("GET", sb_path(pool, b))
    assert r.status == 410 and "ended" in r.json()["error"], r
    r = plat.request("POST", sb_path(pool, a, "/exec"), {"cmd": "true"})
    assert r.status == 410, ("LIE: a gone sandbox was not reported gone", r)
    wait_until(lambda: inspect(plat, pool)["hosts"] == [], timeout=15, what="the host dropped")
    listed = plat.request("GET", f"/v1/pools/t/{pool['name']}/sandboxes").json()["sandboxes"]
    assert listed == []
    # the pool goes on: a new host for the next request (positive control)
    (c,) = make_ok(plat, pool, 1)
    assert c["host"] != host and sb_exec(plat, pool, c, "echo new").out == "new\n"
    drain(plat, pool)



def host_agent_pid(plat, job):
    """The pid of a pool host's agent (its run's process, named by the node's run record) after
    checking that it is that process: an sbx-server in host mode, started when the record says."""
    recs = [(n, n.run_record(job)) for n in plat.nodes]
    recs = [(n, r) for n, r in recs if r and r.get("state") == "running"]
    assert len(recs) == 1, recs
    rec = recs[0][1]
    pid = rec["pid"]
    with open(f"/proc/{pid}/stat") as f:
        assert int(f.read().rsplit(")", 1)[1].split()[19]) == rec["start_time"]
    with open(f"/proc/{pid}/environ", "rb") as f:
        env = f.read().split(b"\0")
    assert b"SBX_HOST_MODE=1" in env, env
    assert os.path.basename(os.readlink(f"/proc/{pid}/exe")).startswith("sbx-server")
    return pid


def test_a_host_whose_agent_is_killed_is_dropped_and_its_sandboxes_are_gone(plat):
    """The pool host's agent dies for real (SIGKILL, no cancel): its sandboxes are reported gone
    (410, never served by another host), the host is dropped, and the pool goes on."""
    pool = new_pool(plat, per_host=4, max_hosts=2)
    a, b = make_ok(plat, pool, 2)
    assert sb_exec(plat, pool, a, "echo up").out == "up\n"  # positive control
    host = a["host"]
    pid = host_agent_pid(plat, host)
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: plat.request("GET", sb_path(pool, a)).status == 410, timeout=30,
               what="the sandbox to be reported gone")
    r = plat.request("GET", sb_path(pool, b))
    assert r.status == 410 and f"its pool host {host} ended" in r.json()["error"], r
    for sb in (a, b):
        r = plat.request("POST", sb_path(pool, sb, "/exec"), {"cmd": "echo served"})
        assert r.status == 410, ("LIE: a sandbox of a dead host was not reported gone", r)
    wait_until(lambda: all(h["job"] != host for h in inspect(plat, pool)["hosts"]), timeout=30,
               what="the dead host dropped")
    job = plat.request("GET", f"/v1/jobs/t/{host}").json()
    assert job["stage"] == "ERROR" and "signal 9" in job["message"], job
    listed = plat.request("GET", f"/v1/pools/t/{pool['name']}/sandboxes").json()["sandboxes"]
    assert listed == []
    # the pool goes on: the next request gets a host that runs (positive control)
    (c,) = make_ok(plat, pool, 1)
    assert c["host"] != host and sb_exec(plat, pool, c, "echo new").out == "new\n"
    for sb in (a, b):  # still gone: the new host never answers for the old sandboxes
        r = plat.request("POST", sb_path(pool, sb, "/exec"), {"cmd": "echo served"})
        assert r.status == 410, ("ATTACK: a dead host's sandbox was served by another", r)
    drain(plat, pool)

def test_a_restarted_host_never_serves_the_sandboxes_of_its_old_run(plat):
    """Pause + resume gives the host's job a new generation (a new agent that never had these
    sandboxes): requests for them are 410 at the edge, never forwarded to the new run."""
    pool = new_pool(plat, per_host=4, max_hosts=1)
    (a,) = make_ok(plat, pool, 1)
    assert sb_exec(plat, pool, a, "echo before").out == "before\n"  # positive control
    host = a["host"]
    assert plat.request("POST", f"/v1/jobs/t/{host}/pause").status == 202
    wait_until(lambda: plat.request("GET", f"/v1/jobs/t/{host}").json()["stage"] == "PAUSED",
               timeout=30, what="paused")
    assert plat.request("POST", f"/v1/jobs/t/{host}/resume").status == 202
    wait_until(lambda: plat.request("GET", f"/v1/jobs/t/{host}").json()["stage"] == "RUNNING",
               timeout=30, what="running again")
    r = plat.request("POST", sb_path(pool, a, "/exec"), {"cmd": "echo after"})
    assert r.status == 410 and "generation" in r.json()["error"], \
        ("ATTACK: a sandbox of the old run was forwarded to the new one", r)
    wait_until(lambda: plat.request("GET", sb_path(pool, a)).status == 410, timeout=15,
               what="the record to say gone")
    # the restarted host is used again, from an empty slate
    wait_until(lambda: inspect(plat, pool)["hosts"][0]["used"] == 0, timeout=15, what="freed")
    (b,) = make_ok(plat, pool, 1)
    assert b["host"] == host and sb_exec(plat, pool, b, "echo fresh").out == "fresh\n"
    drain(plat, pool)


def test_empty_hosts_retire_after_their_idle_timeout_and_warm_hosts_stay(plat):
    pool = new_pool(plat, per_host=2, max_hosts=3, warm=1, host_idle_s=1)
    # a warm host boots without any request
    wait_until(lambda: [h["state"] for h in inspect(plat, pool)["hosts"]] == ["ready"],
               timeout=30, what="the warm host")
    warm_job = inspect(plat, pool)["hosts"][0]["job"]
    sbs = make_ok(plat, pool, 4)  # fills the warm host and boots a second
    assert len({s["host"] for s in sbs}) == 2 and warm_job in {s["host"] for s in sbs}
    for s in sbs:
        assert plat.request("DELETE", sb_path(pool, s), timeout=60).status == 200
    # one host retires (its job canceled), one stays warm
    wait_until(lambda: len(inspect(plat, pool)["hosts"]) == 1, timeout=30,
               what="the empty host to retire")
    jobs = plat.request("GET", f"/v1/jobs/t?label=sbx-pool={pool['name']}").json()
    stages = sorted(j["stage"] for j in jobs)
    assert stages == ["CANCELED", "RUNNING"], stages
    time.sleep(2.5)  # well past host_idle_s: the warm host stays
    assert len(inspect(plat, pool)["hosts"]) == 1
    drain(plat, pool)


def test_a_sandbox_idle_past_its_timeout_is_gone_and_frees_its_slot(plat):
    pool = new_pool(plat, per_host=1, max_hosts=1, sandbox_idle_s=1)
    (a,) = make_ok(plat, pool, 1)
    assert make(plat, pool, 1).status == 429  # the only slot is taken
    wait_until(lambda: plat.request("GET", sb_path(pool, a)).status == 410, timeout=30,
               what="the idle sandbox to be reported gone")
    assert "no longer has it" in plat.request("GET", sb_path(pool, a)).json()["error"]
    wait_until(lambda: inspect(plat, pool)["hosts"][0]["used"] == 0, timeout=15,
               what="its slot freed")
    assert len(make_ok(plat, pool, 1)) == 1  # the slot is used again
    drain(plat, pool)


def test_deleting_a_pool_drains_it(plat):
    pool = new_pool(plat, per_host=2, max_hosts=2)
    sbs = make_ok(plat, pool, 3)
    hosts = {s["host"] for s in sbs}
    assert len(hosts) == 2
    r = plat.request("DELETE", f"/v1/pools/t/{pool['name']}")
    assert r.status == 202 and r.json()["state"] == "draining", r
    assert make(plat, pool, 1).status in (404, 409)  # no new sandboxes while draining
    wait_until(lambda: plat.request("GET", f"/v1/pools/t/{pool['name']}").status == 404,
               timeout=30, what="the pool removed")
    for h in hosts:
        assert plat.request("GET", f"/v1/jobs/t/{h}").json()["stage"] == "CANCELED"
    assert plat.request("GET", sb_path(pool, sbs[0])).status == 404
    # the name can be used again
    again = new_pool(plat, name=pool["name"], per_host=2, max_hosts=1)
    assert len(make_ok(plat, again, 1)) == 1
    drain(plat, again)


# ---- a control process that dies in the middle of a request -----------------------------------

def swap_control(plat, env=None):
    """Stop the control process (or reap one that crashed) and start another on the same store
    and port."""
    old = plat.control
    if old.proc.alive():
        old.proc.stop()
    else:
        old.proc.proc.wait()
        old.proc.crashed = False  # the test made it crash
        old.proc.stop()
    plat._retired.append(old)
    c = Control(plat, f"control-{len(plat._retired)}", plat.ctl_state, port=old.port, env=env)
    plat.controls[0] = plat.control = c
    return c


def create_through_a_control_that_dies_at(plat, pool, point):
    """A create of one sandbox through a control process that ends (SIGKILL) at crash point
    control:pool:<point>; then a control process of its own again."""
    swap_control(plat, {"SBX_TEST_CRASH_AT": "control:pool:" + point})
    try:
        make(plat, pool, 1)
    except OSError:
        pass  # the crash cuts the answer
    assert _wait_until(lambda: not plat.control.proc.alive(), 20), plat.control.log()[-2000:]
    assert plat.control.proc.proc.returncode == 137
    swap_control(plat)


def test_a_reservation_of_a_control_that_died_is_released(plat):
    """The control process ends between reserving a slot and asking the host's agent (SBX_TEST_
    CRASH_AT=control:pool:reserved). Its reservation must not hold the slot for ever: once its
    heartbeat record is stale the reconciler drops it, and the slot is used again."""
    pool = new_pool(plat, per_host=2, max_hosts=1)
    (a,) = make_ok(plat, pool, 1)
    create_through_a_control_that_dies_at(plat, pool, "reserved")
    wait_until(lambda: inspect(plat, pool)["hosts"][0]["free"] == 1, timeout=20,
               what="the dead control's reservation to be dropped")
    (b,) = make_ok(plat, pool, 1)  # the slot it held
    assert b["host"] == a["host"]
    r = make(plat, pool, 1)
    assert r.status == 429, ("LIE: the pool handed out more slots than it has", r)
    assert sb_exec(plat, pool, a, "echo a").out == "a\n"
    drain(plat, pool)


def test_sandboxes_a_dead_control_made_but_never_recorded_do_not_fill_the_host(plat):
    """The control process ends after the host's agent made a sandbox and before it recorded it
    (SBX_TEST_CRASH_AT=control:pool:made). The agent counts that sandbox against its capacity
    though no record names it: once no allocation is pending on the host, the reconciler
    deletes it there at once (not after the minute's grace it gives an allocation in flight),
    so the pool's creates are not refused as full while the control shows free slots."""
    pool = new_pool(plat, per_host=2, max_hosts=1)
    (a,) = make_ok(plat, pool, 1)
    create_through_a_control_that_dies_at(plat, pool, "made")
    t0 = time.monotonic()

    def made():
        r = make(plat, pool, 1)
        assert r.status in (200, 429), r
        return r.json()["sandboxes"][0] if r.status == 200 else None
    b = _wait_until(made, 30, 0.5)
    assert b, ("the orphan still fills the host", time.monotonic() - t0,
               plat.control.log()[-2000:])
    assert b["host"] == a["host"]
    assert "no record names it" in plat.control.log()
    r = make(plat, pool, 1)
    assert r.status == 429, ("LIE: the pool handed out more slots than it has", r)
    assert sb_exec(plat, pool, a, "echo a").out == "a\n"  # the recorded one is untouched
    assert sb_exec(plat, pool, b, "echo b").out == "b\n"
    drain(plat, pool)


def _sql(plat, query):
    out = subprocess.run(["sqlite3", "-cmd", ".timeout 5000",
                          os.path.join(plat.ctl_state, "store.db"), query],
                         capture_output=True, timeout=20)
    assert out.returncode == 0, out.stderr.decode()
    return out.stdout.decode().strip()


def test_the_edge_refuses_another_generation_before_the_reconciler_marks_the_sandbox_gone(plat):
    """The edge checks the host run's generation itself: with the sandbox's record and token put
    back as they were before its host restarted (the moment before the reconciler notices), a
    request is still 410 and never reaches the new run."""
    pool = new_pool(plat, per_host=4, max_hosts=1)
    (a,) = make_ok(plat, pool, 1)
    assert sb_exec(plat, pool, a, "echo before").out == "before\n"  # positive control
    keys = [f"poolsbx/t/{pool['name']}/{a['id']}", f"secrets/psb/t/{pool['name']}/{a['id']}"]
    saved = {k: _sql(plat, f"SELECT hex(value) FROM kv WHERE key = '{k}'") for k in keys}
    assert all(saved.values()), saved
    host = a["host"]
    assert plat.request("POST", f"/v1/jobs/t/{host}/pause").status == 202
    wait_until(lambda: plat.request("GET", f"/v1/jobs/t/{host}").json()["stage"] == "PAUSED",
               timeout=30, what="paused")
    assert plat.request("POST", f"/v1/jobs/t/{host}/resume").status == 202
    wait_until(lambda: plat.request("GET", f"/v1/jobs/t/{host}").json()["stage"] == "RUNNING",
               timeout=30, what="running again")
    wait_until(lambda: plat.request("GET", sb_path(pool, a)).status == 410, timeout=15,
               what="the reconciler to mark it gone")
    # the edge's route cache learns the new run (a request to the host job's own agent)
    r = plat.request("GET", f"/v1/jobs/t/{host}/proxy/49983/health")
    assert r.status in (200, 401, 403), r
    for k, v in saved.items():  # as before the restart
        _sql(plat, f"BEGIN IMMEDIATE; UPDATE meta SET rev = rev + 1; INSERT OR REPLACE INTO "
                   f"kv(key, value, rev) SELECT '{k}', X'{v}', rev FROM meta; COMMIT;")
    assert plat.request("GET", sb_path(pool, a)).status == 200
    r = plat.request("POST", sb_path(pool, a, "/exec"), {"cmd": "echo after"})
    assert r.status == 410 and "generation" in r.json()["error"], \
        ("ATTACK: a sandbox of the old run was forwarded to the new one", r)
    drain(plat, pool)
