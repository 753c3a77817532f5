# SPDX-License-Identifier: MIT
"""Process creation off the event loop (src/server/spawner.c): spawn helpers with tiny file
tables start the commands; the loop answers while a spawn is stuck; a helper that dies fails
what it had in flight with a clear error (nothing runs in its place) and is replaced; a sandbox
deleted while its command is being started gets no process that outlives the delete."""
import os
import signal
import threading
import time

import pytest

from conftest import uid_pids, wait_until


def children_named(ppid, comm):
    found = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                st = f.read()
        except OSError:
            continue
        name = st[st.index("(") + 1:st.rindex(")")]
        fields = st[st.rindex(")") + 2:].split()
        if name == comm and int(fields[1]) == ppid and fields[0] != "Z":
            found.append(int(d))
    return sorted(found)


def helpers(srv):
    return children_named(srv.proc.pid, "sbx-spawner")


def nfds(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


def in_thread(fn):
    box = {}

    def run():
        try:
            box["value"] = fn()
        except Exception as e:  # noqa: BLE001 - reported by the test
            box["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, box


def signal_all(pids, sig):
    for p in pids:
        os.kill(p, sig)


@pytest.fixture(params=["dedicated", "host"])
def any_server(request, make_server, make_host_server):
    return make_server() if request.param == "dedicated" else make_host_server()


def run_true(srv, sb=None):
    body = {"cmd": ["true"]}
    return sb.exec(body) if sb else srv.exec(body)


def test_helpers_hold_a_few_descriptors_while_the_server_holds_many(make_host_server):
    srv = make_host_server()
    hs = wait_until(lambda: helpers(srv), 5)
    assert hs, "no spawn helper runs beside the server"
    sbs = srv.create(60)
    for sb in sbs[:5]:
        assert sb.run(["true"]).code == 0
    # positive control: the server's own table grew with the sandboxes (2-3 per sandbox)
    assert nfds(srv.proc.pid) > 120, nfds(srv.proc.pid)
    for h in helpers(srv):
        assert nfds(h) <= 5, (h, os.listdir(f"/proc/{h}/fd"))


def test_the_loop_answers_while_a_spawn_is_stuck_and_a_dead_helper_fails_it(any_server):
    srv = any_server
    sb = srv.sandbox() if hasattr(srv, "sandbox") else None
    st, ev = run_true(srv, sb)
    assert st == 200 and ev[-1]["exit_code"] == 0, (st, ev)  # positive control
    before = wait_until(lambda: helpers(srv), 5)
    assert before
    signal_all(before, signal.SIGSTOP)
    try:
        t, box = in_thread(lambda: run_true(srv, sb))
        time.sleep(0.5)
        assert t.is_alive(), box  # the command cannot start: every helper is stopped
        t0 = time.monotonic()
        st, _, _ = srv.request("GET", "/health")
        assert st == 200 and time.monotonic() - t0 < 2  # the loop is not held by the spawn
    finally:
        signal_all(before, signal.SIGKILL)
    t.join(10)
    assert not t.is_alive()
    st, j = box["value"]
    assert st == 400 and "spawn helper died" in j["error"], (st, j)
    # commands start again, on new helpers (started at the next request)
    st, ev = run_true(srv, sb)
    assert st == 200 and ev[-1]["exit_code"] == 0, (st, ev)
    after = helpers(srv)
    assert after and not set(after) & set(before), (before, after)
    assert "spawn helper" in srv.stop()


def test_a_sandbox_deleted_while_its_command_starts_keeps_nothing(make_host_server):
    srv = make_host_server()
    sb = srv.sandbox()
    marker = "9" + str(os.getpid() % 100000)
    # positive control: the same command runs and is seen as the sandbox's uid
    p = sb.start(["sleep", marker])
    assert wait_until(lambda: uid_pids(sb.uid), 5)
    st, _ = sb.json("DELETE", f"/processes/{p['id']}")
    assert st == 200
    assert wait_until(lambda: not uid_pids(sb.uid), 5)
    hs = wait_until(lambda: helpers(srv), 5)
    signal_all(hs, signal.SIGSTOP)
    try:
        t1, started = in_thread(lambda: sb.json("POST", "/processes", {"cmd": ["sleep", marker]}))
        time.sleep(0.3)
        t2, deleted = in_thread(sb.delete)
        time.sleep(0.3)
        assert t2.is_alive(), (started, deleted)  # it waits for the spawn's answer
    finally:
        signal_all(hs, signal.SIGCONT)
    t1.join(15)
    t2.join(15)
    st, j = started["value"]
    assert st == 400 and "deleted" in j["error"], (st, j)
    st, j = deleted["value"]
    assert st == 200 and j["deleted"] is True, (st, j)
    assert not uid_pids(sb.uid), uid_pids(sb.uid)
    _, h = srv.json("GET", "/health")
    assert h["uids"]["quarantined"] == 0, h


def test_a_large_request_travels_whole(any_server):
    """A request over the inline size (32 KiB) reaches the helper through a memfd."""
    srv = any_server
    sb = srv.sandbox() if hasattr(srv, "sandbox") else None
    big = "x" * 60000
    args = ["a" * 30000, "b" * 30000]
    body = {"cmd": ["sh", "-c", 'echo ${#BIG} ${#1} ${#2}', "sh", *args], "env": {"BIG": big}}
    st, ev = sb.exec(body) if sb else srv.exec(body)
    assert st == 200, (st, ev)
    out = "".join(e.get("data", "") for e in ev if e.get("event") == "stdout")
    assert out == "60000 30000 30000\n", ev
    # positive control: a small request gives the small answer
    st, ev = sb.exec({"cmd": ["sh", "-c", "echo ${#BIG}"], "env": {"BIG": "xy"}}) if sb else \
        srv.exec({"cmd": ["sh", "-c", "echo ${#BIG}"], "env": {"BIG": "xy"}})
    assert "".join(e.get("data", "") for e in ev if e.get("event") == "stdout") == "2\n", ev
