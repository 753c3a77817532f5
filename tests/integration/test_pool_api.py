# SPDX-License-Identifier: MIT
"""Pool host API (SBX_HOST_MODE=1): create/list/delete, capacity, bounds, environment,
ownership, cwd, idle eviction, host shutdown, the Landlock floor, the mode gate, /health and
per-sandbox process scoping. Needs root, like the pool host itself."""
import json
import os
import secrets
import shutil
import socket
import stat
import subprocess
import tempfile
import threading
import time
import urllib.parse

import pytest

from conftest import (POOL_UID_BASE, POOL_UID_COUNT, Sandbox, homes_in, small_ext4, uid_pids,
                      wait_until)
from test_envd import files_request, sandbox_envd
from test_envd import fs as envd_fs

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="pool host mode needs root")


def ids_of(listing):
    return {x["id"] for x in listing}


# ---- create, capacity, list, tokens, delete-all ----------------------------------------------

def test_create_count_and_capacity(make_host_server):
    s = make_host_server(env={"SBX_CAPACITY": "4"})
    st, j = s.create_raw({"count": 3})
    assert st == 200 and len(j["sandboxes"]) == 3 and j["rejected"] == 0, j
    uids = {x["uid"] for x in j["sandboxes"]}
    assert len(uids) == 3 and all(20000 <= u < 65000 for u in uids)
    for x in j["sandboxes"]:
        assert len(x["id"]) == 16 and len(x["token"]) == 64
        assert x["home"] == os.path.join(s.homes, x["id"][:2], x["id"])
        st_ = os.stat(x["home"])
        assert (st_.st_uid, st_.st_mode & 0o777) == (x["uid"], 0o700)
    st, j = s.create_raw({"count": 3})  # one slot left
    assert st == 200 and len(j["sandboxes"]) == 1 and j["rejected"] == 2, j
    st, j = s.create_raw({"count": 2})  # full: still 200
    assert (st, j) == (200, {"sandboxes": [], "rejected": 2})
    st, j = s.create_raw({})  # count defaults to 1
    assert (st, j) == (200, {"sandboxes": [], "rejected": 1})
    assert len(s.list()) == 4
    assert s.json("GET", "/health")[1]["sandboxes"] == 4


def test_a_full_homes_filesystem_is_said_not_taken_for_a_full_host(make_host_server):
    """Homes on a filesystem whose inodes a sandbox used up: the creates that need a new home
    are rejected with the reason (and a log line), never as if the host had no uid left.
    Positive control: the first creates, on homes made before, work."""
    s = None
    with small_ext4("-N", "768") as mnt:
        try:
            os.mkdir(mnt + "/h", 0o711)  # sandboxes reach their homes through it
            os.chmod(mnt + "/h", 0o711)
            s = make_host_server(env={"SBX_HOMES_DIR": mnt + "/h", "SBX_CAPACITY": "64"})
            a = s.sandbox()
            r = a.run(["sh", "-c",
                       "i=0; while touch f$i 2>/dev/null; do i=$((i+1)); done; echo $i"])
            # it filled the inodes left
            assert r.out.strip().isdigit() and int(r.out) > 0, (r, r.err)
            reasons = set()
            for _ in range(60):
                st, j = s.create_raw({"count": 1})
                assert st == 200, (st, j)
                if j["rejected"]:
                    reasons.add(j.get("reason"))
                    break
            assert reasons == {"no space left on the homes filesystem"}, \
                ("a full homes filesystem was not said (or taken for no uid left)", reasons)
            log, s = s.stop(), None
            assert "no space left on the homes filesystem" in log, log[-2000:]
        finally:
            if s:
                s.stop()


def test_uploads_never_spend_the_blocks_kept_for_root(make_host_server):
    """The files API writes for a sandbox as its uid would: once the sandbox has filled the
    homes filesystem to the blocks ext4 keeps for root, an upload is refused too (it used to
    go on as root, into the reserve the host needs). Positive controls: the same upload works
    before, and root on the host can still write into the reserve."""
    s = None
    with small_ext4("-m", "10") as mnt:
        try:
            os.mkdir(mnt + "/h", 0o711)
            s = make_host_server(env={"SBX_HOMES_DIR": mnt + "/h", "SBX_CAPACITY": "4"})
            a = s.sandbox()
            blob = os.urandom(256 * 1024)
            assert a.write("before", blob)[0] == 200  # positive control
            r = a.run(["sh", "-c", "dd if=/dev/zero of=fill bs=64k 2>&1; sync; df -k ."])
            assert "No space left" in r.out, r
            st = os.statvfs(mnt)
            assert st.f_bavail * st.f_frsize < 64 * 1024, st  # nothing left for the sandbox...
            assert st.f_bfree * st.f_frsize > 512 * 1024, st  # ...and the reserve untouched
            # positive control: root on the host writes into the reserve
            with open(mnt + "/root-file", "wb") as f:
                f.write(blob)
                f.flush()
                os.fsync(f.fileno())
            os.unlink(mnt + "/root-file")
            os.sync()
            status, _, body = a.write("upload", blob)
            assert status >= 400, ("ATTACK: an upload spent the blocks kept for root", status)
            assert b"space" in body.lower(), body
            # envd's file upload (the E2B SDK's) likewise
            status, _, body = files_request(sandbox_envd(a), "POST", "?path=/envd-upload", blob,
                                            {"Content-Type": "application/octet-stream"})
            assert status >= 400, ("ATTACK: an envd upload spent the blocks kept for root", status)
            # nor directories made through either API (each takes a block): a red-team pass
            # drained the whole reserve with mkdirs
            st = os.statvfs(mnt)
            before, left = st.f_bfree, st.f_bavail  # left: what the sandbox itself may still take
            for i in range(40):
                a.request("POST", f"/files/mkdir?path=/m{i}/n")
                envd_fs(sandbox_envd(a), "MakeDir", {"path": f"/e{i}/f"})
            os.sync()
            spent = before - os.statvfs(mnt).f_bfree
            assert spent <= left + 2, ("ATTACK: mkdirs spent the blocks kept for root", spent, left)
            st = os.statvfs(mnt)
            assert st.f_bfree * st.f_frsize > 512 * 1024, ("the reserve was spent", st)
        finally:
            if s:
                s.stop()


