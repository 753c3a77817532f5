# SPDX-License-Identifier: MIT
"""A delete moves the home into <homes>.trash with one rename and the janitor (a helper process
with three descriptors of its own) empties it off the loop; a create renames a home the janitor
made ahead in <homes>.warm for a uid, with that uid: the home is gone from the homes directory when
the delete answers, the trash is root-only and out of every sandbox's reach, and a stopped or
killed janitor only delays the removal (a new one sweeps what is left)."""
import os
import shutil
import signal
import stat
import tempfile
import threading
import time

import pytest

from conftest import POOL_UID_BASE, SERVER_BIN, homes_in, small_ext4, uid_pids, wait_until
from test_envd import fs as envd_fs, sandbox_envd
from test_spawner import children_named, nfds

MAKE_TREE = ("import os\nfor i in range(50):\n    os.makedirs(f't/{i}/a/b', exist_ok=True)\n"
             "    open(f't/{i}/a/b/f', 'w').write('x' * 100)\nprint('made')")


def trash_of(srv):
    return srv.homes.rstrip("/") + ".trash"


def trash_in(srv):
    """What the trash holds: its entries, and those the remover has taken into its own
    directory there (.removing) and is removing."""
    t = trash_of(srv)
    top = os.listdir(t)
    own = os.listdir(os.path.join(t, ".removing")) if ".removing" in top else []
    return sorted([n for n in top if n != ".removing"] + own)


def janitor(srv):
    js = wait_until(lambda: children_named(srv.proc.pid, "sbx-janitor"), 5)
    assert len(js) == 1, js
    return js[0]


def test_the_trash_is_root_only_and_the_janitor_holds_few_descriptors(make_host_server):
    srv = make_host_server()
    # the socket listens before the pool is set up: ask once, then look
    assert srv.request("GET", "/health")[0] == 200
    st = os.stat(trash_of(srv))
    assert stat.S_ISDIR(st.st_mode) and st.st_uid == 0 and stat.S_IMODE(st.st_mode) == 0o700
    assert os.stat(trash_of(srv)).st_dev == os.stat(srv.homes).st_dev
    j = janitor(srv)

    def quiet():  # no home or namespace being made: none held to be sent
        h = srv.json("GET", "/health")[1]
        return h["homes"]["making"] == 0 and h.get("netns", {}).get("making", 0) == 0
    assert wait_until(quiet, 10)
    # stdio, its socket, the trash and the warm directories, the remover's pipe (and one it
    # may be working in)
    assert nfds(j) <= 8, os.listdir(f"/proc/{j}/fd")
    (rm,) = children_named(j, "sbx-remover")
    # stdio, the socket, the trash, its own directory there, the pipe (and one it works in)
    assert nfds(rm) <= 8, os.listdir(f"/proc/{rm}/fd")
    a = srv.sandbox()
    # from inside: its own home lists (positive control), the trash does not
    r = a.run(["ls", a.home])
    assert r.code == 0, r
    r = a.run(["ls", trash_of(srv)])
    assert r.code != 0 and "ermission denied" in r.err, r
    srv.stop()
    assert not os.path.exists(trash_of(srv))  # removed at shutdown
    assert not os.path.exists(srv.homes.rstrip("/") + ".warm")


