# SPDX-License-Identifier: MIT
"""The hostile suite: a tenant's run holds nothing of the host (issue 8).

One control plane and two nodes on loopback; two tenants (namespaces rba: the attacker, rbv: the
victim). Every case is an attack made from inside a dedicated run or a pooled sandbox created
through the Jobs API (exec through the edge proxy), and asserts the refusal next to a positive
control that proves the effect would have been seen:

- the same probe run on the host as root succeeds (a canary TCP/UDP/unix service of the host, a
  host file holding a random secret, a key in the host root's keyring, a writable sysctl...);
- or run by the victim in its own run / by the sibling sandbox against its own service;
- host state a case could change (sysctls, the canary process, host files, symlink targets) is
  checked unchanged afterwards, and restored by a finalizer even though the attack should fail.

The probes (tests/integration/hostile.py) run as one batch per run (each in a forked child);
each is reported as its own test. A skip would hide an attack: nothing here skips.
"""
import ctypes
import errno
import json
import os
import re
import secrets
import shutil
import stat
import subprocess
import sys
import time

import pytest

import hostile
from conftest import free_port, wait_until
from sbxplatform import AGENT_PORT, Platform

# The outside world of an egress run: a network namespace of this test behind a veth, with a
# server (EXT_IP:8080) standing for the public internet, and a canary on the host's own end of
# the veth (HOST_IP:8090). Its own range: test_platform_egress.py uses 10.199.x.
EG_NET = f"10.198.{secrets.randbelow(200) + 20}"
HOST_IP, EXT_IP = f"{EG_NET}.1", f"{EG_NET}.2"
HTTP_PORT_SERVER = r'''
import http.server, socketserver, sys, threading
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = ("port %d" % self.server.server_address[1]).encode()
        self.send_response(200); self.send_header("Content-Length", str(len(body)))
        self.end_headers(); self.wfile.write(body)
    def log_message(self, *a): pass
socketserver.TCPServer.allow_reuse_address = True
s = socketserver.TCPServer((sys.argv[1], int(sys.argv[2])), H)
s.serve_forever()
'''

PY = sys.executable
RUNNER_IN_RUN = "/tmp/sbx-hostile-runner.py"
CTX_IN_RUN = "/tmp/sbx-hostile-ctx.json"
VICTIM_HTTP_PORT = 8080
SYMLINK_NAMES = ["tmp", ".sbx", ".sbx-bin", "etc", "run", "dev", "proc", "sys", "usr",
                 "tmp-to-other-tenant"]


def rand(prefix="sbx-hostile-"):
    return prefix + secrets.token_hex(6)


class Env:
    """What the checks need to know about the host side."""

    def __init__(self):
        self.secret = secrets.token_hex(16)
        self.key_desc = rand("sbx-hostile-key-")
        self.sysctls = {}
        self.canary_log = None
        self.canary = None
        self.victim_secret = secrets.token_hex(12)
        self.sibling_secret = secrets.token_hex(12)
        self.host_netns = os.readlink("/proc/self/ns/net")
        self.sibling_netns = None
        self.sibling_errors = None
        self.poolhost_secret = secrets.token_hex(12)

    def canary_saw(self, tag):
        with open(self.canary_log) as f:
            return any(json.loads(line)[1].startswith(tag) for line in f if line.strip())

    def canary_alive(self):
        assert self.canary.poll() is None, "the host's canary process was killed"

    def host_file_line(self, path):
        with open(path) as f:
            return f.read()


# ---- module fixtures -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def E():
    return Env()


def ip(*args, check=True):
    return subprocess.run(["ip", *args], check=check, capture_output=True, text=True, timeout=30)


@pytest.fixture(scope="module")
def outside():
    ns = rand("sbxt-hb-")[:15]
    hv, nv = f"sbxhb{secrets.token_hex(2)}", f"sbxnb{secrets.token_hex(2)}"
    ip("netns", "add", ns)
    procs = []
    try:
        ip("link", "add", hv, "type", "veth", "peer", "name", nv, "netns", ns)
        ip("addr", "add", f"{HOST_IP}/30", "dev", hv)
        ip("link", "set", hv, "up")
        ip("-n", ns, "addr", "add", f"{EXT_IP}/30", "dev", nv)
        ip("-n", ns, "link", "set", nv, "up")
        ip("-n", ns, "link", "set", "lo", "up")
        procs.append(subprocess.Popen(["ip", "netns", "exec", ns, PY, "-c", HTTP_PORT_SERVER,
                                       EXT_IP, "8080"]))
        procs.append(subprocess.Popen([PY, "-c", HTTP_PORT_SERVER, HOST_IP, "8090"]))
        for addr, port in ((EXT_IP, 8080), (HOST_IP, 8090)):
            assert wait_until(lambda a=addr, p=port: f"port {p}" in host_get(a, p), 10), \
                f"control: the host reaches {addr}:{port}"
        yield ns
    finally:
        for p in procs:
            p.kill()
            p.wait()
        ip("link", "del", hv, check=False)
        ip("netns", "del", ns, check=False)


def host_get(addr, port):
    import socket
    try:
        with socket.create_connection((addr, port), timeout=2) as s:
            s.sendall(b"GET / HTTP/1.0\r\n\r\n")
            return s.recv(300).decode(errors="replace")
    except OSError as e:
        return repr(e)


# Images whose own root holds a hostile link (a tenant may name any image a node offers).
IMAGE_LINKS = ["tmp", ".sbx", "run", "etc", "dev", "proc", "sys", "root"]


def image_name(link):
    return "hostile-" + link.strip(".")


@pytest.fixture(scope="module")
def image_targets():
    from test_platform_images import make_layer, write_layout
    base = f"/tmp/{rand()}"
    os.mkdir(base, 0o755)
    images = os.path.join(base, "images")
    os.mkdir(images, 0o700)
    targets = {}
    for link in IMAGE_LINKS:
        t = os.path.join(base, "target-" + link.strip("."))
        os.mkdir(t, 0o755)
        with open(os.path.join(t, "keep"), "w") as f:
            f.write("keep\n")
        targets[link] = t
        write_layout(images, image_name(link), [make_layer([("./", None),
                                                           (link, ("symlink", t))])])
    yield images, targets
    shutil.rmtree(base, ignore_errors=True)


# The platform's own default image (scripts/build-image.sh; scripts/test.sh builds it first).
IMAGES = os.environ.get("SBX_IMAGES", "/var/lib/sbx/images")


@pytest.fixture(scope="module")
def plat(image_targets):
    """rb-n1 and rb-n2 offer the default image (debian, the platform's own default here too);
    rb-img offers only the hostile images."""
    assert os.path.exists(os.path.join(IMAGES, "debian", "index.json")), \
        f"no default image in {IMAGES}: run scripts/build-image.sh"
    p = Platform(nodes=("rb-n1", "rb-n2", "rb-img"),
                 images={"rb-n1": IMAGES, "rb-n2": IMAGES, "rb-img": image_targets[0]},
                 default_image="debian")
    yield p
    p.stop()


def _keyctl():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return libc