BIG_LISTING = """
import os
os.mkdir("big")
open("big/f", "w").close()
for i in range(50000):
    os.link("big/f", "big/%06d" % i + "n" * 200)
print("made")
"""


def test_listings_are_bounded_in_size_and_in_flight(make_host_server):
    """A listing's answer stops near 8 MB (truncated, with its cursor) and shows the path tidied
    (a path written long made every entry long: 219 MB from one request); a sandbox has at most
    two listings in flight, the host eight, a third of the sandbox's is 429 (clients that never
    read held 1.3 GB). Positive controls: a sibling lists meanwhile; the sandbox lists again once
    its two are done (a red-team pass)."""
    s = make_host_server()
    a, b = s.create(2)
    assert a.py(BIG_LISTING, timeout=120).out == "made\n"
    q = "/files/list?path=" + urllib.parse.quote("/" + "./" * 500 + "big") + "&limit=50000"
    st, _, body = a.request("GET", q, timeout=60)
    assert st == 200, (st, body[:300])
    j = json.loads(body)
    assert j["truncated"] and 0 < len(j["entries"]) < 50001 and j["next"], len(j["entries"])
    assert len(body) < 10 * 1024 * 1024, len(body)
    assert all(e["path"] == "/big/" + e["name"] for e in j["entries"]), j["entries"][0]
    # envd's ListDir has no pages: past 24 MB it says so; a small one shows tidy paths
    e = sandbox_envd(a)
    st, j = envd_fs(e, "ListDir", {"path": "/big"})
    assert st == 429 and j["code"] == "resource_exhausted", (st, str(j)[:300])
    assert a.run("mkdir -p small && touch small/x").code == 0
    st, j = envd_fs(e, "ListDir", {"path": "/" + "./" * 500 + "small"})
    assert st == 200 and [x["path"] for x in j["entries"]] == ["/small/x"], (st, str(j)[:300])
    # two clients that never read hold the sandbox's two listings
    held = []
    for _ in range(2):
        c = socket.socket()
        c.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        c.connect(("127.0.0.1", s.port))
        c.sendall(f"GET {a.path(q)} HTTP/1.1\r\nHost: x\r\nX-Sandbox-Token: {a.token}\r\n\r\n"
                  .encode())
        held.append(c)
    try:
        def third():
            st, _, body = a.request("GET", "/files/list?path=/big&limit=5")
            return (st, body) if st == 429 else None
        got = wait_until(third, 10, 0.2)
        assert got and b"too many listings" in got[1], got
        assert b.request("GET", "/files/list?path=/")[0] == 200  # a sibling lists meanwhile
    finally:
        for c in held:
            c.close()
    assert wait_until(lambda: a.request("GET", "/files/list?path=/big&limit=5")[0] == 200, 10)


def test_a_batch_that_fails_part_way_is_undone(make_host_server):
    # the third sandbox of a batch of five fails half made (SBX_TEST_CREATE_FAILS_AT): the
    # client gets a 500 and is billed for nothing, the two made before it are gone too
    s = make_host_server(env={"SBX_TEST_CREATE_FAILS_AT": "3", "SBX_CAPACITY": "5"})
    st, j = s.create_raw({"count": 5})
    assert st == 500 and "creating a sandbox failed" in j["error"], (st, j)
    assert s.list() == [], "undo: the batch's sandboxes made before the failure are still listed"
    h = s.json("GET", "/health")[1]
    assert h["sandboxes"] == 0 and h["uids"]["quarantined"] == 0, h
    assert wait_until(lambda: homes_in(s.homes) == [], 10), homes_in(s.homes)
    st, j = s.create_raw({"count": 5})  # control: the next creates work, all of capacity left
    assert st == 200 and len(j["sandboxes"]) == 5 and j["rejected"] == 0, j
    assert ids_of(s.list()) == {x["id"] for x in j["sandboxes"]}


def test_home_paths_that_need_escaping_in_json(make_host_server):
    # the answers are written by hand, not by a JSON library: a homes directory with a quote,
    # a backslash and a non-ASCII letter must still come back as exactly that path
    base = tempfile.mkdtemp(prefix="sbx-esc-")
    try:
        os.chmod(base, 0o711)  # the sandbox uids pass through it to their homes
        homes = os.path.join(base, 'h"o\\m\u00e9s')
        s = make_host_server(env={"SBX_HOMES_DIR": homes})
        st, j = s.create_raw({"count": 2})
        assert st == 200 and len(j["sandboxes"]) == 2, j
        for x in j["sandboxes"]:
            assert x["home"] == os.path.join(homes, x["id"][:2], x["id"])
            assert os.path.isdir(x["home"])
        assert sorted(x["home"] for x in s.list()) == sorted(x["home"] for x in j["sandboxes"])
        r = Sandbox(s, j["sandboxes"][0]).py("import os; print(os.getcwd())")
        assert r.out.strip() == j["sandboxes"][0]["home"], r
        s.stop()
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_homes_dir_that_is_not_utf8_refuses_to_start(make_host_server):
    base = tempfile.mkdtemp(prefix="sbx-esc-")
    try:
        with pytest.raises(RuntimeError) as e:
            make_host_server(env={"SBX_HOMES_DIR": base + "/bad\udcff"})
        assert "SBX_HOMES_DIR is not valid UTF-8" in str(e.value)
        make_host_server(env={"SBX_HOMES_DIR": base + "/good"}).stop()  # control
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_a_shard_that_is_not_roots_directory_refuses_to_start(make_host_server):
    # a home is opened through its shard: one that is a link (or not root's) would lead the
    # host elsewhere, so a host finding one from an earlier run refuses to start
    base = tempfile.mkdtemp(prefix="sbx-shard-")
    try:
        os.chmod(base, 0o711)
        elsewhere = os.path.join(base, "elsewhere")
        os.mkdir(elsewhere)
        homes = os.path.join(base, "homes")
        os.mkdir(homes, 0o711)
        os.symlink(elsewhere, os.path.join(homes, "7f"))
        with pytest.raises(RuntimeError) as e:
            make_host_server(env={"SBX_HOMES_DIR": homes})
        assert "7f is not a directory of root's; refusing to start" in str(e.value)
        os.unlink(os.path.join(homes, "7f"))
        os.mkdir(os.path.join(homes, "7f"), 0o755)
        os.chown(os.path.join(homes, "7f"), 12345, 12345)
        with pytest.raises(RuntimeError) as e:
            make_host_server(env={"SBX_HOMES_DIR": homes})
        assert "7f is not a directory of root's; refusing to start" in str(e.value)
        # control: root's shard from an earlier run is taken over, its mode made 0711
        os.chown(os.path.join(homes, "7f"), 0, 0)
        s = make_host_server(env={"SBX_HOMES_DIR": homes})
        assert stat.S_IMODE(os.stat(os.path.join(homes, "7f")).st_mode) == 0o711
        assert len(s.create(3)) == 3 and os.listdir(elsewhere) == []
        s.stop()
        assert os.listdir(homes) == []  # the shards go at shutdown
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_uid_range_of_its_own(make_host_server):
    # SBX_POOL_UID_BASE/COUNT: the host hands out uids of that range only, and none past it
    base = POOL_UID_BASE + POOL_UID_COUNT - 3  # the end of this session's share
    s = make_host_server(env={"SBX_POOL_UID_BASE": str(base), "SBX_POOL_UID_COUNT": "3"})
    st, j = s.create_raw({"count": 5})
    uids = sorted(x["uid"] for x in j["sandboxes"])
    assert st == 200 and uids and all(base <= u < base + 3 for u in uids), j
    assert len(uids) + j["rejected"] == 5 and len(set(uids)) == len(uids), j