def test_creates_take_homes_made_ahead_with_their_uid(make_host_server):
    srv = make_host_server()
    warm = srv.homes.rstrip("/") + ".warm"

    def filled():
        h = srv.json("GET", "/health")[1]["homes"]
        return h["warm"] >= 2 and h["making"] == 0
    assert wait_until(filled, 10)
    st = os.stat(warm)
    assert st.st_uid == 0 and stat.S_IMODE(st.st_mode) == 0o700
    made = {}
    for n in os.listdir(warm):
        s = os.stat(os.path.join(warm, n))
        made[s.st_uid] = n
    assert made  # positive control: homes wait there, each its uid's, the uid in no one's use
    h = srv.json("GET", "/health")[1]
    assert h["uids"]["used"] == h["homes"]["warm"] == len(made), h  # held by the warm set
    for uid, n in list(made.items())[:3]:
        for rel in ("", ".tmp", ".sbx", ".sbx/proxy"):
            w = os.lstat(os.path.join(warm, n, rel))
            assert (w.st_uid, w.st_gid) == (uid, uid) and stat.S_IMODE(w.st_mode) == 0o700, \
                (rel, w)
        assert uid_pids(uid) == []
    before = srv.json("GET", "/health")[1]["homes"]["from_warm"]
    a, b = srv.create(2)
    assert srv.json("GET", "/health")[1]["homes"]["from_warm"] == before + 2
    for sb in (a, b):
        assert sb.uid in made  # a home made ahead, taken with its uid
        for rel in ("", ".tmp", ".sbx", ".sbx/proxy"):
            s = os.lstat(os.path.join(sb.home, rel))
            assert stat.S_ISDIR(s.st_mode) and stat.S_IMODE(s.st_mode) == 0o700, (rel, s)
            assert (s.st_uid, s.st_gid) == (sb.uid, sb.uid), (rel, s)
        assert sorted(os.listdir(sb.home)) == [".sbx", ".tmp"]
        r = sb.run("touch ~/x && ls -ld ~ | cut -d' ' -f1,3")
        assert r.code == 0 and r.out.startswith("drwx------"), r
        # the other uids' homes wait out of its reach (positive control: its own home lists)
        r = sb.run(["ls", warm])
        assert r.code != 0 and "ermission denied" in r.err, r
    assert a.delete()[0] == 200 and b.delete()[0] == 200
    assert homes_in(srv.homes) == []
    # the deleted homes go back to the warm set with their uids: no uid is held twice
    assert wait_until(lambda: srv.json("GET", "/health")[1]["homes"]["making"] == 0, 10)
    owners = [os.stat(os.path.join(warm, n)).st_uid for n in os.listdir(warm)]
    assert len(owners) == len(set(owners)) and {a.uid, b.uid} <= set(owners), owners


def test_a_delete_renames_the_home_away_and_the_janitor_empties_it(make_host_server):
    srv = make_host_server()
    a = srv.sandbox()
    assert a.py(MAKE_TREE).out == "made\n"
    j = janitor(srv)
    os.kill(j, signal.SIGSTOP)
    try:
        st, res = a.delete()
        assert (st, res) == (200, {"id": a.id, "deleted": True})
        assert not os.path.exists(a.home) and homes_in(srv.homes) == []
        # the tree waits in the trash (the janitor is stopped): the delete did not walk it
        left = trash_in(srv)
        assert len(left) == 1 and left[0].startswith(a.id), left
        assert os.path.exists(os.path.join(trash_of(srv), left[0], "t/49/a/b/f"))
        _, h = srv.json("GET", "/health")
        assert h["uids"]["quarantined"] == 0, h
    finally:
        os.kill(j, signal.SIGCONT)
    assert wait_until(lambda: trash_in(srv) == [], 10), trash_in(srv)


