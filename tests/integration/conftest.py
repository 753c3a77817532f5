# SPDX-License-Identifier: MIT
"""Shared fixtures: start the real sbx-server binary on loopback and talk HTTP to it.

SBX_BUILD selects the build directory (default: build/), so the same suite runs against the
ASan+UBSan build in CI.
"""
import contextlib
import http.client
import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.parse

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


# ---- skips in CI -----------------------------------------------------------------------------
# A security test that skips proves nothing: in CI (CI=true) a skip is a failure, unless the test
# is marked @pytest.mark.skip_ok("why skipping it there is no loss"), which only non-security
# tests may be (a slow stress test, an optional client library).

def in_ci():
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def pytest_configure(config):
    config.addinivalue_line("markers", "skip_ok(reason): a skip of this test is allowed in CI")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if rep.skipped and in_ci() and item.get_closest_marker("skip_ok") is None:
        reason = rep.longrepr[2] if isinstance(rep.longrepr, tuple) else str(rep.longrepr)
        rep.outcome = "failed"
        rep.longrepr = (f"skipped in CI (CI=true), where every security test must run: {reason}. "
                        "Make the environment provide what it needs, or mark the test "
                        "@pytest.mark.skip_ok if it is not a security test.")


# ---- resources of this test session -------------------------------------------------------
# scripts/test.sh runs the suite against build/ and build-asan/ at the same time: each session
# has a slot (SBX_TEST_SLOT, 0..7; 0 when unset) and takes host-wide resources from the slot's
# own share only, so that the two never collide:
# - TCP/UDP ports: 10000..32767 (below the kernel's ephemeral range, where outgoing connections
#   take theirs), 5,000 a slot;
# - subordinate ids of the nodes' runs (sbxplatform, sbx up): 1.0e9..2.0e9 (below 2^31: ICMP echo
#   sockets take gids up to 2^31 - 1 only; the benches use 2.0e9 and up), 250 million a slot;
# - pool hosts' sandbox uids (SBX_POOL_UID_BASE/COUNT): 20000..55999, 9,000 a slot (the
#   benches' pool hosts use 56000..64999). Pool hosts coordinate their uids by lock anyway, but
#   a uid one host frees could be taken by another at once: a test that checks that nothing of
#   a deleted sandbox's uid is left would see the other session's sandbox.
# Within its share a session starts at a random place (another engineer's session on the same
# machine, same slot, most likely starts elsewhere) and wraps around.
# Slots 4..7 (more sessions at once, e.g. several engineers' worktrees) take smaller shares
# outside those of 0..3: ports 2000..9999 (2,000 a slot), ids 0.5e9..1.0e9 (125 million a slot),
# pool uids 56000..64999 (2,250 a slot: the agent takes no base below 20000, so these are the
# benches' pool uids; do not run bench-pool or bench-libsbx beside a session of slot 4..7).
SLOT = int(os.environ.get("SBX_TEST_SLOT", "0") or 0)
assert 0 <= SLOT <= 7, "SBX_TEST_SLOT: 0..7"
if SLOT < 4:
    _PORTS = (10000 + SLOT * 5000, 5000 if SLOT < 3 else 32768 - 25000)
    POOL_UID_BASE = 20000 + SLOT * 9000
    POOL_UID_COUNT = 9000
    _IDS = (1_000_000_000 + SLOT * 250_000_000, 250_000_000)
else:
    _PORTS = (2000 + (SLOT - 4) * 2000, 2000)
    POOL_UID_BASE = 56000 + (SLOT - 4) * 2250
    POOL_UID_COUNT = 2250  # test_pool_teardown.py makes 2,100 sandboxes on one host
    _IDS = (500_000_000 + (SLOT - 4) * 125_000_000, 125_000_000)