@pytest.fixture(scope="module")
def host(E):
    """Canary services, secret files and a keyring key of the host; sysctls saved (and restored
    at the end whatever happened)."""
    work = f"/tmp/{rand()}"
    os.mkdir(work, 0o755)
    for name in hostile.SYSCTLS + ["vm/drop_caches"]:
        try:
            with open("/proc/sys/" + name) as f:
                E.sysctls[name] = f.read()
        except OSError:
            pass
    files = {"etc_public": f"/etc/{rand()}", "etc_private": f"/etc/{rand()}",
             "opt": f"/opt/{rand()}", "tmp": os.path.join(work, "secret")}
    for key, path in files.items():
        with open(path, "w") as f:
            f.write(f"HOST-{E.secret}\n")
        os.chmod(path, 0o600 if key == "etc_private" else 0o644)
    E.files = files
    E.work = work
    E.canary_log = os.path.join(work, "canary.log")
    open(E.canary_log, "w").close()
    E.canary_abs = rand("sbx-hostile-abs-")
    E.canary_path = os.path.join(work, "canary.sock")
    E.canary = subprocess.Popen([PY, "-c", hostile.CANARY, E.canary_log, E.secret, E.canary_abs,
                                 E.canary_path], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    E.canary_ports = json.loads(E.canary.stdout.readline())
    libc = _keyctl()
    payload = E.secret.encode()
    E.key_id = libc.syscall(248, b"user", E.key_desc.encode(), payload, len(payload),
                            ctypes.c_long(-4))  # KEY_SPEC_USER_KEYRING of the host's root
    assert E.key_id > 0, ctypes.get_errno()
    # A handle to the host's secret file (name_to_handle_at), for the "shocker" probe.
    fh = ctypes.create_string_buffer(8 + 128)
    ctypes.memmove(fh, (128).to_bytes(4, "little"), 4)
    mnt = ctypes.c_int()
    assert libc.syscall(303, ctypes.c_long(-100), files["tmp"].encode(), fh,
                        ctypes.byref(mnt), 0) == 0
    nbytes = int.from_bytes(fh.raw[:4], "little")
    E.handle = fh.raw[:8 + nbytes].hex()
    yield E
    E.canary.stdin.close()
    E.canary.kill()
    E.canary.wait()
    libc.syscall(250, 21, ctypes.c_long(E.key_id))  # KEYCTL_INVALIDATE
    for name, value in E.sysctls.items():  # restore what an attack may have changed
        if name == "vm/drop_caches":
            continue
        try:
            with open("/proc/sys/" + name) as f:
                if f.read() == value:
                    continue
            with open("/proc/sys/" + name, "w") as f:
                f.write(value)
        except OSError:
            pass
    for path in files.values():
        try:
            os.unlink(path)
        except OSError:
            pass
    shutil.rmtree(work, ignore_errors=True)


@pytest.fixture(scope="module")
def tenants(plat):
    return {ns: plat.token(f"tenant-{ns}", ns, "write") for ns in ("rba", "rbv")}


def rx(job, cmd, secs=20):
    """exec through the edge with a timeout enforced by the agent (nothing here can hang)."""
    from conftest import ExecResult
    from sbxplatform import parse_ndjson
    r = job.proxy("POST", AGENT_PORT, "/v1/exec", {"cmd": cmd, "timeout": secs},
                  timeout=secs + 30)
    assert r.status == 200 and "ndjson" in r.headers.get("content-type", ""), r
    return ExecResult(parse_ndjson(r.body))


def rsh(job, cmd, secs=20):
    res = rx(job, cmd, secs)
    assert res.code == 0, res
    return res.out


def run_pid(job):
    rec = job.node().run_record(job.id)
    assert rec and rec.get("pid"), rec
    return rec["pid"]


def in_run(job, path):
    """Host path of `path` inside the job's current run (through its pid 1's root)."""
    return f"/proc/{run_pid(job)}/root/{path.lstrip('/')}"


def put(job, path, data, rest_prefix="/v1"):
    r = job.proxy("PUT", AGENT_PORT, f"{rest_prefix}/files/write?path=" + path, data)
    assert r.status == 200, r


@pytest.fixture(scope="module")
def victim(plat, tenants, E, host):
    """Another tenant's run on the same node: a secret file, TCP/UDP/abstract services and an
    exposed HTTP port serving its own content."""
    j = plat.create_on("rb-n1", "rbv", token=tenants["rbv"], flavor="cpu-small",
                       expose=[{"port": AGENT_PORT, "protocol": "http"},
                               {"port": VICTIM_HTTP_PORT, "protocol": "http"}])
    E.victim_ports = {"tcp": free_port(), "udp": free_port(), "abs": rand("sbx-victim-abs-")}
    rsh(j, f"mkdir -p /srv/web && echo VICTIM-{E.victim_secret} > /srv/secret && "
         f"echo VICTIM-WEB-{E.victim_secret} > /srv/web/index.html")
    put(j, "/srv/services.py", hostile.TENANT_SERVICES.encode())
    v = E.victim_ports
    j.start_process(["python3", "/srv/services.py", str(v["tcp"]), str(v["udp"]), v["abs"],
                     E.victim_secret, "/srv/ready"])
    j.start_process(["python3", "-m", "http.server", str(VICTIM_HTTP_PORT), "--directory",
                     "/srv/web"])
    assert wait_until(lambda: rx(j, "test -e /srv/ready").code == 0, 15, 0.2)
    assert wait_until(lambda: j.proxy("GET", VICTIM_HTTP_PORT, "/").status == 200, 15, 0.2)
    yield j
    j.cancel()


@pytest.fixture(scope="module")
def attacker(plat, tenants):
    """The attacker's run, in the platform's default image (no image named)."""
    j = plat.create_on("rb-n1", "rba", token=tenants["rba"], flavor="cpu-basic")
    assert j.inspect()["image"] == "debian"
    yield j
    j.cancel()


@pytest.fixture(scope="module")
def attacker_host_image(plat, tenants):
    """The same attacks from a run in the `host` image (only an admin may name it; the code in
    the run is no less hostile for that)."""
    j = plat.create_on("rb-n1", "rba", flavor="cpu-basic", image="host")
    yield j
    j.cancel()


def test_tenant_cannot_name_the_host_image(plat, tenants):
    body = {"image": "host", "flavor": "cpu-small", "secrets": {"SBX_TOKEN": "x" * 32}}
    r = plat.request("POST", "/v1/jobs/rba", body, token=tenants["rba"])
    if r.status == 201:
        plat.request("POST", f"/v1/jobs/rba/{r.json()['id']}/cancel", {})
    assert 400 <= r.status < 500, f"ATTACK: a tenant runs in the node's own programs: {r}"
    r = plat.request("POST", "/v1/jobs/rba", body)  # control: an admin may
    assert r.status == 201, r
    plat.request("POST", f"/v1/jobs/rba/{r.json()['id']}/cancel", {})


def base_ctx(plat, E, victim, who):
    n1, n2 = plat.node("rb-n1"), plat.node("rb-n2")
    with open(os.path.join(n1.state, "node.token")) as f:
        E.node_token = f.read().strip()
    E.admin = plat.admin
    return {
        "who": who, "canary": E.canary_ports, "canary_abs": E.canary_abs,
        "canary_path": E.canary_path, "canary_pid": E.canary.pid,
        "control_port": plat.control.port, "control_pid": plat.control.proc.proc.pid,
        "node_ports": [n1.port, n2.port], "node_pid": n1.proc.proc.pid,
        "node_token": os.path.join(n1.state, "node.token"),
        "store": os.path.join(plat.ctl_state, "store.db"), "admin_token_file": plat.token_file,
        "host_files": E.files, "handle": E.handle, "key_desc": E.key_desc,
        "host_ip": host_ip(), "free_port": free_port(), "disk": host_disk(),
        "victim": E.victim_ports,
        "victim_paths": [victim.node().root_path(victim.id, "/srv/secret"),
                         f"/proc/{run_pid(victim)}/root/srv/secret"],
        "sibling": getattr(E, "sibling_ports", None),
        "poolhost": getattr(E, "poolhost_ports", None),
        "egress": getattr(E, "egress", None),
    }


def host_ip():
    out = subprocess.run(["ip", "-4", "-o", "addr", "show", "scope", "global"],
                         capture_output=True, text=True).stdout
    m = re.search(r"inet (\d+\.\d+\.\d+\.\d+)/", out)
    assert m, "the host has no global IPv4 address: no control for the external-address case"
    return m.group(1)


def host_disk():
    for name in sorted(os.listdir("/sys/block")):
        if not name.startswith(("loop", "ram")) and os.path.exists(f"/dev/{name}"):
            return f"/dev/{name}"
    raise AssertionError("no block device on the host: no control for the disk case")


def probes_for(cases, host_side=False):
    return {c.id: (c.host_src or c.src) if host_side else c.src for c in cases}


def run_batch_in_job(job, ctx, prefix="/v1", exec_path="/v1/exec", headers=None,
                     runner=RUNNER_IN_RUN, ctx_path=CTX_IN_RUN):
    """Put the runner and its context into the run (or sandbox) and run the batch there."""
    h = {} if headers is None else headers
    for path, data in ((runner, hostile.RUNNER.encode()), (ctx_path, json.dumps(ctx).encode())):
        r = job.proxy("PUT", AGENT_PORT, f"{prefix}/files/write?path=" + path, data, headers=h)
        assert r.status == 200, r
    r = job.proxy("POST", AGENT_PORT, exec_path,
                  {"cmd": ["python3", runner, ctx_path], "timeout": 150},
                  headers=h, timeout=180)
    assert r.status == 200, r
    from sbxplatform import parse_ndjson
    from conftest import ExecResult
    res = ExecResult(parse_ndjson(r.body))
    assert res.code == 0, res
    return json.loads(res.out.strip().splitlines()[-1])


def run_batch_on_host(ctx, work):
    path = os.path.join(work, f"ctx-{ctx['who']}.json")
    runner = os.path.join(work, "runner.py")
    with open(runner, "w") as f:
        f.write(hostile.RUNNER)
    with open(path, "w") as f:
        json.dump(ctx, f)
    out = subprocess.run([PY, runner, path, "--host"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


DED = [c for c in hostile.CASES if "ded" in c.where]
HOST_CONTROLLED = [c for c in hostile.CASES if c.control == "host"]
POOL = [c for c in hostile.CASES if "pool" in c.where]


@pytest.fixture(scope="module")
def ded_results(plat, E, host, victim, attacker):
    ctx = base_ctx(plat, E, victim, "ded")
    ctx["probes"] = probes_for(DED)
    return run_batch_in_job(attacker, ctx)


@pytest.fixture(scope="module")
def dedhost_results(plat, E, host, victim, attacker_host_image):
    ctx = base_ctx(plat, E, victim, "dedhost")
    ctx["probes"] = probes_for(DED)
    return run_batch_in_job(attacker_host_image, ctx)


@pytest.fixture(scope="module")
def host_results(plat, E, host, victim, outside):
    cases = HOST_CONTROLLED
    E.egress = {"host_ip": HOST_IP, "ext_ip": EXT_IP}
    ctx = base_ctx(plat, E, victim, "host")
    ctx["probes"] = probes_for(cases, host_side=True)
    return run_batch_on_host(ctx, E.work)


@pytest.fixture(scope="module")
def victim_results(plat, E, host, victim):
    ctx = base_ctx(plat, E, victim, "victim")
    ctx["probes"] = probes_for([c for c in hostile.CASES if c.control == "victim"])
    return run_batch_in_job(victim, ctx)


# ---- pool host: a platform job kind; two sandboxes A (attacker) and B (sibling) --------------

class Pooled:
    """A sandbox of a pool host job, reached through the edge with its own token."""

    def __init__(self, job, j):
        self.job = job
        self.id = j["id"]
        self.token = j["token"]
        self.home = j["home"]
        self.uid = j.get("uid")
        self.h = {"X-Sandbox-Token": self.token}

    def proxy(self, method, rest, body=None, timeout=60):
        return self.job.proxy(method, AGENT_PORT, f"/v1/sandboxes/{self.id}{rest}", body,
                              headers=self.h, timeout=timeout)

    def exec(self, cmd, http_timeout=200, **body):
        from conftest import ExecResult
        from sbxplatform import parse_ndjson
        b = {"cmd": cmd, "timeout": 20}
        b.update(body)
        r = self.proxy("POST", "/exec", b, timeout=http_timeout)
        assert r.status == 200 and "ndjson" in r.headers.get("content-type", ""), r
        return ExecResult(parse_ndjson(r.body))

    def start(self, cmd, **body):
        b = {"cmd": cmd}
        b.update(body)
        r = self.proxy("POST", "/processes", b)
        assert r.status == 200, r
        return r.json()

    def write(self, rel, data):
        r = self.proxy("PUT", "/files/write?path=" + rel, data)
        assert r.status == 200, r

    def batch(self, ctx):
        self.write("hostile-runner.py", hostile.RUNNER.encode())
        self.write("hostile-ctx.json", json.dumps(ctx).encode())
        res = self.exec(["python3", "hostile-runner.py", "hostile-ctx.json"], timeout=150)
        assert res.code == 0, res
        return json.loads(res.out.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def pool(plat, tenants):
    j = plat.create_on("rb-n1", "rba", token=tenants["rba"], flavor="cpu-basic", mode="pool",
                       labels={"sbx-sandbox": "1", "sbx-sandbox-mode": "pool",
                               "sbx-sandbox-pool": "hostile"})
    r = j.proxy("POST", AGENT_PORT, "/v1/sandboxes", {"count": 2})
    assert r.status == 200, r
    a, b = (Pooled(j, x) for x in r.json()["sandboxes"])
    j.sandboxes = (a, b)
    yield j
    j.cancel()


@pytest.fixture(scope="module")
def sibling(pool, E):
    """Sandbox B runs TCP (v4, v6), UDP echo, abstract and autobound services."""
    _, b = pool.sandboxes
    E.sibling_ports = {"tcp": free_port(), "udp": free_port(), "abs": rand("sbx-sib-abs-")}
    s = E.sibling_ports
    b.write("services.py", hostile.TENANT_SERVICES.encode())
    b.start(["python3", "services.py", str(s["tcp"]), str(s["udp"]), s["abs"], E.sibling_secret,
             "ready"])
    wait_until(lambda: b.exec("cat ready").code == 0, 15, 0.2)
    res = b.exec("cat ready")
    # Services the sandbox may not run show up as failed positive controls of their cases.
    first = res.out.split("\n")[0].strip()
    s["auto"] = int(first) if first.isdigit() else 0
    E.sibling_errors = res.out.split("\n", 1)[1:] or [res.err]
    return b


def setns_net(path):
    def enter():
        fd = os.open(path, os.O_RDONLY)
        if ctypes.CDLL(None, use_errno=True).setns(fd, 0x40000000) != 0:
            raise OSError(ctypes.get_errno(), "setns " + path)
        os.close(fd)
    return enter


@pytest.fixture(scope="module")
def poolhost_services(pool, E):
    """Services in the pool host run's own network namespace (root of the host started them
    there): what a sandbox must not reach."""
    E.poolhost_ports = {"tcp": free_port(), "udp": free_port(), "abs": rand("sbx-ph-abs-")}
    s = E.poolhost_ports
    ready = os.path.join(E.work, "poolhost-ready")
    p = subprocess.Popen([PY, "-c", hostile.TENANT_SERVICES, str(s["tcp"]), str(s["udp"]),
                          s["abs"], E.poolhost_secret, ready],
                         preexec_fn=setns_net(f"/proc/{run_pid(pool)}/ns/net"))
    assert wait_until(lambda: os.path.exists(ready), 10), "the pool host's services started"
    yield s
    p.kill()
    p.wait()


@pytest.fixture(scope="module")
def poolhost_results(plat, E, host, victim, pool, poolhost_services):
    ctx = base_ctx(plat, E, victim, "poolhost")
    ctx["netns"] = f"/proc/{run_pid(pool)}/ns/net"
    ctx["probes"] = probes_for([c for c in hostile.CASES if c.control == "poolhost"])
    return run_batch_on_host(ctx, E.work)


@pytest.fixture(scope="module")
def pool_results(plat, E, host, victim, pool, sibling, poolhost_services):
    a, _ = pool.sandboxes
    ctx = base_ctx(plat, E, victim, "pool")
    ctx["probes"] = probes_for(POOL)
    return a.batch(ctx)


@pytest.fixture(scope="module")
def sibling_results(plat, E, host, victim, pool, sibling):
    """The same probes, run by root on the host inside the sibling's network namespace (that of
    its services process): they reach what B serves."""
    pids = wait_until(lambda: host_pids_with(E.sibling_secret), 5)
    assert pids, "control: the host sees the sibling's services process"
    ctx = base_ctx(plat, E, victim, "sibling")
    ctx["netns"] = f"/proc/{pids[0]}/ns/net"
    ctx["probes"] = probes_for([c for c in hostile.CASES if c.control == "sibling"])
    res = run_batch_on_host(ctx, E.work)
    own = res.get("pool-sandbox-own-netns", {}).get("r")
    E.sibling_netns = own[0] if own else None
    return res


def check(case, who, results, control, E):
    r = results.get(case.id)
    assert r is not None and "r" in r, f"the probe did not run: {r}"
    c = control.get(case.id)
    assert c is not None and "r" in c, f"the positive control did not run: {c}"
    why = f" (the sibling's services: {E.sibling_errors})" if case.control == "sibling" else ""
    assert case.works(c["r"], E), \
        f"positive control failed ({case.control}): {c['r']!r}{why}"
    assert case.refused(r["r"], E), \
        f"ATTACK SUCCEEDED from the {who} run: {r['r']!r} (control: {c['r']!r})"
    if case.after:
        case.after(E, who)


EGRESS = [c for c in hostile.CASES if c.id in hostile.EGRESS_REUSED or "egress" in c.where]


@pytest.fixture(scope="module")
def egress_attacker(plat, tenants, outside, E):
    """A run with network "egress" whose allow-list asks for everything."""
    E.egress = {"host_ip": HOST_IP, "ext_ip": EXT_IP}
    j = plat.create_on("rb-n1", "rba", token=tenants["rba"], flavor="cpu-basic",
                       network="egress", egress_allow=["0.0.0.0/0", "::/0"])
    ctl = "python3 -c 'import urllib.request as u; print(u.urlopen(\"http://%s:8080/\", " \
          "timeout=3).read().decode())'" % EXT_IP
    wait_until(lambda: "port 8080" in rx(j, ctl).out, 15, 0.3)
    yield j
    j.cancel()


@pytest.fixture(scope="module")
def egress_results(plat, E, host, victim, egress_attacker):
    ctx = base_ctx(plat, E, victim, "egress")
    ctx["probes"] = probes_for(EGRESS)
    ctx["probes"]["egress-control"] = hostile.EGRESS_CONTROL
    return run_batch_in_job(egress_attacker, ctx)


def test_egress_run_reaches_what_its_list_allows(egress_results):
    """The control of every egress case: the run's way out works (the outside server)."""
    r = egress_results["egress-control"]
    assert "port 8080" in str(r.get("r")), f"the egress run cannot reach the outside: {r}"


@pytest.mark.parametrize("case", EGRESS, ids=str)
def test_egress(case, request, E, egress_results):
    control = request.getfixturevalue(f"{case.control}_results")
    check(case, "egress", egress_results, control, E)


@pytest.mark.parametrize("case", DED, ids=str)
def test_dedicated(case, request, E, ded_results):
    control = request.getfixturevalue(f"{case.control}_results")
    check(case, "ded", ded_results, control, E)


@pytest.mark.parametrize("case", DED, ids=str)
def test_dedicated_host_image(case, request, E, dedhost_results):
    control = request.getfixturevalue(f"{case.control}_results")
    check(case, "dedhost", dedhost_results, control, E)


@pytest.mark.parametrize("case", POOL, ids=str)
def test_pooled(case, request, E, pool_results):
    control = request.getfixturevalue(f"{case.control}_results")
    check(case, "pool", pool_results, control, E)


# ---- dedicated runs: cases that need the host's view between steps ---------------------------

def uid_base(job):
    """(inside base, host base, count) of the run's uid map as read inside the run."""
    line = rsh(job, "cat /proc/self/uid_map").split("\n")[0].split()
    return int(line[0]), int(line[1]), int(line[2])


def host_uids(pid):
    with open(f"/proc/{pid}/status") as f:
        m = re.search(r"^Uid:\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)", f.read(), re.M)
    return [int(x) for x in m.groups()]


def test_uid_map_root_in_run_is_an_unprivileged_block(attacker):
    inside, base, count = uid_base(attacker)
    assert rsh(attacker, "id -u").strip() == "0"  # control: root inside the run
    with open("/proc/self/uid_map") as f:  # control: the host's own map is the identity
        assert f.read().split()[:2] == ["0", "0"]
    assert (inside, count) == (0, 65536) and base != 0, \
        f"ATTACK: root in the run is uid {base} on the host (map {inside} {base} {count})"


def test_run_pid1_is_unprivileged_on_host(attacker):
    _, base, _ = uid_base(attacker)
    uids = host_uids(run_pid(attacker))
    assert rsh(attacker, "cat /proc/1/status | grep ^Uid").split()[1] == "0"  # control
    assert uids[0] != 0 and all(u == uids[0] for u in uids), f"ATTACK: pid 1 is host uid {uids}"


def test_file_made_by_run_root_is_owned_by_block(attacker):
    name = rand("/tmp/owned-")
    assert rsh(attacker, f"touch {name} && stat -c %u {name}").strip() == "0"  # control
    st = os.stat(in_run(attacker, name))
    assert st.st_uid != 0, "ATTACK: a file root in the run made is owned by host root"
    _, base, count = uid_base(attacker)
    assert base <= st.st_uid < base + count


def test_setuid_file_made_in_run_is_not_host_root(attacker):
    name = rand("/tmp/suid-")
    out = rsh(attacker, f"cp /usr/bin/id {name} && chmod 4755 {name} && stat -c %a:%u {name}")
    assert out.strip() == "4755:0"  # control: setuid root, as the run sees it
    st = os.stat(in_run(attacker, name))
    assert st.st_mode & stat.S_ISUID, "the setuid bit is there on the host"
    assert st.st_uid != 0, "ATTACK: a setuid-root binary of the host was made from a run"
    # and inside, an unprivileged user running it stays unprivileged (nosuid, NO_NEW_PRIVS)
    res = rx(attacker, f"setpriv --reuid=65534 --regid=65534 --clear-groups {name} -u")
    assert res.out.strip() == "65534", f"ATTACK: a setuid binary raised a user in the run: {res}"


INOTIFY_HOLD = r"""
import ctypes, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
def take():
    n = 0
    while n < 100000 and libc.inotify_init1(0) >= 0:
        n += 1
    return n, ctypes.get_errno()
kids = []
for uid in (1, 2, 3):  # the run's other uids: each counted against the namespace's owner too
    pid = os.fork()
    if pid == 0:
        os.setresuid(uid, uid, uid)
        n, e = take()
        open("/tmp/inotify-%d" % uid, "w").write("%d %d" % (n, e))
        time.sleep(25)
        os._exit(0)
    kids.append(pid)
n, e = take()
open("/tmp/inotify-0", "w").write("%d %d" % (n, e))
time.sleep(25)
"""


def test_a_run_cannot_take_the_hosts_root_per_user_kernel_counters(attacker):
    """Every uid of a run is also counted, one level up, against the owner of the run's user
    namespace: with host root as every run's owner, one run took all of root's inotify
    instances (and POSIX queue bytes, queued signals) and left none to the host's root nor to
    other runs. The owner is the run's own block now. The run takes all it may (positive
    control: it stops at EMFILE); meanwhile host root still makes inotify instances."""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    with open(in_run(attacker, "/tmp/inotify-hold.py"), "w") as f:
        f.write(INOTIFY_HOLD)
    rsh(attacker, "(python3 /tmp/inotify-hold.py >/dev/null 2>&1 &); sleep 0.2")
    try:
        assert wait_until(lambda: all(os.path.exists(in_run(attacker, f"/tmp/inotify-{u}"))
                                      for u in range(4)), 20)
        held = [open(in_run(attacker, f"/tmp/inotify-{u}")).read().split() for u in range(4)]
        assert all(e == str(errno.EMFILE) for _, e in held), held  # it took all it could
        fds = []
        try:
            for _ in range(10):
                fd = libc.inotify_init1(0)
                assert fd >= 0, ("ATTACK: a run took host root's inotify instances", held,
                                 os.strerror(ctypes.get_errno()))
                fds.append(fd)
        finally:
            for fd in fds:
                os.close(fd)
    finally:
        rx(attacker, "pkill -f inotify-hold.py; rm -f /tmp/inotify-*")


def test_runs_get_disjoint_id_blocks(attacker, victim):
    _, a, n = uid_base(attacker)
    _, v, _ = uid_base(victim)
    assert a != 0 and v != 0, "ATTACK: a run is host root"
    assert abs(a - v) >= n, f"two tenants' runs share ids: {a} and {v}"


def test_core_pattern_runs_tenant_script_as_host_root(E, host, attacker):
    """The full attack: point core_pattern at a script in the run (through /proc/%P/root) and
    crash a process. Refused, core_pattern unchanged, no marker; control: the script, run by the
    host, does leave the marker."""
    marker = os.path.join(E.work, rand("core-marker-"))
    script = f"#!/bin/sh\ntouch {marker}\n"
    put(attacker, "/tmp/sbx-evil.sh", script.encode())
    r = rx(attacker, "chmod 755 /tmp/sbx-evil.sh; python3 -c '\n"
                      "import os, resource, time\n"
                      "old = open(\"/proc/sys/kernel/core_pattern\").read()\n"
                      "try:\n"
                      "    open(\"/proc/sys/kernel/core_pattern\", \"w\").write("
                      "\"|/proc/%P/root/tmp/sbx-evil.sh\")\n"
                      "    print(\"WROTE\")\n"
                      "except OSError as e:\n"
                      "    print(\"refused\", e.errno)\n"
                      "    raise SystemExit(0)\n"
                      "pid = os.fork()\n"
                      "if pid == 0:\n"
                      "    resource.setrlimit(resource.RLIMIT_CORE, (1 << 30, 1 << 30))\n"
                      "    os.abort()\n"
                      "os.waitpid(pid, 0)\n"
                      "time.sleep(1)\n"
                      "open(\"/proc/sys/kernel/core_pattern\", \"w\").write(old)\n'")
    seen = os.path.exists(marker)
    with open("/proc/sys/kernel/core_pattern") as f:
        now = f.read()
    # control: the script works when the host runs it
    subprocess.run(["sh", in_run(attacker, "/tmp/sbx-evil.sh")], check=True, timeout=10)
    assert os.path.exists(marker)
    os.unlink(marker)
    assert now == E.sysctls["kernel/core_pattern"], "ATTACK: core_pattern changed"
    assert "WROTE" not in r.out and not seen, f"ATTACK: core_pattern written ({r})"


@pytest.fixture(scope="module")
def log_probe(attacker):
    node = attacker.node()
    path = os.path.join(node.run_dir(attacker.id), "log")
    assert os.path.isfile(path), "control: the node keeps the run's log as a file"
    size0 = os.path.getsize(path)
    mark = rand("OVERWRITE-")
    res = rx(attacker, "python3 -c '\n"
                        "import json, os, stat, sys\n"
                        "out = {}\n"
                        "for n in (1, 2):\n"
                        "    p = \"/proc/1/fd/%d\" % n\n"
                        "    try:\n"
                        "        fd = os.open(p, os.O_WRONLY)\n"
                        "    except OSError as e:\n"
                        "        out[n] = {\"open\": e.errno}\n"
                        "        continue\n"
                        "    r = {\"reg\": stat.S_ISREG(os.fstat(fd).st_mode)}\n"
                        "    try:\n"
                        "        os.pwrite(fd, sys.argv[1].encode(), 0) if n == 1 else "
                        "os.ftruncate(fd, 0)\n"
                        "        r[\"op\"] = \"ok\"\n"
                        "    except OSError as e:\n"
                        "        r[\"op\"] = e.errno\n"
                        "    out[n] = r\n"
                        "print(json.dumps(out))\n' " + mark)
    assert res.code == 0, res
    return {"path": path, "size0": size0, "mark": mark,
            "r": json.loads(res.out.strip().splitlines()[-1])}


def test_log_overwrite_from_run(log_probe):
    with open(log_probe["path"], "rb") as f:
        head = f.read(4096)
    r = log_probe["r"]["1"]
    assert log_probe["mark"].encode() not in head, f"ATTACK: the run overwrote its log ({r})"
    assert not r.get("reg") and r.get("op") != "ok", f"ATTACK: the log file is reachable: {r}"


def test_log_truncate_from_run(log_probe):
    r = log_probe["r"]["2"]
    size = os.path.getsize(log_probe["path"])
    assert size >= log_probe["size0"], \
        f"ATTACK: the run truncated its log on the node ({log_probe['size0']} -> {size} bytes)"
    assert not r.get("reg") and r.get("op") != "ok", f"ATTACK: the log file is reachable: {r}"


LISTENER = r'''
import socket, sys, threading
def serve(fam, addr, port):
    s = socket.socket(fam)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if fam == socket.AF_INET6:
        s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
    try:
        s.bind((addr, port))
    except OSError as e:
        print("bind", addr, port, e, flush=True)
        return
    s.listen(16)
    while True:
        c, _ = s.accept()
        c.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: 6\r\n\r\nPWNED\n")
        c.close()
for fam, addr, port in ((socket.AF_INET, "0.0.0.0", int(sys.argv[1])),
                        (socket.AF_INET6, "::", int(sys.argv[1])),
                        (socket.AF_INET, "0.0.0.0", 1023),
                        (socket.AF_INET, "0.0.0.0", int(sys.argv[2]))):
    threading.Thread(target=serve, args=(fam, addr, port), daemon=True).start()
threading.Event().wait()
'''


@pytest.fixture(scope="module")
def attacker_listens(attacker, victim):
    port = free_port()
    put(attacker, "/tmp/listen.py", LISTENER.encode())
    attacker.start_process(["python3", "/tmp/listen.py", str(port), str(VICTIM_HTTP_PORT)])
    time.sleep(0.5)
    return port


def host_tcp(host, port):
    import socket
    fam = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(fam) as s:
        s.settimeout(2)
        try:
            s.connect((host, port))
            return s.recv(100).decode(errors="replace")
        except OSError as e:
            return repr(e)


@pytest.mark.parametrize("addr,which", [("127.0.0.1", "high"), ("::1", "high"),
                                        ("127.0.0.1", "1023")], ids=["v4", "v6", "port-1023"])
def test_bind_host_port(attacker, attacker_listens, addr, which):
    port = attacker_listens if which == "high" else 1023
    inside = rx(attacker, f"python3 -c 'import socket; s=socket.socket("
                           f"socket.AF_INET6 if \":\" in \"{addr}\" else socket.AF_INET); "
                           f"s.settimeout(3); s.connect((\"{addr}\", {port})); print(s.recv(100))'")
    assert "PWNED" in inside.out, f"control: the run's own listener answers inside: {inside}"
    got = host_tcp(addr, port)
    assert "PWNED" not in got, f"ATTACK: the run listens on the host's {addr}:{port}"


def test_take_other_tenant_exposed_port(attacker, attacker_listens, victim):
    inside = rx(attacker, "python3 -c 'import socket; s=socket.socket(); s.settimeout(3); "
                f"s.connect((\"127.0.0.1\", {VICTIM_HTTP_PORT})); "
                "s.sendall(b\"GET / HTTP/1.0\\r\\n\\r\\n\"); print(s.recv(300))'")
    assert "VICTIM-WEB" not in inside.out, \
        f"ATTACK: the attacker's 127.0.0.1:{VICTIM_HTTP_PORT} is the other tenant's: {inside}"
    assert "PWNED" in inside.out, f"control: the attacker's own port {VICTIM_HTTP_PORT}: {inside}"
    for _ in range(5):  # the victim's clients, through the edge, reach the victim only
        r = victim.proxy("GET", VICTIM_HTTP_PORT, "/")
        assert r.status == 200 and b"VICTIM-WEB" in r.body and b"PWNED" not in r.body, \
            f"ATTACK: the victim's exposed port served {r}"


# ---- the node never follows a tenant's symlink as host root ----------------------------------

PLANT = {  # link in the run's root -> a host directory made for the case
    "tmp": "/tmp", ".sbx": "/.sbx", ".sbx-bin": "/.sbx/bin", "run": "/run", "etc": "/etc",
    "var": "/var", "root": "/root", "tmp-to-other-tenant": "/tmp",
}


def snapshot(top):
    out = []
    for root, dirs, files in os.walk(top):
        for n in [""] + dirs + files if root == top else dirs + files:
            p = os.path.join(root, n) if n else root
            st = os.lstat(p)
            data = None
            if stat.S_ISREG(st.st_mode):
                with open(p, "rb") as f:
                    data = f.read(4096)
            out.append((os.path.relpath(p, top), st.st_mode, st.st_uid, st.st_gid, st.st_size,
                        data))
    return sorted(out, key=lambda x: x[0])


@pytest.fixture(scope="module")
def symlinked(plat, tenants, E, host, victim):
    """Runs whose roots hold hostile links; paused, resumed, then moved; host targets
    snapshotted before and after each step."""
    state = {}
    for name, link in PLANT.items():
        if name == "tmp-to-other-tenant":
            target = f"/proc/{run_pid(victim)}/root/srv"
        else:
            target = os.path.join(E.work, "target-" + name.replace(".", "_"))
            os.mkdir(target, 0o755)
            with open(os.path.join(target, "keep"), "w") as f:
                f.write(E.secret)
        job = plat.create_on("rb-n1", "rba", token=tenants["rba"], flavor="cpu-small")
        old = link + "-old-" + secrets.token_hex(3)
        res = rx(job, f"mv {link} {old} 2>&1 && ln -s {target} {link} && readlink {link}")
        state[name] = {"job": job, "target": target, "planted": res.out.strip() == target,
                       "plant": res, "before": snapshot(target)}
    for s in state.values():
        assert s["job"].action("pause").status == 202
    for s in state.values():
        s["job"].wait_stage("PAUSED")
        s["paused"] = snapshot(s["target"])
    for s in state.values():
        assert s["job"].action("resume").status == 202
    for s in state.values():
        wait_until(lambda j=s["job"]: j.inspect()["stage"] in ("RUNNING", "ERROR") and
                   (j.inspect().get("run") or {}).get("generation", 0) >= 2, 20, 0.1)
        s["resumed_stage"] = s["job"].inspect()["stage"]
        s["resume"] = snapshot(s["target"])
    for s in state.values():
        if s["resumed_stage"] == "RUNNING":
            assert s["job"].action("move", {"node": "rb-n2"}).status == 202
    for s in state.values():
        if s["resumed_stage"] == "RUNNING":
            wait_until(lambda j=s["job"]: j.inspect()["stage"] in ("RUNNING", "ERROR") and
                       (j.inspect().get("run") or {}).get("node") == "rb-n2", 25, 0.1)
        s["moved_stage"] = s["job"].inspect()["stage"]
        s["move"] = snapshot(s["target"])
    yield state
    for s in state.values():
        s["job"].action("cancel")


@pytest.mark.parametrize("stage", ["resume", "move"])
@pytest.mark.parametrize("name", list(PLANT))
def test_symlink_in_root_on_lifecycle(symlinked, name, stage):
    s = symlinked[name]
    assert s["planted"], f"control: the link could not be planted in the run's root: {s['plant']}"
    assert s["before"] and any(x[0] != "." for x in s["before"]), "control: the target exists"
    assert s["paused"] == s["before"], "ATTACK: pausing changed the host target"
    assert s[stage] == s["before"], \
        f"ATTACK: {stage} followed the tenant's {PLANT[name]} link and changed the host: " \
        f"{s['before']} -> {s[stage]} (stages {s['resumed_stage']}/{s['moved_stage']})"


# ---- pool hosts: a job kind, not a tenant's env var -----------------------------------------

@pytest.mark.parametrize("body", [
    {"env": {"SBX_HOST_MODE": "1"}}, {"secrets_": {"SBX_HOST_MODE": "1"}},
    {"mode": "pool", "command": ["/bin/sh", "-c", "id"]}, {"mode": "bogus"},
    {"env": {"SBX_HOST_MODE": "1"}, "command": ["/bin/sh"]},
    {"mode": "pool", "env": {"SBX_POOL_UID_BASE": "0"}},
    {"mode": "pool", "env": {"SBX_MIN_LANDLOCK_ABI": "0"}},
    {"env": {"SBX_PORT": "8080"}}, {"secrets_": {"SBX_TEST_CRASH_AT": "x"}}],
    ids=["env-host-mode", "secret-host-mode", "pool-with-command", "unknown-mode",
         "env-host-mode-with-command", "pool-uid-base", "pool-landlock-abi", "agent-port",
         "test-hook"])
def test_pool_privileges_from_tenant_input(plat, tenants, body):
    b = dict(body)
    sec = {"SBX_TOKEN": secrets.token_hex(16)}
    sec.update(b.pop("secrets_", {}))
    b["secrets"] = sec
    r = plat.request("POST", "/v1/jobs/rba", b, token=tenants["rba"])
    if r.status == 201:
        plat.request("POST", f"/v1/jobs/rba/{r.json()['id']}/cancel", {})
    assert 400 <= r.status < 500, f"ATTACK: the platform took {body}: {r}"
    # control: the same request without the privileged part is taken
    ok = {"secrets": {"SBX_TOKEN": secrets.token_hex(16)}, "flavor": "cpu-small"}
    r = plat.request("POST", "/v1/jobs/rba", ok, token=tenants["rba"])
    assert r.status == 201, r
    plat.request("POST", f"/v1/jobs/rba/{r.json()['id']}/cancel", {})


def host_pids_with(text):
    pids = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/cmdline", "rb") as f:
                    if text.encode() in f.read():
                        pids.append(int(d))
            except OSError:
                pass
    return pids


def cgroups_of(pid):
    with open(f"/proc/{pid}/cgroup") as f:
        return {l.split(":")[1]: l.split(":", 2)[2].strip() for l in f if l.strip()}


def test_pool_sandbox_cgroups_nest_in_the_run(pool):
    a, _ = pool.sandboxes
    tag = "1000." + str(secrets.randbelow(10 ** 6))
    a.start(["sleep", tag])
    pids = wait_until(lambda: host_pids_with("sleep\0" + tag), 5)
    assert pids, "control: the host sees the sandbox's process"
    run = cgroups_of(run_pid(pool))
    sb = cgroups_of(pids[0])
    for ctrl in ("memory", "pids"):
        key = next((k for k in run if ctrl in k.split(",")), None)
        assert key and run[key] not in ("", "/"), f"control: the run has a {ctrl} cgroup: {run}"
        assert sb[key].startswith(run[key].rstrip("/") + "/"), \
            f"ATTACK: the sandbox's {ctrl} cgroup {sb[key]} is outside the run's {run[key]}"


def test_pool_sandbox_cgroup_escape(pool):
    a, _ = pool.sandboxes
    tag = "1000." + str(secrets.randbelow(10 ** 6))
    res = a.exec("python3 -c '\n"
                 "import os, subprocess\n"
                 "p = subprocess.Popen([\"sleep\", \"" + tag + "\"])\n"
                 "out = []\n"
                 "for line in open(\"/proc/self/cgroup\"):\n"
                 "    _, ctrl, path = line.strip().split(\":\", 2)\n"
                 "    for c in (ctrl.split(\",\") + [\"\"]):\n"
                 "        for d in (\"/sys/fs/cgroup/\" + c, \"/sys/fs/cgroup/\" + c + "
                 "os.path.dirname(path)):\n"
                 "            try:\n"
                 "                open(d + \"/cgroup.procs\", \"w\").write(str(p.pid))\n"
                 "                out.append(\"ok \" + d)\n"
                 "            except OSError as e:\n"
                 "                out.append(e.errno)\n"
                 "print(out)\n' &")
    pids = wait_until(lambda: host_pids_with("sleep\0" + tag), 5)
    assert pids, f"control: the sandbox's process runs ({res})"
    run = cgroups_of(run_pid(pool))
    sb = cgroups_of(pids[0])
    for key in run:
        if run[key] not in ("", "/"):
            assert sb[key].startswith(run[key].rstrip("/") + "/"), \
                f"ATTACK: escaped the run's cgroup: {sb[key]} ({res.out})"
    assert "ok" not in res.out, f"ATTACK: the sandbox moved a process between cgroups: {res}"


def test_pool_sandbox_uid_from_the_runs_block(pool):
    a, _ = pool.sandboxes
    res = a.exec("touch owned && id -u")
    assert res.code == 0, res
    st = os.stat(in_run(pool, os.path.join(a.home, "owned")))  # control: the file is there
    base = host_uids(run_pid(pool))[0]
    assert base != 0, "ATTACK: the pool host runs as host root"
    assert base < st.st_uid < base + 65536, \
        f"ATTACK: the sandbox's uid {st.st_uid} is outside the run's block {base}+65536"


def _heartbeat_size(a, name):
    r = a.exec(f"wc -c < {name} 2>/dev/null || echo 0")
    return int(r.out.strip() or 0)


def test_pool_setsid_descendant_survives_timeout(pool):
    a, _ = pool.sandboxes
    hb = rand("hb-")
    a.exec(f"setsid sh -c 'while :; do echo x >> {hb}; sleep 0.1; done' </dev/null "
           f">/dev/null 2>&1 & sleep 30", timeout=1)
    time.sleep(1)
    s1 = _heartbeat_size(a, hb)
    time.sleep(1.5)
    s2 = _heartbeat_size(a, hb)
    assert s1 > 0, "control: the descendant was running"
    assert s1 == s2, f"ATTACK: a setsid() descendant outlived the command's timeout ({s1}->{s2})"


def test_pool_setsid_descendant_survives_kill(pool):
    a, _ = pool.sandboxes
    hb = rand("hb-")
    j = a.start(["sh", "-c", f"setsid sh -c 'while :; do echo x >> {hb}; sleep 0.1; done' "
                 f"</dev/null >/dev/null 2>&1 & sleep 300"])
    assert wait_until(lambda: _heartbeat_size(a, hb) > 0, 5), "control: the descendant runs"
    r = a.proxy("POST", f"/processes/{j['id']}/signal", {"signal": "KILL"})
    assert r.status == 200, r
    time.sleep(1)
    s1 = _heartbeat_size(a, hb)
    time.sleep(1.5)
    s2 = _heartbeat_size(a, hb)
    assert s1 == s2, f"ATTACK: a setsid() descendant outlived a kill ({s1}->{s2})"


def test_pool_hosts_of_two_tenants_share_no_cgroup(plat, tenants):
    """One pool host exiting must not take another tenant's sandbox cgroups with it."""
    jobs, tags, pids = {}, {}, {}
    for ns in ("rba", "rbv"):
        j = plat.create_on("rb-n1", ns, token=tenants[ns], flavor="cpu-small", mode="pool")
        r = j.proxy("POST", AGENT_PORT, "/v1/sandboxes", {"count": 1})
        assert r.status == 200, r
        sb = Pooled(j, r.json()["sandboxes"][0])
        tags[ns] = "1000." + str(secrets.randbelow(10 ** 6))
        sb.start(["sleep", tags[ns]])
        found = wait_until(lambda t=tags[ns]: host_pids_with("sleep\0" + t), 5)
        assert found, f"control: the host sees {ns}'s sandbox process"
        jobs[ns], pids[ns] = (j, sb), found[0]
    cg = {ns: cgroups_of(pid) for ns, pid in pids.items()}
    mem = next(k for k in cg["rba"] if "memory" in k.split(","))
    assert cg["rba"][mem] != cg["rbv"][mem], f"ATTACK: two tenants' sandboxes share {cg}"
    victim_dir = "/sys/fs/cgroup/memory" + cg["rbv"][mem]
    assert os.path.isdir(victim_dir), f"control: the victim's sandbox cgroup {victim_dir}"
    jobs["rba"][0].cancel()
    assert wait_until(lambda: not os.path.exists(f"/proc/{pids['rba']}"), 10), \
        "control: the canceled pool host's sandbox is gone"
    try:
        assert os.path.exists(f"/proc/{pids['rbv']}"), \
            "ATTACK: another pool host's exit killed this tenant's sandbox"
        assert os.path.isdir(victim_dir), \
            "ATTACK: another pool host's exit removed this tenant's sandbox cgroup"
        res = jobs["rbv"][1].exec("echo alive")
        assert res.out == "alive\n", res
    finally:
        jobs["rbv"][0].cancel()


RELEASE_AGENT = r'''
import ctypes, os, subprocess, sys, time
libc = ctypes.CDLL(None, use_errno=True)
agent = sys.argv[1]
d = "/tmp/sbx-cg-%d" % os.getpid()
os.makedirs(d, exist_ok=True)
tried = []
for opts in ("none,name=sbxhostile", "rdma", "memory", "pids"):
    if libc.mount(b"cgroup", d.encode(), b"cgroup", 0, opts.encode()) == 0:
        break
    tried.append("%s:%d" % (opts, ctypes.get_errno()))
else:
    print("REFUSED", tried)
    sys.exit(0)
print("MOUNTED", opts)
os.mkdir(d + "/x")
open(d + "/x/notify_on_release", "w").write("1")
open(d + "/release_agent", "w").write(agent)
subprocess.run(["sh", "-c", "echo $$ > %s/x/cgroup.procs" % d])
time.sleep(1)
libc.umount2(d.encode(), 2)
'''


def test_release_agent_runs_tenant_script_as_host_root(E, host, attacker):
    """CVE-2022-0492's shape: mount a cgroup v1 hierarchy, point release_agent at a script of
    the run (by its host path) and empty a cgroup. Refused, no marker; control: the script, run
    by the host, leaves the marker."""
    marker = os.path.join(E.work, rand("release-marker-"))
    put(attacker, "/tmp/sbx-ra.sh", f"#!/bin/sh\ntouch {marker}\n".encode())
    put(attacker, "/tmp/sbx-ra.py", RELEASE_AGENT.encode())
    host_path = in_run(attacker, "/tmp/sbx-ra.sh")
    r = rx(attacker, f"chmod 755 /tmp/sbx-ra.sh && python3 /tmp/sbx-ra.py {host_path}")
    seen = os.path.exists(marker)
    subprocess.run(["sh", host_path], check=True, timeout=10)  # control
    assert os.path.exists(marker)
    os.unlink(marker)
    assert "MOUNTED" not in r.out and not seen, f"ATTACK: release_agent reachable: {r}"
    assert "REFUSED" in r.out, r


@pytest.fixture(scope="module")
def hostile_images(plat, tenants, image_targets):
    images, targets = image_targets
    state = {}
    for link in IMAGE_LINKS:
        before = snapshot(targets[link])
        job = plat.create("rba", wait=False, token=tenants["rba"], flavor="cpu-small",
                          image=image_name(link))
        state[link] = {"job": job, "before": before}
    for link, s in state.items():
        wait_until(lambda j=s["job"]: j.inspect()["stage"] in ("RUNNING", "ERROR"), 20, 0.1)
        s["stage"] = s["job"].inspect()["stage"]
        s["after"] = snapshot(targets[link])
        if s["stage"] == "RUNNING":  # and the run's own view (through the agent's file API:
            # the image holds no shell): the link leads nowhere, not to the host's directory
            r = s["job"].read_file(f"/{link}/keep")
            s["inside"] = r.text if r.status == 200 else ""
            w = s["job"].proxy("PUT", AGENT_PORT, "/v1/files/write?path=/own-file", b"own\n")
            s["own"] = s["job"].read_file("/own-file").text if w.status == 200 else ""
    yield state
    for s in state.values():
        s["job"].action("cancel")


@pytest.mark.parametrize("link", IMAGE_LINKS)
def test_image_with_hostile_link_at_install(image_targets, hostile_images, link):
    """The image's own root holds /<link> -> a host directory: installing the run must not
    change that directory (the node works beneath the run's root, never through its links)."""
    images, targets = image_targets
    links = [os.path.join(d, "rootfs", link)
             for d in (os.path.join(images, ".rootfs", x)
                       for x in os.listdir(os.path.join(images, ".rootfs")))
             if os.path.islink(os.path.join(d, "rootfs", link))]
    assert any(os.readlink(x) == targets[link] for x in links), \
        "control: the node unpacked the image with its link"
    s = hostile_images[link]
    assert s["stage"] in ("RUNNING", "ERROR"), \
        f"the job neither ran nor failed: {s['stage']}: {s['job'].inspect()['message']}"
    assert s["after"] == s["before"], \
        f"ATTACK: installing an image with /{link} -> {targets[link]} changed the host: " \
        f"{s['before']} -> {s['after']} (stage {s['stage']})"
    if s["stage"] == "RUNNING":
        assert s["own"] == "own\n", "control: the run's file API reads the run's own files"
    assert "keep" not in s.get("inside", ""), \
        f"ATTACK: the run sees the host directory through its image's /{link}: {s['inside']}"


# ---- disk: the flavor's limit, sparse files, the log's cap ------------------------------------

GiB = 1 << 30


@pytest.fixture(scope="module")
def disk_job(plat, tenants):
    j = plat.create_on("rb-n1", "rba", token=tenants["rba"], flavor="cpu-small")
    yield j
    j.cancel()


def test_disk_fallocate_beyond_the_flavor(disk_job):
    """One call asks for more than the flavor's 4 GiB disk: ENOSPC inside; the host's file
    system (which has the room: the control) gives the run no more than its limit."""
    st = os.statvfs(disk_job.node().state)
    assert st.f_bavail * st.f_frsize > 6 * GiB, "control: the host could hold 6 GiB"
    free0 = st.f_bavail * st.f_frsize
    res = rx(disk_job, "python3 -c '\n"
                       "import os\n"
                       "fd = os.open(\"/root/small\", os.O_CREAT | os.O_WRONLY, 0o600)\n"
                       "os.posix_fallocate(fd, 0, 64 << 20)\n"
                       "print(\"small ok\")\n"
                       "fd = os.open(\"/root/big\", os.O_CREAT | os.O_WRONLY, 0o600)\n"
                       "try:\n"
                       "    os.posix_fallocate(fd, 0, 6 << 30)\n"
                       "    print(\"BIG OK\")\n"
                       "except OSError as e:\n"
                       "    print(\"big\", e.errno)\n"
                       "os.unlink(\"/root/big\")\n"
                       "os.unlink(\"/root/small\")\n'", secs=60)
    used = free0 - os.statvfs(disk_job.node().state).f_bavail * os.statvfs(
        disk_job.node().state).f_frsize
    assert "small ok" in res.out, f"control: the run can allocate within its disk: {res}"
    assert "BIG OK" not in res.out and "big 28" in res.out, f"ATTACK: no disk limit: {res}"
    assert used < 5 * GiB, f"ATTACK: the run took {used >> 20} MiB of the host's disk"


def test_sparse_file_stays_sparse_across_move(disk_job):
    rsh(disk_job, "truncate -s 3G /root/sparse && printf x >> /root/sparse")
    gen = disk_job.inspect()["run"]["generation"]
    assert disk_job.action("move", {"node": "rb-n2"}).status == 202
    disk_job.wait_stage("RUNNING", generation=gen + 1, node="rb-n2", timeout=60)
    st = os.stat(in_run(disk_job, "/root/sparse"))
    assert st.st_size == 3 * GiB + 1, "control: the file arrived whole on the new node"
    assert st.st_blocks * 512 < 16 << 20, \
        f"ATTACK: a move made a sparse file cost {st.st_blocks * 512 >> 20} MiB"


def test_log_flood_is_capped(disk_job):
    """The run writes 48 MiB into its pid 1's output (the node's fifo, through /proc/1/fd/1):
    refused, or the node's log of it stays at the 16 MiB cap; the run stays usable."""
    log = os.path.join(disk_job.node().run_dir(disk_job.id), "log")
    with open(log, "rb") as f:
        assert b"listening" in f.read(), "control: the node logs the agent's output"
    res = rx(disk_job, "head -c 50331648 /dev/zero | tr '\\0' x > /proc/1/fd/1", secs=30)
    size = os.path.getsize(log)
    assert res.code != 0 or size > 1 << 20, f"the flood neither failed nor arrived: {res}"
    assert size <= (16 << 20) + (1 << 20), f"ATTACK: the run filled its log to {size} bytes"
    assert rx(disk_job, "echo alive").out == "alive\n", "the run hangs after the flood"