@pytest.mark.parametrize("api", ["files", "envd"])
def test_a_files_api_delete_of_a_tree_renames_it_away_and_the_janitor_empties_it(
        make_host_server, api):
    """DELETE .../files/delete?recursive=true of a directory (or envd's Remove) moves it into
    the trash with one rename and the janitor empties it, off the loop (a tree emptied on the
    loop held every request of the host for seconds): with the janitor stopped the delete still
    answers, the tree is gone from the sandbox and waits whole in the trash; a symlink in it is
    removed, its target outside is not touched."""
    srv = make_host_server()
    a = srv.sandbox()
    assert a.py(MAKE_TREE + "\nos.symlink('/etc/hostname', 't/out')").out == "made\n"
    j = janitor(srv)
    os.kill(j, signal.SIGSTOP)
    try:
        if api == "files":
            st, _, body = a.request("DELETE", "/files/delete?path=/t&recursive=true")
        else:
            st, body = envd_fs(sandbox_envd(a), "Remove", {"path": "/t"})
        assert st == 200, (st, body)
        assert not os.path.lexists(a.home + "/t")
        left = [n for n in trash_in(srv) if n.startswith(a.id + "-f")]
        assert len(left) == 1, ("the delete walked the tree on the loop",
                                trash_in(srv))
        assert os.path.exists(os.path.join(trash_of(srv), left[0], "49/a/b/f")), \
            "the delete walked the tree on the loop"
        assert a.run("ls").code == 0  # the sandbox goes on
    finally:
        os.kill(j, signal.SIGCONT)
    assert wait_until(lambda: not [n for n in trash_in(srv)
                                   if n.startswith(a.id + "-f")], 10), trash_in(srv)
    assert os.path.exists("/etc/hostname")  # the symlink's target
    # a file (not a tree) and a directory without recursive are removed in place, as before
    assert a.write("f", b"x")[0] == 200
    assert a.request("DELETE", "/files/delete?path=/f")[0] == 200
    assert not os.path.exists(a.home + "/f")


# In the sandbox: atk/ holds the remover's old teardown names (files), a payload, and a chain
# of 300 directories (deeper than a removal walks) whose first name comes first in atk's readdir
# order, so that a removal gives up before anything else (names tried until one does).
DEEP_WITH_BLOCKERS = """
import os
X = os.path.abspath("atk")
os.mkdir(X)
for i in range(2048):
    open(os.path.join(X, ".sbx-teardown-%d" % i), "w").close()
open(os.path.join(X, "payload"), "w").write("x" * 100000)
win = None
for batch in range(40):
    names = ["k%d" % (batch * 500 + i) for i in range(500)]
    for n in names:
        open(os.path.join(X, n), "w").close()
    first = next(iter(os.listdir(X)))
    for n in names:
        if n != first:
            os.unlink(os.path.join(X, n))
    if first.startswith("k"):
        win = first
        break
assert win, "no name came first"
os.unlink(os.path.join(X, win))
os.makedirs(os.path.join(X, win, *(["d"] * 299)))
assert next(iter(os.listdir(X))) == win
print("made")
"""


def test_a_tree_with_the_teardown_names_made_ahead_is_still_removed(make_host_server):
    """A chain deeper than a removal walks is taken apart by moving every 128th level to the
    top of the tree under a name of the remover's; a tenant that made those names ahead (as
    files) made every move "succeed" without moving, and the tree was never removed (found by a
    red-team pass). Positive control: the delete answers and the tree leaves the sandbox."""
    srv = make_host_server()
    a = srv.sandbox()
    r = a.py(DEEP_WITH_BLOCKERS)
    assert r.out == "made\n", r
    st, _, body = a.request("DELETE", "/files/delete?path=/atk&recursive=true")
    assert st == 200, (st, body)
    assert not os.path.lexists(a.home + "/atk")
    assert wait_until(lambda: trash_in(srv) == [], 60), ("the tree was never removed",
                                                         trash_in(srv))