def test_concurrent_creates_never_exceed_capacity(make_host_server):
    s = make_host_server(env={"SBX_CAPACITY": "5"})
    results = []
    lock = threading.Lock()

    def create():
        st, j = s.create_raw({"count": 2})
        with lock:
            results.append((st, j))
    ts = [threading.Thread(target=create) for _ in range(8)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert all(st == 200 for st, _ in results), results
    created = [x for _, j in results for x in j["sandboxes"]]
    assert len(created) == 5 and sum(j["rejected"] for _, j in results) == 16 - 5
    assert len({x["id"] for x in created}) == 5 and len({x["uid"] for x in created}) == 5
    assert ids_of(s.list()) == {x["id"] for x in created}
    assert len(homes_in(s.homes)) == 5


def _send_create(s, count):
    """POST a create on a socket of its own and return the socket, unread."""
    body = json.dumps({"count": count}).encode()
    c = socket.create_connection(("127.0.0.1", s.port), timeout=60)
    c.sendall(b"POST /v1/sandboxes HTTP/1.1\r\nHost: x\r\nX-Sandbox-Token: " + s.token.encode() +
              b"\r\nContent-Type: application/json\r\nContent-Length: " + str(len(body)).encode() +
              b"\r\n\r\n" + body)
    return c


def _read_answer(c):
    """The whole answer to one request on c: (status, json)."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += c.recv(65536)
    head, rest = data.split(b"\r\n\r\n", 1)
    n = int([l.split(b":")[1] for l in head.split(b"\r\n") if l.lower().startswith(b"content-length")][0])
    while len(rest) < n:
        rest += c.recv(65536)
    return int(head.split(b" ")[1]), json.loads(rest[:n])


BURST = 400


def test_a_burst_of_creates_is_made_off_the_loop(make_host_server):
    # A create for more sandboxes than the warm sets hold waits for the janitor to make their
    # homes and namespaces: the event loop serves other requests meanwhile, and every home of
    # the burst comes from the warm set (none is made on the loop).
    s = make_host_server(env={"SBX_CAPACITY": str(BURST)})
    h0 = s.json("GET", "/health")[1]
    assert wait_until(lambda: s.json("GET", "/health")[1]["homes"]["warm"] > 0, 10)
    c = _send_create(s, BURST)
    try:
        time.sleep(0.05)  # the burst is being made
        st, h = s.json("GET", "/health", timeout=5)
        assert st == 200 and h["sandboxes"] < BURST, h
        # it waits, and says so: the slots it has yet to fill
        assert h["creates"]["waiting"] == 1 and 0 < h["creates"]["slots"] <= BURST, h
        assert h["sandboxes"] + h["creates"]["slots"] == BURST, h
        c.setblocking(False)
        try:
            early = c.recv(1)
        except BlockingIOError:
            early = b""
        assert early == b"", "the burst was answered before a request sent after it: made on the loop"
        c.setblocking(True)
        st, j = _read_answer(c)
    finally:
        c.close()
    assert st == 200 and len(j["sandboxes"]) == BURST and j["rejected"] == 0, (st, j)
    assert len({x["uid"] for x in j["sandboxes"]}) == BURST
    assert all(os.path.isdir(x["home"]) for x in j["sandboxes"])
    h = s.json("GET", "/health")[1]
    assert h["creates"] == {"waiting": 0, "slots": 0}, h  # answered: nothing waits
    assert h0["creates"] == {"waiting": 0, "slots": 0}, h0
    made = h["homes"]["from_warm"] - h0["homes"]["from_warm"]
    assert made == BURST, f"{BURST - made} of the burst's homes were made on the loop: {h}"
    if "netns" in h:  # one namespace was made at start (the only one made on the loop)
        assert h["netns"]["made"] + 1 >= BURST, h
    r = Sandbox(s, j["sandboxes"][-1]).run("id -u; echo ok > f; cat f")  # control: they work
    assert r.out.split() == [str(j["sandboxes"][-1]["uid"]), "ok"], r


def test_a_burst_whose_client_leaves_is_undone(make_host_server):
    # The client of a waiting create goes away: nobody holds the tokens of what was made, so it
    # is all deleted, and the capacity it reserved is free again.
    s = make_host_server(env={"SBX_CAPACITY": str(BURST)})
    c = _send_create(s, BURST)
    assert wait_until(lambda: s.json("GET", "/health")[1]["sandboxes"] > 0, 10)
    c.close()
    assert wait_until(lambda: s.json("GET", "/health")[1]["sandboxes"] == 0, 20), \
        "undo: the sandboxes of a create whose client left are still there"
    assert s.list() == []
    assert wait_until(lambda: homes_in(s.homes) == [], 20), homes_in(s.homes)
    st, j = s.create_raw({"count": BURST})  # control: all of capacity is there again
    assert st == 200 and len(j["sandboxes"]) == BURST and j["rejected"] == 0, \
        (st, j.get("rejected") if isinstance(j, dict) else j)


def test_a_burst_waiting_at_shutdown_is_refused(make_host_server):
    s = make_host_server(env={"SBX_CAPACITY": str(BURST)})
    c = _send_create(s, BURST)
    try:
        assert wait_until(lambda: s.json("GET", "/health")[1]["sandboxes"] > 0, 10)
        homes = s.homes
        s.proc.send_signal(15)
        st, j = _read_answer(c)
        assert st == 503 and "shutting down" in j["error"], (st, j)
        assert s.proc.wait(30) == 0
        assert homes_in(homes) == [], "the refused burst's homes outlived the host"
    finally:
        c.close()


def test_limits_and_confinement_reported_and_applied(make_host_server):
    s = make_host_server()
    st, j = s.create_raw({"max_procs": 17, "max_mem_mb": 300, "idle_timeout_secs": 0})
    assert st == 200
    sb = j["sandboxes"][0]
    assert sb["confinement"] == "landlock"
    lim = sb["limits"]
    assert (lim["max_procs"], lim["max_mem_mb"], lim["idle_timeout_secs"]) == (17, 300, 0)
    assert lim["nofile"] == 4096 and lim["core"] == 0
    assert lim["cgroup_memory_bytes"] in (None, 300 << 20)
    assert lim["cgroup_pids"] in (None, 17)
    a = Sandbox(s, sb)
    r = a.py("import resource as r\nfor k in ('NPROC', 'NOFILE', 'AS', 'CORE', 'FSIZE'):\n"
             "    print(*r.getrlimit(getattr(r, 'RLIMIT_' + k)))")
    assert r.out.splitlines() == ["17 17", "4096 4096", f"{300 << 20} {300 << 20}", "0 0",
                                  f"{8192 << 20} {8192 << 20}"], r
    st, listing = s.json("GET", "/v1/sandboxes")
    assert [x["confinement"] for x in listing] == ["landlock"]
    assert listing[0]["limits"]["max_procs"] == 17
    # defaults
    d = s.sandbox()
    assert (d.info["limits"]["max_procs"], d.info["limits"]["max_mem_mb"]) == (256, 2048)


def test_list_has_no_tokens_and_token_recovery(make_host_server):
    s = make_host_server()
    made = s.create(3)
    listing = s.list()
    assert ids_of(listing) == {x.id for x in made}
    raw = json.dumps(listing)
    for sb in made:
        assert sb.token not in raw
    for x in listing:
        assert "token" not in x and {"id", "uid", "home", "created_at_ms", "confinement"} <= set(x)
    assert [x["id"] for x in listing] == [x.id for x in made]  # creation order
    for sb in made:
        st, j = s.json("GET", f"/v1/sandboxes/{sb.id}/token")
        assert (st, j) == (200, {"id": sb.id, "token": sb.token})
    now_ms = time.time() * 1000
    assert all(abs(x["created_at_ms"] - now_ms) < 60000 for x in listing)


def test_delete_all(make_host_server):
    s = make_host_server()
    made = s.create(3)
    made[0].run("sleep 1000 </dev/null >/dev/null 2>&1 &")
    made[1].start(["sleep", "1000"])
    assert uid_pids(made[0].uid) and uid_pids(made[1].uid)
    st, j = s.json("DELETE", "/v1/sandboxes")
    assert (st, j) == (200, {"deleted": 3})
    assert s.list() == [] and homes_in(s.homes) == []
    for sb in made:
        assert uid_pids(sb.uid) == []
        st, _, _ = sb.request("POST", "/exec", {"cmd": "id"})
        assert st == 403  # the token died with the sandbox
    st, j = s.json("DELETE", "/v1/sandboxes")
    assert (st, j) == (200, {"deleted": 0})
    assert len(s.create(2)) == 2  # positive control: the host still creates


def test_delete_one(make_host_server):
    s = make_host_server()
    a, b = s.create(2)
    st, j = a.delete()
    assert (st, j) == (200, {"id": a.id, "deleted": True})
    assert ids_of(s.list()) == {b.id} and not os.path.exists(a.home)
    st, _ = a.delete()
    assert st == 403  # gone: no entry, no token to match
    assert b.run("echo ok").out == "ok\n"


# ---- bounds -----------------------------------------------------------------------------------

BAD_BODIES = [
    {"count": 0}, {"count": 5000}, {"count": -1}, {"count": "3"}, {"count": 1.5},
    {"max_procs": 0}, {"max_procs": 5000}, {"max_procs": True},
    {"max_mem_mb": 0}, {"max_mem_mb": 1048577}, {"max_mem_mb": -5},
    {"idle_timeout_secs": -1}, {"idle_timeout_secs": "1"},
    {"env": {"K": "x" * (200 * 1024)}}, {"env": {"A=B": "c"}}, {"env": {"": "v"}},
    {"env": ["A=B"]}, {"env": {"K": 5}}, {"env": {"K": "a\u0000b"}},
]


@pytest.mark.parametrize("body", BAD_BODIES, ids=[json.dumps(b)[:40] for b in BAD_BODIES])
def test_create_bounds(pool_host, body):
    n = len(pool_host.list())
    st, j = pool_host.create_raw(body)
    assert st == 400 and "error" in j, (st, j)
    assert len(pool_host.list()) == n


@pytest.mark.parametrize("raw", [b"[1]", b"{", b'{"count":1,"count":2}', b"null", b"\xff"])
def test_create_bad_json(pool_host, raw):
    st, _, data = pool_host.request("POST", "/v1/sandboxes", raw)
    assert st == 400, (st, data)


def test_create_bounds_positive_control(pool_host):
    sbs = pool_host.create(2, max_procs=4096, max_mem_mb=1, idle_timeout_secs=0,
                           env={"K": "x" * (60 * 1024)})
    assert len(sbs) == 2
    for sb in sbs:
        sb.delete()


# ---- environment ------------------------------------------------------------------------------

def test_env_precedence_and_host_secrets(make_host_server):
    secret = "hush-" + secrets.token_hex(8)
    s = make_host_server(env={"SBX_SECRET_TEST": secret, "HOST_ONLY_VAR": secret})
    a = s.sandbox(env={"FOO": "create", "BAR": "b", "PATH": "/usr/bin:/bin"})
    r = a.run("env")
    env = dict(l.split("=", 1) for l in r.out.splitlines() if "=" in l)
    assert env["FOO"] == "create" and env["BAR"] == "b" and env["PATH"] == "/usr/bin:/bin"
    r = a.run("env", env={"FOO": "exec", "NEW": "n"})
    env = dict(l.split("=", 1) for l in r.out.splitlines() if "=" in l)
    assert env["FOO"] == "exec" and env["BAR"] == "b" and env["NEW"] == "n"
    # nothing of the server's own environment, not even in the initial environment block
    r = a.run("env; cat /proc/self/environ; cat /proc/$$/environ")
    assert secret not in r.out and s.token not in r.out, r
    assert "SBX_TOKEN" not in r.out and "HOST_ONLY_VAR" not in r.out
    j = a.start(["sleep", "5"], env={"P": "bg"})

    def environ():
        with open(f"/proc/{j['pid']}/environ", "rb") as f:
            return f.read()
    blk = wait_until(environ, 2)  # empty until the exec has set up the new image
    assert secret.encode() not in blk and b"P=bg" in blk and b"FOO=create" in blk
    # a sibling does not get A's create-time env
    b = s.sandbox()
    assert "FOO=" not in b.run("env").out


def test_base_environment(make_host_server):
    s = make_host_server()
    a = s.sandbox()
    r = a.run('echo "$HOME|$TMPDIR|$USER|$LOGNAME|$SBX_SANDBOX_ID|$SBX_PROXY_DIR|$PATH"; '
              'mktemp; id -un 2>/dev/null || true')
    home, tmp, user, logname, sid, proxy, path = r.out.splitlines()[0].split("|")
    assert home == a.home and tmp == a.home + "/.tmp"
    assert user == logname == "sbx-" + a.id and sid == a.id
    assert proxy == a.home + "/.sbx/proxy"
    assert path.split(":")[0] == a.home + "/.local/bin" and "/usr/bin" in path.split(":")
    assert r.out.splitlines()[1].startswith(a.home + "/.tmp/")  # TMPDIR is writable
    for d in (".tmp", ".sbx", ".sbx/proxy"):
        st_ = os.stat(os.path.join(a.home, d))
        assert (st_.st_uid, st_.st_gid) == (a.uid, a.uid)


# ---- files and cwd ----------------------------------------------------------------------------

def test_files_written_via_the_api_belong_to_the_sandbox(make_host_server):
    s = make_host_server()
    a = s.sandbox()
    st, _, data = a.write("deep/er/file.txt", b"hello", query="&mode=640")
    assert st == 200, data
    assert a.json("POST", "/files/mkdir?path=made/x")[0] == 200
    for rel in ("deep", "deep/er", "deep/er/file.txt", "made", "made/x"):
        st_ = os.lstat(os.path.join(a.home, rel))
        assert (st_.st_uid, st_.st_gid) == (a.uid, a.uid), rel
    assert os.stat(os.path.join(a.home, "deep/er/file.txt")).st_mode & 0o777 == 0o640
    r = a.run("cat deep/er/file.txt && echo more >> deep/er/file.txt && ls -ln deep/er")
    assert r.out.startswith("hello") and f" {a.uid} {a.uid} " in r.out, r
    st, j = a.json("POST", "/files/rename", {"from": "deep/er/file.txt", "to": "made/f"})
    assert st == 200 and os.stat(os.path.join(a.home, "made/f")).st_uid == a.uid


def test_exec_cwd_relative_to_home(make_host_server):
    s = make_host_server()
    a = s.sandbox()
    assert a.json("POST", "/files/mkdir?path=sub/dir")[0] == 200
    for cwd in ("sub/dir", "./sub/dir/", a.home + "/sub/dir", "sub/../sub/dir", "/sub/dir"):
        r = a.run("pwd", cwd=cwd)
        assert r.out.strip() == a.home + "/sub/dir", (cwd, r)
    assert a.run("pwd").out.strip() == a.home
    assert a.run("pwd", cwd="").out.strip() == a.home
    st, j = a.exec({"cmd": "pwd", "cwd": "missing"})
    assert st == 400 and "chdir" in j["error"], j
    assert a.write("afile", b"x")[0] == 200
    st, j = a.exec({"cmd": "pwd", "cwd": "afile"})
    assert st == 400, j
    # background processes too
    j = a.start("pwd > where", cwd="sub/dir")
    assert wait_until(lambda: os.path.exists(a.home + "/sub/dir/where"))
    assert wait_until(lambda: open(a.home + "/sub/dir/where").read() == a.home + "/sub/dir\n")


# ---- idle eviction and host shutdown ---------------------------------------------------------

def test_idle_eviction(make_host_server):
    s = make_host_server()
    keep = s.sandbox()  # no idle timeout: never evicted
    t0 = time.monotonic()
    a = s.sandbox(idle_timeout_secs=1)
    assert a.run("echo hi").out == "hi\n"
    t_used = time.monotonic()
    assert wait_until(lambda: a.id not in ids_of(s.list()), 5)
    waited = time.monotonic() - t_used
    assert 0.8 <= waited <= 3.5, waited
    assert not os.path.exists(a.home)
    assert a.request("POST", "/exec", {"cmd": "id"})[0] == 403
    assert keep.id in ids_of(s.list()) and time.monotonic() - t0 > 1


def test_idle_eviction_after_timed_sandboxes_are_deleted(make_host_server):
    # The sweep walks its own list of the sandboxes with an idle timeout, newest first: the
    # newest (its head) and one in its middle are deleted by hand, and the oldest must still
    # be found and evicted, while the one without a timeout stays.
    s = make_host_server()
    keep = s.sandbox()
    old, mid, new = (s.sandbox(idle_timeout_secs=2) for _ in range(3))
    for sb in (new, mid):
        st, j = sb.delete()
        assert st == 200 and j.get("deleted") is True, j
    assert old.id in ids_of(s.list())
    assert wait_until(lambda: old.id not in ids_of(s.list()), 6)
    assert not os.path.exists(old.home)
    assert ids_of(s.list()) == {keep.id}


def test_idle_eviction_waits_for_background_processes(make_host_server):
    s = make_host_server()
    a = s.sandbox(idle_timeout_secs=1)
    j = a.start(["sleep", "3"])
    time.sleep(2.2)
    assert a.id in ids_of(s.list())  # a running process keeps it
    assert a.json("GET", f"/processes/{j['id']}")[1]["running"] is True
    t_exit = time.monotonic() + 0.8  # the sleep ends about here
    assert wait_until(lambda: a.id not in ids_of(s.list()), 6)
    assert time.monotonic() - t_exit <= 3.5
    assert uid_pids(a.uid) == []


def test_idle_eviction_waits_for_a_foreground_exec(make_host_server):
    s = make_host_server()
    a = s.sandbox(idle_timeout_secs=1)
    r = a.run("sleep 2.5; echo done")
    assert r.out == "done\n" and r.code == 0
    assert a.id in ids_of(s.list())
    assert wait_until(lambda: a.id not in ids_of(s.list()), 4)


def test_idle_eviction_waits_for_a_slow_upload(make_host_server):
    """A request in flight (here an upload trickling in over 2.5 s) is activity: the sandbox
    must not be deleted under it, and the 200 must mean the bytes are on disk."""
    s = make_host_server()
    a = s.sandbox(idle_timeout_secs=1)
    n = 25
    sock = socket.create_connection(("127.0.0.1", s.port))
    sock.settimeout(10)
    sock.sendall((f"PUT {a.path('/files/write?path=up')} HTTP/1.1\r\nHost: x\r\n"
                  f"X-Sandbox-Token: {a.token}\r\nContent-Length: {n}\r\n\r\n").encode())
    for _ in range(n):
        sock.sendall(b"x")
        time.sleep(0.1)
    resp = sock.recv(4096)
    sock.close()
    assert resp.startswith(b"HTTP/1.1 200"), resp
    assert a.id in ids_of(s.list())
    assert open(os.path.join(a.home, "up"), "rb").read() == b"x" * n
    # the end of the request counts as activity; then it is evicted as usual
    assert wait_until(lambda: a.id not in ids_of(s.list()), 4)


UNIX_HTTP_KEEPALIVE = """
import http.server, socketserver, sys
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        body = self.path.encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
socketserver.UnixStreamServer(sys.argv[1], H).serve_forever()
"""


def test_idle_eviction_waits_for_an_open_proxy_tunnel(make_host_server):
    """A client talking to a sandbox's service through the proxy (one tunnel, several requests
    over 2.5 s) is using the sandbox, even when the service was started untracked."""
    s = make_host_server()
    a = s.sandbox(idle_timeout_secs=1)
    sock_path = a.home + "/.sbx/proxy/8080.sock"
    a.run(["sh", "-c", 'setsid python3 -c "$0" "$1" </dev/null >/dev/null 2>&1 &',
           UNIX_HTTP_KEEPALIVE, sock_path])
    assert wait_until(lambda: os.path.exists(sock_path), 5)
    c = socket.create_connection(("127.0.0.1", s.port))
    c.settimeout(5)
    got = b""
    for i in range(6):
        c.sendall((f"GET {a.path('/proxy/8080/r' + str(i))} HTTP/1.1\r\nHost: x\r\n"
                   f"X-Sandbox-Token: {a.token}\r\n\r\n").encode())
        want = f"/r{i}".encode()
        while not got.endswith(want):
            chunk = c.recv(4096)
            assert chunk, (i, got)
            got += chunk
        time.sleep(0.5)
    assert a.id in ids_of(s.list())
    c.close()
    # the end of the tunnel counts as activity; then the sandbox is evicted as usual
    assert wait_until(lambda: a.id not in ids_of(s.list()), 4)
    assert uid_pids(a.uid) == []


HOLD_UNIX = """
import os, socket, sys, time
s = socket.socket(socket.AF_UNIX)
s.bind(sys.argv[1])
s.listen(64)
keep, end = [], time.time() + 40
s.settimeout(1)
while time.time() < end:  # takes every connection, never answers, never closes one
    try:
        keep.append(s.accept()[0])
    except socket.timeout:
        pass
