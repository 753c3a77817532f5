# SPDX-License-Identifier: MIT
"""Pool host teardown of a home: the short path for a home as create made it (four rmdirs by
descriptor) and the full walk it hands over to when the sandbox changed the layout. Whatever the
sandbox planted, delete removes the home, never anything outside it, and recycles the uid."""
import os
import shutil
import tempfile
import time

import pytest

from conftest import Sandbox, homes_in, uid_pids, wait_until


@pytest.fixture
def outside():
    """A root-owned directory outside every home, holding an empty directory named like each
    entry of the layout, so that following a planted link would find something to remove."""
    d = tempfile.mkdtemp(prefix="sbx-outside-")
    for name in ("proxy", ".tmp", ".sbx", "empty"):
        os.mkdir(os.path.join(d, name))
    yield d
    shutil.rmtree(d, ignore_errors=True)


def quarantined(host):
    return host.json("GET", "/health")[1]["uids"]["quarantined"]


def delete_and_check(host, sb, before):
    st, j = sb.delete()
    assert (st, j) == (200, {"id": sb.id, "deleted": True})
    assert not os.path.exists(sb.home)
    assert quarantined(host) == before  # teardown converged: the uid is recycled
    host.homes_settled()  # with a home made (or taken over) for it, next in the warm set


def test_pristine_home_is_removed(pool_host):
    q = quarantined(pool_host)
    a = pool_host.sandbox()
    for rel in (".tmp", ".sbx", ".sbx/proxy"):  # the layout the short path expects
        assert os.path.isdir(os.path.join(a.home, rel)), rel
    delete_and_check(pool_host, a, q)
    b = pool_host.sandbox()  # the recycled uid works in a fresh home
    try:
        assert b.uid == a.uid and b.run("ls -A").out.split() == [".sbx", ".tmp"]
    finally:
        b.delete()


def test_pristine_home_after_an_exec_is_removed(pool_host):
    q = quarantined(pool_host)
    a = pool_host.sandbox()
    assert a.run("true").code == 0
    delete_and_check(pool_host, a, q)


def test_files_left_in_the_home_are_removed(pool_host):
    q = quarantined(pool_host)
    a = pool_host.sandbox()
    r = a.run("echo x > top && echo y > .tmp/t && mkdir -p a/b && echo z > a/b/c && "
              "echo w > .sbx/proxy/f")
    assert r.code == 0, r
    delete_and_check(pool_host, a, q)


@pytest.mark.parametrize("entry,target", [
    (".sbx", ""),             # the short path opens .sbx with O_NOFOLLOW
    (".tmp", "empty"),        # rmdir of a link fails; the link is unlinked, not followed
    (".sbx/proxy", "proxy"),  # rmdir of .sbx/proxy, a link in a real directory
])
def test_planted_link_is_never_followed(pool_host, outside, entry, target):
    q = quarantined(pool_host)
    a = pool_host.sandbox()
    dest = os.path.join(outside, target) if target else outside
    r = a.run(["sh", "-c", 'rm -rf "$1" && ln -s "$2" "$1"', "sh", entry, dest])
    assert r.code == 0, r
    link = os.path.join(a.home, entry)
    # positive control: the link is there, and following it reaches an empty directory that a
    # teardown following links would remove
    assert os.path.islink(link) and os.path.realpath(link) == os.path.realpath(dest)
    assert os.path.isdir(os.path.join(link, "proxy") if entry == ".sbx" else link)
    delete_and_check(pool_host, a, q)
    for name in ("proxy", ".tmp", ".sbx", "empty"):
        assert os.path.isdir(os.path.join(outside, name)), name


def test_missing_layout_entries(pool_host):
    q = quarantined(pool_host)
    a = pool_host.sandbox()
    assert a.run("rmdir .sbx/proxy .tmp").code == 0
    delete_and_check(pool_host, a, q)


def test_exec_with_many_server_descriptors(make_host_server):
    """Every confined child starts with a copy of the server's descriptors (an idle sandbox
    holds one, its network namespace; the ones used last a few more; each connection one): its
    limits, RLIMIT_NOFILE 4096 among them, must not refuse the child its own steps."""
    import resource
    import socket
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 8192)), hard))
    s = make_host_server(env={"SBX_CAPACITY": "2200", "SBX_MAX_CONNECTIONS": "5000"})
    many = s.create(2100)
    conns = []
    try:
        for _ in range(2200):  # idle connections: a descriptor each in the server
            conns.append(socket.create_connection(("127.0.0.1", s.port)))
        fds = 0
        for _ in range(50):
            fds = len(os.listdir(f"/proc/{s.proc.pid}/fd"))
            if fds > 4096 + 64:
                break
            time.sleep(0.1)
        assert fds > 4096 + 64, fds  # vacuity guard: more than the sandbox's descriptor limit
        r = many[-1].run("ulimit -n; true")
        assert (r.code, r.out) == (0, "4096\n"), r  # the limit still holds in the sandbox
    finally:
        for c in conns:
            c.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    st, j = s.json("DELETE", "/v1/sandboxes")
    assert (st, j) == (200, {"deleted": 2100})