@pytest.mark.skip_ok("needs network namespaces")
def test_the_janitor_answers_before_a_long_removal(make_host_server):
    # Removals run in the janitor's own child (the remover), so that a long one (a tree may take
    # seconds) never holds a home or a namespace back. The janitor is stopped while a deleted
    # sandbox's namespace check, its fresh home and the removal of its touched home (30,000
    # files) wait; once going again, both answers must come while the removal still runs.
    srv = make_host_server()
    if "netns" not in srv.json("GET", "/health")[1]:
        pytest.skip("no network namespaces here")
    a = srv.sandbox()
    r = a.py("import os\nos.mkdir('m')\nfor i in range(30000):\n    os.close(os.open(f'm/{i}', "
             "os.O_CREAT | os.O_WRONLY))\nprint('made')", timeout=120)
    assert r.out == "made\n", r
    assert wait_until(lambda: srv.json("GET", "/health")[1]["homes"]["making"] == 0, 10)
    j = janitor(srv)
    assert len(children_named(j, "sbx-remover")) == 1
    os.kill(j, signal.SIGSTOP)
    try:
        # stopped before the delete, so that the requests wait for it together
        assert wait_until(lambda: open(f"/proc/{j}/stat").read().rsplit(")", 1)[1].split()[0]
                          == "T", 5)
        assert a.delete()[0] == 200
        h = srv.json("GET", "/health")[1]
        assert h["netns"]["checking"] == 1 and h["homes"]["making"] == 1, h
        assert [n for n in trash_in(srv) if n.startswith(a.id)]
    finally:
        os.kill(j, signal.SIGCONT)

    def answered():
        h = srv.json("GET", "/health")[1]
        return (h["netns"]["checking"], h["homes"]["making"]) == (0, 0)
    assert wait_until(answered, 10)
    left = [n for n in trash_in(srv) if n.startswith(a.id)]
    assert left, "the answers were held back behind the removal"
    # positive control: the removal ends too
    assert wait_until(lambda: trash_in(srv) == [], 60), trash_in(srv)


def test_removals_wait_while_deletes_keep_coming(make_host_server):
    # A removal makes the filesystem's next inodes dearer and, on ext4 with discard, waits for
    # the disk (janitor.c: the remover): put off while deletes come (less than 100 ms apart),
    # then done.
    srv = make_host_server()
    sbs = srv.create(24)
    for sb in sbs:
        assert sb.run("true").code == 0
    for sb in sbs:
        assert sb.delete()[0] == 200
    left = trash_in(srv)
    assert len(left) >= 18, left  # most still there right after the burst
    # positive control: all removed once the deletes stopped
    assert wait_until(lambda: trash_in(srv) == [], 10), trash_in(srv)