"""


def test_one_sandboxs_port_proxy_holds_at_most_a_quarter_of_the_connections(make_host_server):
    """A sandbox's service that takes connections and never lets one go (or clients that keep
    theirs) hold tunnels, each a connection slot of the whole host: one sandbox holds at most a
    quarter of SBX_MAX_CONNECTIONS, so its siblings and the host's own calls always get in.
    Once its clients are gone the tunnels close and it may open others."""
    s = make_host_server(env={"SBX_MAX_CONNECTIONS": "16"})  # a sandbox: 4 tunnels
    a, b = s.create(2)
    sock_path = a.home + "/.sbx/proxy/8080.sock"
    a.start(["python3", "-c", HOLD_UNIX, sock_path])
    assert wait_until(lambda: os.path.exists(sock_path), 5)

    def open_tunnel(i):
        c = socket.create_connection(("127.0.0.1", s.port))
        c.settimeout(1)
        c.sendall((f"GET {a.path('/proxy/8080/t' + str(i))} HTTP/1.1\r\nHost: x\r\n"
                   f"X-Sandbox-Token: {a.token}\r\n\r\n").encode())
        try:
            return c, c.recv(4096)  # an answer: refused
        except socket.timeout:
            return c, b""  # a tunnel to the silent service

    held = [open_tunnel(i) for i in range(4)]
    assert [r for _, r in held] == [b""] * 4, held  # positive control: four tunnels are up
    c, r = open_tunnel(4)
    c.close()
    assert r.startswith(b"HTTP/1.1 503") and b"the most one sandbox may hold" in r, \
        ("ATTACK: one sandbox's port proxy took more than its share of connections", r)
    # the rest of the host is unaffected: the host token's calls, the sibling's exec
    assert a.id in ids_of(s.list())
    assert b.run("echo sibling-ok").out == "sibling-ok\n"
    for c, _ in held:
        c.close()
    # its clients gone, the silent service's tunnels close (http/proxy.c: 10 s), and A's
    # proxy takes connections again
    def reopened():
        c, r = open_tunnel(9)
        c.close()
        return r == b""
    assert wait_until(reopened, 20), "the tunnels of clients that left were never closed"


def test_one_sandbox_runs_at_most_a_quarter_of_the_background_processes(make_host_server):
    """The host runs 1,024 background processes at most: one sandbox (even with max_procs
    above that share) runs 256 of them, so its siblings can still start theirs."""
    s = make_host_server()
    a = s.sandbox(max_procs=400)
    b = s.sandbox()
    try:
        for i in range(256):
            a.start(["sleep", "60"])  # positive control: its share starts
        st, j = a.json("POST", "/processes", {"cmd": ["sleep", "60"]})
        assert st == 503 and "the most one sandbox may" in j["error"], \
            ("ATTACK: one sandbox took more than its share of background processes", st, j)
        assert b.start(["true"])["id"]  # the sibling's own start
    finally:
        assert a.delete()[0] == 200
        b.delete()


def test_host_exits_when_idle(make_host_server):
    t0 = time.monotonic()
    s = make_host_server(env={"SBX_IDLE_TIMEOUT": "2"})
    a = s.sandbox()
    time.sleep(3)
    assert s.proc.poll() is None  # positive control: a sandbox keeps the host up
    assert a.delete()[0] == 200
    t_empty = time.monotonic()
    s.proc.wait(timeout=6)
    assert s.proc.returncode == 0
    assert 1.5 <= time.monotonic() - t_empty <= 4.5
    assert time.monotonic() - t0 < 12


def test_host_exits_when_never_used(make_host_server):
    s = make_host_server(env={"SBX_IDLE_TIMEOUT": "2"})
    s.proc.wait(timeout=6)
    assert s.proc.returncode == 0
    assert not os.path.exists(s.homes) or os.listdir(s.homes) == []


# ---- Landlock floor ---------------------------------------------------------------------------

def test_landlock_floor_refuses_to_start(make_host_server):
    with pytest.raises(RuntimeError) as e:
        make_host_server(env={"SBX_MIN_LANDLOCK_ABI": "99"})
    msg = str(e.value)
    assert "SBX_MIN_LANDLOCK_ABI=99" in msg and "ABI" in msg, msg
    assert "have: fs" in msg and "--allow-unconfined" in msg, msg


def test_allow_unconfined_starts_uid_only(make_host_server):
    s = make_host_server(env={"SBX_MIN_LANDLOCK_ABI": "99"}, args=("--allow-unconfined",))
    a, b = s.create(2)
    assert a.info["confinement"] == "uid-only"
    assert [x["confinement"] for x in s.list()] == ["uid-only", "uid-only"]
    h = s.json("GET", "/health")[1]
    assert "landlock" not in h["confinement"] and "uid" in h["confinement"]
    # still uid-isolated: own uid, sibling home unreadable
    r = a.run(f"id -u; ls {b.home}; echo rc=$?")
    assert r.out.splitlines()[0] == str(a.uid) and "rc=0" not in r.out


def test_landlock_floor_default_accepts_this_kernel(make_host_server):
    s = make_host_server(env={"SBX_MIN_LANDLOCK_ABI": "6"})
    h = s.json("GET", "/health")[1]
    if h["landlock"]["abi"] < 6:
        pytest.skip("kernel Landlock ABI below 6")
    assert s.sandbox().info["confinement"] == "landlock"


@pytest.mark.parametrize("env,needle", [({"SBX_CAPACITY": "0"}, "SBX_CAPACITY"),
                                        ({"SBX_CAPACITY": "x"}, "SBX_CAPACITY"),
                                        ({"SBX_MIN_LANDLOCK_ABI": "-1"}, "SBX_MIN_LANDLOCK_ABI"),
                                        ({"SBX_HOMES_DIR": "relative/dir"}, "SBX_HOMES_DIR"),
                                        ({"SBX_HOST_MODE": "2"}, "SBX_HOST_MODE")])
def test_bad_host_config_refuses_to_start(make_host_server, env, needle):
    with pytest.raises(RuntimeError) as e:
        make_host_server(env=env)
    assert needle in str(e.value)


# ---- the mode gate and /health ----------------------------------------------------------------

DEDICATED = [("POST", "/v1/exec", {"cmd": "id"}), ("GET", "/v1/files/read?path=/etc/passwd", None),
             ("PUT", "/v1/files/write?path=/tmp/sbx-gate", b"x"), ("GET", "/v1/processes", None),
             ("POST", "/v1/processes", {"cmd": "id"}), ("GET", "/v1/proxy/8080/", None),
             ("GET", "/v1/files/list?path=/", None)]


@pytest.mark.parametrize("method,path,body", DEDICATED, ids=[p for _, p, _ in DEDICATED])
def test_dedicated_routes_in_host_mode(pool_host, method, path, body):
    a = pool_host.sandbox()
    try:
        st, _, data = pool_host.request(method, path, body)
        assert st == 404 and b"uid=0" not in data and b"root:" not in data, (st, data)
        for tok in ("", a.token, secrets.token_hex(32)):
            st, _, data = pool_host.request(method, path, body, token=False,
                                            headers={"X-Sandbox-Token": tok} if tok else {})
            assert st == 403, (tok, st, data)
        assert not os.path.exists("/tmp/sbx-gate")
        # positive control: the scoped equivalent works with the sandbox token
        st, _, _ = a.request("POST", "/exec", {"cmd": "id -u"})
        assert st == 200
    finally:
        a.delete()


def test_health(pool_host):
    a = pool_host.sandbox()
    try:
        st, h = pool_host.json("GET", "/health")
        assert st == 200 and h["mode"] == "host" and h["status"] == "ok"
        assert h["sandboxes"] == len(pool_host.list()) >= 1
        ll = h["landlock"]
        assert isinstance(ll["abi"], int) and ll["abi"] >= 1
        # an array of Hugging Face's names, one per ABI step
        assert isinstance(ll["features"], list) and ll["features"][0] == "fs"
        assert len(ll["features"]) == min(ll["abi"], 6)
        if ll["abi"] >= 6:
            assert "scope_abstract_unix" in ll["features"]
        assert {"landlock", "uid", "no_new_privs", "rlimits"} <= set(h["confinement"])
        assert h["capacity"] == 64
        st, h2 = pool_host.json("GET", "/health", token=False)
        assert st == 200 and set(h2) == {"status", "protocol"}
        st, h3 = pool_host.json("GET", "/health", token=False,
                                headers={"X-Sandbox-Token": a.token})
        assert set(h3) == {"status", "protocol"}
    finally:
        a.delete()
    assert pool_host.json("GET", "/health")[1]["sandboxes"] == len(pool_host.list())


# ---- processes are scoped per sandbox -----------------------------------------------------

def test_processes_are_scoped(make_host_server):
    s = make_host_server()
    a, b = s.create(2)
    j = a.start(["sleep", "30"], tag="a-tag")
    pid_id = j["id"]
    st, lb = b.json("GET", "/processes")
    assert st == 200 and lb == []
    for method, rest, body in [("GET", f"/processes/{pid_id}", None),
                               ("DELETE", f"/processes/{pid_id}", None),
                               ("POST", f"/processes/{pid_id}/signal", {"signal": "SIGKILL"}),
                               ("POST", f"/processes/{pid_id}/stdin", {"data": "x"}),
                               ("GET", f"/processes/{pid_id}/output?follow=false", None)]:
        st, _, data = b.request(method, rest, body)
        assert st == 404, (method, rest, st, data)
    # positive controls: A sees and controls it; it survived B's attempts
    st, la = a.json("GET", "/processes")
    assert [x["id"] for x in la] == [pid_id] and la[0]["tag"] == "a-tag"
    assert a.json("GET", f"/processes/{pid_id}")[1]["running"] is True
    st, r = a.json("DELETE", f"/processes/{pid_id}")
    assert st == 200 and r["killed"] is True
    # the host-wide process count in /health covers everyone
    b.start(["sleep", "30"])
    assert s.json("GET", "/health")[1]["processes"] >= 1
    assert [x["id"] for x in a.json("GET", "/processes")[1]] == [pid_id]


def test_deleted_sandbox_processes_are_gone(make_host_server):
    s = make_host_server()
    a, b = s.create(2)
    ja = a.start(["sleep", "30"])
    jb = b.start(["sleep", "30"])
    assert a.delete()[0] == 200
    assert not os.path.exists(f"/proc/{ja['pid']}") or uid_pids(a.uid) == []
    assert b.json("GET", f"/processes/{jb['id']}")[1]["running"] is True
    assert [x["id"] for x in b.json("GET", "/processes")[1]] == [jb["id"]]


# ---- teardown paths -----------------------------------------------------------------------------

def test_delete_during_a_streaming_exec(make_host_server):
    s = make_host_server()
    a, b = s.create(2)
    out = {}

    def stream():
        out["r"] = a.exec({"cmd": "echo started; sleep 30; echo never"})
    t = threading.Thread(target=stream)
    t.start()
    assert wait_until(lambda: len(uid_pids(a.uid)) >= 2, 3)
    t0 = time.monotonic()
    assert a.delete()[0] == 200
    t.join(timeout=10)
    assert not t.is_alive() and time.monotonic() - t0 < 5
    st, ev = out["r"]
    assert st == 200 and ev[-1]["event"] == "exit" and ev[-1]["signal"] == 9, ev
    assert not any(e.get("data") == "never\n" for e in ev)
    assert uid_pids(a.uid) == []
    assert b.run("echo ok").out == "ok\n"


def test_recycled_uid_gets_the_new_sandboxes_limits(make_host_server):
    s = make_host_server(env={"SBX_CAPACITY": "1"})
    a = s.sandbox(max_mem_mb=64, max_procs=8)
    r = a.py("b = bytearray(200 << 20); print('big-ok')")
    assert "big-ok" not in r.out  # A's limit holds
    assert a.delete()[0] == 200
    s.homes_settled()  # the uid goes back to the warm set with its home, on top
    b = s.sandbox()  # the same uid, recycled, with the default limits
    assert b.uid == a.uid
    r = b.py("b = b'x' * (200 << 20); print('big-ok')")
    assert r.out == "big-ok\n", r
    r = b.run("for i in $(seq 20); do sleep 1 & done; wait; echo forked")
    assert r.out == "forked\n", r


def test_shutdown_deletes_every_sandbox(make_host_server):
    s = make_host_server()
    a, b = s.create(2)
    a.run("setsid sleep 1000 </dev/null >/dev/null 2>&1 &")
    b.start(["sleep", "1000"])
    assert uid_pids(a.uid) and uid_pids(b.uid)
    # a request in flight at shutdown (it holds its sandbox past the pool's teardown)
    sock = socket.create_connection(("127.0.0.1", s.port))
    sock.sendall((f"PUT {a.path('/files/write?path=up')} HTTP/1.1\r\nHost: x\r\n"
                  f"X-Sandbox-Token: {a.token}\r\nContent-Length: 100\r\n\r\nhalf").encode())
    time.sleep(0.2)
    s.proc.terminate()
    s.proc.wait(timeout=10)
    assert s.proc.returncode == 0
    sock.close()
    assert uid_pids(a.uid) == [] and uid_pids(b.uid) == []
    assert os.listdir(s.homes) == []


def test_two_hosts_on_one_kernel_never_share_a_uid(make_host_server):
    """Two pool hosts on one machine (tests, benchmarks, a restarted host beside an old one):
    a uid one hands out is never handed out by the other, so neither's teardown (a kill of
    every process of the uid) nor its sandboxes can reach the other's."""
    h1 = make_host_server()
    h2 = make_host_server()
    a1 = h1.create(3)
    a2 = h2.create(3)
    assert not ({x.uid for x in a1} & {x.uid for x in a2}), ([x.uid for x in a1],
                                                             [x.uid for x in a2])
    j = a1[0].start(["sleep", "30"])
    for sb in a2:
        sb.run("true")
        assert sb.delete()[0] == 200
    assert a1[0].json("GET", f"/processes/{j['id']}")[1]["running"] is True
    # released uids go back to the host that released them, still never to both at once
    b2 = h2.create(3)
    assert not ({x.uid for x in a1} & {x.uid for x in b2})