_next_port = [secrets.randbelow(_PORTS[1])]
_next_id = [secrets.randbelow(_IDS[1] // 65536) * 65536]


def free_port():
    """A port of this session's share that nothing (TCP, any address) is bound to now."""
    for _ in range(_PORTS[1]):
        port = _PORTS[0] + _next_port[0] % _PORTS[1]
        _next_port[0] += 1
        with socket.socket() as s:
            try:
                s.bind(("0.0.0.0", port))
                return port
            except OSError:
                continue
    raise RuntimeError("no free port in this session's share")


def id_range(count):
    """A subordinate id range of count ids (a multiple of 65,536) of this session's share, never
    handed out before in this process (until the share wraps around)."""
    assert count % 65536 == 0 and count <= _IDS[1]
    if _next_id[0] + count > _IDS[1]:
        _next_id[0] = 0
    start = _IDS[0] + _next_id[0]
    _next_id[0] += count
    return start, count


class Server:
    """A running sbx-server process plus small HTTP helpers."""

    def __init__(self, env=None, args=(), token=None, unix_path=None, binary=SERVER_BIN,
                 popen_kw=None):
        self.token = token if token is not None else secrets.token_hex(32)
        self.port = free_port()
        self.unix_path = unix_path
        e = {k: v for k, v in os.environ.items() if not k.startswith("SBX_")}
        e["SBX_PORT"] = str(self.port)
        # a pool host takes this session's uids (env below may set others)
        e["SBX_POOL_UID_BASE"] = str(POOL_UID_BASE)
        e["SBX_POOL_UID_COUNT"] = str(POOL_UID_COUNT)
        if self.token:
            e["SBX_TOKEN"] = self.token
        if unix_path:
            e["SBX_LISTEN"] = "unix:" + unix_path
        e.update(env or {})
        # popen_kw: e.g. extra_groups, to start the server with supplementary groups
        self.proc = subprocess.Popen([binary, *args], env=e, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, **(popen_kw or {}))
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


def wait_until(pred, timeout=5.0, step=0.02):
    """Poll pred until it returns something true or timeout seconds pass; return its value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(step)
    return pred()


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


@pytest.fixture
def huge_dir(tmp_path, request):
    """huge_dir(n): a directory of n empty files f000000..., on a tmpfs of its own (on ext4
    without a journal, making hundreds of thousands of inodes soon after many were deleted, as
    other tests do, takes minutes); unmounted after the test."""
    def make(n):
        d = tmp_path / "huge"
        d.mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size=256m,nr_inodes={n + 1000}",
                        "tmpfs", str(d)], check=True)
        request.addfinalizer(lambda: subprocess.run(["umount", "-l", str(d)], check=False))
        dfd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
        try:
            for i in range(n):
                os.close(os.open(f"f{i:06d}", os.O_CREAT | os.O_WRONLY, 0o600, dir_fd=dfd))
        finally:
            os.close(dfd)
        return d
    return make


# -- pool host mode ----------------------------------------------------------------------------

HOME_SHARDS = ["%02x" % i for i in range(256)]


def homes_in(homes):
    """What a pool host's homes directory holds: each home as '<shard>/<id>' (a shard is 00 to
    ff, the first two hex digits of its homes' ids), and anything else at its top as itself."""
    out = []
    for e in sorted(os.listdir(homes)):
        p = os.path.join(homes, e)
        if e in HOME_SHARDS and os.path.isdir(p) and not os.path.islink(p):
            out += [e + "/" + h for h in sorted(os.listdir(p))]
        else:
            out.append(e)
    return out


class HostServer(Server):
    """A pool host (SBX_HOST_MODE=1) with its own homes directory (removed at stop)."""

    def __init__(self, env=None, args=(), **kw):
        self.homes = tempfile.mkdtemp(prefix="sbx-homes-")
        os.chmod(self.homes, 0o711)  # sandboxes must be able to reach their own home
        e = {"SBX_HOST_MODE": "1", "SBX_HOMES_DIR": self.homes}
        e.update(env or {})
        try:
            super().__init__(env=e, args=args, **kw)
        except Exception:
            shutil.rmtree(self.homes, ignore_errors=True)
            raise

    def stop(self):
        try:
            return super().stop()
        finally:
            shutil.rmtree(self.homes, ignore_errors=True)

    def create_raw(self, body=None, token=True, headers=None):
        """POST /v1/sandboxes; (status, json)."""
        return self.json("POST", "/v1/sandboxes", body if body is not None else {}, token=token,
                         headers=headers)

    def create(self, count=None, **opts):
        """Create sandboxes (200 expected); return the list of Sandbox objects."""
        body = dict(opts)
        if count is not None:
            body["count"] = count
        st, j = self.create_raw(body)
        assert st == 200, (st, j)
        return [Sandbox(self, x) for x in j["sandboxes"]]

    def sandbox(self, **opts):
        return self.create(1, **opts)[0]

    def homes_settled(self, timeout=10):
        """Wait until the janitor answered every warm home asked of it: a deleted sandbox's
        uid is then back in the warm set with its home, the next one a create takes."""
        assert wait_until(
            lambda: self.json("GET", "/health")[1]["homes"]["making"] == 0, timeout)

    def list(self):
        st, j = self.json("GET", "/v1/sandboxes")
        assert st == 200, (st, j)
        return j


class ExecResult:
    def __init__(self, events):
        self.events = events
        self.out = output_of(events, "stdout").decode(errors="replace")
        self.err = output_of(events, "stderr").decode(errors="replace")
        ex = [e for e in events if e.get("event") == "exit"]
        self.exit = ex[-1] if ex else None
        self.code = self.exit.get("exit_code") if self.exit else None

    def __repr__(self):
        return f"ExecResult(code={self.code}, out={self.out[-2000:]!r}, err={self.err[-2000:]!r})"


class Sandbox:
    """One sandbox of a HostServer; requests carry its own token unless told otherwise."""

    def __init__(self, server, j):
        self.server = server
        self.info = j
        self.id = j["id"]
        self.uid = j["uid"]
        self.home = j["home"]
        self.token = j.get("token")

    def path(self, rest=""):
        return f"/v1/sandboxes/{self.id}{rest}"

    def request(self, method, rest, body=None, headers=None, token=None, timeout=30):
        """A scoped request; token=None uses this sandbox's token, "" sends no token."""
        tok = self.token if token is None else token
        h = dict(headers or {})
        if tok:
            h["X-Sandbox-Token"] = tok
        return self.server.request(method, self.path(rest), body, headers=h, token=False,
                                   timeout=timeout)

    def json(self, method, rest, body=None, **kw):
        st, _, data = self.request(method, rest, body, **kw)
        try:
            return st, json.loads(data) if data else None
        except ValueError:
            return st, data

    def exec(self, body, **kw):
        """POST .../exec; (status, events) for a stream, else (status, json)."""
        st, hdrs, data = self.request("POST", "/exec", body, **kw)
        if st != 200 or "ndjson" not in hdrs.get("content-type", ""):
            return st, json.loads(data) if data else None
        return st, [json.loads(l) for l in data.split(b"\n") if l]

    def run(self, cmd, **body):
        """Run cmd (a shell string or an argv list) in the foreground; expect a stream."""
        b = {"cmd": cmd}
        b.update(body)
        st, ev = self.exec(b)
        assert st == 200, (st, ev)
        return ExecResult(ev)

    def py(self, script, *args, **body):
        """Run a python3 script inside the sandbox."""
        return self.run(["python3", "-c", script, *args], **body)

    def start(self, cmd, **body):
        """Start a background process; return its json ({id, pid, ...})."""
        b = {"cmd": cmd}
        b.update(body)
        st, j = self.json("POST", "/processes", b)
        assert st == 200, (st, j)
        return j

    def read(self, path):
        return self.request("GET", "/files/read?path=" + urllib.parse.quote(path, safe=""))

    def write(self, path, data, query=""):
        return self.request("PUT", "/files/write?path=" + urllib.parse.quote(path, safe="") +
                            query, data)

    def delete(self):
        return self.json("DELETE", "")


def uid_pids(uid):
    """Host view: pids of live (non-zombie) processes whose real, effective or saved uid is uid."""
    pids = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/status") as f:
                st = f.read()
        except OSError:
            continue
        m = re.search(r"^Uid:\s+(\d+)\s+(\d+)\s+(\d+)", st, re.M)
        z = re.search(r"^State:\s+Z", st, re.M)
        if m and not z and str(uid) in m.groups():
            pids.append(int(d))
    return pids


@pytest.fixture
def make_host_server():
    started = []

    def start(**kw):
        s = HostServer(**kw)
        started.append(s)
        return s

    yield start
    for s in started:
        s.stop()


@pytest.fixture(scope="module")
def pool_host():
    """One pool host shared by a test module (tests create and delete their own sandboxes)."""
    s = HostServer()
    yield s
    s.stop()


@contextlib.contextmanager
def small_ext4(*mkfs_opts):
    """A 16 MB ext4 loop-mounted for homes (mkfs.ext4 options as given); yields its mount
    point, reachable by the sandbox uids; unmounted and removed after."""
    d = tempfile.mkdtemp(prefix="sbx-smallfs-")
    os.chmod(d, 0o711)
    img, mnt = d + "/fs.img", d + "/mnt"
    os.mkdir(mnt)
    subprocess.run(["truncate", "-s", "16M", img], check=True)
    subprocess.run(["mkfs.ext4", "-q", "-F", *mkfs_opts, img], check=True)
    subprocess.run(["mount", "-o", "loop", img, mnt], check=True)
    try:
        os.chmod(mnt, 0o711)
        yield mnt
    finally:
        subprocess.run(["umount", "-l", mnt], check=False)
        shutil.rmtree(d, ignore_errors=True)


def health_while(server, work, after):
    """Run work() on a thread (it returns (its result, when the server was done with it));
    `after` seconds later, GET /health on server. Returns (work's result, /health's status,
    whether /health was answered before the server was done with work)."""
    import threading
    done = {}

    def run():
        done["value"], done["at"] = work()
    t = threading.Thread(target=run)
    t.start()
    time.sleep(after)
    status, _ = server.json("GET", "/health")
    health_at = time.monotonic()
    t.join(60)
    return done["value"], status, health_at < done["at"]