def test_uid_whose_processes_survive_the_kill_is_quarantined(make_host_server):
    """Teardown's kill made to fail on purpose (the test knob SBX_TEST_TEARDOWN_KILL_FAILS=1
    skips it): the sandbox's process really survives, delete reports it, and the uid is
    quarantined, never handed to the next sandbox while that process lives."""
    host = make_host_server(env={"SBX_TEST_TEARDOWN_KILL_FAILS": "1"})
    a = host.sandbox()
    uid = a.uid
    try:
        r = a.run("setsid sleep 1000 </dev/null >/dev/null 2>&1 &")
        assert r.code == 0, r
        assert wait_until(lambda: uid_pids(uid), 3), "the background process did not start"
        q = quarantined(host)
        st, j = a.delete()
        assert st == 500 and "survived the kill" in (j or {}).get("error", ""), (st, j)
        # positive control: the process did outlive the teardown
        assert uid_pids(uid), "the kill was not made to fail: nothing of the uid survived"
        assert quarantined(host) == q + 1, \
            f"uid quarantine: uid {uid} was recycled although its processes survived the kill"
        b = host.sandbox()
        try:
            assert b.uid != uid, \
                f"uid quarantine: the next sandbox got uid {uid}, whose processes still run"
        finally:
            b.delete()
    finally:
        for pid in uid_pids(uid):
            try:
                os.kill(pid, 9)
            except OSError:
                pass


def test_create_that_runs_out_of_descriptors_leaves_nothing_behind(make_host_server):
    """A create that fails because the host's descriptor table is full (EMFILE) removes what it
    had made: no half-made home stays behind and its uid is not quarantined (nothing ran as
    it); the host serves again once descriptors are free."""
    import resource

    def low_nofile():
        resource.setrlimit(resource.RLIMIT_NOFILE, (200, 200))

    # an idle sandbox holds one descriptor: more than 200 would fit the capacity's default
    host = make_host_server(env={"SBX_CAPACITY": "400"}, popen_kw={"preexec_fn": low_nofile})
    made, refused = [], None
    for _ in range(300):
        st, j = host.create_raw({"count": 1})
        if st != 200:
            refused = (st, j)
            break
        made.extend(j["sandboxes"])
    assert refused and refused[0] == 500 and "Too many open files" in refused[1]["error"], \
        (len(made), refused)  # positive control: the table did fill
    assert made, "not a single sandbox fitted"
    assert quarantined(host) == 0, host.json("GET", "/health")
    homes = sorted(e.split("/")[-1] for e in homes_in(host.homes) if not e.startswith("."))
    ids = sorted(s["id"] for s in made)
    assert homes == ids or set(ids) <= set(homes) and len(homes) == len(ids), \
        ("a half-made home was left behind", homes, ids)
    # descriptors freed: a create works again
    st, _ = Sandbox(host, made[0]).json("DELETE", "")
    assert st == 200
    st, j = host.create_raw({"count": 1})
    assert st == 200, j


def test_idle_sandboxes_hold_one_descriptor_and_reopen_their_handles(make_host_server):
    """Under a small descriptor table (RLIMIT_NOFILE 8192: handles for 256 sandboxes) an idle
    sandbox holds its network namespace only; one whose handles were closed opens them again
    when used, and its confinement is the same: from inside, a world-writable file outside the
    home stays refused (Landlock, from a ruleset made again), the home works."""
    import resource

    def nofile_8192():
        resource.setrlimit(resource.RLIMIT_NOFILE, (8192, 8192))

    host = make_host_server(env={"SBX_CAPACITY": "1000"}, popen_kw={"preexec_fn": nofile_8192})
    h = host.json("GET", "/health")[1]
    assert h["handles"]["max"] == 256, h["handles"]
    fds0 = len(os.listdir(f"/proc/{host.proc.pid}/fd"))
    many = host.create(900)
    fds1 = len(os.listdir(f"/proc/{host.proc.pid}/fd"))
    per = (fds1 - fds0 - 256 * 2) / 900  # the 256 used last keep home + ruleset
    netns = "netns" in h["confinement"]
    assert per <= (1.1 if netns else 0.1), (fds0, fds1, per)
    first = many[0]  # its handles were closed long ago
    path = os.path.join("/tmp", "sbx-ww-" + first.id)
    with open(path, "w") as f:
        f.write("orig\n")
    os.chmod(path, 0o666)
    try:
        r = first.run(f"echo planted >> {path}; echo rc=$?; echo y > $HOME/f && cat $HOME/f")
        assert "rc=0" not in r.out, f"ATTACK: a reopened sandbox wrote outside its home: {r}"
        with open(path) as f:
            assert f.read() == "orig\n"
        assert r.out.endswith("y\n"), r  # positive control: the home works
    finally:
        os.unlink(path)
    h = host.json("GET", "/health")[1]["handles"]
    assert h["reopened"] >= 1 and h["open"] <= 256, h  # vacuity guard: it was reopened
    # the home is opened again by name: the sandbox cannot move it aside (or put a link in its
    # place) for the next open to find; positive control: a move inside the home works
    r = first.run("mv $HOME $HOME.x; echo rc=$?; ln -s / $HOME.y; echo rc=$?; "
                  "mkdir $HOME/d && mv $HOME/d $HOME/e && echo moved")
    assert "rc=0" not in r.out and r.out.endswith("moved\n"), f"ATTACK: home moved: {r}"
    assert not os.path.exists(first.home + ".x") and not os.path.lexists(first.home + ".y")
    # a file request reopens a home too (another sandbox whose handles were closed)
    st, _, _ = many[1].write("g", b"z")
    assert st == 200 and open(os.path.join(many[1].home, "g"), "rb").read() == b"z"
    assert os.stat(os.path.join(many[1].home, "g")).st_uid == many[1].uid
    assert host.json("GET", "/health")[1]["handles"]["reopened"] > h["reopened"]
    st, j = host.json("DELETE", "/v1/sandboxes")
    assert (st, j) == (200, {"deleted": 900})