@pytest.mark.parametrize("full", ["blocks", "inodes"])
def test_removals_go_at_once_on_a_filesystem_nine_tenths_full(make_host_server, full):
    """Put off while deletes keep coming, except when the homes' filesystem has a tenth or
    less of its blocks or inodes left: then each tree is removed as soon as it is named (its
    space is what the next creates need). The same burst as above (20 ms apart) on a small
    ext4 whose blocks or inodes are 95 % used; the test above, on a roomy filesystem, is the
    positive control."""
    with small_ext4("-m", "0", "-N", "1024") as mnt:
        homes = os.path.join(mnt, "h")
        os.mkdir(homes, 0o711)
        os.chmod(homes, 0o711)
        srv = make_host_server(env={"SBX_HOMES_DIR": homes, "SBX_CAPACITY": "32"})
        srv.homes = homes
        sbs = srv.create(24)
        for sb in sbs:
            assert sb.run("true").code == 0
        st = os.statvfs(mnt)
        if full == "blocks":
            fill = (st.f_bavail - st.f_blocks // 20) * st.f_frsize  # 5 % left
            with open(os.path.join(mnt, "filler"), "wb") as f:
                f.write(b"\0" * fill)
                os.fsync(f.fileno())
        else:
            os.mkdir(os.path.join(mnt, "filler"))
            for i in range(st.f_favail - st.f_files // 20):
                open(os.path.join(mnt, "filler", str(i)), "w").close()
        st = os.statvfs(mnt)
        assert (st.f_bavail if full == "blocks" else st.f_favail) < (
            st.f_blocks if full == "blocks" else st.f_files) // 10, st
        for sb in sbs:  # 20 ms apart: a pause the remover would not wait for, time to remove
            assert sb.delete()[0] == 200
            time.sleep(0.02)
        left = trash_in(srv)
        assert len(left) <= 4, f"removals put off on a full filesystem: {left}"
        assert wait_until(lambda: trash_in(srv) == [], 10), trash_in(srv)


def test_removals_go_at_once_past_a_backlog_of_1024(make_host_server):
    """Put off while deletes keep coming, except past 1,024 trees waiting: then one goes for
    each one named (as fast as the remover keeps up). 1,400 directories deleted one after
    another through the files API (each a rename into the trash), within the 5 s a tree may
    wait: many of the 376 past the backlog are gone when the burst ends. The burst of 24 above,
    all still waiting right after, is the positive control for the deferral itself."""
    srv = make_host_server()
    (a,) = srv.create(1)
    n = 1400
    r = a.run(["sh", "-c", f"i=0; while [ $i -lt {n} ]; do mkdir d$i; i=$((i+1)); done"])
    assert r.code == 0, r
    start = time.monotonic()
    for i in range(n):
        st, _, body = a.request("DELETE", f"/files/delete?path=/d{i}&recursive=true")
        assert st == 200, (i, st, body)
    took = time.monotonic() - start
    left = len(trash_in(srv))
    assert wait_until(lambda: trash_in(srv) == [], 20), len(trash_in(srv))
    if took >= 4.5:  # the 5 s bound removed the first ones anyway: this run tells nothing
        pytest.skip(f"{n} deletes took {took:.1f} s here, near the 5 s bound")
    assert left <= n - 100, f"removals put off past the backlog: {left} of {n} waiting"


def test_a_tenant_deleting_all_the_time_cannot_hold_a_siblings_removal(make_host_server):
    """The remover waits for a pause in deletes, but no tree waits more than 5 s: a tenant that
    deletes an empty directory every 40 ms (never a pause) kept every sibling's deleted home
    waiting as long as it went on (a red-team pass). B's home must be gone while A still goes
    on (the churn runs 20 s)."""
    srv = make_host_server()
    a, b = srv.create(2)
    assert b.write("data", b"x" * 100000)[0] == 200
    stop = threading.Event()
    churned = []

    def churn():
        deadline = time.monotonic() + 20
        while not stop.is_set() and time.monotonic() < deadline:
            a.request("POST", "/files/mkdir?path=/e")
            st, _, _ = a.request("DELETE", "/files/delete?path=/e&recursive=true")
            churned.append(st)
            time.sleep(0.04)
    t = threading.Thread(target=churn)
    t.start()
    try:
        time.sleep(0.5)
        assert b.delete()[0] == 200
        gone = wait_until(lambda: not [n for n in trash_in(srv) if n.startswith(b.id)]
                          or not t.is_alive(), 25, 0.1)
        assert gone and t.is_alive(), ("a sibling's churn held B's removal", trash_in(srv))
        assert churned and all(st == 200 for st in churned), churned  # the churn went on
    finally:
        stop.set()
        t.join()


def test_homes_an_earlier_run_left_are_removed_at_start(make_host_server):
    # A host killed (or a paused pool-host run resumed from its kept disk) leaves its sandboxes'
    # homes in the shards, owned by uids the next run hands out again: the next run removes
    # them before it makes any sandbox.
    base = tempfile.mkdtemp(prefix="sbx-left-")
    try:
        os.chmod(base, 0o711)
        homes = os.path.join(base, "homes")
        env = {"SBX_HOMES_DIR": homes, "SBX_POOL_UID_BASE": str(POOL_UID_BASE),
               "SBX_POOL_UID_COUNT": "2", "SBX_CAPACITY": "2"}
        s1 = make_host_server(env=env)
        (a,) = s1.create(1)
        assert a.write("secret", b"OLD-TENANT-SECRET")[0] == 200
        s1.proc.kill()
        s1.proc.wait()
        assert wait_until(lambda: not uid_pids(a.uid), 5)
        # positive control: the home and its file outlive the killed host
        assert open(os.path.join(a.home, "secret"), "rb").read() == b"OLD-TENANT-SECRET"
        s2 = make_host_server(env=env)
        assert not os.path.exists(a.home), os.listdir(os.path.dirname(a.home))
        b, c = s2.create(2)
        assert a.uid in (b.uid, c.uid)  # the uid is handed out again, its old home gone
        trash = homes + ".trash"
        assert wait_until(lambda: set(os.listdir(trash)) <= {".removing"}, 10), os.listdir(trash)
        s2.stop()
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_a_killed_janitor_is_replaced_and_its_leftovers_swept(make_host_server):
    srv = make_host_server()
    a, b = srv.create(2)
    assert a.py(MAKE_TREE).out == "made\n"
    j = janitor(srv)
    os.kill(j, signal.SIGSTOP)
    assert a.delete()[0] == 200
    assert len(trash_in(srv)) == 1  # left behind by the janitor about to die
    os.kill(j, signal.SIGKILL)
    assert wait_until(lambda: not children_named(srv.proc.pid, "sbx-janitor"), 5)
    time.sleep(0.2)  # the server has reaped it
    assert b.delete()[0] == 200  # starts a new janitor, which sweeps both
    j2 = janitor(srv)
    assert j2 != j
    assert wait_until(lambda: trash_in(srv) == [], 10), trash_in(srv)
    assert homes_in(srv.homes) == []


def test_homes_are_made_ahead_only_with_uids_to_spare(make_host_server):
    """A uid goes to a home made ahead only while more uids are free than creates the
    capacity still allows: with as many uids as capacity none is, and a create of all of them
    at once gets them all (a uid held for a home being made would have refused one)."""
    srv = make_host_server(env={"SBX_CAPACITY": "4", "SBX_POOL_UID_COUNT": "4"})
    time.sleep(0.5)  # time the janitor would take to make some
    assert srv.json("GET", "/health")[1]["homes"]["warm"] == 0
    sbs = srv.create(4)
    assert len({sb.uid for sb in sbs}) == 4
    for sb in sbs:
        assert sb.delete()[0] == 200
    # positive control: with uids to spare (the default range) homes wait ahead
    other = make_host_server(env={"SBX_CAPACITY": "4"})
    assert wait_until(lambda: other.json("GET", "/health")[1]["homes"]["warm"] > 0, 10)


@pytest.mark.parametrize("inherited", range(6))
@pytest.mark.parametrize("mode", ["landlock", "uid-only"])
def test_the_janitor_gets_its_directories_whatever_the_descriptor_numbers(make_host_server,
                                                                          tmp_path, inherited,
                                                                          mode):
    # The janitor moves its socket and directories to descriptors 3, 4 and 5. Where the
    # server holds them decides which numbers are free for the move, so the server starts with
    # 0 to 5 descriptors inherited (all its own ones shift up), with Landlock or without (fewer
    # of its own): whichever the numbers, the warm homes are made in the warm directory and the
    # trash stays empty.
    wrap = tmp_path / "server.sh"
    opens = " ".join(f"{3 + i}</dev/null" for i in range(inherited))
    wrap.write_text(f"#!/bin/sh\nexec {opens} {SERVER_BIN} \"$@\"\n" if opens else
                    f"#!/bin/sh\nexec {SERVER_BIN} \"$@\"\n")
    wrap.chmod(0o755)
    uid_only = {"env": {"SBX_MIN_LANDLOCK_ABI": "99"}, "args": ("--allow-unconfined",)}
    srv = make_host_server(binary=str(wrap), **(uid_only if mode == "uid-only" else {}))
    warm = srv.homes.rstrip("/") + ".warm"

    def filled():
        h = srv.json("GET", "/health")[1]["homes"]
        return h["making"] == 0 and h["warm"] > 0 and h
    h = wait_until(filled, 10)
    assert h, srv.json("GET", "/health")[1]
    assert len(os.listdir(warm)) == h["warm"], (os.listdir(warm), h)
    assert trash_in(srv) == [], "the janitor made the warm homes in the trash"
    before = h["from_warm"]
    a = srv.sandbox()  # positive control: a create takes one
    assert srv.json("GET", "/health")[1]["homes"]["from_warm"] == before + 1
    assert a.run("id -u").out.strip() == str(a.uid)
